package nprdmabench

import (
	"github.com/nprdma/nprdma/bench"

	"context"
	"fmt"
	"time"

	"github.com/nprdma/nprdma/nprdma"
)

// Pair is a connected client and server queue pair on one provider, each
// with its own device, with a registered local buffer on the client and a
// remote region on the server that READ and WRITE name and SEND lands in.
// Registered memory lives outside the Go heap, as a target's does.
type Pair struct {
	CliDev, SrvDev *nprdma.Device
	Cli, Srv       *nprdma.QP
	SendCQ         *nprdma.CQ // the client's
	Local, Remote  *nprdma.MR

	srvRCQ   *nprdma.CQ
	mems     [][]byte
	wcs      []nprdma.WC
	stopRecv context.CancelFunc
	recvDone chan struct{}
}

// PairOptions sizes a Pair.
type PairOptions struct {
	LocalSize, RemoteSize int
	RecvSize              int // > 0: the server keeps receives of this size posted
	BusyPoll              bool
	Pin                   bool          // Register pins with mlock (the default of a real NIC)
	RemoteAccess          nprdma.Access // of the remote region (default local write, remote read and write)
}

// ListenAddr is what a server on p listens on: an ephemeral loopback port
// for tcp, a fresh name for loop.
func ListenAddr(p nprdma.Provider) string {
	if p.Name() == "tcp" {
		return "127.0.0.1:0"
	}
	return ""
}

const recvDepth = 1024

// NewPair connects a Pair over prov.
func NewPair(ctx context.Context, prov nprdma.Provider, o PairOptions) (*Pair, error) {
	p := &Pair{
		CliDev: nprdma.NewDevice(prov, nprdma.WithName("bench-client"), nprdma.WithPinning(o.Pin)),
		SrvDev: nprdma.NewDevice(prov, nprdma.WithName("bench-server"), nprdma.WithPinning(o.Pin)),
		wcs:    make([]nprdma.WC, 1),
	}
	ok := false
	defer func() {
		if !ok {
			p.Close()
		}
	}()
	var cqOpts []nprdma.CQOption
	if o.BusyPoll {
		cqOpts = append(cqOpts, nprdma.WithBusyPoll(200*time.Microsecond))
	}
	cpd, spd := p.CliDev.AllocPD(), p.SrvDev.AllocPD()
	p.SendCQ = p.CliDev.NewCQ(4096, cqOpts...)
	p.srvRCQ = p.SrvDev.NewCQ(2 * recvDepth)
	var err error
	if p.Cli, err = cpd.NewQP(nprdma.QPConfig{SendCQ: p.SendCQ, SendDepth: 512}); err != nil {
		return nil, err
	}
	if p.Srv, err = spd.NewQP(nprdma.QPConfig{SendCQ: p.SrvDev.NewCQ(16), RecvCQ: p.srvRCQ, RecvDepth: recvDepth}); err != nil {
		return nil, err
	}
	alloc := func(pd *nprdma.PD, n int, access nprdma.Access) (*nprdma.MR, error) {
		mem, err := nprdma.AllocBuffer(max(n, 4096))
		if err != nil {
			return nil, err
		}
		p.mems = append(p.mems, mem)
		FillPattern(mem) // real data: never-written pages all read as the one zero page
		return pd.Register(mem, access)
	}
	if p.Local, err = alloc(cpd, o.LocalSize, nprdma.AccessLocalWrite); err != nil {
		return nil, err
	}
	access := o.RemoteAccess
	if access == 0 {
		access = nprdma.AccessLocalWrite | nprdma.AccessRemoteRead | nprdma.AccessRemoteWrite
	}
	if p.Remote, err = alloc(spd, max(o.RemoteSize, o.RecvSize), access); err != nil {
		return nil, err
	}
	// Receives land in the remote region's slots in turn, as READs and
	// WRITEs at the same depth use them.
	recvSlots := max(1, o.RemoteSize/max(o.RecvSize, 1))
	recv := func(i int) nprdma.RecvWR {
		slot := i % recvSlots
		return nprdma.RecvWR{ID: uint64(slot), SG: []nprdma.SGE{p.Remote.SGE(slot*o.RecvSize, o.RecvSize)}}
	}
	if o.RecvSize > 0 {
		for i := 0; i < recvDepth; i++ {
			if err := p.Srv.PostRecv(recv(i)); err != nil {
				return nil, err
			}
		}
	}
	ln, err := p.SrvDev.Listen(ListenAddr(prov))
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	accepted := make(chan error, 1)
	go func() {
		req, err := ln.Accept(ctx)
		if err == nil {
			err = req.Accept(p.Srv, nil)
		}
		accepted <- err
	}()
	if _, err := p.Cli.Connect(ctx, ln.Addr(), nil); err != nil {
		return nil, err
	}
	if err := <-accepted; err != nil {
		return nil, err
	}
	if o.RecvSize > 0 {
		// Repost each consumed receive, so SENDs never meet an RNR.
		rctx, cancel := context.WithCancel(context.Background())
		p.stopRecv, p.recvDone = cancel, make(chan struct{})
		go func() {
			defer close(p.recvDone)
			wcs := make([]nprdma.WC, 64)
			for {
				n, err := p.srvRCQ.Wait(rctx, wcs)
				if err != nil {
					return
				}
				for i := 0; i < n; i++ {
					if wcs[i].Status != nprdma.StatusSuccess || p.Srv.PostRecv(recv(int(wcs[i].ID))) != nil {
						return
					}
				}
			}
		}()
	}
	ok = true
	return p, nil
}

