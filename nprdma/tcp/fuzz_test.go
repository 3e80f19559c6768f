package tcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/link"
)

// stubProvider connects queue pairs to a link that goes nowhere, so that a
// fuzz input can play the peer.
type stubProvider struct{}

func (stubProvider) Name() string { return "stub" }
func (stubProvider) Listen(string) (link.Listener, error) {
	return nil, errors.New("stub: no listening")
}
func (stubProvider) Dial(context.Context, string, link.Hello) (link.Link, link.Hello, error) {
	return stubLink{}, link.Hello{QPNum: 1}, nil
}

type stubLink struct{}

func (stubLink) Start(link.Receiver) {}
func (stubLink) Send(pkts []link.Packet) {
	for i := range pkts {
		if pkts[i].Buf != nil {
			pkts[i].Buf.Release()
		}
	}
}
func (stubLink) Flush() {}
func (stubLink) Close() {}
func (stubLink) Abort() {}

// frameSeeds are valid frame streams: every frame type, and the answers a
// peer would give to the work requests fuzzPeer posts (seq 0 READ of 4096
// bytes, seq 1 SEND, seq 2 WRITE).
func frameSeeds() [][]byte {
	var all []byte
	var seeds [][]byte
	for _, h := range samplePackets() {
		b := appendHeader(nil, &h)
		b = append(b, make([]byte, h.PayloadLen())...)
		seeds = append(seeds, b)
		all = append(all, b...)
	}
	seeds = append(seeds, all)
	enc := func(hs ...link.Header) []byte {
		var b []byte
		for _, h := range hs {
			b = appendHeader(b, &h)
			b = append(b, bytes.Repeat([]byte{0xa5}, h.PayloadLen())...)
		}
		return b
	}
	seeds = append(seeds,
		enc(link.Header{Kind: link.PacketReadResponse, Seq: 0, Len: 4096, Last: true}, link.Header{Kind: link.PacketAck, Seq: 2}),
		enc(link.Header{Kind: link.PacketReadResponse, Seq: 0, Len: 100},
			link.Header{Kind: link.PacketReadResponse, Seq: 0, Offset: 100, Len: 3996, Fill: true, Pattern: 0x1122334455667788, Last: true},
			link.Header{Kind: link.PacketNak, Seq: 1, Syndrome: link.NakRNR}),
		enc(link.Header{Kind: link.PacketReadResponse, Seq: 0, Len: 4096, Last: true}, link.Header{Kind: link.PacketNak, Seq: 2, Syndrome: link.NakRemoteAccess}),
		enc(link.Header{Kind: link.PacketSend, Seq: 0, Len: 64}, link.Header{Kind: link.PacketSend, Seq: 1, Len: 10, HasImm: true, Imm: 3},
			link.Header{Kind: link.PacketReadRequest, Seq: 2, Len: 64, RKey: 1, Addr: 0}, link.Header{Kind: link.PacketWrite, Seq: 3, Len: 8, RKey: 1}),
		enc(link.Header{Kind: link.PacketAck, Seq: 7}),
		// Piggybacked acknowledgements: valid, stale, before the READ's
		// data, beyond what was sent.
		enc(link.Header{Kind: link.PacketReadResponse, Seq: 0, Len: 4096, Last: true},
			link.Header{Kind: link.PacketSend, Seq: 0, Len: 8, HasAck: true, Ack: 2}),
		enc(link.Header{Kind: link.PacketReadResponse, Seq: 0, Len: 4096, Last: true}, link.Header{Kind: link.PacketAck, Seq: 2},
			link.Header{Kind: link.PacketReadRequest, Seq: 0, Len: 8, RKey: 1, HasAck: true, Ack: 1}),
		enc(link.Header{Kind: link.PacketWrite, Seq: 0, Len: 8, RKey: 1, HasAck: true, Ack: 0}),
		enc(link.Header{Kind: link.PacketReadResponse, Seq: 0, Len: 4096, Last: true},
			link.Header{Kind: link.PacketSend, Seq: 0, Len: 8, HasAck: true, Ack: 5}),
		enc(link.Header{Kind: link.PacketDisconnect}),
		append(appendHeader(nil, &link.Header{Kind: link.PacketSend, Seq: 0, Len: 1 << 20}), 1, 2, 3), // payload cut short
	)
	return seeds
}

// fuzzPeer connects a queue pair to a stub, posts work, and feeds data to
// it as the byte stream from the peer, through the real frame reader.
func fuzzPeer(t *testing.T, data []byte) {
	feedPeer(t, data)
}

