package conformance

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
)

// Run runs the whole suite against the provider the harness describes.
func Run(t *testing.T, h Harness) {
	tests := []struct {
		name string
		fn   func(*testing.T, Harness)
	}{
		{"ConnectPrivateData", testConnectPrivateData},
		{"ConnectReject", testConnectReject},
		{"ConnectToNothing", testConnectToNothing},
		{"PostBeforeConnect", testPostBeforeConnect},
		{"Opcodes", testOpcodes},
		{"ScatterGather", testScatterGather},
		{"Ordering", testOrdering},
		{"Unsignaled", testUnsignaled},
		{"Inline", testInline},
		{"LocalErrors", testLocalErrors},
		{"RemoteAccessErrors", testRemoteAccessErrors},
		{"AccessTag", testAccessTag},
		{"SendTooLong", testSendTooLong},
		{"RNRRetryExceeded", testRNRRetryExceeded},
		{"RNRGoBackN", testRNRGoBackN},
		{"PeerDeath", testPeerDeath},
		{"CloseWhilePeerSends", testCloseWhilePeerSends},
		{"DisconnectWithWorkOutstanding", testDisconnectOutstanding},
		{"PeerSilentTimeout", testPeerSilent},
		{"ManyQPsOneCQ", testManyQPsOneCQ},
		{"CQOverflow", testCQOverflow},
		{"LargeBidirectional", testLargeBidirectional},
		{"Unpinned", testUnpinned},
		{"UnpinnedShared", testUnpinnedShared},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, h) })
	}
}

