package tcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
)

// Areas of each side's 16 MiB registered buffer in TestLargeOpsBothWays,
// each of largeSlots slots of largeSlot bytes.
const (
	largeSlot  = 384 << 10
	largeSlots = 6
	largeArea  = largeSlot * largeSlots
)

const (
	areaWriteSrc = iota * largeArea // sources of this side's WRITEs
	areaSendSrc                     // sources of its SENDs
	areaReadDst                     // destinations of its READs
	areaWriteDst                    // where the peer's WRITEs land
	areaRecvDst                     // receive buffers for the peer's SENDs
	areaReadSrc                     // what the peer READs (never changes)
	areaCheck                       // a WRITE's bytes read back from the peer
)

// verifyBit marks the READ that reads a completed WRITE back.
const verifyBit = 1 << 32

// largeSizes are the transfer lengths, one after the other: the 128 KiB of the
// throughput goal, odd lengths around it, one beyond maxExpected's share
// of a slot, one under directRead; largeOffsets their offsets in a slot.
var (
	largeSizes   = []int{128 << 10, 128<<10 + 1000, 333333, 40000, 64 << 10, 128 << 10, 256<<10 + 7}
	largeOffsets = []int{0, 8, 100, 4096, 0, 3}
)

// largeData is the content of transfer k of a side: distinct for every
// side, transfer and byte.
func largeData(b []byte, side byte, k int) {
	x := uint64(k)<<8 | uint64(side) | 1
	for i := 0; i < len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], x)
		copy(b[i:], w[:])
	}
}

// largeSide is one side of TestLargeOpsBothWays: a QP issuing READs,
// WRITEs and SENDs at depth 8 into its peer, while its peer does the same.
type largeSide struct {
	name       string
	id         byte
	qp         *nprdma.QP
	scq, rcq   *nprdma.CQ
	mr, peerMR *nprdma.MR
	buf, peer  []byte
	credits    chan int // receive slots the peer has posted (SENDs may go)
	peerCreds  chan int // where this side returns the peer's credits
}

// Both sides of a connection READ, WRITE and SEND large, odd-sized
// transfers at once, eight outstanding each, and every byte lands where
// it belongs: WRITEs in the peer's memory at their remote address (read
// back), READs from the peer's memory, SENDs in the receive buffers in
// order, with
// the completion queues of both directions waited on by goroutines of
// their own (the receive side changing hands between drivers and the
// reader goroutines all along).
func TestLargeOpsBothWays(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := newDirectPair(t, nil, nil)
	cli := &largeSide{name: "client", id: 1, qp: p.cli, scq: p.cliSCQ, rcq: p.cliRCQ, mr: p.lmr, peerMR: p.rmr, buf: p.lbuf, peer: p.rbuf}
	srv := &largeSide{name: "server", id: 2, qp: p.srv, scq: p.srvSCQ, rcq: p.srvRCQ, mr: p.rmr, peerMR: p.lmr, buf: p.rbuf, peer: p.lbuf}
	cli.credits, srv.credits = make(chan int, largeSlots), make(chan int, largeSlots)
	cli.peerCreds, srv.peerCreds = srv.credits, cli.credits
	for _, s := range []*largeSide{cli, srv} {
		for i := range largeSlot * largeSlots {
			s.buf[areaReadSrc+i] = byte(i*7) ^ s.id
		}
		for slot := range largeSlots {
			if err := s.qp.PostRecv(nprdma.RecvWR{ID: uint64(slot), SG: []nprdma.SGE{s.mr.SGE(areaRecvDst+slot*largeSlot, largeSlot)}}); err != nil {
				t.Fatal(err)
			}
			s.peerCreds <- slot
		}
	}
	ops := 60
	if testing.Short() {
		ops = 24
	}
	errs := make(chan error, 4)
	for _, s := range []*largeSide{cli, srv} {
		go func() { errs <- s.issue(ctx, ops) }()
		go func() { errs <- s.receive(ctx, ops/3) }()
	}
	for range 4 {
		if err := <-errs; err != nil {
			cancel()
			t.Fatal(err)
		}
	}
}

// largeOp is transfer k of a side: its opcode (WRITE, READ, SEND, again
// and again), length and offset.
func largeOp(k int) (nprdma.Opcode, int, int) {
	op := []nprdma.Opcode{nprdma.OpWrite, nprdma.OpRead, nprdma.OpSend}[k%3]
	return op, largeSizes[k%len(largeSizes)], largeOffsets[k%len(largeOffsets)]
}

