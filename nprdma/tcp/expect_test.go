package tcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/link"
)

// scriptedRx is a receiver that expects READ responses from a list, in
// order, and records every packet delivered with its payload.
type scriptedRx struct {
	mu        sync.Mutex
	expect    []link.ExpectedPayload // the head is expected next
	delivered chan delivery
	down      chan error
	after     func(h *link.Header) // called once a packet's payload is read
}

type delivery struct {
	h    link.Header
	data []byte
}

func (r *scriptedRx) ExpectPayload(least int, e *link.ExpectedPayload) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.expect) == 0 || int(r.expect[0].Header.Len) < least {
		return false
	}
	*e = r.expect[0]
	return true
}

func (r *scriptedRx) Deliver(h *link.Header, p link.Payload) error {
	var data []byte
	r.mu.Lock()
	if len(r.expect) > 0 && h.Kind == link.PacketReadResponse && h.Seq == r.expect[0].Header.Seq {
		data = r.expect[0].Dst[:h.Len] // the READ's destination, as a QP's
		r.expect = r.expect[1:]
	} else {
		data = make([]byte, h.PayloadLen())
	}
	r.mu.Unlock()
	if err := p.Read(data); err != nil {
		return err
	}
	if r.after != nil {
		r.after(h)
	}
	r.delivered <- delivery{h: *h, data: bytes.Clone(data)}
	return nil
}

func (r *scriptedRx) Idle()              {}
func (r *scriptedRx) LinkDown(err error) { r.down <- err }

// frameWriter writes frames as a link's writer lays them out: a payload of
// alignPayload bytes or more at its source's address mod alignTo, every
// write ending on a multiple of alignTo.
type frameWriter struct {
	c   net.Conn
	pos int
}

func (w *frameWriter) frame(h *link.Header, src uint64, payload []byte) []byte {
	var b []byte
	if len(payload) >= alignPayload {
		if k := padFor(w.pos, int(src)-payloadOffset(h)); k > 0 {
			b = appendPad(b, k)
		}
	}
	b = append(appendHeader(b, h), payload...)
	w.pos += len(b)
	return b
}

// end ends a write on a multiple of alignTo, as a link's writes do.
func (w *frameWriter) end(b []byte) []byte {
	if k := padFor(w.pos, 0); k > 0 {
		b = appendPad(b, k)
		w.pos += k
	}
	return b
}

func (w *frameWriter) write(t *testing.T, b []byte) {
	t.Helper()
	if _, err := w.c.Write(b); err != nil {
		t.Fatal(err)
	}
}