func testConnectPrivateData(t *testing.T, h Harness) {
	cli, srv := newSide(t, h), newSide(t, h)
	cli.newQP(t, nprdma.QPConfig{}, 0)
	srv.newQP(t, nprdma.QPConfig{}, 0)
	ln, err := srv.dev.Listen(h.ListenAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	got := make(chan []byte, 1)
	go func() {
		req, err := ln.Accept(ctx)
		if err != nil {
			got <- nil
			return
		}
		got <- append([]byte(nil), req.PrivateData()...)
		req.Accept(srv.qp, []byte("hello from the server"))
	}()
	reply, err := cli.qp.Connect(ctx, ln.Addr(), []byte("hello from the client"))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	samePrivateData(t, "server", <-got, []byte("hello from the client"))
	samePrivateData(t, "client", reply, []byte("hello from the server"))
	if cli.qp.State() != nprdma.QPStateRTS {
		t.Fatalf("client state %s", cli.qp.State())
	}
	eventually(t, "server RTS", func() bool { return srv.qp.State() == nprdma.QPStateRTS })
	if cli.qp.RemoteNum() != srv.qp.Num() || srv.qp.RemoteNum() != cli.qp.Num() {
		t.Fatalf("remote numbers %d/%d, want %d/%d", cli.qp.RemoteNum(), srv.qp.RemoteNum(), srv.qp.Num(), cli.qp.Num())
	}
	if _, err := cli.qp.Connect(ctx, ln.Addr(), nil); err == nil {
		t.Fatal("second connect of one QP succeeded")
	}
}

func testConnectReject(t *testing.T, h Harness) {
	cli, srv := newSide(t, h), newSide(t, h)
	cli.newQP(t, nprdma.QPConfig{}, 0)
	ln, err := srv.dev.Listen(h.ListenAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	go func() {
		if req, err := ln.Accept(ctx); err == nil {
			req.Reject([]byte("host not allowed"))
		}
	}()
	postRecv(t, cli.qp, nprdma.RecvWR{ID: 9})
	_, err = cli.qp.Connect(ctx, ln.Addr(), []byte("let me in"))
	var rej *nprdma.RejectError
	if !errors.As(err, &rej) {
		t.Fatalf("connect error %v, want *RejectError", err)
	}
	samePrivateData(t, "reject", rej.PrivateData, []byte("host not allowed"))
	if cli.qp.State() != nprdma.QPStateError {
		t.Fatalf("state after reject %s", cli.qp.State())
	}
	// The receive posted in advance is flushed.
	one(t, cli.rcq, 9, nprdma.OpRecv, nprdma.StatusWRFlushed)
}

func testConnectToNothing(t *testing.T, h Harness) {
	cli, srv := newSide(t, h), newSide(t, h)
	cli.newQP(t, nprdma.QPConfig{}, 0)
	ln, err := srv.dev.Listen(h.ListenAddr)
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr()
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	_, err = cli.qp.Connect(ctx, addr, nil)
	if err == nil {
		t.Fatal("connect to a closed listener succeeded")
	}
	var rej *nprdma.RejectError
	if errors.As(err, &rej) {
		t.Fatalf("connect to nothing returned a rejection: %v", err)
	}
	if !strings.Contains(err.Error(), addr) {
		t.Fatalf("error %q does not name the address %s", err, addr)
	}
	if ctx.Err() != nil {
		t.Fatal("connect to nothing waited for the context")
	}
}

func testPostBeforeConnect(t *testing.T, h Harness) {
	s := newSide(t, h)
	s.newQP(t, nprdma.QPConfig{}, 0)
	mr, _ := s.region(t, 64, rw)
	err := s.qp.PostSend(nprdma.SendWR{ID: 1, Op: nprdma.OpSend, SG: []nprdma.SGE{mr.SGE(0, 64)}})
	if !errors.Is(err, nprdma.ErrNotConnected) {
		t.Fatalf("post send before connect: %v", err)
	}
	postRecv(t, s.qp, nprdma.RecvWR{ID: 2, SG: []nprdma.SGE{mr.SGE(0, 64)}})
	if err := s.qp.PostSend(nprdma.SendWR{ID: 3, Op: nprdma.Opcode(99)}); !errors.Is(err, nprdma.ErrInvalidWorkRequest) {
		t.Fatalf("bad opcode: %v", err)
	}
}

func testOpcodes(t *testing.T, h Harness) {
	cli, srv := connect(t, h, pairConfig{})
	const n = 8192
	lmr, lbuf := cli.region(t, 4*n, rw)
	rmr, rbuf := srv.region(t, 4*n, rw)
	cq := cli.scq

	// SEND and SEND_WITH_IMM.
	postRecv(t, srv.qp, nprdma.RecvWR{ID: 100, SG: []nprdma.SGE{rmr.SGE(0, n)}}, nprdma.RecvWR{ID: 101, SG: []nprdma.SGE{rmr.SGE(n, n)}})
	post(t, cli.qp, nprdma.SendWR{ID: 1, Op: nprdma.OpSend, SG: []nprdma.SGE{lmr.SGE(0, 1000)}, Signaled: true},
		nprdma.SendWR{ID: 2, Op: nprdma.OpSendWithImm, Imm: 0xfeedbeef, SG: []nprdma.SGE{lmr.SGE(1000, n)}, Signaled: true})
	wc := one(t, cq, 1, nprdma.OpSend, nprdma.StatusSuccess)
	if wc.QPNum != cli.qp.Num() {
		t.Fatalf("completion qp %d, want %d", wc.QPNum, cli.qp.Num())
	}
	one(t, cq, 2, nprdma.OpSendWithImm, nprdma.StatusSuccess)
	r := one(t, srv.rcq, 100, nprdma.OpRecv, nprdma.StatusSuccess)
	if r.ByteLen != 1000 || r.HasImm || r.QPNum != srv.qp.Num() {
		t.Fatalf("recv completion %+v", r)
	}
	sameBytes(t, "SEND", rbuf[:1000], lbuf[:1000])
	r = one(t, srv.rcq, 101, nprdma.OpRecv, nprdma.StatusSuccess)
	if r.ByteLen != n || !r.HasImm || r.Imm != 0xfeedbeef {
		t.Fatalf("recv-with-imm completion %+v", r)
	}
	sameBytes(t, "SEND_WITH_IMM", rbuf[n:2*n], lbuf[1000:1000+n])

	// WRITE does not consume a receive; WRITE_WITH_IMM does.
	before := srv.dev.Stats()
	post(t, cli.qp, nprdma.SendWR{ID: 3, Op: nprdma.OpWrite, SG: []nprdma.SGE{lmr.SGE(0, n)}, RemoteAddr: rmr.Addr() + 2*n, RKey: rmr.RKey(), Signaled: true})
	one(t, cq, 3, nprdma.OpWrite, nprdma.StatusSuccess)
	sameBytes(t, "WRITE", rbuf[2*n:3*n], lbuf[:n])
	noMore(t, srv.rcq)
	postRecv(t, srv.qp, nprdma.RecvWR{ID: 102})
	post(t, cli.qp, nprdma.SendWR{ID: 4, Op: nprdma.OpWriteWithImm, Imm: 77, SG: []nprdma.SGE{lmr.SGE(n, 512)}, RemoteAddr: rmr.Addr() + 3*n, RKey: rmr.RKey(), Signaled: true})
	one(t, cq, 4, nprdma.OpWriteWithImm, nprdma.StatusSuccess)
	r = one(t, srv.rcq, 102, nprdma.OpRecvRDMAWithImm, nprdma.StatusSuccess)
	if !r.HasImm || r.Imm != 77 || r.ByteLen != 512 {
		t.Fatalf("write-with-imm receive completion %+v", r)
	}
	sameBytes(t, "WRITE_WITH_IMM", rbuf[3*n:3*n+512], lbuf[n:n+512])

	// READ.
	post(t, cli.qp, nprdma.SendWR{ID: 5, Op: nprdma.OpRead, SG: []nprdma.SGE{lmr.SGE(2*n, n)}, RemoteAddr: rmr.Addr() + 5, RKey: rmr.RKey(), Signaled: true})
	if wc := one(t, cq, 5, nprdma.OpRead, nprdma.StatusSuccess); wc.ByteLen != n {
		t.Fatalf("READ completion %+v", wc)
	}
	sameBytes(t, "READ", lbuf[2*n:3*n], rbuf[5:5+n])

	// Zero-length SEND and READ.
	postRecv(t, srv.qp, nprdma.RecvWR{ID: 103})
	post(t, cli.qp, nprdma.SendWR{ID: 6, Op: nprdma.OpSend, Signaled: true}, nprdma.SendWR{ID: 7, Op: nprdma.OpRead, RKey: rmr.RKey(), RemoteAddr: rmr.Addr(), Signaled: true})
	one(t, cq, 6, nprdma.OpSend, nprdma.StatusSuccess)
	one(t, cq, 7, nprdma.OpRead, nprdma.StatusSuccess)
	if r := one(t, srv.rcq, 103, nprdma.OpRecv, nprdma.StatusSuccess); r.ByteLen != 0 {
		t.Fatalf("zero-length recv %+v", r)
	}

	after := srv.dev.Stats()
	if !srv.dev.Caps().ResponderStats {
		return
	}
	if after.ReadsServed-before.ReadsServed != 2 || after.ReadBytesServed-before.ReadBytesServed != n {
		t.Fatalf("reads served %d (%d bytes), want 2 (%d)", after.ReadsServed-before.ReadsServed, after.ReadBytesServed-before.ReadBytesServed, n)
	}
	if after.WritesServed-before.WritesServed != 2 || after.WriteBytesServed-before.WriteBytesServed != n+512 {
		t.Fatalf("writes served %d (%d bytes)", after.WritesServed-before.WritesServed, after.WriteBytesServed-before.WriteBytesServed)
	}
	noMore(t, cq)
	noMore(t, srv.rcq)
}

func testScatterGather(t *testing.T, h Harness) {
	cli, srv := connect(t, h, pairConfig{})
	a, abuf := cli.region(t, 10000, rw)
	b, bbuf := cli.region(t, 10000, rw)
	rmr, rbuf := srv.region(t, 40000, rw)
	// Gather 3 pieces from two regions into 2 receive pieces.
	sg := []nprdma.SGE{a.SGE(10, 100), b.SGE(500, 3000), a.SGE(4000, 5000)}
	want := append(append(append([]byte(nil), abuf[10:110]...), bbuf[500:3500]...), abuf[4000:9000]...)
	postRecv(t, srv.qp, nprdma.RecvWR{ID: 1, SG: []nprdma.SGE{rmr.SGE(0, 4000), rmr.SGE(20000, 5000)}})
	post(t, cli.qp, nprdma.SendWR{ID: 1, Op: nprdma.OpSend, SG: sg, Signaled: true})
	one(t, cli.scq, 1, nprdma.OpSend, nprdma.StatusSuccess)
	if r := one(t, srv.rcq, 1, nprdma.OpRecv, nprdma.StatusSuccess); r.ByteLen != uint32(len(want)) {
		t.Fatalf("recv length %d, want %d", r.ByteLen, len(want))
	}
	got := append(append([]byte(nil), rbuf[:4000]...), rbuf[20000:20000+len(want)-4000]...)
	sameBytes(t, "gathered SEND", got, want)

	// WRITE gathers the same way.
	post(t, cli.qp, nprdma.SendWR{ID: 2, Op: nprdma.OpWrite, SG: sg, RemoteAddr: rmr.Addr() + 30000, RKey: rmr.RKey(), Signaled: true})
	one(t, cli.scq, 2, nprdma.OpWrite, nprdma.StatusSuccess)
	sameBytes(t, "gathered WRITE", rbuf[30000:30000+len(want)], want)

	// READ scatters into 3 pieces.
	dst := []nprdma.SGE{b.SGE(0, 7), a.SGE(9000, 1000), b.SGE(5000, 4993)}
	post(t, cli.qp, nprdma.SendWR{ID: 3, Op: nprdma.OpRead, SG: dst, RemoteAddr: rmr.Addr() + 100, RKey: rmr.RKey(), Signaled: true})
	one(t, cli.scq, 3, nprdma.OpRead, nprdma.StatusSuccess)
	got = append(append(append([]byte(nil), bbuf[:7]...), abuf[9000:10000]...), bbuf[5000:9993]...)
	sameBytes(t, "scattered READ", got, rbuf[100:6100])
}

func testOrdering(t *testing.T, h Harness) {
	cli, srv := connect(t, h, pairConfig{cli: nprdma.QPConfig{SendDepth: 64}, srv: nprdma.QPConfig{RecvDepth: 256}})
	const slots, size = 200, 512
	lmr, lbuf := cli.region(t, 2*slots*size, rw)
	rmr, rbuf := srv.region(t, slots*size, rw)
	// WRITE slot i, then READ it back: an RC READ sees every WRITE before it.
	for i := 0; i < slots; i++ {
		for j := range size {
			lbuf[i*size+j] = byte(i * 7)
		}
	}
	var wcs []nprdma.WC
	next := 0
	for next < slots || len(wcs) < 2*slots {
		for next < slots {
			err := cli.qp.PostSend(
				nprdma.SendWR{ID: uint64(2 * next), Op: nprdma.OpWrite, SG: []nprdma.SGE{lmr.SGE(next*size, size)}, RemoteAddr: rmr.Addr() + uint64(next*size), RKey: rmr.RKey(), Signaled: true},
				nprdma.SendWR{ID: uint64(2*next + 1), Op: nprdma.OpRead, SG: []nprdma.SGE{lmr.SGE((slots+next)*size, size)}, RemoteAddr: rmr.Addr() + uint64(next*size), RKey: rmr.RKey(), Signaled: true})
			if errors.Is(err, nprdma.ErrQueueFull) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			next++
		}
		wcs = append(wcs, wait(t, cli.scq, 1)...)
	}
	for i, wc := range wcs {
		if wc.ID != uint64(i) || wc.Status != nprdma.StatusSuccess {
			t.Fatalf("completion %d: %+v", i, wc)
		}
	}
	sameBytes(t, "written slots", rbuf, lbuf[:slots*size])
	sameBytes(t, "slots read back", lbuf[slots*size:], lbuf[:slots*size])

	// SENDs land in receives in order.
	recvs := make([]nprdma.RecvWR, slots)
	for i := range recvs {
		recvs[i] = nprdma.RecvWR{ID: uint64(i), SG: []nprdma.SGE{rmr.SGE(i*size, size)}}
	}
	postRecv(t, srv.qp, recvs...)
	for i := 0; i < slots; i++ {
		binary.LittleEndian.PutUint64(lbuf[i*size:], uint64(i)+1000)
	}
	go func() {
		for i := 0; i < slots; {
			err := cli.qp.PostSend(nprdma.SendWR{ID: uint64(i), Op: nprdma.OpSend, SG: []nprdma.SGE{lmr.SGE(i*size, 8)}, Signaled: i == slots-1})
			if errors.Is(err, nprdma.ErrQueueFull) {
				time.Sleep(100 * time.Microsecond)
				continue
			}
			if err != nil {
				return
			}
			i++
		}
	}()
	for i, wc := range wait(t, srv.rcq, slots) {
		if wc.ID != uint64(i) || wc.Status != nprdma.StatusSuccess || wc.ByteLen != 8 {
			t.Fatalf("receive completion %d: %+v", i, wc)
		}
		if v := binary.LittleEndian.Uint64(rbuf[i*size:]); v != uint64(i)+1000 {
			t.Fatalf("receive %d holds message %d", i, v-1000)
		}
	}
	one(t, cli.scq, slots-1, nprdma.OpSend, nprdma.StatusSuccess)
	noMore(t, cli.scq)
}

func testUnsignaled(t *testing.T, h Harness) {
	cli, srv := connect(t, h, pairConfig{})
	lmr, lbuf := cli.region(t, 4096, rw)
	rmr, rbuf := srv.region(t, 4096*11, rw)
	var wrs []nprdma.SendWR
	for i := 0; i < 11; i++ {
		wrs = append(wrs, nprdma.SendWR{ID: uint64(i), Op: nprdma.OpWrite, SG: []nprdma.SGE{lmr.SGE(0, 4096)}, RemoteAddr: rmr.Addr() + uint64(i*4096), RKey: rmr.RKey(), Signaled: i == 10})
	}
	post(t, cli.qp, wrs...)
	one(t, cli.scq, 10, nprdma.OpWrite, nprdma.StatusSuccess)
	noMore(t, cli.scq)
	for i := 0; i < 11; i++ {
		sameBytes(t, "unsignaled WRITE", rbuf[i*4096:(i+1)*4096], lbuf)
	}
	// An error completes even when unsignaled.
	post(t, cli.qp, nprdma.SendWR{ID: 11, Op: nprdma.OpWrite, SG: []nprdma.SGE{lmr.SGE(0, 8)}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey() + 1})
	one(t, cli.scq, 11, nprdma.OpWrite, nprdma.StatusRemoteAccess)
}

func testInline(t *testing.T, h Harness) {
	cli, srv := connect(t, h, pairConfig{cli: nprdma.QPConfig{MaxInline: 128}})
	lmr, lbuf := cli.region(t, 4096, rw)
	rmr, rbuf := srv.region(t, 4096, rw)
	postRecv(t, srv.qp, nprdma.RecvWR{ID: 1, SG: []nprdma.SGE{rmr.SGE(0, 1024)}}, nprdma.RecvWR{ID: 2, SG: []nprdma.SGE{rmr.SGE(1024, 1024)}})
	// The payload is copied at post time: changing it afterwards changes
	// nothing, and InlineData needs no registration.
	data := []byte("inline payload, no registration needed")
	want := append([]byte(nil), data...)
	post(t, cli.qp, nprdma.SendWR{ID: 1, Op: nprdma.OpSend, Inline: true, InlineData: data, Signaled: true})
	copy(data, "XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX")
	wantSG := append([]byte(nil), lbuf[:100]...)
	post(t, cli.qp, nprdma.SendWR{ID: 2, Op: nprdma.OpSendWithImm, Imm: 5, Inline: true, SG: []nprdma.SGE{lmr.SGE(0, 60), lmr.SGE(60, 40)}, Signaled: true})
	for i := range 100 {
		lbuf[i] ^= 0xff
	}
	one(t, cli.scq, 1, nprdma.OpSend, nprdma.StatusSuccess)
	one(t, cli.scq, 2, nprdma.OpSendWithImm, nprdma.StatusSuccess)
	if r := one(t, srv.rcq, 1, nprdma.OpRecv, nprdma.StatusSuccess); int(r.ByteLen) != len(want) {
		t.Fatalf("inline recv %+v", r)
	}
	sameBytes(t, "inline SEND", rbuf[:len(want)], want)
	one(t, srv.rcq, 2, nprdma.OpRecv, nprdma.StatusSuccess)
	sameBytes(t, "inline SEND from SGEs", rbuf[1024:1124], wantSG)
	// Inline WRITE.
	post(t, cli.qp, nprdma.SendWR{ID: 3, Op: nprdma.OpWrite, Inline: true, InlineData: []byte("written inline"), RemoteAddr: rmr.Addr() + 3000, RKey: rmr.RKey(), Signaled: true})
	one(t, cli.scq, 3, nprdma.OpWrite, nprdma.StatusSuccess)
	sameBytes(t, "inline WRITE", rbuf[3000:3014], []byte("written inline"))
	// Too large for MaxInline: refused at post time, nothing posted.
	err := cli.qp.PostSend(nprdma.SendWR{ID: 4, Op: nprdma.OpSend, Inline: true, InlineData: make([]byte, 129), Signaled: true})
	if !errors.Is(err, nprdma.ErrInvalidWorkRequest) {
		t.Fatalf("oversized inline: %v", err)
	}
	noMore(t, cli.scq)
}

func testLocalErrors(t *testing.T, h Harness) {
	cases := []struct {
		name string
		wr   func(l, ro *nprdma.MR, r *nprdma.MR) nprdma.SendWR
	}{
		{"BadLKey", func(l, ro, r *nprdma.MR) nprdma.SendWR {
			return nprdma.SendWR{Op: nprdma.OpWrite, SG: []nprdma.SGE{{Addr: l.Addr(), Length: 8, LKey: l.LKey() ^ 0x5500}}, RemoteAddr: r.Addr(), RKey: r.RKey()}
		}},
		{"BeyondRegion", func(l, ro, r *nprdma.MR) nprdma.SendWR {
			return nprdma.SendWR{Op: nprdma.OpWrite, SG: []nprdma.SGE{l.SGE(4000, 200)}, RemoteAddr: r.Addr(), RKey: r.RKey()}
		}},
		{"ReadIntoReadOnly", func(l, ro, r *nprdma.MR) nprdma.SendWR {
			return nprdma.SendWR{Op: nprdma.OpRead, SG: []nprdma.SGE{ro.SGE(0, 64)}, RemoteAddr: r.Addr(), RKey: r.RKey()}
		}},
		{"ForeignPD", func(l, ro, r *nprdma.MR) nprdma.SendWR {
			return nprdma.SendWR{Op: nprdma.OpWrite, SG: []nprdma.SGE{r.SGE(0, 8)}, RemoteAddr: r.Addr(), RKey: r.RKey()}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cli, srv := connect(t, h, pairConfig{})
			lmr, _ := cli.region(t, 4096, rw)
			ro, _ := cli.region(t, 4096, 0)
			rmr, _ := srv.region(t, 4096, rw)
			// A good request before the bad one completes first (or is
			// flushed, on hardware); the bad one fails the QP; one after it
			// is flushed.
			post(t, cli.qp,
				nprdma.SendWR{ID: 1, Op: nprdma.OpWrite, SG: []nprdma.SGE{lmr.SGE(0, 64)}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey(), Signaled: true},
				func() nprdma.SendWR { w := tc.wr(lmr, ro, rmr); w.ID = 2; return w }(),
				nprdma.SendWR{ID: 3, Op: nprdma.OpWrite, SG: []nprdma.SGE{lmr.SGE(0, 64)}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
			if first := wait(t, cli.scq, 1)[0]; first.ID != 1 || first.Op != nprdma.OpWrite ||
				(first.Status != nprdma.StatusSuccess && (cli.dev.Caps().OrderedLocalErrors || first.Status != nprdma.StatusWRFlushed)) {
				t.Fatalf("good request completed %+v (%s)", first, first.Status)
			}
			exact := cli.dev.Caps().ExactErrorStatus
			wc := wait(t, cli.scq, 1)[0]
			if wc.ID != 2 || (wc.Status != nprdma.StatusLocalProtection && (exact || wc.Status != nprdma.StatusWRFlushed)) {
				t.Fatalf("bad request completed %+v (%s)", wc, wc.Status)
			}
			one(t, cli.scq, 3, nprdma.OpWrite, nprdma.StatusWRFlushed)
			if exact || wc.Status == nprdma.StatusLocalProtection {
				expectErr(t, cli.qp, nprdma.ErrLocalProtection)
			} else {
				expectErr(t, cli.qp, nprdma.ErrDevice)
			}
			// Posting after the failure completes with a flush.
			post(t, cli.qp, nprdma.SendWR{ID: 4, Op: nprdma.OpSend})
			one(t, cli.scq, 4, nprdma.OpSend, nprdma.StatusWRFlushed)
		})
	}
	t.Run("RecvBadLKey", func(t *testing.T) {
		cli, srv := connect(t, h, pairConfig{})
		lmr, _ := cli.region(t, 4096, rw)
		rmr, _ := srv.region(t, 4096, rw)
		postRecv(t, srv.qp, nprdma.RecvWR{ID: 7, SG: []nprdma.SGE{{Addr: rmr.Addr(), Length: 64, LKey: rmr.LKey() + 1}}})
		post(t, cli.qp, nprdma.SendWR{ID: 1, Op: nprdma.OpSend, SG: []nprdma.SGE{lmr.SGE(0, 64)}})
		one(t, srv.rcq, 7, nprdma.OpRecv, nprdma.StatusLocalProtection)
		one(t, cli.scq, 1, nprdma.OpSend, nprdma.StatusRemoteOperation)
		expectErr(t, cli.qp, nprdma.ErrRemoteOperation)
		expectErr(t, srv.qp, nprdma.ErrLocalProtection)
	})
}

func testRemoteAccessErrors(t *testing.T, h Harness) {
	type target struct{ rw, ro, wo *nprdma.MR }
	cases := []struct {
		name string
		op   nprdma.Opcode
		at   func(tg target) (addr uint64, rkey uint32)
		n    int
	}{
		{"ReadBadRKey", nprdma.OpRead, func(tg target) (uint64, uint32) { return tg.rw.Addr(), tg.rw.RKey() ^ 0x10001 }, 64},
		{"WriteBadRKey", nprdma.OpWrite, func(tg target) (uint64, uint32) { return tg.rw.Addr(), tg.rw.RKey() ^ 0x10001 }, 64},
		{"ReadOutOfBounds", nprdma.OpRead, func(tg target) (uint64, uint32) { return tg.rw.Addr() + 4096 - 32, tg.rw.RKey() }, 64},
		{"WriteBeforeStart", nprdma.OpWrite, func(tg target) (uint64, uint32) { return tg.rw.Addr() - 8, tg.rw.RKey() }, 64},
		{"ReadLongerThanRegion", nprdma.OpRead, func(tg target) (uint64, uint32) { return tg.rw.Addr(), tg.rw.RKey() }, 8192},
		{"ReadWithoutRight", nprdma.OpRead, func(tg target) (uint64, uint32) { return tg.wo.Addr(), tg.wo.RKey() }, 64},
		{"WriteWithoutRight", nprdma.OpWrite, func(tg target) (uint64, uint32) { return tg.ro.Addr(), tg.ro.RKey() }, 64},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cli, srv := connect(t, h, pairConfig{})
			lmr, _ := cli.region(t, 8192, rw)
			var tg target
			var robuf []byte
			tg.rw, _ = srv.region(t, 4096, rw)
			tg.ro, robuf = srv.region(t, 4096, nprdma.AccessRemoteRead)
			tg.wo, _ = srv.region(t, 4096, nprdma.AccessLocalWrite|nprdma.AccessRemoteWrite)
			roBefore := append([]byte(nil), robuf...)
			before := srv.dev.Stats().RemoteAccessErrors
			addr, rkey := tc.at(tg)
			postRecv(t, srv.qp, nprdma.RecvWR{ID: 50})
			post(t, cli.qp,
				nprdma.SendWR{ID: 1, Op: tc.op, SG: []nprdma.SGE{lmr.SGE(0, tc.n)}, RemoteAddr: addr, RKey: rkey, Signaled: true},
				nprdma.SendWR{ID: 2, Op: nprdma.OpRead, SG: []nprdma.SGE{lmr.SGE(0, 8)}, RemoteAddr: tg.rw.Addr(), RKey: tg.rw.RKey(), Signaled: true})
			one(t, cli.scq, 1, tc.op, nprdma.StatusRemoteAccess)
			one(t, cli.scq, 2, nprdma.OpRead, nprdma.StatusWRFlushed)
			expectErr(t, cli.qp, nprdma.ErrRemoteAccess)
			// Real RC: the responder's QP fails too.
			expectPeerErr(t, srv.qp, nprdma.ErrRemoteAccess)
			one(t, srv.rcq, 50, nprdma.OpRecv, nprdma.StatusWRFlushed)
			if got := srv.dev.Stats().RemoteAccessErrors - before; srv.dev.Caps().ResponderStats && got != 1 {
				t.Fatalf("remote access errors counted %d, want 1", got)
			}
			sameBytes(t, "read-only region", robuf, roBefore)
		})
	}
}

// testAccessTag: a region registered WithAccessTag serves READs only on
// queue pairs carrying that tag; on any other queue pair of the same PD its
// rkey is refused like a wrong key (and, as for every remote access error,
// both queue pairs fail).
func testAccessTag(t *testing.T, h Harness) {
	require(t, caps(t, h).AccessTags, "access tags")
	for _, tc := range []struct {
		name   string
		qpTag  uint64
		wantOK bool
	}{
		{"SameTag", 7, true},
		{"UntaggedQP", 0, false},
		{"OtherTag", 8, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli, srv := connect(t, h, pairConfig{})
			srv.qp.SetAccessTag(tc.qpTag)
			if got := srv.qp.AccessTag(); got != tc.qpTag {
				t.Fatalf("AccessTag() = %d, want %d", got, tc.qpTag)
			}
			buf, err := nprdma.AllocBuffer(4096)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { nprdma.FreeBuffer(buf) })
			copy(buf, "tagged region")
			mr, err := srv.pd.Register(buf, nprdma.AccessRemoteRead, nprdma.WithAccessTag(7))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { mr.Deregister() })
			if mr.AccessTag() != 7 {
				t.Fatalf("MR.AccessTag() = %d, want 7", mr.AccessTag())
			}
			lmr, lbuf := cli.region(t, 4096, rw)
			before := srv.dev.Stats().RemoteAccessErrors
			post(t, cli.qp, nprdma.SendWR{ID: 1, Op: nprdma.OpRead, SG: []nprdma.SGE{lmr.SGE(0, 64)},
				RemoteAddr: mr.Addr(), RKey: mr.RKey(), Signaled: true})
			if tc.wantOK {
				one(t, cli.scq, 1, nprdma.OpRead, nprdma.StatusSuccess)
				sameBytes(t, "tagged read", lbuf[:64], buf[:64])
				return
			}
			one(t, cli.scq, 1, nprdma.OpRead, nprdma.StatusRemoteAccess)
			expectErr(t, cli.qp, nprdma.ErrRemoteAccess)
			expectErr(t, srv.qp, nprdma.ErrRemoteAccess)
			if got := srv.dev.Stats().RemoteAccessErrors - before; got != 1 {
				t.Fatalf("remote access errors counted %d, want 1", got)
			}
		})
	}
}

