package nprdmabench

import (
	"context"
	"fmt"
	"time"

	"github.com/nprdma/nprdma/nprdma"
)

// pair is a connected client and server on one provider, each with its own
// device. Registered memory lives outside the Go heap, as a target's does.
type pair struct {
	cliDev, srvDev *nprdma.Device
	cli, srv       *nprdma.QP
	scq, srvRCQ    *nprdma.CQ
	lmr, rmr       *nprdma.MR
	mems           [][]byte
	stopRecv       context.CancelFunc
	recvDone       chan struct{}
}

type pairOptions struct {
	localSize, remoteSize int
	recvSize              int // > 0: the server keeps receives of this size posted
	busyPoll              bool
	pin                   bool
	remoteAccess          nprdma.Access
}

func listenAddr(p nprdma.Provider) string {
	if p.Name() == "tcp" {
		return "127.0.0.1:0"
	}
	return ""
}

const recvDepth = 1024

func newPair(ctx context.Context, prov nprdma.Provider, o pairOptions) (*pair, error) {
	p := &pair{
		cliDev: nprdma.NewDevice(prov, nprdma.WithName("bench-client"), nprdma.WithPinning(o.pin)),
		srvDev: nprdma.NewDevice(prov, nprdma.WithName("bench-server"), nprdma.WithPinning(o.pin)),
	}
	ok := false
	defer func() {
		if !ok {
			p.close()
		}
	}()
	var cqOpts []nprdma.CQOption
	if o.busyPoll {
		cqOpts = append(cqOpts, nprdma.WithBusyPoll(200*time.Microsecond))
	}
	cpd, spd := p.cliDev.AllocPD(), p.srvDev.AllocPD()
	p.scq = p.cliDev.NewCQ(4096, cqOpts...)
	p.srvRCQ = p.srvDev.NewCQ(2 * recvDepth)
	var err error
	if p.cli, err = cpd.NewQP(nprdma.QPConfig{SendCQ: p.scq, SendDepth: 512}); err != nil {
		return nil, err
	}
	if p.srv, err = spd.NewQP(nprdma.QPConfig{SendCQ: p.srvDev.NewCQ(16), RecvCQ: p.srvRCQ, RecvDepth: recvDepth}); err != nil {
		return nil, err
	}
	alloc := func(pd *nprdma.PD, n int, access nprdma.Access) (*nprdma.MR, error) {
		mem, err := nprdma.AllocBuffer(max(n, 4096))
		if err != nil {
			return nil, err
		}
		p.mems = append(p.mems, mem)
		return pd.Register(mem, access)
	}
	if p.lmr, err = alloc(cpd, o.localSize, nprdma.AccessLocalWrite); err != nil {
		return nil, err
	}
	access := o.remoteAccess
	if access == 0 {
		access = nprdma.AccessLocalWrite | nprdma.AccessRemoteRead | nprdma.AccessRemoteWrite
	}
	if p.rmr, err = alloc(spd, max(o.remoteSize, o.recvSize), access); err != nil {
		return nil, err
	}
	if o.recvSize > 0 {
		recv := nprdma.RecvWR{SG: []nprdma.SGE{p.rmr.SGE(0, o.recvSize)}}
		for i := 0; i < recvDepth; i++ {
			if err := p.srv.PostRecv(recv); err != nil {
				return nil, err
			}
		}
	}
	ln, err := p.srvDev.Listen(listenAddr(prov))
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	accepted := make(chan error, 1)
	go func() {
		req, err := ln.Accept(ctx)
		if err == nil {
			err = req.Accept(p.srv, nil)
		}
		accepted <- err
	}()
	if _, err := p.cli.Connect(ctx, ln.Addr(), nil); err != nil {
		return nil, err
	}
	if err := <-accepted; err != nil {
		return nil, err
	}
	if o.recvSize > 0 {
		// Repost each consumed receive, so SENDs never meet an RNR.
		rctx, cancel := context.WithCancel(context.Background())
		p.stopRecv, p.recvDone = cancel, make(chan struct{})
		recv := nprdma.RecvWR{SG: []nprdma.SGE{p.rmr.SGE(0, o.recvSize)}}
		go func() {
			defer close(p.recvDone)
			wcs := make([]nprdma.WC, 64)
			for {
				n, err := p.srvRCQ.Wait(rctx, wcs)
				if err != nil {
					return
				}
				for i := 0; i < n; i++ {
					if wcs[i].Status != nprdma.StatusSuccess || p.srv.PostRecv(recv) != nil {
						return
					}
				}
			}
		}()
	}
	ok = true
	return p, nil
}

