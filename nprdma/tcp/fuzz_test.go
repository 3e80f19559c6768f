package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/nprdma/nprdma/nprdma"
)

// stubProvider connects queue pairs to a link that goes nowhere, so that a
// fuzz input can play the peer.
type stubProvider struct{}

func (stubProvider) Name() string { return "stub" }
func (stubProvider) Listen(string) (nprdma.LinkListener, error) {
	return nil, errors.New("stub: no listening")
}
func (stubProvider) Dial(context.Context, string, nprdma.Hello) (nprdma.Link, nprdma.Hello, error) {
	return stubLink{}, nprdma.Hello{QPNum: 1}, nil
}

type stubLink struct{}

func (stubLink) Start(nprdma.Receiver) {}
func (stubLink) Send(pkts []nprdma.Packet) {
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
	enc := func(hs ...nprdma.Header) []byte {
		var b []byte
		for _, h := range hs {
			b = appendHeader(b, &h)
			b = append(b, bytes.Repeat([]byte{0xa5}, h.PayloadLen())...)
		}
		return b
	}
	seeds = append(seeds,
		enc(nprdma.Header{Kind: nprdma.PacketReadResponse, Seq: 0, Len: 4096, Last: true}, nprdma.Header{Kind: nprdma.PacketAck, Seq: 2}),
		enc(nprdma.Header{Kind: nprdma.PacketReadResponse, Seq: 0, Len: 100},
			nprdma.Header{Kind: nprdma.PacketReadResponse, Seq: 0, Offset: 100, Len: 3996, Fill: true, Pattern: 0x1122334455667788, Last: true},
			nprdma.Header{Kind: nprdma.PacketNak, Seq: 1, Syndrome: nprdma.NakRNR}),
		enc(nprdma.Header{Kind: nprdma.PacketReadResponse, Seq: 0, Len: 4096, Last: true}, nprdma.Header{Kind: nprdma.PacketNak, Seq: 2, Syndrome: nprdma.NakRemoteAccess}),
		enc(nprdma.Header{Kind: nprdma.PacketSend, Seq: 0, Len: 64}, nprdma.Header{Kind: nprdma.PacketSend, Seq: 1, Len: 10, HasImm: true, Imm: 3},
			nprdma.Header{Kind: nprdma.PacketReadRequest, Seq: 2, Len: 64, RKey: 1, Addr: 0}, nprdma.Header{Kind: nprdma.PacketWrite, Seq: 3, Len: 8, RKey: 1}),
		enc(nprdma.Header{Kind: nprdma.PacketAck, Seq: 7}),
		// Piggybacked acknowledgements: valid, stale, before the READ's
		// data, beyond what was sent.
		enc(nprdma.Header{Kind: nprdma.PacketReadResponse, Seq: 0, Len: 4096, Last: true},
			nprdma.Header{Kind: nprdma.PacketSend, Seq: 0, Len: 8, HasAck: true, Ack: 2}),
		enc(nprdma.Header{Kind: nprdma.PacketReadResponse, Seq: 0, Len: 4096, Last: true}, nprdma.Header{Kind: nprdma.PacketAck, Seq: 2},
			nprdma.Header{Kind: nprdma.PacketReadRequest, Seq: 0, Len: 8, RKey: 1, HasAck: true, Ack: 1}),
		enc(nprdma.Header{Kind: nprdma.PacketWrite, Seq: 0, Len: 8, RKey: 1, HasAck: true, Ack: 0}),
		enc(nprdma.Header{Kind: nprdma.PacketReadResponse, Seq: 0, Len: 4096, Last: true},
			nprdma.Header{Kind: nprdma.PacketSend, Seq: 0, Len: 8, HasAck: true, Ack: 5}),
		enc(nprdma.Header{Kind: nprdma.PacketDisconnect}),
		append(appendHeader(nil, &nprdma.Header{Kind: nprdma.PacketSend, Seq: 0, Len: 1 << 20}), 1, 2, 3), // payload cut short
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
	dev := nprdma.NewDevice(stubProvider{}, nprdma.WithPinning(false))
	defer dev.Close()
	pd := dev.AllocPD()
	cq := dev.NewCQ(64)
	qp, err := pd.NewQP(nprdma.QPConfig{SendCQ: cq, SendDepth: 16, RecvDepth: 16, Timeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16<<10)
	mr, err := pd.Register(buf, nprdma.AccessLocalWrite|nprdma.AccessRemoteRead|nprdma.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	qp.PostRecv(nprdma.RecvWR{ID: 1, SG: []nprdma.SGE{mr.SGE(0, 64)}}, nprdma.RecvWR{ID: 2, SG: []nprdma.SGE{mr.SGE(64, 64)}})
	if _, err := qp.Connect(context.Background(), "stub", nil); err != nil {
		t.Fatal(err)
	}
	qp.PostSend(
		nprdma.SendWR{ID: 10, Op: nprdma.OpRead, SG: []nprdma.SGE{mr.SGE(8192, 4096)}, RemoteAddr: 0x1000, RKey: 5, Signaled: true},
		nprdma.SendWR{ID: 11, Op: nprdma.OpSend, SG: []nprdma.SGE{mr.SGE(0, 100)}, Signaled: true},
		nprdma.SendWR{ID: 12, Op: nprdma.OpWrite, SG: []nprdma.SGE{mr.SGE(0, 100)}, RemoteAddr: 0x1000, RKey: 5})
	l := &link{prov: New(), rd: newReader(bytes.NewReader(data), 4096), rx: qp, abortCh: make(chan struct{})}
	err = l.readFrames()
	if err == nil {
		t.Fatal("reading a finite stream ended without an error")
	}
	qp.LinkDown(err)
	qp.Close()
	// Every posted work request completed exactly once.
	var wcs [64]nprdma.WC
	n := cq.Poll(wcs[:])
	seen := map[uint64]int{}
	for _, wc := range wcs[:n] {
		seen[wc.ID]++
	}
	for id, k := range seen {
		if k != 1 {
			t.Fatalf("work request %d completed %d times", id, k)
		}
	}
	for _, id := range []uint64{1, 2, 10, 11} {
		if seen[id] != 1 {
			t.Fatalf("work request %d never completed (completions %+v)", id, wcs[:n])
		}
	}
	return wcs[:n], qp.Err()
}

func FuzzFrameDecoder(f *testing.F) {
	for _, s := range frameSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var h nprdma.Header
		if n, err := parseHeader(data, &h); err == nil {
			// Decoding is canonical: encoding the header gives the bytes back.
			if again := appendHeader(nil, &h); !bytes.Equal(again, data[:n]) {
				t.Fatalf("header %+v re-encodes as %x, was %x", h, again, data[:n])
			}
			if h.PayloadLen() > nprdma.MaxMessageSize {
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
		appendCM(nil, cmFrame{typ: frameReject, privateData: make([]byte, nprdma.MaxPrivateData)}),
		append(appendCM(nil, cmFrame{typ: frameAccept, qpn: 1}), appendHeader(nil, &nprdma.Header{Kind: nprdma.PacketAck})...),
	}
}

func FuzzHandshake(f *testing.F) {
	for _, s := range handshakeSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, n, parseErr := parseCM(data, frameConnect, frameAccept, frameReject)
		if parseErr == nil {
			if len(fr.privateData) > nprdma.MaxPrivateData {
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
		for _, size := range []int{2*maxHeaderLen + nprdma.MaxPrivateData, 64} {
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
	for name, seeds := range map[string][][]byte{"FuzzFrameDecoder": frameSeeds(), "FuzzHandshake": handshakeSeeds()} {
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
	enc := func(hs ...nprdma.Header) []byte {
		var b []byte
		for _, h := range hs {
			b = appendHeader(b, &h)
			b = append(b, make([]byte, h.PayloadLen())...)
		}
		return b
	}
	readResp := nprdma.Header{Kind: nprdma.PacketReadResponse, Seq: 0, Len: 4096, Last: true}
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
	wcs, err := feedPeer(t, enc(readResp, nprdma.Header{Kind: nprdma.PacketSend, Seq: 0, Len: 8, HasAck: true, Ack: 2}))
	if !errors.Is(err, nprdma.ErrPeerLost) || status(wcs, 11) != nprdma.StatusSuccess || status(wcs, 1) != nprdma.StatusSuccess {
		t.Fatalf("valid piggybacked ACK: error %v, completions %+v", err, wcs)
	}
	// Stale: an ACK packet acknowledged everything already; the older
	// acknowledgement a later request carries changes nothing.
	wcs, err = feedPeer(t, enc(readResp, nprdma.Header{Kind: nprdma.PacketAck, Seq: 2},
		nprdma.Header{Kind: nprdma.PacketSend, Seq: 0, Len: 8, HasAck: true, Ack: 1}))
	if !errors.Is(err, nprdma.ErrPeerLost) || status(wcs, 11) != nprdma.StatusSuccess || status(wcs, 1) != nprdma.StatusSuccess {
		t.Fatalf("stale piggybacked ACK: error %v, completions %+v", err, wcs)
	}
	// Acknowledging the READ before its data, or a request never sent,
	// breaks the protocol.
	for name, stream := range map[string][]byte{
		"READ without its data": enc(nprdma.Header{Kind: nprdma.PacketSend, Seq: 0, Len: 8, HasAck: true, Ack: 0}),
		"beyond what was sent":  enc(readResp, nprdma.Header{Kind: nprdma.PacketSend, Seq: 0, Len: 8, HasAck: true, Ack: 5}),
	} {
		wcs, err := feedPeer(t, stream)
		if !errors.Is(err, nprdma.ErrProtocol) || status(wcs, 1) != nprdma.StatusWRFlushed {
			t.Fatalf("%s: error %v, completions %+v", name, err, wcs)
		}
	}
}