// Close closes both devices and frees the memory.
func (p *Pair) Close() {
	if p.stopRecv != nil {
		p.stopRecv()
		<-p.recvDone
	}
	p.CliDev.Close()
	p.SrvDev.Close()
	for _, m := range p.mems {
		nprdma.FreeBuffer(m)
	}
}

// WR builds the work request for op on slot i (each slot has its own local
// and remote bytes).
func (p *Pair) WR(op nprdma.Opcode, size, slot int) nprdma.SendWR {
	w := nprdma.SendWR{ID: uint64(slot), Op: op, SG: []nprdma.SGE{p.Local.SGE(slot*size, size)}, Signaled: true}
	if op == nprdma.OpRead || op == nprdma.OpWrite {
		w.RemoteAddr, w.RKey = p.Remote.Addr()+uint64(slot*size), p.Remote.RKey()
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

// Once posts w on the client and waits for its completion (queue depth 1).
func (p *Pair) Once(ctx context.Context, w nprdma.SendWR) error {
	if err := p.Cli.PostSend(w); err != nil {
		return err
	}
	if _, err := p.SendCQ.Wait(ctx, p.wcs); err != nil {
		return err
	}
	if p.wcs[0].Status != nprdma.StatusSuccess {
		return fmt.Errorf("nprdmabench: %s completed with %s", w.Op, p.wcs[0].Status)
	}
	return nil
}

// OpLatency measures the latency of one op of size bytes (post to
// completion) at queue depth 1 over prov.
func OpLatency(ctx context.Context, prov nprdma.Provider, op nprdma.Opcode, size, samples int, busyPoll bool) (LatencyResult, error) {
	if err := checkOp(op); err != nil {
		return LatencyResult{}, err
	}
	o := PairOptions{LocalSize: size, RemoteSize: size, BusyPoll: busyPoll}
	if op == nprdma.OpSend {
		o.RecvSize = size
	}
	p, err := NewPair(ctx, prov, o)
	if err != nil {
		return LatencyResult{}, err
	}
	defer p.Close()
	w := p.WR(op, size, 0)
	lat := make([]time.Duration, 0, samples)
	for i := 0; i < samples+bench.WarmUpOps(samples); i++ {
		t0 := time.Now()
		if err := p.Once(ctx, w); err != nil {
			return LatencyResult{}, err
		}
		if i >= bench.WarmUpOps(samples) {
			lat = append(lat, time.Since(t0))
		}
	}
	return summarize(opName(prov, op, size, busyPoll), lat), nil
}

// OpThroughput keeps qd ops of size bytes outstanding over prov for dur.
func OpThroughput(ctx context.Context, prov nprdma.Provider, op nprdma.Opcode, size, qd int, dur time.Duration, busyPoll bool) (ThroughputResult, error) {
	s, err := NewOpStream(ctx, prov, op, size, qd, busyPoll)
	if err != nil {
		return ThroughputResult{}, err
	}
	defer s.Close()
	return s.Run(ctx, dur)
}

// OpStream is OpThroughput's pair of devices kept between runs, so that its
// runs can take turns with another stream's (see RawStream).
type OpStream struct {
	p        *Pair
	op       nprdma.Opcode
	size, qd int
	name     string
	wcs      []nprdma.WC
}

// NewOpStream connects a pair for qd ops of size bytes over prov.
func NewOpStream(ctx context.Context, prov nprdma.Provider, op nprdma.Opcode, size, qd int, busyPoll bool) (*OpStream, error) {
	if err := checkOp(op); err != nil {
		return nil, err
	}
	if qd < 1 || qd > 512 {
		return nil, fmt.Errorf("nprdmabench: queue depth %d outside [1, 512]", qd)
	}
	o := PairOptions{LocalSize: size * qd, RemoteSize: size * qd, BusyPoll: busyPoll}
	if op == nprdma.OpSend {
		o.RecvSize = size
	}
	p, err := NewPair(ctx, prov, o)
	if err != nil {
		return nil, err
	}
	return &OpStream{p: p, op: op, size: size, qd: qd, name: opName(prov, op, size, busyPoll) + fmt.Sprintf("-qd%d", qd),
		wcs: make([]nprdma.WC, qd)}, nil
}

// Run keeps qd ops outstanding for d, then waits for those still
// outstanding (counted, and timed: draining is part of a run).
func (s *OpStream) Run(ctx context.Context, d time.Duration) (ThroughputResult, error) {
	start := time.Now()
	for i := 0; i < s.qd; i++ {
		if err := s.p.Cli.PostSend(s.p.WR(s.op, s.size, i)); err != nil {
			return ThroughputResult{}, err
		}
	}
	ops, outstanding := 0, s.qd
	deadline := start.Add(d)
	for outstanding > 0 {
		n, err := s.p.SendCQ.Wait(ctx, s.wcs)
		if err != nil {
			return ThroughputResult{}, err
		}
		outstanding -= n
		more := time.Now().Before(deadline)
		for _, wc := range s.wcs[:n] {
			if wc.Status != nprdma.StatusSuccess {
				return ThroughputResult{}, fmt.Errorf("nprdmabench: %s completed with %s", s.op, wc.Status)
			}
			ops++
			if more {
				if err := s.p.Cli.PostSend(s.p.WR(s.op, s.size, int(wc.ID))); err != nil {
					return ThroughputResult{}, err
				}
				outstanding++
			}
		}
	}
	return throughput(s.name, s.size, s.qd, ops, time.Since(start)), nil
}

// Close closes the pair.
func (s *OpStream) Close() { s.p.Close() }

// UnpinnedReadLatency measures READs of size bytes from an unpinned region
// over pager (the NP read path without faults when every page is resident),
// walking through the region.
func UnpinnedReadLatency(ctx context.Context, prov nprdma.Provider, pager nprdma.Pager, size, samples int) (LatencyResult, error) {
	p, err := NewPair(ctx, prov, PairOptions{LocalSize: size, RemoteSize: 4096})
	if err != nil {
		return LatencyResult{}, err
	}
	defer p.Close()
	mr, err := p.Srv.PD().RegisterUnpinned(pager, nprdma.AccessRemoteRead)
	if err != nil {
		return LatencyResult{}, err
	}
	defer mr.Deregister()
	if size > mr.Len() {
		return LatencyResult{}, fmt.Errorf("nprdmabench: %d-byte reads from a %d-byte region", size, mr.Len())
	}
	slots := mr.Len() / size
	lat := make([]time.Duration, 0, samples)
	for i := 0; i < samples+bench.WarmUpOps(samples); i++ {
		w := nprdma.SendWR{Op: nprdma.OpRead, SG: []nprdma.SGE{p.Local.SGE(0, size)}, RemoteAddr: mr.Addr() + uint64((i%slots)*size), RKey: mr.RKey(), Signaled: true}
		t0 := time.Now()
		if err := p.Once(ctx, w); err != nil {
			return LatencyResult{}, err
		}
		p.CliDev.FindMagicPages(p.Local.Bytes()[:size], w.RemoteAddr, mr.Addr(), mr.PageSize(), mr.Magic())
		if i >= bench.WarmUpOps(samples) {
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
	p, err := NewPair(ctx, prov, PairOptions{LocalSize: 4096, RemoteSize: size, Pin: true})
	if err != nil {
		return pooled, perIO, err
	}
	defer p.Close()
	pool, err := nprdma.NewBufferPool(p.Cli.PD(), nprdma.AccessLocalWrite)
	if err != nil {
		return pooled, perIO, err
	}
	defer pool.Close()
	ops, took, err := p.PooledReads(ctx, pool, size, dur)
	if err != nil {
		return pooled, perIO, err
	}
	pooled = throughput(fmt.Sprintf("%s-READ-%d-pooled", prov.Name(), size), size, 1, ops, took)
	mem, err := nprdma.AllocBuffer(size)
	if err != nil {
		return pooled, perIO, err
	}
	defer nprdma.FreeBuffer(mem)
	if ops, took, err = p.RegisteredReads(ctx, mem, size, dur); err != nil {
		return pooled, perIO, err
	}
	perIO = throughput(fmt.Sprintf("%s-READ-%d-register-per-io", prov.Name(), size), size, 1, ops, took)
	return pooled, perIO, nil
}

// PooledReads READs size bytes of the remote region at queue depth 1 for d,
// each into a buffer taken from pool and released after it; it returns the
// operations done and the time they took.
func (p *Pair) PooledReads(ctx context.Context, pool *nprdma.BufferPool, size int, d time.Duration) (int, time.Duration, error) {
	ops := 0
	start := time.Now()
	for time.Since(start) < d {
		b, err := pool.Get(size)
		if err != nil {
			return ops, time.Since(start), err
		}
		err = p.Once(ctx, p.readInto(b.SGE()))
		b.Release()
		if err != nil {
			return ops, time.Since(start), err
		}
		ops++
	}
	return ops, time.Since(start), nil
}

// RegisteredReads READs size bytes of the remote region at queue depth 1
// for d into mem, registered (pinned, with the client device's pinning)
// before each READ and deregistered after it, as a data path without a pool
// would; it returns the operations done and the time they took.
func (p *Pair) RegisteredReads(ctx context.Context, mem []byte, size int, d time.Duration) (int, time.Duration, error) {
	pd := p.Cli.PD()
	ops := 0
	start := time.Now()
	for time.Since(start) < d {
		mr, err := pd.Register(mem[:size], nprdma.AccessLocalWrite)
		if err != nil {
			return ops, time.Since(start), err
		}
		err = p.Once(ctx, p.readInto(mr.SGE(0, size)))
		if derr := mr.Deregister(); err == nil {
			err = derr
		}
		if err != nil {
			return ops, time.Since(start), err
		}
		ops++
	}
	return ops, time.Since(start), nil
}

// readInto is a READ of the start of the remote region into sge.
func (p *Pair) readInto(sge nprdma.SGE) nprdma.SendWR {
	return nprdma.SendWR{Op: nprdma.OpRead, SG: []nprdma.SGE{sge}, RemoteAddr: p.Remote.Addr(), RKey: p.Remote.RKey(), Signaled: true}
}
