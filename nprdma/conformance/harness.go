// Package conformance is the test suite every nprdma provider passes: the
// same test bodies run against each provider (see Run). Each provider's
// package calls Run from a test.
package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
)

// Harness describes the device under test: the software NIC on a provider
// (NewProvider), or any other device (NewDevice: hardware).
type Harness struct {
	// NewProvider returns a provider for one side of a connection (one per
	// process in a real deployment). Providers from one harness must reach
	// each other.
	NewProvider func(t *testing.T) nprdma.Provider
	// NewDevice, when set, opens the device of one side instead (the suite
	// closes it). What it cannot do (Device.Caps) is skipped or checked in
	// the form it takes there.
	NewDevice func(t *testing.T) *nprdma.Device
	// ListenAddr is what servers pass to Device.Listen.
	ListenAddr string
	// CQOptions apply to every completion queue the suite creates (a run
	// with busy-polling CQs, for example).
	CQOptions []nprdma.CQOption
	// SharesInPlace says the provider's requesters execute READs of a
	// region whose pager is an nprdma.SharedPager themselves once the
	// responder has shared it (nprdma.LocalReader): the suite then checks
	// that they did.
	SharesInPlace bool
}

// FaultInjector is implemented by providers that can act on the process
// behind them; tests of peer death and peer silence need it.
type FaultInjector interface {
	// Crash breaks every link at once, like the death of the process.
	Crash()
	// Freeze stops all inbound processing, like SIGSTOP; Thaw resumes.
	Freeze()
	Thaw()
}

// waitTimeout bounds every wait of the suite: a completion that does not
// come within it is a hang, reported as a failure.
const waitTimeout = 30 * time.Second

// side is one end of a connection: its own provider, device, PD, CQs, QP.
type side struct {
	prov nprdma.Provider
	dev  *nprdma.Device
	pd   *nprdma.PD
	scq  *nprdma.CQ
	rcq  *nprdma.CQ
	qp   *nprdma.QP
	cqs  []nprdma.CQOption
	// bufs are the regions' memory, freed once the side's queue pairs are
	// closed: a READ response the link has yet to send may still refer to
	// a region deregistered before.
	bufs [][]byte
}

type pairConfig struct {
	cli, srv nprdma.QPConfig // CQ fields are filled in
	cqDepth  int
	srvRecvs int // receives the server posts before accepting, each recvSize bytes
	recvSize int
}

func newSide(t *testing.T, h Harness) *side {
	t.Helper()
	var p nprdma.Provider
	var dev *nprdma.Device
	if h.NewDevice != nil {
		dev = h.NewDevice(t)
	} else {
		p = h.NewProvider(t)
		dev = nprdma.NewDevice(p, nprdma.WithPinning(false))
	}
	t.Cleanup(func() { dev.Close() })
	s := &side{prov: p, dev: dev, pd: dev.AllocPD(), cqs: h.CQOptions}
	t.Cleanup(func() { // after the queue pairs' (made later), before the device's
		for _, b := range s.bufs {
			nprdma.FreeBuffer(b)
		}
	})
	return s
}

// caps is what the harness's devices offer.
func caps(t *testing.T, h Harness) nprdma.Caps {
	t.Helper()
	return newSide(t, h).dev.Caps()
}

// require skips t on a device without what it tests.
func require(t *testing.T, have bool, what string) {
	t.Helper()
	if !have {
		t.Skipf("the device has no %s", what)
	}
}

// samePrivateData checks private data received through a connection
// manager that may pad it with zeros (Caps.PadsPrivateData).
func samePrivateData(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if !bytes.HasPrefix(got, want) || bytes.Count(got[len(want):], []byte{0}) != len(got)-len(want) {
		t.Fatalf("%s: private data %q, want %q (padded with zeros at most)", what, got, want)
	}
}

// expectPeerErr waits for qp, whose peer failed, to fail with want, or
// with ErrPeerDisconnected on a device that learns no causes from its peer
// (Caps.PeerErrorCauses).
func expectPeerErr(t *testing.T, qp *nprdma.QP, want error) {
	t.Helper()
	waitDone(t, qp)
	err := qp.Err()
	if errors.Is(err, want) || (!qp.PD().Device().Caps().PeerErrorCauses && errors.Is(err, nprdma.ErrPeerDisconnected)) {
		return
	}
	t.Fatalf("qp %d error %v, want %v", qp.Num(), err, want)
}

// sawRNR waits for the responder to refuse a SEND for lack of a receive;
// on a device that does not count that (Caps.ResponderStats) it gives the
// request time to meet the empty queue.
func sawRNR(t *testing.T, srv *side) {
	t.Helper()
	if !srv.dev.Caps().ResponderStats {
		time.Sleep(50 * time.Millisecond)
		return
	}
	eventually(t, "an RNR NAK", func() bool { return srv.dev.Stats().RNRNaksSent > 0 })
}