func testSendTooLong(t *testing.T, h Harness) {
	cli, srv := connect(t, h, pairConfig{})
	lmr, _ := cli.region(t, 4096, rw)
	rmr, _ := srv.region(t, 4096, rw)
	postRecv(t, srv.qp, nprdma.RecvWR{ID: 1, SG: []nprdma.SGE{rmr.SGE(0, 100)}})
	post(t, cli.qp, nprdma.SendWR{ID: 1, Op: nprdma.OpSend, SG: []nprdma.SGE{lmr.SGE(0, 101)}})
	// Soft-RoCE answers with a remote operation error where the NAK
	// should say invalid request, and fails the receive with a protection
	// error (Caps.ExactErrorStatus).
	exact := cli.dev.Caps().ExactErrorStatus
	wc := wait(t, cli.scq, 1)[0]
	rxe := !exact && wc.Status == nprdma.StatusRemoteOperation
	if wc.ID != 1 || (wc.Status != nprdma.StatusRemoteInvalidRequest && !rxe) {
		t.Fatalf("completion %+v (%s), want a remote invalid request", wc, wc.Status)
	}
	r := wait(t, srv.rcq, 1)[0]
	if r.ID != 1 || r.Op != nprdma.OpRecv || (r.Status != nprdma.StatusLocalLength && (exact || r.Status != nprdma.StatusLocalProtection)) {
		t.Fatalf("receive completion %+v (%s), want a local length error", r, r.Status)
	}
	if rxe {
		expectErr(t, cli.qp, nprdma.ErrRemoteOperation)
	} else {
		expectErr(t, cli.qp, nprdma.ErrRemoteRequest)
	}
	if r.Status == nprdma.StatusLocalProtection {
		expectErr(t, srv.qp, nprdma.ErrLocalProtection)
	} else {
		expectErr(t, srv.qp, nprdma.ErrLocalLength)
	}
}

