package nprdma_test

import (
	"context"
	"fmt"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nprdma/nprdmatest"
)

// A responder registers a region without pinning it (its pages are read
// through a Pager; nprdmatest's stands in for a swap.Region here) and a
// requester reads it with one-sided READs over the in-process provider. A
// page the pager does not hold comes back as the region's magic page, which
// FindMagicPages reports so that the requester fetches it two-sided.
func Example_unpinnedRead() {
	const pages, pageSize = 4, 4096
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fabric := loop.NewFabric()

	// Responder: an unpinned region of four pages, each holding its number.
	srvDev := nprdma.NewDevice(loop.New(loop.WithFabric(fabric)))
	defer srvDev.Close()
	pager, err := nprdmatest.NewPager(pages, pageSize)
	if err != nil {
		panic(err)
	}
	defer pager.Close()
	for i := range pages {
		for j := range pageSize {
			pager.Page(i)[j] = byte('A' + i)
		}
	}
	srvPD := srvDev.AllocPD()
	region, err := srvPD.RegisterUnpinned(pager, nprdma.AccessRemoteRead)
	if err != nil {
		panic(err)
	}
	defer region.Deregister()
	srvCQ := srvDev.NewCQ(16)
	srvQP, err := srvPD.NewQP(nprdma.QPConfig{SendCQ: srvCQ})
	if err != nil {
		panic(err)
	}
	defer srvQP.Close()
	ln, err := srvDev.Listen("")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	accepted := make(chan error, 1)
	go func() {
		req, err := ln.Accept(ctx)
		if err == nil {
			err = req.Accept(srvQP, nil)
		}
		accepted <- err
	}()

	// Requester: a registered buffer to read into (not pinned: WithPinning(false)), and a QP.
	cliDev := nprdma.NewDevice(loop.New(loop.WithFabric(fabric)), nprdma.WithPinning(false))
	defer cliDev.Close()
	cliPD := cliDev.AllocPD()
	buf := make([]byte, pages*pageSize)
	local, err := cliPD.Register(buf, nprdma.AccessLocalWrite)
	if err != nil {
		panic(err)
	}
	defer local.Deregister()
	cq := cliDev.NewCQ(16)
	qp, err := cliPD.NewQP(nprdma.QPConfig{SendCQ: cq})
	if err != nil {
		panic(err)
	}
	defer qp.Close()
	if _, err := qp.Connect(ctx, ln.Addr(), nil); err != nil {
		panic(err)
	}
	if err := <-accepted; err != nil {
		panic(err)
	}

	// The responder's pager releases page 2 (as eviction would).
	pager.SetState(2, nprdmatest.Absent)

	// One READ of the whole region; the responder's software is not involved.
	err = qp.PostSend(nprdma.SendWR{ID: 1, Op: nprdma.OpRead, SG: []nprdma.SGE{local.SGE(0, len(buf))},
		RemoteAddr: region.Addr(), RKey: region.RKey(), Signaled: true})
	if err != nil {
		panic(err)
	}
	wc := make([]nprdma.WC, 1)
	if _, err := cq.Wait(ctx, wc); err != nil {
		panic(err)
	}
	fmt.Println("READ:", wc[0].Status)
	for _, r := range cliDev.FindMagicPages(buf, region.Addr(), region.Addr(), region.PageSize(), region.Magic()) {
		fmt.Printf("suspected fault: bytes [%d, +%d), to read two-sided\n", r.Off, r.Len)
	}
	for i := range pages {
		if i != 2 {
			fmt.Printf("page %d: %q\n", i, buf[i*pageSize])
		}
	}
	// Output:
	// READ: success
	// suspected fault: bytes [8192, +4096), to read two-sided
	// page 0: 'A'
	// page 1: 'B'
	// page 3: 'D'
}
