package loop_test

import (
	"context"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nprdma/nprdmatest"
)

// benchRead measures 4 KiB READs at queue depth 1 over loop from a pinned
// region or from an unpinned one with every page resident, the unpinned
// ones followed by the requester's magic-page check as an NP requester
// does: the no-fault NP read path against its pinned baseline. cqOpts
// configure the requester's completion queue (busy polling).
func benchRead(b *testing.B, unpinned bool, cqOpts ...nprdma.CQOption) {
	ctx := context.Background()
	prov := loop.New()
	cli, srv := nprdma.NewDevice(prov, nprdma.WithPinning(false)), nprdma.NewDevice(prov, nprdma.WithPinning(false))
	defer cli.Close()
	defer srv.Close()
	cpd, spd := cli.AllocPD(), srv.AllocPD()
	cq := cli.NewCQ(16, cqOpts...)
	qp, err := cpd.NewQP(nprdma.QPConfig{SendCQ: cq})
	if err != nil {
		b.Fatal(err)
	}
	sqp, err := spd.NewQP(nprdma.QPConfig{SendCQ: srv.NewCQ(16)})
	if err != nil {
		b.Fatal(err)
	}
	const pages, ps = 64, 4096
	pg, err := nprdmatest.NewPager(pages, ps)
	if err != nil {
		b.Fatal(err)
	}
	defer pg.Close()
	var mr *nprdma.MR
	if unpinned {
		mr, err = spd.RegisterUnpinned(pg, nprdma.AccessRemoteRead)
	} else {
		mr, err = spd.Register(pg.Bytes(), nprdma.AccessRemoteRead)
	}
	if err != nil {
		b.Fatal(err)
	}
	buf, err := nprdma.AllocBuffer(ps)
	if err != nil {
		b.Fatal(err)
	}
	defer nprdma.FreeBuffer(buf)
	lmr, err := cpd.Register(buf, nprdma.AccessLocalWrite)
	if err != nil {
		b.Fatal(err)
	}
	ln, err := srv.Listen("")
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		if req, err := ln.Accept(ctx); err == nil {
			req.Accept(sqp, nil)
		}
	}()
	if _, err := qp.Connect(ctx, ln.Addr(), nil); err != nil {
		b.Fatal(err)
	}
	wcs := make([]nprdma.WC, 1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		addr := mr.Addr() + uint64(i%pages)*ps
		if err := qp.PostSend(nprdma.SendWR{Op: nprdma.OpRead, SG: []nprdma.SGE{lmr.SGE(0, ps)}, RemoteAddr: addr, RKey: mr.RKey(), Signaled: true}); err != nil {
			b.Fatal(err)
		}
		if _, err := cq.Wait(ctx, wcs); err != nil || wcs[0].Status != nprdma.StatusSuccess {
			b.Fatalf("%v %+v", err, wcs[0])
		}
		if unpinned && len(cli.FindMagicPages(buf, addr, mr.Addr(), ps, mr.Magic())) != 0 {
			b.Fatal("magic page from a resident page")
		}
	}
}

func BenchmarkReadPinned(b *testing.B)   { benchRead(b, false) }
func BenchmarkReadUnpinned(b *testing.B) { benchRead(b, true) }

// The busy-polling waiter spins on the P that the peer's delivery goroutine
// was made runnable on: it must let that goroutine run.
func BenchmarkReadPinnedBusyPoll(b *testing.B) {
	benchRead(b, false, nprdma.WithBusyPoll(time.Millisecond))
}
