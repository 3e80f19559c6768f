package tcp_test

import (
	"context"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/tcp"
)

// TestHotPathAllocations checks that a READ, a WRITE and a SEND with its
// receive, from post to completion, allocate nothing in the steady state
// (counted over every goroutine, the connection's own included), with
// blocking and with busy-polling completion queues, small (through the
// read buffer) and large (read into place, a READ's response and a SEND
// guessed).
func TestHotPathAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	t.Run("blocking", func(t *testing.T) { testHotPathAllocations(t) })
	t.Run("busy-poll", func(t *testing.T) { testHotPathAllocations(t, nprdma.WithBusyPoll(time.Millisecond)) })
}

func testHotPathAllocations(t *testing.T, cqOpts ...nprdma.CQOption) {
	prov := tcp.New()
	cliDev, srvDev := nprdma.NewDevice(prov, nprdma.WithPinning(false)), nprdma.NewDevice(prov, nprdma.WithPinning(false))
	defer cliDev.Close()
	defer srvDev.Close()
	cpd, spd := cliDev.AllocPD(), srvDev.AllocPD()
	cq, rcq := cliDev.NewCQ(64, cqOpts...), srvDev.NewCQ(64, cqOpts...)
	cli, _ := cpd.NewQP(nprdma.QPConfig{SendCQ: cq})
	srv, _ := spd.NewQP(nprdma.QPConfig{SendCQ: srvDev.NewCQ(16), RecvCQ: rcq})
	const large = 128 << 10
	lbuf, _ := nprdma.AllocBuffer(8192 + large)
	rbuf, _ := nprdma.AllocBuffer(8192 + 2*large)
	defer nprdma.FreeBuffer(lbuf)
	defer nprdma.FreeBuffer(rbuf)
	lmr, _ := cpd.Register(lbuf, nprdma.AccessLocalWrite)
	rmr, _ := spd.Register(rbuf, nprdma.AccessLocalWrite|nprdma.AccessRemoteRead|nprdma.AccessRemoteWrite)
	ln, _ := srvDev.Listen("127.0.0.1:0")
	ctx := context.Background()
	go func() {
		if r, err := ln.Accept(ctx); err == nil {
			r.Accept(srv, nil)
		}
	}()
	if _, err := cli.Connect(ctx, ln.Addr(), nil); err != nil {
		t.Fatal(err)
	}
	read := []nprdma.SendWR{{Op: nprdma.OpRead, SG: []nprdma.SGE{lmr.SGE(0, 4096)}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey(), Signaled: true}}
	write := []nprdma.SendWR{{Op: nprdma.OpWrite, SG: []nprdma.SGE{lmr.SGE(0, 4096)}, RemoteAddr: rmr.Addr() + 4096, RKey: rmr.RKey(), Signaled: true}}
	send := []nprdma.SendWR{{Op: nprdma.OpSend, SG: []nprdma.SGE{lmr.SGE(4096, 512)}, Signaled: true}}
	recv := []nprdma.RecvWR{{SG: []nprdma.SGE{rmr.SGE(0, 512)}}}
	readLarge := []nprdma.SendWR{{Op: nprdma.OpRead, SG: []nprdma.SGE{lmr.SGE(8192, large)}, RemoteAddr: rmr.Addr() + 8192, RKey: rmr.RKey(), Signaled: true}}
	writeLarge := []nprdma.SendWR{{Op: nprdma.OpWrite, SG: []nprdma.SGE{lmr.SGE(8192, large)}, RemoteAddr: rmr.Addr() + 8192 + large, RKey: rmr.RKey(), Signaled: true}}
	sendLarge := []nprdma.SendWR{{Op: nprdma.OpSend, SG: []nprdma.SGE{lmr.SGE(8192, large)}, Signaled: true}}
	recvLarge := []nprdma.RecvWR{{SG: []nprdma.SGE{rmr.SGE(8192, large)}}}
	wcs := make([]nprdma.WC, 4)
	op := func() {
		srv.PostRecv(recv...)
		srv.PostRecv(recvLarge...)
		for _, wr := range [][]nprdma.SendWR{read, write, send, readLarge, writeLarge, sendLarge} {
			if err := cli.PostSend(wr...); err != nil {
				t.Fatal(err)
			}
			if _, err := cq.Wait(ctx, wcs[:1]); err != nil || wcs[0].Status != nprdma.StatusSuccess {
				t.Fatalf("%v %+v", err, wcs[0])
			}
		}
		for range 2 {
			if _, err := rcq.Wait(ctx, wcs[:1]); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := 0; i < 300; i++ { // every queue slot used once
		op()
	}
	if a := testing.AllocsPerRun(200, op); a > 0.5 {
		t.Fatalf("%.2f allocations per READ+WRITE+SEND round", a)
	}
}