func testRNRRetryExceeded(t *testing.T, h Harness) {
	cli, srv := connect(t, h, pairConfig{cli: nprdma.QPConfig{RNRRetry: 3, RNRTimeout: time.Millisecond}})
	lmr, _ := cli.region(t, 4096, rw)
	post(t, cli.qp, nprdma.SendWR{ID: 1, Op: nprdma.OpSend, SG: []nprdma.SGE{lmr.SGE(0, 64)}, Signaled: true},
		nprdma.SendWR{ID: 2, Op: nprdma.OpSend, SG: []nprdma.SGE{lmr.SGE(0, 64)}, Signaled: true})
	one(t, cli.scq, 1, nprdma.OpSend, nprdma.StatusRNRRetryExceeded)
	one(t, cli.scq, 2, nprdma.OpSend, nprdma.StatusWRFlushed)
	expectErr(t, cli.qp, nprdma.ErrRNRRetryExceeded)
	if !srv.dev.Caps().ResponderStats {
		return
	}
	if n := cli.dev.Stats().RNRRetries; n != 4 {
		t.Fatalf("RNR NAKs received %d, want 4 (3 retries)", n)
	}
	if n := srv.dev.Stats().RNRNaksSent; n != 4 {
		t.Fatalf("RNR NAKs sent %d, want 4", n)
	}
}