// feedPeer is fuzzPeer, returning the completions and the queue pair's
// error for tests that check them.
func feedPeer(t *testing.T, data []byte) ([]nprdma.WC, error) {
	qp, cq, mr := stubPeer(t, make([]byte, 16<<10))
	qp.PostRecv(nprdma.RecvWR{ID: 1, SG: []nprdma.SGE{mr.SGE(0, 64)}}, nprdma.RecvWR{ID: 2, SG: []nprdma.SGE{mr.SGE(64, 64)}})
	if _, err := qp.Connect(context.Background(), "stub", nil); err != nil {
		t.Fatal(err)
	}
	qp.PostSend(
		nprdma.SendWR{ID: 10, Op: nprdma.OpRead, SG: []nprdma.SGE{mr.SGE(8192, 4096)}, RemoteAddr: 0x1000, RKey: 5, Signaled: true},
		nprdma.SendWR{ID: 11, Op: nprdma.OpSend, SG: []nprdma.SGE{mr.SGE(0, 100)}, Signaled: true},
		nprdma.SendWR{ID: 12, Op: nprdma.OpWrite, SG: []nprdma.SGE{mr.SGE(0, 100)}, RemoteAddr: 0x1000, RKey: 5})
	readToEnd(t, &tcpLink{prov: New(), rd: newReader(bytes.NewReader(data), 4096), rx: qp.Driver().(link.Receiver), abortCh: make(chan struct{})}, qp)
	return completedOnce(t, cq, 1, 2, 10, 11), qp.Err()
}

// stubPeer is a queue pair on a stub device (closed when the test ends),
// with buf registered for every access; the caller connects it.
func stubPeer(t *testing.T, buf []byte) (*nprdma.QP, *nprdma.CQ, *nprdma.MR) {
	dev := nprdma.NewDevice(stubProvider{}, nprdma.WithPinning(false))
	t.Cleanup(func() { dev.Close() })
	pd := dev.AllocPD()
	cq := dev.NewCQ(64)
	qp, err := pd.NewQP(nprdma.QPConfig{SendCQ: cq, SendDepth: 16, RecvDepth: 16, Timeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.Register(buf, nprdma.AccessLocalWrite|nprdma.AccessRemoteRead|nprdma.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	return qp, cq, mr
}

// readToEnd reads l's stream, finite, to its end, and takes qp down with
// the error that ended it.
func readToEnd(t *testing.T, l *tcpLink, qp *nprdma.QP) {
	err := l.readFrames()
	rx := qp.Driver().(link.Receiver)
	if err == nil {
		rx.LinkDown(errors.New("test: the stream ended"))
		qp.Close()
		t.Fatal("reading a finite stream ended without an error")
	}
	rx.LinkDown(err)
	qp.Close()
}

// completedOnce returns cq's completions, each work request's at most once
// and those of ids exactly once.
func completedOnce(t *testing.T, cq *nprdma.CQ, ids ...uint64) []nprdma.WC {
	var wcs [64]nprdma.WC
	n := cq.Poll(wcs[:])
	seen := map[uint64]int{}
	for _, wc := range wcs[:n] {
		if seen[wc.ID]++; seen[wc.ID] > 1 {
			t.Fatalf("work request %d completed more than once (completions %+v)", wc.ID, wcs[:n])
		}
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Fatalf("work request %d never completed (completions %+v)", id, wcs[:n])
		}
	}
	return wcs[:n]
}

func FuzzFrameDecoder(f *testing.F) {
	for _, s := range frameSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var h link.Header
		if n, err := parseHeader(data, &h); err == nil {
			// Decoding is canonical: encoding the header gives the bytes back.
			if again := appendHeader(nil, &h); !bytes.Equal(again, data[:n]) {
				t.Fatalf("header %+v re-encodes as %x, was %x", h, again, data[:n])
			}
			if h.PayloadLen() > link.MaxMessageSize {
				t.Fatalf("accepted a %d-byte payload", h.PayloadLen())
			}
		} else if !errors.Is(err, errShort) && !errors.Is(err, errFrame) {
			t.Fatalf("unexpected error %v", err)
		}
		fuzzPeer(t, data)
	})
}