func (p *pair) close() {
	if p.stopRecv != nil {
		p.stopRecv()
		<-p.recvDone
	}
	p.cliDev.Close()
	p.srvDev.Close()
	for _, m := range p.mems {
		nprdma.FreeBuffer(m)
	}
}

// wr builds the work request for op on slot i (each slot has its own local
// and remote bytes).
func (p *pair) wr(op nprdma.Opcode, size, slot int) nprdma.SendWR {
	w := nprdma.SendWR{ID: uint64(slot), Op: op, SG: []nprdma.SGE{p.lmr.SGE(slot*size, size)}, Signaled: true}
	if op == nprdma.OpRead || op == nprdma.OpWrite {
		w.RemoteAddr, w.RKey = p.rmr.Addr()+uint64(slot*size), p.rmr.RKey()
	}
	return w
}

func checkOp(op nprdma.Opcode) error {
	switch op {
	case nprdma.OpRead, nprdma.OpWrite, nprdma.OpSend:
		return nil
	}
	return fmt.Errorf("nprdmabench: opcode %s not measured (READ, WRITE, SEND)", op)
}

func opName(prov nprdma.Provider, op nprdma.Opcode, size int, busyPoll bool) string {
	name := fmt.Sprintf("%s-%s-%d", prov.Name(), op, size)
	if busyPoll {
		name += "-busypoll"
	}
	return name
}

// roundTrip posts w and waits for its completion.
func roundTrip(ctx context.Context, qp *nprdma.QP, cq *nprdma.CQ, w nprdma.SendWR, wcs []nprdma.WC) error {
	if err := qp.PostSend(w); err != nil {
		return err
	}
	if _, err := cq.Wait(ctx, wcs[:1]); err != nil {
		return err
	}
	if wcs[0].Status != nprdma.StatusSuccess {
		return fmt.Errorf("nprdmabench: %s completed with %s", w.Op, wcs[0].Status)
	}
	return nil
}

// OpLatency measures the latency of one op of size bytes (post to
// completion) at queue depth 1 over prov.
func OpLatency(ctx context.Context, prov nprdma.Provider, op nprdma.Opcode, size, samples int, busyPoll bool) (LatencyResult, error) {
	if err := checkOp(op); err != nil {
		return LatencyResult{}, err
	}
	o := pairOptions{localSize: size, remoteSize: size, busyPoll: busyPoll}
	if op == nprdma.OpSend {
		o.recvSize = size
	}
	p, err := newPair(ctx, prov, o)
	if err != nil {
		return LatencyResult{}, err
	}
	defer p.close()
	w := p.wr(op, size, 0)
	wcs := make([]nprdma.WC, 1)
	lat := make([]time.Duration, 0, samples)
	for i := 0; i < samples+warmup(samples); i++ {
		t0 := time.Now()
		if err := roundTrip(ctx, p.cli, p.scq, w, wcs); err != nil {
			return LatencyResult{}, err
		}
		if i >= warmup(samples) {
			lat = append(lat, time.Since(t0))
		}
	}
	return summarize(opName(prov, op, size, busyPoll), lat), nil
}

// OpThroughput keeps qd ops of size bytes outstanding over prov for dur.
func OpThroughput(ctx context.Context, prov nprdma.Provider, op nprdma.Opcode, size, qd int, dur time.Duration, busyPoll bool) (ThroughputResult, error) {
	if err := checkOp(op); err != nil {
		return ThroughputResult{}, err
	}
	if qd < 1 || qd > 512 {
		return ThroughputResult{}, fmt.Errorf("nprdmabench: queue depth %d outside [1, 512]", qd)
	}
	o := pairOptions{localSize: size * qd, remoteSize: size * qd, busyPoll: busyPoll}
	if op == nprdma.OpSend {
		o.recvSize = size
	}
	p, err := newPair(ctx, prov, o)
	if err != nil {
		return ThroughputResult{}, err
	}
	defer p.close()
	for i := 0; i < qd; i++ {
		if err := p.cli.PostSend(p.wr(op, size, i)); err != nil {
			return ThroughputResult{}, err
		}
	}
	wcs := make([]nprdma.WC, qd)
	ops, outstanding := 0, qd
	start := time.Now()
	deadline := start.Add(dur)
	for outstanding > 0 {
		n, err := p.scq.Wait(ctx, wcs)
		if err != nil {
			return ThroughputResult{}, err
		}
		outstanding -= n
		more := time.Now().Before(deadline)
		for _, wc := range wcs[:n] {
			if wc.Status != nprdma.StatusSuccess {
				return ThroughputResult{}, fmt.Errorf("nprdmabench: %s completed with %s", op, wc.Status)
			}
			ops++
			if more {
				if err := p.cli.PostSend(p.wr(op, size, int(wc.ID))); err != nil {
					return ThroughputResult{}, err
				}
				outstanding++
			}
		}
	}
	return throughput(opName(prov, op, size, busyPoll)+fmt.Sprintf("-qd%d", qd), size, qd, ops, time.Since(start)), nil
}

