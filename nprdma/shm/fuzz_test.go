package shm

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/link"
)

// Every decoder of bytes a peer writes has a fuzz target: packet headers
// in the ring, socket messages, and the ring's stream as a whole fed to a
// real queue pair. Seeds: testdata/fuzz/<name>/ (NPRDMA_WRITE_SEEDS=1 go
// test -run TestWriteSeedCorpus rewrites them) plus the f.Add ones.

func sampleHeaders() []link.Header {
	return []link.Header{
		{Kind: link.PacketSend, Seq: 1, Len: 64},
		{Kind: link.PacketSend, Seq: 2, Len: 8, HasImm: true, Imm: 7, HasAck: true, Ack: 3},
		{Kind: link.PacketWrite, Seq: 3, Len: 16, RKey: 9, Addr: 0x1000},
		{Kind: link.PacketReadRequest, Seq: 4, Len: 4096, RKey: 9, Addr: 0x2000, HasAck: true, Ack: 1},
		{Kind: link.PacketReadResponse, Seq: 4, Len: 100, Offset: 0},
		{Kind: link.PacketReadResponse, Seq: 4, Len: 3996, Offset: 100, Fill: true, Pattern: 0x1122334455667788, Last: true},
		{Kind: link.PacketAck, Seq: 5},
		{Kind: link.PacketNak, Seq: 6, Syndrome: link.NakRemoteAccess},
		{Kind: link.PacketDisconnect},
		{Kind: kindEnd},
	}
}

func headerSeeds() [][]byte {
	var seeds [][]byte
	for _, h := range sampleHeaders() {
		b := make([]byte, packetHeaderLen)
		encodeHeader(b, &h)
		seeds = append(seeds, b)
	}
	bad := bytes.Clone(seeds[0])
	bad[1] = flagFill // a flag SEND may not carry
	return append(seeds, bad, seeds[0][:20])
}

func FuzzPacketHeader(f *testing.F) {
	for _, s := range headerSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var h link.Header
		if _, err := decodeHeader(b, &h); err != nil {
			return
		}
		again := make([]byte, packetHeaderLen)
		encodeHeader(again, &h)
		if !bytes.Equal(again, b[:packetHeaderLen]) {
			t.Fatalf("decoded %+v, encodes as %x, not %x", h, again, b[:packetHeaderLen])
		}
		if h.PayloadLen() > link.MaxMessageSize {
			t.Fatalf("payload of %d bytes accepted", h.PayloadLen())
		}
	})
}

// messageSeed is a socket message and the number of descriptors with it.
type messageSeed struct {
	b   []byte
	fds int
}

func messageSeeds() []messageSeed {
	g := grantInfo{rkey: 5, addr: 0x7f0000000000, length: 1 << 30, pageSize: 4096, magic: 0xfeedface,
		bits: link.StateBits{Present: 1, Busy: 2, Zero: 16, VersionShift: 16}}
	return []messageSeed{
		{encodeConnect(3, []byte("hello")), 0},
		{encodeAccept(4, []byte("welcome"), DefaultRingSize), acceptFDs},
		{encodeReject([]byte("no")), 0},
		{encodeGrant(7, &g), grantFDs},
		{encodeRevoke(7, 5), 0},
		{encodeFin(), 0},
		{encodeAccept(4, nil, 3000), acceptFDs}, // not a power of two
		{encodeGrant(fenceSlots, &g), grantFDs}, // slot out of range
		{encodeConnect(3, nil), 1},              // a descriptor too many
	}
}

func FuzzSocketMessage(f *testing.F) {
	for _, s := range messageSeeds() {
		f.Add(s.b, s.fds)
	}
	f.Fuzz(func(t *testing.T, b []byte, fds int) {
		m, err := decodeMessage(b, fds)
		if err != nil {
			if !errors.Is(err, errMessage) {
				t.Fatalf("error %v is not errMessage", err)
			}
			return
		}
		var again []byte
		switch m.typ {
		case msgConnect:
			again = encodeConnect(m.qpn, m.privateData)
		case msgAccept:
			again = encodeAccept(m.qpn, m.privateData, m.ringSize)
		case msgReject:
			again = encodeReject(m.privateData)
		case msgGrant:
			again = encodeGrant(m.slot, &m.grant)
		case msgRevoke:
			again = encodeRevoke(m.slot, m.rkey)
		case msgFin:
			again = encodeFin()
		default:
			t.Fatalf("type %d accepted", m.typ)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("decoded %+v, encodes as %x, not %x", m, again, b)
		}
	})
}

// streamSeeds are ring streams: every packet kind, and the answers a peer
// would give to the work requests feedRing posts (seq 0 READ of 4096
// bytes, seq 1 SEND, seq 2 WRITE).
func streamSeeds() [][]byte {
	enc := func(hs ...link.Header) []byte {
		var b []byte
		for _, h := range hs {
			hdr := make([]byte, packetHeaderLen)
			encodeHeader(hdr, &h)
			b = append(b, hdr...)
			b = append(b, bytes.Repeat([]byte{0xa5}, paddedLen(h.PayloadLen()))...)
		}
		return b
	}
	var all []byte
	for _, h := range sampleHeaders()[:9] {
		all = append(all, enc(h)...)
	}
	return [][]byte{all,
		enc(link.Header{Kind: link.PacketReadResponse, Seq: 0, Len: 4096, Last: true}, link.Header{Kind: link.PacketAck, Seq: 2}),
		enc(link.Header{Kind: link.PacketReadResponse, Seq: 0, Len: 100},
			link.Header{Kind: link.PacketReadResponse, Seq: 0, Offset: 100, Len: 3996, Fill: true, Pattern: 0x1122334455667788, Last: true},
			link.Header{Kind: link.PacketNak, Seq: 1, Syndrome: link.NakRNR}),
		enc(link.Header{Kind: link.PacketSend, Seq: 0, Len: 64}, link.Header{Kind: link.PacketSend, Seq: 1, Len: 10, HasImm: true, Imm: 3},
			link.Header{Kind: link.PacketReadRequest, Seq: 2, Len: 64, RKey: 1}, link.Header{Kind: link.PacketWrite, Seq: 3, Len: 8, RKey: 1}),
		enc(link.Header{Kind: link.PacketReadResponse, Seq: 0, Len: 4096, Last: true}, link.Header{Kind: kindEnd}),
		enc(link.Header{Kind: link.PacketDisconnect}),
		enc(link.Header{Kind: link.PacketSend, Seq: 0, Len: 1 << 20})[:packetHeaderLen+3], // payload cut short
	}
}