func testRNRGoBackN(t *testing.T, h Harness) {
	cli, srv := connect(t, h, pairConfig{cli: nprdma.QPConfig{RNRRetry: 100000, RNRTimeout: 2 * time.Millisecond}})
	lmr, lbuf := cli.region(t, 4096, rw)
	rmr, rbuf := srv.region(t, 4096, rw)
	// SEND (refused: no receive), then WRITE_WITH_IMM, READ and SEND behind
	// it: the responder drops them until the SEND returns, so each executes
	// exactly once, in order.
	post(t, cli.qp,
		nprdma.SendWR{ID: 1, Op: nprdma.OpSend, SG: []nprdma.SGE{lmr.SGE(0, 100)}, Signaled: true},
		nprdma.SendWR{ID: 2, Op: nprdma.OpWriteWithImm, Imm: 42, SG: []nprdma.SGE{lmr.SGE(100, 200)}, RemoteAddr: rmr.Addr() + 1000, RKey: rmr.RKey(), Signaled: true},
		nprdma.SendWR{ID: 3, Op: nprdma.OpRead, SG: []nprdma.SGE{lmr.SGE(2000, 200)}, RemoteAddr: rmr.Addr() + 1000, RKey: rmr.RKey(), Signaled: true},
		nprdma.SendWR{ID: 4, Op: nprdma.OpSend, SG: []nprdma.SGE{lmr.SGE(300, 50)}, Signaled: true})
	sawRNR(t, srv)
	noMore(t, cli.scq)
	postRecv(t, srv.qp, nprdma.RecvWR{ID: 10, SG: []nprdma.SGE{rmr.SGE(0, 100)}}, nprdma.RecvWR{ID: 11}, nprdma.RecvWR{ID: 12, SG: []nprdma.SGE{rmr.SGE(3000, 100)}})
	for i, wc := range wait(t, cli.scq, 4) {
		if wc.ID != uint64(i+1) || wc.Status != nprdma.StatusSuccess {
			t.Fatalf("completion %d: %+v (%s)", i, wc, wc.Status)
		}
	}
	rw := wait(t, srv.rcq, 3)
	if rw[0].ID != 10 || rw[0].Op != nprdma.OpRecv || rw[0].ByteLen != 100 ||
		rw[1].ID != 11 || rw[1].Op != nprdma.OpRecvRDMAWithImm || rw[1].Imm != 42 ||
		rw[2].ID != 12 || rw[2].Op != nprdma.OpRecv || rw[2].ByteLen != 50 {
		t.Fatalf("receive completions %+v", rw)
	}
	noMore(t, srv.rcq)
	sameBytes(t, "SEND after RNR", rbuf[:100], lbuf[:100])
	sameBytes(t, "WRITE after RNR", rbuf[1000:1200], lbuf[100:300])
	sameBytes(t, "READ after RNR", lbuf[2000:2200], lbuf[100:300])
	sameBytes(t, "second SEND", rbuf[3000:3050], lbuf[300:350])
	if cli.qp.State() != nprdma.QPStateRTS {
		t.Fatalf("state after RNR recovery %s", cli.qp.State())
	}
}