func handshakeSeeds() [][]byte {
	return [][]byte{
		appendCM(nil, cmFrame{typ: frameConnect, qpn: 3, privateData: []byte("nvme queue 0")}),
		appendCM(nil, cmFrame{typ: frameAccept, qpn: 4, privateData: []byte{1, 2}}),
		appendCM(nil, cmFrame{typ: frameReject, privateData: []byte("denied")}),
		appendCM(nil, cmFrame{typ: frameReject, privateData: make([]byte, link.MaxPrivateData)}),
		append(appendCM(nil, cmFrame{typ: frameAccept, qpn: 1}), appendHeader(nil, &link.Header{Kind: link.PacketAck})...),
	}
}

func FuzzHandshake(f *testing.F) {
	for _, s := range handshakeSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, n, parseErr := parseCM(data, frameConnect, frameAccept, frameReject)
		if parseErr == nil {
			if len(fr.privateData) > link.MaxPrivateData {
				t.Fatalf("accepted %d bytes of private data", len(fr.privateData))
			}
			if again := appendCM(nil, fr); !bytes.Equal(again, data[:n]) {
				t.Fatalf("frame %+v re-encodes as %x, was %x", fr, again, data[:n])
			}
		} else if !errors.Is(parseErr, errShort) && !errors.Is(parseErr, errFrame) {
			t.Fatalf("unexpected error %v", parseErr)
		}
		// The reader the handshake uses ends with a frame or an error, with
		// the smallest read buffer a provider allows and with one too small
		// for the frame (which once spun for ever).
		for _, size := range []int{2*maxHeaderLen + link.MaxPrivateData, 64} {
			rd := newReader(bytes.NewReader(data), size)
			got, err := readCM(rd, frameConnect)
			if err == nil && data[0] != frameConnect {
				t.Fatalf("readCM returned a frame of type %d", data[0])
			}
			if size >= len(data) && (err == nil) != (parseErr == nil && fr.typ == frameConnect) {
				t.Fatalf("readCM with a %d-byte buffer: %+v, %v; parseCM: %+v, %v", size, got, err, fr, parseErr)
			}
		}
	})
}

