package nprdma_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nprdma/nprdmatest"
)

// gatePager is a Pager whose first ReadBegin stops until the test opens
// the gate, so that a READ is caught in the middle of its copy.
type gatePager struct {
	*nprdmatest.Pager
	entered chan struct{}
	gate    chan struct{}
	once    atomic.Bool
}

func (g *gatePager) ReadBegin(i int) (uint64, bool, bool) {
	if g.once.CompareAndSwap(false, true) {
		close(g.entered)
		<-g.gate
	}
	return g.Pager.ReadBegin(i)
}

// TestDeregisterWaitsForUnpinnedReadInProgress: Deregister of an unpinned
// region returns only after a READ that is copying out of the pager has
// finished, so the owner may close the pager (unmap the region) right
// after it, while the queue pair lives on; the next READ with the key is a
// remote access error.
func TestDeregisterWaitsForUnpinnedReadInProgress(t *testing.T) {
	const ps = 4096
	f := loop.NewFabric()
	srv := nprdma.NewDevice(loop.New(loop.WithFabric(f)), nprdma.WithPinning(false))
	defer srv.Close()
	cli := nprdma.NewDevice(loop.New(loop.WithFabric(f)), nprdma.WithPinning(false))
	defer cli.Close()
	pg, err := nprdmatest.NewPager(4, ps)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	for i := range pg.Bytes() {
		pg.Bytes()[i] = byte(i % 251)
	}
	gp := &gatePager{Pager: pg, entered: make(chan struct{}), gate: make(chan struct{})}
	var opened sync.Once
	open := func() { opened.Do(func() { close(gp.gate) }) }
	defer open() // before the devices close, whatever happens
	spd := srv.AllocPD()
	mr, err := spd.RegisterUnpinned(gp, nprdma.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.Listen("")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() {
		req, err := ln.Accept(ctx)
		if err != nil {
			return
		}
		qp, err := spd.NewQP(nprdma.QPConfig{SendCQ: srv.NewCQ(16)})
		if err != nil {
			req.Reject(nil)
			return
		}
		req.Accept(qp, nil)
	}()
	cpd := cli.AllocPD()
	cq := cli.NewCQ(16)
	qp, err := cpd.NewQP(nprdma.QPConfig{SendCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := qp.Connect(ctx, ln.Addr(), nil); err != nil {
		t.Fatal(err)
	}
	buf, err := nprdma.AllocBuffer(2 * ps)
	if err != nil {
		t.Fatal(err)
	}
	defer nprdma.FreeBuffer(buf)
	lmr, err := cpd.Register(buf, nprdma.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer lmr.Deregister()
	read := func(id uint64) {
		t.Helper()
		if err := qp.PostSend(nprdma.SendWR{ID: id, Op: nprdma.OpRead, SG: []nprdma.SGE{lmr.SGE(0, 2*ps)},
			RemoteAddr: mr.Addr(), RKey: mr.RKey(), Signaled: true}); err != nil {
			t.Fatal(err)
		}
	}
	read(1)
	<-gp.entered // the engine is inside the copy of page 0

	deregistered := make(chan struct{})
	go func() {
		mr.Deregister()
		close(deregistered)
	}()
	select {
	case <-deregistered:
		t.Fatal("Deregister returned while a READ was copying out of the region")
	case <-time.After(50 * time.Millisecond):
	}
	open()
	select {
	case <-deregistered:
	case <-time.After(10 * time.Second):
		t.Fatal("Deregister did not return after the READ finished")
	}
	wcs := make([]nprdma.WC, 4)
	n, err := cq.Wait(ctx, wcs)
	if err != nil || n != 1 || wcs[0].ID != 1 || wcs[0].Status != nprdma.StatusSuccess {
		t.Fatalf("READ begun before Deregister: %d completions %+v, %v", n, wcs[:n], err)
	}
	for i := 0; i < 2*ps; i++ {
		if buf[i] != byte(i%251) {
			t.Fatalf("READ begun before Deregister: byte %d is %d, want %d", i, buf[i], byte(i%251))
		}
	}
	if pg.InFlight() != 0 {
		t.Fatalf("%d pager reads still in flight", pg.InFlight())
	}

	// The key is dead for the next READ on the same queue pair.
	read(2)
	n, err = cq.Wait(ctx, wcs)
	if err != nil || n != 1 || wcs[0].Status != nprdma.StatusRemoteAccess {
		t.Fatalf("READ after Deregister: %+v, %v", wcs[:n], err)
	}
	<-qp.Done()
	if !errors.Is(qp.Err(), nprdma.ErrRemoteAccess) {
		t.Fatalf("queue pair error %v, want a remote access error", qp.Err())
	}
}