// checkFailedRun checks completions of ids 0..n-1 after the QP failed:
// successes first, then at most one with head, then flushes.
func checkFailedRun(t *testing.T, wcs []nprdma.WC, head nprdma.Status) {
	t.Helper()
	phase := 0
	for i, wc := range wcs {
		if wc.ID != uint64(i) {
			t.Fatalf("completion %d has id %d", i, wc.ID)
		}
		switch {
		case phase == 0 && wc.Status == nprdma.StatusSuccess:
		case phase == 0 && wc.Status == head:
			phase = 1
		case wc.Status == nprdma.StatusWRFlushed:
			phase = 1
		default:
			t.Fatalf("completion %d: status %s after phase %d", i, wc.Status, phase)
		}
	}
}

func testPeerDeath(t *testing.T, h Harness) {
	cli, srv := connect(t, h, pairConfig{cli: nprdma.QPConfig{SendDepth: 64}})
	fi := injector(t, srv.prov)
	const n, size = 64, 1 << 20
	lmr, _ := cli.region(t, 2*size, rw)
	rmr, _ := srv.region(t, 2*size, rw)
	wrs := make([]nprdma.SendWR, n)
	for i := range wrs {
		// READs land in the first half, WRITEs come from the second.
		op, off := nprdma.OpRead, 0
		if i%3 == 1 {
			op, off = nprdma.OpWrite, size
		}
		wrs[i] = nprdma.SendWR{ID: uint64(i), Op: op, SG: []nprdma.SGE{lmr.SGE(off, size)}, RemoteAddr: rmr.Addr() + uint64(off), RKey: rmr.RKey(), Signaled: true}
	}
	// Half the work goes out; once it is under way the peer stops (so the
	// second half is surely outstanding), then dies.
	post(t, cli.qp, wrs[:n/2]...)
	wcs := wait(t, cli.scq, 1)
	fi.Freeze()
	post(t, cli.qp, wrs[n/2:]...)
	fi.Crash()
	wcs = append(wcs, wait(t, cli.scq, n-1)...)
	checkFailedRun(t, wcs, nprdma.StatusRetryExceeded)
	if last := wcs[n-1]; last.Status != nprdma.StatusWRFlushed {
		t.Fatalf("last completion %s, want a flush", last.Status)
	}
	expectErr(t, cli.qp, nprdma.ErrPeerLost)
	noMore(t, cli.scq)
}