// TestWriteSeedCorpus regenerates the committed seed corpus
// (NPRDMA_WRITE_SEEDS=1 go test -run TestWriteSeedCorpus).
func TestWriteSeedCorpus(t *testing.T) {
	if os.Getenv("NPRDMA_WRITE_SEEDS") != "1" {
		t.Skip("set NPRDMA_WRITE_SEEDS=1 to rewrite testdata/fuzz")
	}
	var guess [][]byte
	for _, name := range slices.Sorted(maps.Keys(guessSeeds())) {
		guess = append(guess, guessSeeds()[name])
	}
	for name, seeds := range map[string][][]byte{"FuzzFrameDecoder": frameSeeds(), "FuzzHandshake": handshakeSeeds(), "FuzzGuessedReads": guess} {
		dir := filepath.Join("testdata", "fuzz", name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, s := range seeds {
			body := fmt.Sprintf("go test fuzz v1\n[]byte(%s)\n", strconv.Quote(string(s)))
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestPiggybackedAckValidation feeds a queue pair (READ 0, SEND 1 signaled,
// WRITE 2 posted) requests from the peer that carry acknowledgements.
func TestPiggybackedAckValidation(t *testing.T) {
	enc := func(hs ...link.Header) []byte {
		var b []byte
		for _, h := range hs {
			b = appendHeader(b, &h)
			b = append(b, make([]byte, h.PayloadLen())...)
		}
		return b
	}
	readResp := link.Header{Kind: link.PacketReadResponse, Seq: 0, Len: 4096, Last: true}
	status := func(wcs []nprdma.WC, id uint64) nprdma.Status {
		for _, wc := range wcs {
			if wc.ID == id {
				return wc.Status
			}
		}
		t.Fatalf("no completion of %d in %+v", id, wcs)
		return 0
	}
	// Valid: the SEND from the peer acknowledges our SEND and WRITE, and
	// is received.
	wcs, err := feedPeer(t, enc(readResp, link.Header{Kind: link.PacketSend, Seq: 0, Len: 8, HasAck: true, Ack: 2}))
	if !errors.Is(err, link.ErrPeerLost) || status(wcs, 11) != nprdma.StatusSuccess || status(wcs, 1) != nprdma.StatusSuccess {
		t.Fatalf("valid piggybacked ACK: error %v, completions %+v", err, wcs)
	}
	// Stale: an ACK packet acknowledged everything already; the older
	// acknowledgement a later request carries changes nothing.
	wcs, err = feedPeer(t, enc(readResp, link.Header{Kind: link.PacketAck, Seq: 2},
		link.Header{Kind: link.PacketSend, Seq: 0, Len: 8, HasAck: true, Ack: 1}))
	if !errors.Is(err, link.ErrPeerLost) || status(wcs, 11) != nprdma.StatusSuccess || status(wcs, 1) != nprdma.StatusSuccess {
		t.Fatalf("stale piggybacked ACK: error %v, completions %+v", err, wcs)
	}
	// Acknowledging the READ before its data, or a request never sent,
	// breaks the protocol.
	for name, stream := range map[string][]byte{
		"READ without its data": enc(link.Header{Kind: link.PacketSend, Seq: 0, Len: 8, HasAck: true, Ack: 0}),
		"beyond what was sent":  enc(readResp, link.Header{Kind: link.PacketSend, Seq: 0, Len: 8, HasAck: true, Ack: 5}),
	} {
		wcs, err := feedPeer(t, stream)
		if !errors.Is(err, link.ErrProtocol) || status(wcs, 1) != nprdma.StatusWRFlushed {
			t.Fatalf("%s: error %v, completions %+v", name, err, wcs)
		}
	}
}

// arrivalSource plays the peer's byte stream to a reader as it would
// arrive on a socket, in arrivals of the given sizes (then the rest at
// once): a call returns what has arrived, never more than the current
// arrival's rest. It reads through Read and readv alike: a vectorReader,
// so the link guesses the next frame as it does on a socket.
type arrivalSource struct {
	data     []byte
	arrivals []int
}

func (s *arrivalSource) Read(p []byte) (int, error) { return s.readv(p, nil) }

func (s *arrivalSource) readv(p, q []byte) (int, error) {
	if len(s.data) == 0 {
		return 0, io.EOF
	}
	limit := len(s.data)
	if len(s.arrivals) > 0 {
		limit = min(limit, s.arrivals[0])
	}
	n := copy(p, s.data[:limit])
	n += copy(q, s.data[n:limit])
	s.data = s.data[n:]
	if len(s.arrivals) > 0 {
		if s.arrivals[0] -= n; s.arrivals[0] == 0 {
			s.arrivals = s.arrivals[1:]
		}
	}
	return n, nil
}

// Layout of guessPeer's registered buffer: two large READs (the second in
// two segments, from a source off alignTo) and two large receives, with
// canaries between and after them that no work request gives the network.
const (
	guessRead1      = 0         // 40 KiB
	guessRead2a     = 64 << 10  // 16 KiB
	guessRead2b     = 88 << 10  // 32 KiB
	guessRecv1      = 128 << 10 // 40 KiB
	guessRecv2      = 168 << 10 // 40 KiB
	guessBuf        = 256 << 10
	guessRead1Len   = 40 << 10
	guessRead2Len   = 48 << 10
	guessRecvLen    = 40 << 10
	guessRead1Src   = 0x10000
	guessRead2Src   = 0x20018
	guessCanaryByte = 0x5a
)

var guessCanaries = [][2]int{{guessRead1 + guessRead1Len, guessRead2a}, {guessRead2a + 16<<10, guessRead2b},
	{guessRead2b + 32<<10, guessRecv1}, {guessRecv2 + guessRecvLen, guessBuf}}

// guessPeer is feedPeer for the guessed read (expect.go): the queue pair
// has two large READs outstanding and two large receives posted, and the
// stream arrives in pieces (arrivalSource). Whatever the stream holds,
// every work request completes exactly once and no byte outside the memory
// the work requests gave the network is written: a wrong guess may only
// scribble on a READ's destination or a posted receive.
func guessPeer(t *testing.T, sizes []int, data []byte) guessRun {
	buf := bytes.Repeat([]byte{guessCanaryByte}, guessBuf)
	qp, cq, mr := stubPeer(t, buf)
	qp.PostRecv(nprdma.RecvWR{ID: 1, SG: []nprdma.SGE{mr.SGE(guessRecv1, guessRecvLen)}},
		nprdma.RecvWR{ID: 2, SG: []nprdma.SGE{mr.SGE(guessRecv2, guessRecvLen)}})
	if _, err := qp.Connect(context.Background(), "stub", nil); err != nil {
		t.Fatal(err)
	}
	qp.PostSend(
		nprdma.SendWR{ID: 10, Op: nprdma.OpRead, SG: []nprdma.SGE{mr.SGE(guessRead1, guessRead1Len)}, RemoteAddr: guessRead1Src, RKey: 5, Signaled: true},
		nprdma.SendWR{ID: 11, Op: nprdma.OpRead, SG: []nprdma.SGE{mr.SGE(guessRead2a, 16<<10), mr.SGE(guessRead2b, 32<<10)},
			RemoteAddr: guessRead2Src, RKey: 5, Signaled: true})
	src := &arrivalSource{data: data, arrivals: sizes}
	l := &tcpLink{prov: New(), rd: newReader(src, 64<<10), rx: qp.Driver().(link.Receiver), abortCh: make(chan struct{})}
	l.exp.ex = qp.Driver().(link.PayloadExpecter)
	readToEnd(t, l, qp)
	for _, c := range guessCanaries {
		for i := c[0]; i < c[1]; i++ {
			if buf[i] != guessCanaryByte {
				t.Fatalf("byte %#x of the buffer, which no work request gave the network, was written (right guesses %d, wrong %d)",
					i, l.exp.hits.Load(), l.exp.wrong.Load())
			}
		}
	}
	return guessRun{wcs: completedOnce(t, cq, 1, 2, 10, 11), hits: l.exp.hits.Load(), wrong: l.exp.wrong.Load(), buf: buf}
}

// guessRun is what guessPeer saw.
type guessRun struct {
	wcs         []nprdma.WC
	hits, wrong uint64
	buf         []byte // the registered buffer afterwards
}

// guessStream expands prog, a compact description of a peer's stream,
// into the stream and the sizes it arrives in: the fuzzer then mutates
// frames and their order rather than 100 KiB of payload. Each step is an
// op byte (its top bit ends an arrival after the step) and its operands:
//
//	op&3 == 0: n (1 byte), then n raw bytes
//	op&3 == 1: a frame as a link writes it (frameWriter): kind (1 byte, of
//	           the seven, counted from PacketSend), seq (1 byte), length and offset (2 bytes each, in 64-byte
//	           units), flags (1 byte: bit 0 last, bit 1 fill), the low bits
//	           of its source address (1 byte); the payload is a pattern
//	op&3 == 2: n (2 bytes), then n pattern bytes
//	op&3 == 3: PAD to the next multiple of alignTo, as a write ends
//
// The stream is capped at 1 MiB.
func guessStream(prog []byte) (data []byte, sizes []int) {
	var w frameWriter
	take := func(n int) []byte {
		b := make([]byte, n)
		k := copy(b, prog)
		prog = prog[k:]
		return b
	}
	u16 := func() int { return int(binary.LittleEndian.Uint16(take(2))) }
	last := 0
	for len(prog) > 0 && len(data) < 1<<20 {
		op := take(1)[0]
		switch op & 3 {
		case 0:
			b := take(int(take(1)[0]))
			data = append(data, b...)
			w.pos += len(b)
		case 1:
			f := take(2)
			n, off := u16()*64, u16()*64
			flags, src := take(1)[0], take(1)[0]
			h := link.Header{Kind: link.PacketSend + link.PacketKind(f[0]%7), Seq: uint32(f[1]), Len: uint32(n), Offset: uint32(off),
				Last: flags&1 != 0, Fill: flags&2 != 0}
			data = append(data, w.frame(&h, uint64(src), guessPattern(n, op))...)
		case 2:
			b := guessPattern(u16(), op)
			data = append(data, b...)
			w.pos += len(b)
		case 3:
			data = append(data, w.end(nil)...)
		}
		if op&0x80 != 0 && len(data) > last {
			sizes = append(sizes, len(data)-last)
			last = len(data)
		}
	}
	return data, sizes
}

// guessProgram is guessStream's inverse for well-formed frames, for seeds.
type guessProgram []byte

func (p guessProgram) frame(kind link.PacketKind, seq uint32, n int, src uint64) guessProgram {
	p = append(p, 1, byte(kind-link.PacketSend), byte(seq))
	p = binary.LittleEndian.AppendUint16(p, uint16(n/64))
	p = binary.LittleEndian.AppendUint16(p, 0)
	return append(p, 1, byte(src))
}

// end ends a write (PAD to alignTo) and the arrival with it.
func (p guessProgram) end() guessProgram { return append(p, 0x80|3) }

// guessSeeds are programs for guessPeer, each frame arriving on its own:
// the two READs' responses (the second padded to its source's alignment)
// and SENDs as large as the receives, in order, SENDs first, responses
// swapped, a corrupted header, a short SEND, and a stream cut short.
func guessSeeds() map[string]guessProgram {
	r1 := func(p guessProgram) guessProgram {
		return p.frame(link.PacketReadResponse, 0, guessRead1Len, guessRead1Src).end()
	}
	r2 := func(p guessProgram) guessProgram {
		return p.frame(link.PacketReadResponse, 1, guessRead2Len, guessRead2Src).end()
	}
	s0 := func(p guessProgram) guessProgram { return p.frame(link.PacketSend, 0, guessRecvLen, 0).end() }
	s1 := func(p guessProgram) guessProgram { return p.frame(link.PacketSend, 1, guessRecvLen, 0).end() }
	short := func(p guessProgram) guessProgram { return p.frame(link.PacketSend, 0, 2048, 0).end() }
	build := func(steps ...func(guessProgram) guessProgram) guessProgram {
		var p guessProgram
		for _, s := range steps {
			p = s(p)
		}
		return p
	}
	return map[string]guessProgram{
		"in order":    build(r1, r2, s0, s1),
		"SENDs first": build(s0, s1, r1, r2),
		"swapped":     build(r2, r1, s0, s1),
		"short SEND":  build(r1, short, s1, r2),
		// Garbage where the first response should be: the link dies.
		"garbage": build(func(p guessProgram) guessProgram { return append(p, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8) }, r1, r2, s0, s1),
		// The stream ends in the middle of a SEND's header.
		"cut short": build(r1, r2, func(p guessProgram) guessProgram { return append(p, 0, 3, byte(link.PacketSend), 0, 0) }),
	}
}

// guessPattern is payload bytes for guessStream, by seed.
func guessPattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// The seeds do what they are there for: in order, every frame the queue
// pair can name is read in place and lands whole; a SEND before the READs'
// responses is a wrong guess, recovered from; the stream arriving at once
// or in small pieces changes what is guessed, not what lands.
func TestGuessSeeds(t *testing.T) {
	seeds := guessSeeds()
	status := func(r guessRun, id uint64) nprdma.Status {
		for _, wc := range r.wcs {
			if wc.ID == id {
				return wc.Status
			}
		}
		return nprdma.Status(255)
	}
	landed := func(t *testing.T, r guessRun) {
		t.Helper()
		for id, want := range map[uint64][]byte{10: guessPattern(guessRead1Len, 1), 11: guessPattern(guessRead2Len, 1),
			1: guessPattern(guessRecvLen, 1), 2: guessPattern(guessRecvLen, 1)} {
			if status(r, id) != nprdma.StatusSuccess {
				t.Fatalf("work request %d: %v (completions %+v)", id, status(r, id), r.wcs)
			}
			var got []byte
			switch id {
			case 10:
				got = r.buf[guessRead1 : guessRead1+guessRead1Len]
			case 11:
				got = append(bytes.Clone(r.buf[guessRead2a:guessRead2a+16<<10]), r.buf[guessRead2b:guessRead2b+32<<10]...)
			case 1:
				got = r.buf[guessRecv1 : guessRecv1+guessRecvLen]
			case 2:
				got = r.buf[guessRecv2 : guessRecv2+guessRecvLen]
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("work request %d: the data landed wrong", id)
			}
		}
	}
	for name, want := range map[string][2]uint64{"in order": {3, 0}, "SENDs first": {2, 1}} {
		data, sizes := guessStream(seeds[name])
		r := guessPeer(t, sizes, data)
		landed(t, r)
		if r.hits != want[0] || r.wrong != want[1] {
			t.Fatalf("%s, a frame at a time: %d right guesses and %d wrong, want %d and %d", name, r.hits, r.wrong, want[0], want[1])
		}
		for _, sizes := range [][]int{nil, slices.Repeat([]int{100}, len(data)/100)} {
			landed(t, guessPeer(t, sizes, data))
		}
	}
	// Garbage where a guessed response should be goes back into the
	// stream and is read as frames: the READ fails, whatever lands in its
	// destination.
	data, sizes := guessStream(seeds["garbage"])
	if r := guessPeer(t, sizes, data); r.wrong != 1 || status(r, 10) == nprdma.StatusSuccess {
		t.Fatalf("garbage: %d wrong guesses, READ %v; want one wrong guess and the READ failed", r.wrong, status(r, 10))
	}
}

func FuzzGuessedReads(f *testing.F) {
	for _, p := range guessSeeds() {
		f.Add([]byte(p))
	}
	f.Fuzz(func(t *testing.T, prog []byte) {
		data, sizes := guessStream(prog)
		guessPeer(t, sizes, data)
	})
}