// socketPair is a connected loopback TCP pair, closed at cleanup.
func socketPair(t *testing.T) (cli, srv *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// A guessed read places the expected READ response's payload straight in
// its destination; when something else arrives first, what the guess put
// in the destination is read again from the stream and every frame is
// delivered intact; a frame arriving in pieces is read as usual.
func TestExpectedResponseReadInPlace(t *testing.T) {
	cli, srv := socketPair(t)
	const size = 96 << 10
	dst := make([][]byte, 5)
	payload := make([][]byte, 5)
	rx := &scriptedRx{delivered: make(chan delivery, 8), down: make(chan error, 1)}
	for i := range dst {
		dst[i], payload[i] = make([]byte, size), make([]byte, size)
		rand.Read(payload[i])
		rx.expect = append(rx.expect, link.ExpectedPayload{
			Header: link.Header{Kind: link.PacketReadResponse, Seq: uint32(10 + i), Len: size, Last: true},
			Src:    0x7f0000001000 + uint64(24*(i/4)), // the last one padded differently
			Dst:    dst[i],
		})
	}
	exps := append([]link.ExpectedPayload(nil), rx.expect...)
	l, err := newLink(New(), srv, newReader(srv, 64<<10))
	if err != nil {
		t.Fatal(err)
	}
	l.Start(rx)
	defer func() {
		l.Abort()
		<-rx.down
	}()
	w := &frameWriter{c: cli}
	resp := func(i int) []byte { return w.frame(&exps[i].Header, exps[i].Src, payload[i]) }
	want := func(kind link.PacketKind, seq uint32, data []byte) {
		t.Helper()
		select {
		case d := <-rx.delivered:
			if d.h.Kind != kind || d.h.Seq != seq || !bytes.Equal(d.data, data) {
				t.Fatalf("delivered %s %d (%d bytes), want %s %d with its %d bytes", d.h.Kind, d.h.Seq, len(d.data), kind, seq, len(data))
			}
		case err := <-rx.down:
			t.Fatalf("link down: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatalf("%s %d not delivered", kind, seq)
		}
	}

	// 1. As expected.
	w.write(t, w.end(resp(0)))
	want(link.PacketReadResponse, 10, payload[0])
	if !bytes.Equal(dst[0], payload[0]) {
		t.Fatal("READ 10's destination does not hold its payload")
	}
	// 2. In pieces: the guessed read gets part of the header only.
	b := w.end(resp(1))
	w.write(t, b[:5])
	time.Sleep(20 * time.Millisecond)
	w.write(t, b[5:])
	want(link.PacketReadResponse, 11, payload[1])
	// 3. A SEND first: the guess is wrong. 4. The next boundary does not
	// guess.
	send := make([]byte, 40<<10)
	rand.Read(send)
	w.write(t, w.end(append(w.frame(&link.Header{Kind: link.PacketSend, Seq: 3, Len: uint32(len(send))}, 0x1000, send), resp(2)...)))
	want(link.PacketSend, 3, send)
	want(link.PacketReadResponse, 12, payload[2])
	w.write(t, w.end(resp(3)))
	want(link.PacketReadResponse, 13, payload[3])
	// 5. As expected again.
	w.write(t, w.end(resp(4)))
	want(link.PacketReadResponse, 14, payload[4])
	for i := range dst {
		if !bytes.Equal(dst[i], payload[i]) {
			t.Fatalf("READ %d's destination does not hold its payload", 10+i)
		}
	}
	if hits, wrong := l.exp.hits.Load(), l.exp.wrong.Load(); hits < 2 || hits > 3 || wrong != 1 {
		t.Fatalf("%d guesses right and %d wrong, want 2 (3 if the pieces came together) and exactly 1", hits, wrong)
	}
}

// Over queue pairs, large READs at queue depth 1 and 8 land in place,
// through one segment or several, from any alignment: at depth 1 with one
// guessed read each, every guess right, every byte where it belongs.
func TestLargeReadsLandInPlace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The waiter receives (direct completion, kept for the whole test): it
	// reaches each frame boundary with its READ posted. (The reader
	// goroutine, receiving between waits, may be blocked in a read before
	// the next READ is posted, and then reads as if nothing were expected.)
	p := newDirectPair(t, []Option{WithDirectCompletion(time.Hour)}, nil)
	l := onlyLink(t, p.cliProv)
	const size = 128 << 10
	reads := 0
	for _, off := range []struct{ local, remote int }{{0, 0}, {64, 4096}, {100, 3}, {4096 + 8, 1 << 20}} {
		for range 10 {
			reads++
			clear(p.lbuf[:off.local+size])
			if err := p.cli.PostSend(nprdma.SendWR{ID: uint64(reads), Op: nprdma.OpRead, Signaled: true,
				SG:         []nprdma.SGE{p.lmr.SGE(off.local, size/4), p.lmr.SGE(off.local+size/4, size-size/4)},
				RemoteAddr: p.rmr.Addr() + uint64(off.remote), RKey: p.rmr.RKey()}); err != nil {
				t.Fatal(err)
			}
			waitOne(t, ctx, p.cliSCQ, uint64(reads), nprdma.OpRead)
			if !bytes.Equal(p.lbuf[off.local:off.local+size], p.rbuf[off.remote:off.remote+size]) {
				t.Fatalf("READ of [%d, +%d) into %d: wrong bytes", off.remote, size, off.local)
			}
		}
	}
	// At queue depth 1 nothing follows a response, so READs are guessed:
	// most of them (after a READ from offset 3 the reader may stand off
	// alignTo, and the next one is read as usual).
	if hits, wrong := l.exp.hits.Load(), l.exp.wrong.Load(); hits < 20 || wrong != 0 {
		t.Fatalf("%d guesses right and %d wrong over %d READs at QD1, want at least 20 right and none wrong", hits, wrong, reads)
	}
	t.Logf("%d of %d READs at QD1 guessed", l.exp.hits.Load(), reads)
	// At 8, a response's header mostly comes with the payload before it
	// (readDirect), and the guess is only needed after a pause.
	const qd = 8
	wcs := make([]nprdma.WC, qd)
	for round := range 5 {
		clear(p.lbuf[:qd*size])
		for i := range qd {
			if err := p.cli.PostSend(nprdma.SendWR{ID: uint64(i), Op: nprdma.OpRead, Signaled: true, SG: []nprdma.SGE{p.lmr.SGE(i*size, size)},
				RemoteAddr: p.rmr.Addr() + uint64((round*qd+i)*size), RKey: p.rmr.RKey()}); err != nil {
				t.Fatal(err)
			}
		}
		for got := 0; got < qd; {
			n, err := p.cliSCQ.Wait(ctx, wcs)
			if err != nil {
				t.Fatal(err)
			}
			for _, wc := range wcs[:n] {
				if wc.Status != nprdma.StatusSuccess {
					t.Fatalf("READ %d: %s", wc.ID, wc.Status)
				}
			}
			got += n
		}
		if !bytes.Equal(p.lbuf[:qd*size], p.rbuf[round*qd*size:(round+1)*qd*size]) {
			t.Fatalf("round %d of %d READs: wrong bytes", round, qd)
		}
		reads += qd
	}
	if wrong := l.exp.wrong.Load(); wrong != 0 {
		t.Fatalf("%d guesses wrong over %d READs, want none", wrong, reads)
	}
}

// A stream of large SENDs lands in the receive buffers with one read each
// once the first has shown the length and the sender's alignment; a SEND
// of another length is a wrong guess and arrives intact all the same.
func TestLargeSendsLandInPlace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := newDirectPair(t, nil, nil)
	l := onlyLink(t, p.srvProv)
	lengths := []int{128 << 10, 128 << 10, 128 << 10, 128 << 10, 96 << 10, 96 << 10, 96 << 10, 40 << 10, 128 << 10, 128 << 10}
	const slot = 128 << 10
	for i := range lengths {
		if err := p.srv.PostRecv(nprdma.RecvWR{ID: uint64(i), SG: []nprdma.SGE{p.rmr.SGE(i*slot, slot)}}); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := range lengths {
		src := p.lbuf[i*slot : i*slot+n]
		rand.Read(src)
		if err := p.cli.PostSend(nprdma.SendWR{ID: uint64(i), Op: nprdma.OpSend, Signaled: true, SG: []nprdma.SGE{p.lmr.SGE(i*slot, n)}}); err != nil {
			t.Fatal(err)
		}
		waitOne(t, ctx, p.cliSCQ, uint64(i), nprdma.OpSend)
		wcs := make([]nprdma.WC, 1)
		if _, err := p.srvRCQ.Wait(ctx, wcs); err != nil {
			t.Fatal(err)
		}
		if wc := wcs[0]; wc.ID != uint64(i) || wc.Status != nprdma.StatusSuccess || wc.ByteLen != uint32(n) {
			t.Fatalf("receive %+v (%s), want id %d success with %d bytes", wc, wc.Status, i, n)
		}
		if !bytes.Equal(p.rbuf[i*slot:i*slot+n], src) {
			t.Fatalf("SEND %d of %d bytes: wrong bytes received", i, n)
		}
	}
	hits, wrong := l.exp.hits.Load(), l.exp.wrong.Load()
	t.Logf("%d SENDs: %d guessed reads placed payload, %d guesses wrong", len(lengths), hits, wrong)
	// Guessed: every SEND after the first, but for the one after each
	// change of length (paused after a wrong guess).
	if hits < 4 || wrong < 1 || wrong > 3 {
		t.Fatalf("%d guesses right and %d wrong, want at least 4 right and 1 to 3 wrong", hits, wrong)
	}
}

// The read that takes the rest of a large payload straight into place
// takes what follows it into the buffer too: with frames queued, the next
// header comes without a read of its own.
func TestPayloadReadTakesWhatFollows(t *testing.T) {
	cli, srv := socketPair(t)
	w := &frameWriter{c: cli}
	const size = 100 << 10
	payloads := [][]byte{make([]byte, size), make([]byte, size)}
	var b []byte
	for i, p := range payloads {
		rand.Read(p)
		b = append(b, w.frame(&link.Header{Kind: link.PacketSend, Seq: uint32(i), Len: size}, 0x1000, p)...)
	}
	w.write(t, w.end(b)) // all queued before the link reads anything
	rx := &scriptedRx{delivered: make(chan delivery, 2), down: make(chan error, 1)}
	l, err := newLink(New(), srv, newReader(srv, 64<<10))
	if err != nil {
		t.Fatal(err)
	}
	buffered := -1
	rx.after = func(h *link.Header) {
		if h.Seq == 0 {
			buffered = l.rd.buffered()
		}
	}
	l.Start(rx)
	defer func() {
		l.Abort()
		<-rx.down
	}()
	for i, p := range payloads {
		select {
		case d := <-rx.delivered:
			if d.h.Seq != uint32(i) || !bytes.Equal(d.data, p) {
				t.Fatalf("delivered SEND %d (%d bytes), want %d with its bytes", d.h.Seq, len(d.data), i)
			}
		case err := <-rx.down:
			t.Fatalf("link down: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatalf("SEND %d not delivered", i)
		}
	}
	// The first read took 64 KiB (the header and the start of SEND 0); the
	// rest of SEND 0 was read into place with 4 KiB of SEND 1 behind it.
	if buffered < headerLens[frameSend] {
		t.Fatalf("after SEND 0's payload %d bytes were buffered, want SEND 1's header at least", buffered)
	}
}