func FuzzRingStream(f *testing.F) {
	for _, s := range streamSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > minRingSize {
			data = data[:minRingSize]
		}
		feedRing(t, data)
	})
}

// stubProvider hands Dial a link made beforehand, so that a test can play
// the peer through the ring's memory.
type stubProvider struct{ l *shmLink }

func (stubProvider) Name() string { return "stub" }
func (stubProvider) Listen(string) (link.Listener, error) {
	return nil, errors.New("stub: no listening")
}
func (s stubProvider) Dial(context.Context, string, link.Hello) (link.Link, link.Hello, error) {
	return s.l, link.Hello{QPNum: 1}, nil
}

// feedRing connects a queue pair to a link whose peer writes data into the
// ring and then goes quiet; once the link has taken what it could, it is
// aborted. Every work request must complete exactly once, whatever data
// held, and nothing may panic.
func feedRing(t *testing.T, data []byte) {
	p := New(WithSpin(0), WithRingSize(minRingSize))
	// The ring file, mapped twice: the link's mapping (which it unmaps when
	// it goes down) and the peer's, which this test writes and watches.
	fd, err := unix.MemfdCreate("nprdma-shm-fuzz", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, int64(ringFileSize(minRingSize))); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, ringFileSize(minRingSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	peerMem, err := unix.Mmap(fd, 0, ringFileSize(minRingSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(peerMem)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	peerSock := os.NewFile(uintptr(fds[1]), "peer")
	defer peerSock.Close()
	lf := os.NewFile(uintptr(fds[0]), "link")
	c, err := net.FileConn(lf) // a copy of the descriptor
	lf.Close()
	if err != nil {
		t.Fatal(err)
	}
	var bells [4]bell
	for i := range bells {
		if bells[i], err = newBell(); err != nil {
			t.Fatal(err)
		}
	}
	l := newLink(p, c.(*net.UnixConn), true, mem, minRingSize, bells)
	dev := nprdma.NewDevice(stubProvider{l}, nprdma.WithPinning(false))
	defer dev.Close()
	pd := dev.AllocPD()
	cq := dev.NewCQ(64)
	qp, err := pd.NewQP(nprdma.QPConfig{SendCQ: cq, SendDepth: 16, RecvDepth: 16, Timeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	buf, err := nprdma.AllocBuffer(16 << 10) // off the heap, as registered memory is
	if err != nil {
		t.Fatal(err)
	}
	defer nprdma.FreeBuffer(buf)
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
	// The peer writes data into ring 1 (listener → dialer).
	peer := producer{ring: newRing(peerMem, minRingSize, 1)}
	peer.put(data)
	peer.publish()
	l.inData.ring() // as the peer would (a closed bell, if the link went down, refuses it)
	// Quiet: the link consumed everything or waits for more (asleep), or
	// it is down.
	in := peer.ring
	deadline := time.Now().Add(20 * time.Second)
	for !l.isBroken() && !(atomic.LoadUint32(in.rxSleeping) == 1) {
		if time.Now().After(deadline) {
			t.Fatal("the link neither consumed the stream nor stopped")
		}
		time.Sleep(50 * time.Microsecond)
	}
	qp.Close()
	seen := map[uint64]int{}
	var wcs [64]nprdma.WC
	for n := cq.Poll(wcs[:]); n > 0; n = cq.Poll(wcs[:]) {
		for _, wc := range wcs[:n] {
			seen[wc.ID]++
		}
	}
	for id, k := range seen {
		if k != 1 {
			t.Fatalf("work request %d completed %d times", id, k)
		}
	}
	for _, id := range []uint64{1, 2, 10, 11} {
		if seen[id] != 1 {
			t.Fatalf("work request %d completed %d times, want once (completions %v)", id, seen[id], seen)
		}
	}
}

// TestWriteSeedCorpus rewrites the committed seed corpora
// (NPRDMA_WRITE_SEEDS=1).
func TestWriteSeedCorpus(t *testing.T) {
	if os.Getenv("NPRDMA_WRITE_SEEDS") != "1" {
		t.Skip("NPRDMA_WRITE_SEEDS=1 rewrites testdata/fuzz")
	}
	write := func(name string, i int, args ...string) {
		dir := filepath.Join("testdata", "fuzz", name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		body := "go test fuzz v1\n"
		for _, a := range args {
			body += a + "\n"
		}
		if err := os.WriteFile(filepath.Join(dir, "seed-"+strconv.Itoa(i)), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range headerSeeds() {
		write("FuzzPacketHeader", i, "[]byte("+strconv.Quote(string(s))+")")
	}
	for i, s := range messageSeeds() {
		write("FuzzSocketMessage", i, "[]byte("+strconv.Quote(string(s.b))+")", "int("+strconv.Itoa(s.fds)+")")
	}
	for i, s := range streamSeeds() {
		write("FuzzRingStream", i, "[]byte("+strconv.Quote(string(s))+")")
	}
}