func testCloseWhilePeerSends(t *testing.T, h Harness) {
	cli, srv := connect(t, h, pairConfig{cli: nprdma.QPConfig{SendDepth: 64, RNRRetry: 1000000}})
	const n, size = 64, 256 << 10
	lmr, _ := cli.region(t, size, rw)
	rmr, _ := srv.region(t, 4*size, rw)
	for i := 0; i < 4; i++ {
		postRecv(t, srv.qp, nprdma.RecvWR{ID: uint64(i), SG: []nprdma.SGE{rmr.SGE(i*size, size)}})
	}
	wrs := make([]nprdma.SendWR, n)
	for i := range wrs {
		wrs[i] = nprdma.SendWR{ID: uint64(i), Op: nprdma.OpSend, SG: []nprdma.SGE{lmr.SGE(0, size)}, Signaled: true}
	}
	post(t, cli.qp, wrs...)
	wait(t, srv.rcq, 1)
	if err := srv.qp.Close(); err != nil {
		t.Fatal(err)
	}
	if srv.qp.State() != nprdma.QPStateClosed {
		t.Fatalf("state after close %s", srv.qp.State())
	}
	wcs := wait(t, cli.scq, n)
	checkFailedRun(t, wcs, nprdma.StatusRetryExceeded)
	if wcs[n-1].Status != nprdma.StatusWRFlushed {
		t.Fatalf("last send %s", wcs[n-1].Status)
	}
	expectPeerErr(t, cli.qp, nprdma.ErrPeerLost)
	// Close flushed the server's remaining receives before returning.
	var buf [8]nprdma.WC
	got := 1 + srv.rcq.Poll(buf[:])
	if got != 4 {
		t.Fatalf("server receive completions %d, want 4", got)
	}
}

func testDisconnectOutstanding(t *testing.T, h Harness) {
	cli, srv := connect(t, h, pairConfig{cli: nprdma.QPConfig{RNRRetry: 1000000, RNRTimeout: 5 * time.Millisecond}})
	lmr, _ := cli.region(t, 4096, rw)
	postRecv(t, cli.qp, nprdma.RecvWR{ID: 100, SG: []nprdma.SGE{lmr.SGE(0, 64)}}, nprdma.RecvWR{ID: 101})
	var wrs []nprdma.SendWR
	for i := 0; i < 5; i++ {
		wrs = append(wrs, nprdma.SendWR{ID: uint64(i), Op: nprdma.OpSend, SG: []nprdma.SGE{lmr.SGE(0, 64)}})
	}
	post(t, cli.qp, wrs...) // the server has no receive: RNR until the disconnect
	sawRNR(t, srv)
	if err := cli.qp.Disconnect(); err != nil {
		t.Fatal(err)
	}
	for i, wc := range wait(t, cli.scq, 5) {
		if wc.ID != uint64(i) || wc.Status != nprdma.StatusWRFlushed {
			t.Fatalf("send completion %d: %+v (%s)", i, wc, wc.Status)
		}
	}
	one(t, cli.rcq, 100, nprdma.OpRecv, nprdma.StatusWRFlushed)
	one(t, cli.rcq, 101, nprdma.OpRecv, nprdma.StatusWRFlushed)
	expectErr(t, cli.qp, nprdma.ErrDisconnected)
	expectErr(t, srv.qp, nprdma.ErrPeerDisconnected)
	postRecv(t, srv.qp, nprdma.RecvWR{ID: 7})
	one(t, srv.rcq, 7, nprdma.OpRecv, nprdma.StatusWRFlushed)
}