// UnpinnedReadLatency measures READs of size bytes from an unpinned region
// over pager (the NP read path without faults when every page is resident),
// walking through the region.
func UnpinnedReadLatency(ctx context.Context, prov nprdma.Provider, pager nprdma.Pager, size, samples int) (LatencyResult, error) {
	p, err := newPair(ctx, prov, pairOptions{localSize: size, remoteSize: 4096})
	if err != nil {
		return LatencyResult{}, err
	}
	defer p.close()
	mr, err := p.srv.PD().RegisterUnpinned(pager, nprdma.AccessRemoteRead)
	if err != nil {
		return LatencyResult{}, err
	}
	defer mr.Deregister()
	if size > mr.Len() {
		return LatencyResult{}, fmt.Errorf("nprdmabench: %d-byte reads from a %d-byte region", size, mr.Len())
	}
	slots := mr.Len() / size
	wcs := make([]nprdma.WC, 1)
	lat := make([]time.Duration, 0, samples)
	for i := 0; i < samples+warmup(samples); i++ {
		w := nprdma.SendWR{Op: nprdma.OpRead, SG: []nprdma.SGE{p.lmr.SGE(0, size)}, RemoteAddr: mr.Addr() + uint64((i%slots)*size), RKey: mr.RKey(), Signaled: true}
		t0 := time.Now()
		if err := roundTrip(ctx, p.cli, p.scq, w, wcs); err != nil {
			return LatencyResult{}, err
		}
		p.cliDev.FindMagicPages(p.lmr.Bytes()[:size], w.RemoteAddr, mr.Addr(), mr.PageSize(), mr.Magic())
		if i >= warmup(samples) {
			lat = append(lat, time.Since(t0))
		}
	}
	return summarize(fmt.Sprintf("%s-unpinned-READ-%d", prov.Name(), size), lat), nil
}

// PoolVsRegister compares READs of size bytes into buffers from a
// BufferPool (registered once) with READs into a buffer registered and
// deregistered around each I/O (pinned with mlock, as ibv_reg_mr does), for
// dur each.
func PoolVsRegister(ctx context.Context, prov nprdma.Provider, size int, dur time.Duration) (pooled, perIO ThroughputResult, err error) {
	p, err := newPair(ctx, prov, pairOptions{localSize: 4096, remoteSize: size, pin: true})
	if err != nil {
		return pooled, perIO, err
	}
	defer p.close()
	pd := p.cli.PD()
	pool, err := nprdma.NewBufferPool(pd, nprdma.AccessLocalWrite)
	if err != nil {
		return pooled, perIO, err
	}
	defer pool.Close()
	wcs := make([]nprdma.WC, 1)
	read := func(sge nprdma.SGE) error {
		return roundTrip(ctx, p.cli, p.scq, nprdma.SendWR{Op: nprdma.OpRead, SG: []nprdma.SGE{sge}, RemoteAddr: p.rmr.Addr(), RKey: p.rmr.RKey(), Signaled: true}, wcs)
	}
	ops := 0
	start := time.Now()
	for time.Since(start) < dur {
		b, err := pool.Get(size)
		if err != nil {
			return pooled, perIO, err
		}
		err = read(b.SGE())
		b.Release()
		if err != nil {
			return pooled, perIO, err
		}
		ops++
	}
	pooled = throughput(fmt.Sprintf("%s-READ-%d-pooled", prov.Name(), size), size, 1, ops, time.Since(start))

	mem, err := nprdma.AllocBuffer(size)
	if err != nil {
		return pooled, perIO, err
	}
	defer nprdma.FreeBuffer(mem)
	ops = 0
	start = time.Now()
	for time.Since(start) < dur {
		mr, err := pd.Register(mem, nprdma.AccessLocalWrite)
		if err != nil {
			return pooled, perIO, err
		}
		err = read(mr.SGE(0, size))
		if derr := mr.Deregister(); err == nil {
			err = derr
		}
		if err != nil {
			return pooled, perIO, err
		}
		ops++
	}
	perIO = throughput(fmt.Sprintf("%s-READ-%d-register-per-io", prov.Name(), size), size, 1, ops, time.Since(start))
	return pooled, perIO, nil
}