func (s *side) newQP(t *testing.T, cfg nprdma.QPConfig, cqDepth int) {
	t.Helper()
	if cqDepth == 0 {
		cqDepth = 1024
	}
	if s.scq == nil {
		s.scq = s.dev.NewCQ(cqDepth, s.cqs...)
		s.rcq = s.dev.NewCQ(cqDepth, s.cqs...)
	}
	cfg.SendCQ, cfg.RecvCQ = s.scq, s.rcq
	qp, err := s.pd.NewQP(cfg)
	if err != nil {
		t.Fatalf("create qp: %v", err)
	}
	s.qp = qp
	t.Cleanup(func() { qp.Close() })
}

// connect creates both sides and connects them: the server accepts on a
// listener, the client connects.
func connect(t *testing.T, h Harness, pc pairConfig) (cli, srv *side) {
	t.Helper()
	cli, srv = newSide(t, h), newSide(t, h)
	cli.newQP(t, pc.cli, pc.cqDepth)
	srv.newQP(t, pc.srv, pc.cqDepth)
	ln, err := srv.dev.Listen(h.ListenAddr)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	accepted := make(chan error, 1)
	go func() {
		req, err := ln.Accept(ctx)
		if err != nil {
			accepted <- err
			return
		}
		accepted <- req.Accept(srv.qp, nil)
	}()
	if _, err := cli.qp.Connect(ctx, ln.Addr(), nil); err != nil {
		t.Fatalf("connect: %v", err)
	}
	if err := <-accepted; err != nil {
		t.Fatalf("accept: %v", err)
	}
	return cli, srv
}

// region registers n bytes of random content, off the Go heap.
func (s *side) region(t *testing.T, n int, access nprdma.Access) (*nprdma.MR, []byte) {
	t.Helper()
	buf, err := nprdma.AllocBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	rand.Read(buf)
	mr, err := s.pd.Register(buf, access)
	if err != nil {
		nprdma.FreeBuffer(buf)
		t.Fatalf("register %d bytes: %v", n, err)
	}
	s.bufs = append(s.bufs, buf)
	t.Cleanup(func() { mr.Deregister() })
	return mr, buf
}

const rw = nprdma.AccessLocalWrite | nprdma.AccessRemoteRead | nprdma.AccessRemoteWrite

// wait collects exactly n completions from cq (failing on a hang).
func wait(t *testing.T, cq *nprdma.CQ, n int) []nprdma.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	out := make([]nprdma.WC, 0, n)
	buf := make([]nprdma.WC, 64)
	for len(out) < n {
		k, err := cq.Wait(ctx, buf[:min(len(buf), n-len(out))])
		if err != nil {
			t.Fatalf("waiting for completion %d of %d: %v (got %+v)", len(out)+1, n, err, out)
		}
		out = append(out, buf[:k]...)
	}
	return out
}

// one waits for a single completion and checks its id, opcode and status.
func one(t *testing.T, cq *nprdma.CQ, id uint64, op nprdma.Opcode, st nprdma.Status) nprdma.WC {
	t.Helper()
	wc := wait(t, cq, 1)[0]
	if wc.ID != id || wc.Op != op || wc.Status != st {
		t.Fatalf("completion %+v (status %s), want id %d op %s status %s", wc, wc.Status, id, op, st)
	}
	return wc
}

func noMore(t *testing.T, cq *nprdma.CQ) {
	t.Helper()
	var buf [8]nprdma.WC
	if n := cq.Poll(buf[:]); n != 0 {
		t.Fatalf("unexpected completions: %+v", buf[:n])
	}
}

func waitDone(t *testing.T, qp *nprdma.QP) {
	t.Helper()
	select {
	case <-qp.Done():
	case <-time.After(waitTimeout):
		t.Fatalf("qp %d still %s", qp.Num(), qp.State())
	}
}

func expectErr(t *testing.T, qp *nprdma.QP, target error) {
	t.Helper()
	waitDone(t, qp)
	if err := qp.Err(); !errors.Is(err, target) {
		t.Fatalf("qp %d error %v, want %v", qp.Num(), err, target)
	}
}

// eventually polls cond (no timing assertion: it only bounds a hang).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func sameBytes(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		t.Fatalf("%s: %d bytes differ from the expected %d bytes at offset %d", what, len(got), len(want), i)
	}
}

func post(t *testing.T, qp *nprdma.QP, wrs ...nprdma.SendWR) {
	t.Helper()
	if err := qp.PostSend(wrs...); err != nil {
		t.Fatalf("post send: %v", err)
	}
}

func postRecv(t *testing.T, qp *nprdma.QP, wrs ...nprdma.RecvWR) {
	t.Helper()
	if err := qp.PostRecv(wrs...); err != nil {
		t.Fatalf("post recv: %v", err)
	}
}

func injector(t *testing.T, p nprdma.Provider) FaultInjector {
	t.Helper()
	if p == nil {
		t.Skip("the device has no provider to inject faults through")
	}
	fi, ok := p.(FaultInjector)
	if !ok {
		t.Skipf("provider %s cannot inject faults", p.Name())
	}
	return fi
}