// issue posts n transfers, eight outstanding, and checks each as it
// completes.
func (s *largeSide) issue(ctx context.Context, n int) error {
	const qd = 8
	type pending struct {
		k, slot int
		op      nprdma.Opcode
	}
	inflight := map[uint64]pending{}
	free := map[nprdma.Opcode][]int{}
	for _, op := range []nprdma.Opcode{nprdma.OpWrite, nprdma.OpRead, nprdma.OpSend} {
		for slot := range largeSlots {
			free[op] = append(free[op], slot)
		}
	}
	wcs := make([]nprdma.WC, qd)
	post := func(k int) error {
		op, size, off := largeOp(k)
		slot := free[op][0]
		free[op] = free[op][1:]
		at := slot*largeSlot + off
		wr := nprdma.SendWR{ID: uint64(k), Op: op, Signaled: true}
		switch op {
		case nprdma.OpWrite:
			largeData(s.buf[areaWriteSrc+at:areaWriteSrc+at+size], s.id, k)
			wr.SG = []nprdma.SGE{s.mr.SGE(areaWriteSrc+at, size)}
			wr.RemoteAddr, wr.RKey = s.peerMR.Addr()+uint64(areaWriteDst+at), s.peerMR.RKey()
		case nprdma.OpRead:
			clear(s.buf[areaReadDst+at : areaReadDst+at+size])
			// Two segments, the second at an odd place of the slot.
			wr.SG = []nprdma.SGE{s.mr.SGE(areaReadDst+at, size/3), s.mr.SGE(areaReadDst+at+size/3, size-size/3)}
			wr.RemoteAddr, wr.RKey = s.peerMR.Addr()+uint64(areaReadSrc+at), s.peerMR.RKey()
		case nprdma.OpSend:
			select {
			case <-s.credits:
			case <-ctx.Done():
				return fmt.Errorf("%s: waiting for a receive of the peer's: %w", s.name, ctx.Err())
			}
			largeData(s.buf[areaSendSrc+at:areaSendSrc+at+size], s.id, k)
			wr.SG = []nprdma.SGE{s.mr.SGE(areaSendSrc+at, size)}
		}
		inflight[uint64(k)] = pending{k: k, slot: slot, op: op}
		return s.qp.PostSend(wr)
	}
	next := 0
	for ; next < qd && next < n; next++ {
		if err := post(next); err != nil {
			return err
		}
	}
	for len(inflight) > 0 {
		got, err := s.scq.Wait(ctx, wcs)
		if err != nil {
			return fmt.Errorf("%s: %d of %d transfers posted, %d outstanding: %w", s.name, next, n, len(inflight), err)
		}
		for _, wc := range wcs[:got] {
			pd, ok := inflight[wc.ID]
			if !ok || wc.Status != nprdma.StatusSuccess || wc.Op != pd.op {
				return fmt.Errorf("%s: completion %+v (%s), want one of %d outstanding, successful", s.name, wc, wc.Status, len(inflight))
			}
			delete(inflight, wc.ID)
			op, size, off := largeOp(pd.k)
			at := pd.slot*largeSlot + off
			switch {
			case wc.ID&verifyBit != 0:
				if !bytes.Equal(s.buf[areaCheck+at:areaCheck+at+size], s.buf[areaWriteSrc+at:areaWriteSrc+at+size]) {
					return fmt.Errorf("%s: WRITE %d of %d bytes at %d: wrong bytes at the target", s.name, pd.k, size, at)
				}
			case op == nprdma.OpWrite:
				// Read it back before the slot is written again.
				clear(s.buf[areaCheck+at : areaCheck+at+size])
				id := uint64(pd.k) | verifyBit
				inflight[id] = pending{k: pd.k, slot: pd.slot, op: nprdma.OpRead}
				if err := s.qp.PostSend(nprdma.SendWR{ID: id, Op: nprdma.OpRead, Signaled: true, SG: []nprdma.SGE{s.mr.SGE(areaCheck+at, size)},
					RemoteAddr: s.peerMR.Addr() + uint64(areaWriteDst+at), RKey: s.peerMR.RKey()}); err != nil {
					return err
				}
				continue
			case op == nprdma.OpRead:
				if !bytes.Equal(s.buf[areaReadDst+at:areaReadDst+at+size], s.peer[areaReadSrc+at:areaReadSrc+at+size]) {
					return fmt.Errorf("%s: READ %d of %d bytes at %d: wrong bytes read", s.name, pd.k, size, at)
				}
			}
			free[op] = append(free[op], pd.slot)
			if next < n {
				if err := post(next); err != nil {
					return err
				}
				next++
			}
		}
	}
	return nil
}

// receive takes n of the peer's SENDs, in order, checks each and posts its
// buffer again.
func (s *largeSide) receive(ctx context.Context, n int) error {
	peerID := 3 - s.id
	wcs := make([]nprdma.WC, 4)
	want := make([]byte, largeSlot)
	for k := 2; k < 3*n; {
		got, err := s.rcq.Wait(ctx, wcs)
		if err != nil {
			return fmt.Errorf("%s: receiving SEND %d: %w", s.name, k, err)
		}
		for _, wc := range wcs[:got] {
			_, size, _ := largeOp(k)
			if wc.Status != nprdma.StatusSuccess || wc.Op != nprdma.OpRecv || int(wc.ByteLen) != size {
				return fmt.Errorf("%s: receive %+v (%s), want SEND %d of %d bytes", s.name, wc, wc.Status, k, size)
			}
			at := areaRecvDst + int(wc.ID)*largeSlot
			largeData(want[:size], peerID, k)
			if !bytes.Equal(s.buf[at:at+size], want[:size]) {
				return fmt.Errorf("%s: SEND %d of %d bytes: wrong bytes received", s.name, k, size)
			}
			if err := s.qp.PostRecv(nprdma.RecvWR{ID: wc.ID, SG: []nprdma.SGE{s.mr.SGE(at, largeSlot)}}); err != nil {
				return err
			}
			s.peerCreds <- int(wc.ID)
			k += 3
		}
	}
	return nil
}