func testPeerSilent(t *testing.T, h Harness) {
	cli, srv := connect(t, h, pairConfig{cli: nprdma.QPConfig{Timeout: 300 * time.Millisecond}})
	fi := injector(t, srv.prov)
	lmr, _ := cli.region(t, 4096, rw)
	rmr, _ := srv.region(t, 4096, rw)
	fi.Freeze()
	defer fi.Thaw()
	post(t, cli.qp, nprdma.SendWR{ID: 1, Op: nprdma.OpRead, SG: []nprdma.SGE{lmr.SGE(0, 64)}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()},
		nprdma.SendWR{ID: 2, Op: nprdma.OpRead, SG: []nprdma.SGE{lmr.SGE(0, 64)}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
	one(t, cli.scq, 1, nprdma.OpRead, nprdma.StatusRetryExceeded)
	one(t, cli.scq, 2, nprdma.OpRead, nprdma.StatusWRFlushed)
	expectErr(t, cli.qp, nprdma.ErrTimeout)
}

func testManyQPsOneCQ(t *testing.T, h Harness) {
	const qps, rounds, size = 8, 40, 1024
	cliSide, srvSide := newSide(t, h), newSide(t, h)
	scq, rcq := cliSide.dev.NewCQ(4096, h.CQOptions...), cliSide.dev.NewCQ(16, h.CQOptions...)
	srvRCQ, srvSCQ := srvSide.dev.NewCQ(4096, h.CQOptions...), srvSide.dev.NewCQ(16, h.CQOptions...)
	ln, err := srvSide.dev.Listen(h.ListenAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	rmr, rbuf := srvSide.region(t, qps*rounds*size, rw)
	lmr, lbuf := cliSide.region(t, 2*qps*rounds*size, rw)
	cqps := make([]*nprdma.QP, qps)
	sqps := make([]*nprdma.QP, qps)
	for i := range cqps {
		var err error
		if cqps[i], err = cliSide.pd.NewQP(nprdma.QPConfig{SendCQ: scq, RecvCQ: rcq, SendDepth: 3 * rounds}); err != nil {
			t.Fatal(err)
		}
		if sqps[i], err = srvSide.pd.NewQP(nprdma.QPConfig{SendCQ: srvSCQ, RecvCQ: srvRCQ, RecvDepth: rounds}); err != nil {
			t.Fatal(err)
		}
		defer cqps[i].Close()
		defer sqps[i].Close()
		for r := 0; r < rounds; r++ {
			postRecv(t, sqps[i], nprdma.RecvWR{ID: uint64(r), SG: []nprdma.SGE{rmr.SGE((i*rounds+r)*size, size)}})
		}
		go func() {
			if req, err := ln.Accept(ctx); err == nil {
				req.Accept(sqps[i], nil)
			}
		}()
		if _, err := cqps[i].Connect(ctx, ln.Addr(), nil); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for i := range cqps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				off := (i*rounds + r) * size
				binary.LittleEndian.PutUint64(lbuf[off:], uint64(i<<16|r))
				cqps[i].PostSend(
					nprdma.SendWR{ID: uint64(3 * r), Op: nprdma.OpSend, SG: []nprdma.SGE{lmr.SGE(off, size)}, Signaled: true},
					nprdma.SendWR{ID: uint64(3*r + 1), Op: nprdma.OpWrite, SG: []nprdma.SGE{lmr.SGE(off, 8)}, RemoteAddr: rmr.Addr() + uint64(off) + 8, RKey: rmr.RKey(), Signaled: true},
					nprdma.SendWR{ID: uint64(3*r + 2), Op: nprdma.OpRead, SG: []nprdma.SGE{lmr.SGE(qps*rounds*size+off, 16)}, RemoteAddr: rmr.Addr() + uint64(off), RKey: rmr.RKey(), Signaled: true})
			}
		}()
	}
	wcs := wait(t, scq, qps*rounds*3)
	wg.Wait()
	next := map[uint32]uint64{}
	for _, wc := range wcs {
		if wc.Status != nprdma.StatusSuccess {
			t.Fatalf("completion %+v (%s)", wc, wc.Status)
		}
		if wc.ID != next[wc.QPNum] {
			t.Fatalf("qp %d: completion %d, want %d (out of order)", wc.QPNum, wc.ID, next[wc.QPNum])
		}
		next[wc.QPNum]++
	}
	if len(next) != qps {
		t.Fatalf("completions from %d queue pairs, want %d", len(next), qps)
	}
	perQP := map[uint32]int{}
	for _, wc := range wait(t, srvRCQ, qps*rounds) {
		perQP[wc.QPNum]++
	}
	for _, q := range sqps {
		if perQP[q.Num()] != rounds {
			t.Fatalf("server qp %d: %d receives, want %d", q.Num(), perQP[q.Num()], rounds)
		}
	}
	for i := 0; i < qps; i++ {
		for r := 0; r < rounds; r++ {
			off := (i*rounds + r) * size
			want := uint64(i<<16 | r)
			if v := binary.LittleEndian.Uint64(rbuf[off:]); v != want {
				t.Fatalf("qp %d round %d: SEND landed %#x", i, r, v)
			}
			if v := binary.LittleEndian.Uint64(rbuf[off+8:]); v != want {
				t.Fatalf("qp %d round %d: WRITE landed %#x", i, r, v)
			}
			rd := lbuf[qps*rounds*size+off:]
			if binary.LittleEndian.Uint64(rd) != want || binary.LittleEndian.Uint64(rd[8:]) != want {
				t.Fatalf("qp %d round %d: READ did not see the SEND and WRITE before it", i, r)
			}
		}
	}
}

func testCQOverflow(t *testing.T, h Harness) {
	require(t, caps(t, h).CQOverflow, "completion queue of exactly its depth")
	cli, srv := connect(t, h, pairConfig{cqDepth: 2})
	lmr, _ := cli.region(t, 4096, rw)
	rmr, _ := srv.region(t, 4096, rw)
	for i := 0; i < 4; i++ {
		post(t, cli.qp, nprdma.SendWR{ID: uint64(i), Op: nprdma.OpWrite, SG: []nprdma.SGE{lmr.SGE(0, 64)}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey(), Signaled: true})
	}
	expectErr(t, cli.qp, nprdma.ErrCQOverflow)
	wcs := wait(t, cli.scq, 2)
	if wcs[0].ID != 0 || wcs[1].ID != 1 || wcs[0].Status != nprdma.StatusSuccess || wcs[1].Status != nprdma.StatusSuccess {
		t.Fatalf("kept completions %+v", wcs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	var buf [4]nprdma.WC
	if _, err := cli.scq.Wait(ctx, buf[:]); !errors.Is(err, nprdma.ErrCQOverflow) {
		t.Fatalf("wait on an overflowed queue: %v", err)
	}
	if !cli.scq.Overflowed() {
		t.Fatal("Overflowed() false")
	}
}

func testLargeBidirectional(t *testing.T, h Harness) {
	cli, srv := connect(t, h, pairConfig{})
	const size, n = 4 << 20, 6
	cmr, cbuf := cli.region(t, (n+1)*size, rw)
	smr, sbuf := srv.region(t, (n+1)*size, rw)
	// Both sides READ n large blocks from each other at once: neither
	// side's responses may wait for the other side to read.
	var wrsC, wrsS []nprdma.SendWR
	for i := 0; i < n; i++ {
		wrsC = append(wrsC, nprdma.SendWR{ID: uint64(i), Op: nprdma.OpRead, SG: []nprdma.SGE{cmr.SGE((i+1)*size, size)}, RemoteAddr: smr.Addr(), RKey: smr.RKey(), Signaled: true})
		wrsS = append(wrsS, nprdma.SendWR{ID: uint64(i), Op: nprdma.OpRead, SG: []nprdma.SGE{smr.SGE((i+1)*size, size)}, RemoteAddr: cmr.Addr(), RKey: cmr.RKey(), Signaled: true})
	}
	post(t, cli.qp, wrsC...)
	post(t, srv.qp, wrsS...)
	for _, wc := range append(wait(t, cli.scq, n), wait(t, srv.scq, n)...) {
		if wc.Status != nprdma.StatusSuccess {
			t.Fatalf("READ %d on qp %d: %s (client: %v; server: %v)", wc.ID, wc.QPNum, wc.Status, cli.qp.Err(), srv.qp.Err())
		}
	}
	for i := 0; i < n; i++ {
		sameBytes(t, "client READ", cbuf[(i+1)*size:(i+2)*size], sbuf[:size])
		sameBytes(t, "server READ", sbuf[(i+1)*size:(i+2)*size], cbuf[:size])
	}
	// And a large WRITE.
	post(t, cli.qp, nprdma.SendWR{ID: 9, Op: nprdma.OpWrite, SG: []nprdma.SGE{cmr.SGE(0, size)}, RemoteAddr: smr.Addr() + size, RKey: smr.RKey(), Signaled: true})
	one(t, cli.scq, 9, nprdma.OpWrite, nprdma.StatusSuccess)
	if !bytes.Equal(sbuf[size:2*size], cbuf[:size]) {
		t.Fatal("large WRITE differs")
	}
}
