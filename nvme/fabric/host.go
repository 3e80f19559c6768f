package fabric

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/internal/turns"
)

// HostAccess is the access a host's data pool must grant: the controller
// RDMA READs write data from it and RDMA WRITEs read data into it.
const HostAccess = nprdma.AccessLocalWrite | nprdma.AccessRemoteRead | nprdma.AccessRemoteWrite

// DefaultReadSlots bounds the one-sided READs (or batches of them) in
// flight on one host queue.
const DefaultReadSlots = 64

// MaxReadBatch is the most READs ReadRemoteBatch posts at once.
const MaxReadBatch = 32

// QueueConfig describes the queue a host dials.
type QueueConfig struct {
	// QID is the queue ID: 0 for the admin queue.
	QID uint16
	// Entries is the submission queue size (2..65536); the controller may
	// accept fewer (its CRQSIZE).
	Entries int
	// InCapsuleData is the in-capsule data the controller accepts on this
	// queue (nvme.ICDLimit of Identify IOCCSZ on I/O queues; 0 on admin).
	InCapsuleData int
	// CNTLID goes into the connection request (informational).
	CNTLID uint16
}

// DialOption configures Dial.
type DialOption func(*dialConfig)

type dialConfig struct {
	pool      *nprdma.BufferPool
	qpTimeout time.Duration
	busyPoll  time.Duration
	readSlots int
}

// WithPool makes the queue take data buffers from pool, which must grant
// HostAccess (default: a pool of the queue's own).
func WithPool(pool *nprdma.BufferPool) DialOption { return func(c *dialConfig) { c.pool = pool } }

// WithQPTimeout sets the queue pair's peer-silence timeout
// (nprdma.QPConfig.Timeout).
func WithQPTimeout(d time.Duration) DialOption { return func(c *dialConfig) { c.qpTimeout = d } }

// WithCompletionBusyPoll makes the goroutine waiting for completions spin
// for up to d before parking (nprdma.WithBusyPoll).
func WithCompletionBusyPoll(d time.Duration) DialOption {
	return func(c *dialConfig) { c.busyPoll = d }
}

// WithReadSlots bounds the one-sided READs in flight (default
// DefaultReadSlots).
func WithReadSlots(n int) DialOption { return func(c *dialConfig) { c.readSlots = n } }

// HostQueue is the host side of one queue. Submit, SubmitBuffer and
// ReadRemote may be called from many goroutines at once.
//
// Completions are dispatched without a goroutine of the queue's own: the
// goroutines waiting for their commands take turns polling the completion
// queue (leader/follower, package turns). The leader delivers every
// completion it finds
// and hands the role over when its own command is done, so with one
// command in flight its submitter is woken directly by the queue pair and
// no hand-off between goroutines sits on the path.
type HostQueue struct {
	qid     uint16
	addr    string
	entries int
	icd     int
	qp      *nprdma.QP
	cq      *nprdma.CQ
	pool    *nprdma.BufferPool
	ownPool bool
	recvBuf []byte
	recvMR  *nprdma.MR
	maxInl  int

	turns turns.Turns // the goroutine polling the CQ holds the role
	cids  chan uint16
	rslot chan int
	wcs   []nprdma.WC // leader only

	mu     sync.Mutex
	calls  []*call // by CID
	reads  []*call // by read slot
	failed error

	ctx       context.Context // ends when the queue fails
	cancel    context.CancelFunc
	closeOnce sync.Once
	closed    chan struct{}
}

// call is a command or READ slot; its wait state is guarded by q.mu.
type call struct {
	turns.Slot
	cqe     nvme.Completion
	err     error
	capsule *nprdma.Buffer
	data    *nprdma.Buffer // a pool buffer of the queue's (copy mode)
	st      nprdma.Status  // READ completions
	scratch []byte         // inline capsule bytes (command slots only)
}

// newIdleCall returns a call slot that is not in use: finished, so that a
// failing queue skips it.
func newIdleCall() *call {
	c := &call{}
	c.Init()
	return c
}

// Dial connects a queue to the controller at addr with a queue pair of pd.
// A refusal is a *nvme.CMRejectError.
func Dial(ctx context.Context, pd *nprdma.PD, addr string, qc QueueConfig, opts ...DialOption) (*HostQueue, error) {
	cfg := dialConfig{readSlots: DefaultReadSlots}
	for _, o := range opts {
		o(&cfg)
	}
	if qc.Entries < 2 || qc.Entries > 1<<16 {
		return nil, fmt.Errorf("nvme fabric: dial queue %d at %s: %d entries outside [2, 65536]", qc.QID, addr, qc.Entries)
	}
	q := &HostQueue{qid: qc.QID, addr: addr, entries: qc.Entries, icd: qc.InCapsuleData, pool: cfg.pool,
		maxInl: nprdma.MaxInlineLimit, closed: make(chan struct{})}
	dev := pd.Device()
	if q.pool == nil {
		pool, err := nprdma.NewBufferPool(pd, HostAccess)
		if err != nil {
			return nil, fmt.Errorf("nvme fabric: dial queue %d at %s: %w", qc.QID, addr, err)
		}
		q.pool, q.ownPool = pool, true
	}
	cleanup := func() {
		if q.qp != nil {
			q.qp.Close()
		}
		if q.cq != nil {
			q.cq.Close()
		}
		if q.recvMR != nil {
			q.recvMR.Deregister()
		}
		if q.ownPool {
			q.pool.Close()
		}
	}
	var err error
	if q.recvBuf, err = nprdma.AllocBuffer(qc.Entries * nvme.CQESize); err != nil {
		cleanup()
		return nil, fmt.Errorf("nvme fabric: dial queue %d at %s: %w", qc.QID, addr, err)
	}
	// A leader may be reading a completion from recvBuf as the queue
	// fails: the mapping goes when the queue is unreachable.
	runtime.AddCleanup(q, func(b []byte) { nprdma.FreeBuffer(b) }, q.recvBuf)
	if q.recvMR, err = pd.Register(q.recvBuf, nprdma.AccessLocalWrite); err != nil {
		cleanup()
		return nil, fmt.Errorf("nvme fabric: dial queue %d at %s: %w", qc.QID, addr, err)
	}
	// Room for the commands, a READ per slot and two batches besides; a
	// batch that finds the queue full waits for room (ReadRemoteBatch).
	sendDepth := qc.Entries + cfg.readSlots + 2*MaxReadBatch + 8
	var cqOpts []nprdma.CQOption
	if cfg.busyPoll > 0 {
		cqOpts = append(cqOpts, nprdma.WithBusyPoll(cfg.busyPoll))
	}
	q.cq = dev.NewCQ(sendDepth+qc.Entries+8, cqOpts...)
	q.qp, err = pd.NewQP(nprdma.QPConfig{SendCQ: q.cq, SendDepth: sendDepth, RecvDepth: qc.Entries,
		MaxInline: q.maxInl, Timeout: cfg.qpTimeout})
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("nvme fabric: dial queue %d at %s: %w", qc.QID, addr, err)
	}
	q.maxInl = q.qp.MaxInline() // hardware may grant less: larger capsules go from a registered buffer
	for i := 0; i < qc.Entries; i++ {
		if err := q.postRecv(i); err != nil {
			cleanup()
			return nil, fmt.Errorf("nvme fabric: dial queue %d at %s: post receive: %w", qc.QID, addr, err)
		}
	}
	req := nvme.CMRequest{QID: qc.QID, HRQSIZE: uint16(qc.Entries), HSQSIZE: uint16(qc.Entries - 1), CNTLID: qc.CNTLID}
	reply, err := q.qp.Connect(ctx, addr, req.Marshal())
	if err != nil {
		cleanup()
		var rej *nprdma.RejectError
		if errors.As(err, &rej) {
			if r, perr := nvme.ParseCMReject(rej.PrivateData); perr == nil {
				return nil, fmt.Errorf("nvme fabric: queue %d at %s: %w", qc.QID, addr, &nvme.CMRejectError{Status: r.Status, Detail: "connection refused by the controller"})
			}
		}
		return nil, fmt.Errorf("nvme fabric: connect queue %d to %s: %w", qc.QID, addr, err)
	}
	acc, err := nvme.ParseCMAccept(reply)
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("nvme fabric: connect queue %d to %s: %w", qc.QID, addr, err)
	}
	if n := int(acc.CRQSIZE); n >= 1 && n < q.entries {
		q.entries = n // the controller holds fewer capsules than asked
	}
	q.turns = turns.New()
	q.cids = make(chan uint16, q.entries)
	q.calls = make([]*call, q.entries)
	for i := 0; i < q.entries; i++ {
		q.cids <- uint16(i)
		q.calls[i] = newIdleCall()
		q.calls[i].scratch = make([]byte, q.maxInl)
	}
	q.rslot = make(chan int, cfg.readSlots)
	q.reads = make([]*call, cfg.readSlots)
	for i := range q.reads {
		q.rslot <- i
		q.reads[i] = newIdleCall()
	}
	q.wcs = make([]nprdma.WC, 64)
	q.ctx, q.cancel = context.WithCancel(context.Background())
	go q.watch()
	return q, nil
}

func (q *HostQueue) postRecv(i int) error {
	return q.qp.PostRecv(nprdma.RecvWR{ID: wrRecv | uint64(i), SG: []nprdma.SGE{q.recvMR.SGE(i*nvme.CQESize, nvme.CQESize)}})
}

// QID is the queue ID.
func (q *HostQueue) QID() uint16 { return q.qid }

// Entries is the number of commands the queue holds in flight.
func (q *HostQueue) Entries() int { return q.entries }

// InCapsuleData is the in-capsule data limit the queue uses for writes.
func (q *HostQueue) InCapsuleData() int { return q.icd }

// SetInCapsuleData changes the in-capsule data limit (the admin queue
// learns the I/O queues' limit from Identify only after connecting).
func (q *HostQueue) SetInCapsuleData(n int) { q.icd = n }

// Pool is the pool the queue takes data buffers from.
func (q *HostQueue) Pool() *nprdma.BufferPool { return q.pool }

// QP is the queue's queue pair.
func (q *HostQueue) QP() *nprdma.QP { return q.qp }

// Done is closed when the queue has failed or was closed; Err says why.
func (q *HostQueue) Done() <-chan struct{} { return q.closed }

// Err is the reason the queue failed (nil while it works).
func (q *HostQueue) Err() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.failed
}

// Close closes the queue: commands in flight fail with ErrQueueFailed.
func (q *HostQueue) Close() error {
	q.fail(fmt.Errorf("queue %d to %s: %w: closed by the host", q.qid, q.addr, ErrQueueFailed))
	return nil
}

func (q *HostQueue) watch() {
	select {
	case <-q.qp.Done():
		q.fail(fmt.Errorf("queue %d to %s: %w: %w", q.qid, q.addr, ErrQueueFailed, q.qp.Err()))
	case <-q.ctx.Done():
	}
}

// fail closes the queue pair first (after Close returns nothing lands in or
// leaves our buffers any more), then completes every command and READ in
// flight with err.
func (q *HostQueue) fail(err error) {
	q.closeOnce.Do(func() {
		q.mu.Lock()
		q.failed = err
		q.mu.Unlock()
		q.cancel()
		q.qp.Close()
		q.mu.Lock()
		for _, c := range q.calls {
			q.finishLocked(c, err)
		}
		for _, c := range q.reads {
			q.finishLocked(c, err)
		}
		q.mu.Unlock()
		q.cq.Close()
		q.recvMR.Deregister()
		if q.ownPool {
			q.pool.Close() // fails (and stays open) while a caller holds a buffer
		}
		close(q.closed)
	})
}

// Submit sends cmd with data and waits for its completion. For a command
// that moves data to the controller, data is the payload: in the capsule
// when it fits the queue's in-capsule limit, else copied into a registered
// buffer the controller reads; for one that moves data to the host, data
// is filled from a registered buffer the controller writes. cmd.DPTR and
// cmd.CID are set here. The error is a transport error (wrapping
// ErrQueueFailed) or, for an unsuccessful completion, cqe.Err().
func (q *HostQueue) Submit(ctx context.Context, cmd nvme.Command, data []byte) (nvme.Completion, error) {
	if err := q.Err(); err != nil {
		return nvme.Completion{}, err
	}
	if len(data) == 0 {
		return q.submit(ctx, cmd, nil, nil, nil, true)
	}
	dir := cmd.Direction()
	if dir == nvme.HostToController && len(data) <= q.icd {
		cmd.DPTR = nvme.InCapsuleSGL(0, uint32(len(data)))
		return q.submit(ctx, cmd, data, nil, nil, true)
	}
	if len(data) > MaxTransfer {
		return nvme.Completion{}, fmt.Errorf("nvme fabric: queue %d: transfer of %d bytes beyond %d", q.qid, len(data), MaxTransfer)
	}
	buf, err := q.pool.Get(len(data))
	if err != nil {
		if qerr := q.Err(); qerr != nil {
			return nvme.Completion{}, qerr // closed meanwhile, its pool with it: the queue's failure says why
		}
		return nvme.Completion{}, fmt.Errorf("nvme fabric: queue %d: %w", q.qid, err)
	}
	if dir == nvme.HostToController {
		copy(buf.Bytes(), data)
	}
	if cmd.DPTR, err = nvme.KeyedSGL(buf.Addr(), uint32(len(data)), buf.RKey()); err != nil {
		buf.Release()
		return nvme.Completion{}, err
	}
	var out []byte
	if dir != nvme.HostToController {
		out = data
	}
	return q.submit(ctx, cmd, nil, buf, out, true)
}

// SubmitBuffer sends cmd with its data in n bytes at offset off of buf, a
// registered buffer granting HostAccess (from the queue's pool or any
// other of the same protection domain): the controller moves the data with
// RDMA, no copy is made. Because the controller may write into buf until
// the command completes, ctx bounds only the wait for a free command slot:
// once sent, SubmitBuffer returns when the command completes or the queue
// fails (the queue pair's timeout bounds that), never earlier.
func (q *HostQueue) SubmitBuffer(ctx context.Context, cmd nvme.Command, buf *nprdma.Buffer, off, n int) (nvme.Completion, error) {
	if off < 0 || n <= 0 || off+n > len(buf.Bytes()) || n > MaxTransfer {
		return nvme.Completion{}, fmt.Errorf("nvme fabric: queue %d: [%d, +%d) outside the %d-byte buffer", q.qid, off, n, len(buf.Bytes()))
	}
	var err error
	if cmd.DPTR, err = nvme.KeyedSGL(buf.Addr()+uint64(off), uint32(n), buf.RKey()); err != nil {
		return nvme.Completion{}, err
	}
	return q.submit(ctx, cmd, nil, nil, nil, false)
}

func (q *HostQueue) submit(ctx context.Context, cmd nvme.Command, icd []byte, dataBuf *nprdma.Buffer, out []byte, mayAbandon bool) (nvme.Completion, error) {
	var cid uint16
	select {
	case cid = <-q.cids:
	case <-q.closed:
		if dataBuf != nil {
			dataBuf.Release()
		}
		return nvme.Completion{}, q.Err()
	case <-ctx.Done():
		if dataBuf != nil {
			dataBuf.Release()
		}
		return nvme.Completion{}, ctx.Err()
	}
	c := q.calls[cid]
	cmd.CID = cid
	c.data = dataBuf
	wr := nprdma.SendWR{ID: wrSend | uint64(cid), Op: nprdma.OpSend}
	n := nvme.SQESize + len(icd)
	if n <= q.maxInl {
		b := c.scratch[:n]
		cmd.MarshalTo(b)
		copy(b[nvme.SQESize:], icd)
		wr.Inline, wr.InlineData = true, b
	} else {
		cb, err := q.pool.Get(n)
		if err != nil {
			q.recycle(c, cid)
			if qerr := q.Err(); qerr != nil {
				return nvme.Completion{}, qerr
			}
			return nvme.Completion{}, fmt.Errorf("nvme fabric: queue %d: capsule buffer: %w", q.qid, err)
		}
		cmd.MarshalTo(cb.Bytes())
		copy(cb.Bytes()[nvme.SQESize:], icd)
		c.capsule = cb
		wr.SG = []nprdma.SGE{cb.SGE()}
	}
	q.mu.Lock()
	if q.failed != nil {
		err := q.failed
		q.mu.Unlock()
		q.recycle(c, cid)
		return nvme.Completion{}, err
	}
	c.StartLocked()
	q.mu.Unlock()
	if err := q.qp.PostSend(wr); err != nil {
		q.mu.Lock()
		q.finishLocked(c, fmt.Errorf("queue %d to %s: %w: %w", q.qid, q.addr, ErrQueueFailed, err))
		q.mu.Unlock()
	}
	wctx := ctx
	if !mayAbandon {
		wctx = context.Background()
	}
	if err := q.turns.Wait(wctx, &c.Slot, &q.mu, (*leader)(q)); err != nil {
		return nvme.Completion{}, err // abandoned: recycled when it completes
	}
	cqe, err := c.cqe, c.err
	if err == nil && out != nil && cqe.Status.OK() {
		copy(out, c.data.Bytes())
	}
	q.recycle(c, cid)
	if err != nil {
		return nvme.Completion{}, err
	}
	return cqe, cqe.Err()
}

// recycle releases a call's buffers and returns its CID.
func (q *HostQueue) recycle(c *call, cid uint16) {
	if c.capsule != nil {
		c.capsule.Release()
		c.capsule = nil
	}
	if c.data != nil {
		c.data.Release()
		c.data = nil
	}
	c.err = nil
	q.cids <- cid
}

// ReadRemote reads n bytes at raddr of the peer's region rkey into buf at
// off with a one-sided RDMA READ on this queue's queue pair. A refused key
// fails the queue pair (as in RC): the error wraps nprdma.ErrRemoteAccess
// and ErrQueueFailed. As for SubmitBuffer, ctx bounds only the wait for a
// READ slot: the READ lands in buf, so ReadRemote waits for it to complete
// or for the queue to fail.
func (q *HostQueue) ReadRemote(ctx context.Context, buf *nprdma.Buffer, off, n int, raddr uint64, rkey uint32) error {
	return q.readRemote(ctx, buf, []RemoteRead{{Off: off, N: n, Addr: raddr, RKey: rkey}})
}

// RemoteRead is one READ of a batch: n bytes at raddr of the peer's region
// rkey into the buffer at off.
type RemoteRead struct {
	Off, N int
	Addr   uint64
	RKey   uint32
}

// ReadRemoteBatch reads several ranges of the peer's memory into buf with
// one-sided RDMA READs posted together (at most MaxReadBatch), and returns
// when all have completed. It fails, with the queue, as ReadRemote does.
func (q *HostQueue) ReadRemoteBatch(ctx context.Context, buf *nprdma.Buffer, reads []RemoteRead) error {
	if len(reads) == 0 {
		return nil
	}
	if len(reads) > MaxReadBatch {
		return fmt.Errorf("nvme fabric: queue %d: %d READs in a batch, at most %d", q.qid, len(reads), MaxReadBatch)
	}
	return q.readRemote(ctx, buf, reads)
}

// readRemote posts reads (1 to MaxReadBatch) and waits for them.
func (q *HostQueue) readRemote(ctx context.Context, buf *nprdma.Buffer, reads []RemoteRead) error {
	var wrs [MaxReadBatch]nprdma.SendWR
	var sges [MaxReadBatch]nprdma.SGE
	base := buf.SGE()
	for i, r := range reads {
		if r.Off < 0 || r.N <= 0 || r.Off+r.N > len(buf.Bytes()) {
			return fmt.Errorf("nvme fabric: queue %d: READ into [%d, +%d) outside the %d-byte buffer", q.qid, r.Off, r.N, len(buf.Bytes()))
		}
		sges[i] = nprdma.SGE{Addr: base.Addr + uint64(r.Off), Length: uint32(r.N), LKey: base.LKey}
	}
	var slot int
	select {
	case slot = <-q.rslot:
	case <-q.closed:
		return q.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
	c := q.reads[slot]
	q.mu.Lock()
	if q.failed != nil {
		err := q.failed
		q.mu.Unlock()
		q.rslot <- slot
		return err
	}
	c.StartLocked()
	q.mu.Unlock()
	// Only the last READ is signaled: RC completes them in order, and an
	// error completes whichever failed (the queue pair fails with it).
	for i, r := range reads {
		wrs[i] = nprdma.SendWR{ID: wrRead | uint64(slot), Op: nprdma.OpRead, SG: sges[i : i+1 : i+1],
			RemoteAddr: r.Addr, RKey: r.RKey, Signaled: i == len(reads)-1}
	}
	for {
		err := q.qp.PostSend(wrs[:len(reads)]...)
		if err == nil {
			break
		}
		if errors.Is(err, nprdma.ErrQueueFull) && q.Err() == nil {
			time.Sleep(50 * time.Microsecond) // the other batches leave room as they complete
			continue
		}
		q.mu.Lock()
		q.finishLocked(c, fmt.Errorf("queue %d to %s: %w: %w", q.qid, q.addr, ErrQueueFailed, err))
		q.mu.Unlock()
		break
	}
	if err := q.turns.Wait(context.Background(), &c.Slot, &q.mu, (*leader)(q)); err != nil {
		return err
	}
	err := c.err
	if err == nil && c.st != nprdma.StatusSuccess {
		// The queue pair fails with the READ; its reason names the cause.
		what := fmt.Sprintf("batch of %d READs", len(reads))
		if r := reads[0]; len(reads) == 1 {
			what = fmt.Sprintf("READ of %d bytes at %#x (rkey %#x)", r.N, r.Addr, r.RKey)
		}
		err = fmt.Errorf("queue %d to %s: %s: %s: %w", q.qid, q.addr, what, c.st, q.qpErr())
	}
	c.err = nil
	q.rslot <- slot
	return err
}

func (q *HostQueue) qpErr() error {
	select {
	case <-q.qp.Done():
		return errors.Join(ErrQueueFailed, q.qp.Err())
	case <-time.After(time.Second):
		return ErrQueueFailed
	}
}

// leader is the queue as it leads (turns.Leader).
type leader HostQueue

// Lead polls the completion queue and dispatches what it finds until s is
// finished, the queue fails (s is then finished too) or ctx ends.
func (l *leader) Lead(ctx context.Context, s *turns.Slot) error {
	q := (*HostQueue)(l)
	wctx := q.ctx
	if ctx.Done() != nil {
		var cancel context.CancelFunc
		wctx, cancel = context.WithCancel(q.ctx)
		defer context.AfterFunc(ctx, cancel)()
		defer cancel()
	}
	for !s.Finished() {
		n, err := q.cq.Wait(wctx, q.wcs)
		for i := 0; i < n; i++ {
			q.dispatch(&q.wcs[i])
		}
		if err != nil && !s.Finished() {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// The queue failed: fail completes every call, s's included.
			q.fail(fmt.Errorf("queue %d to %s: %w: %w", q.qid, q.addr, ErrQueueFailed, err))
		}
	}
	return nil
}

func (q *HostQueue) dispatch(wc *nprdma.WC) {
	idx := int(wc.ID &^ wrKind)
	switch wc.ID & wrKind {
	case wrRecv:
		if wc.Status != nprdma.StatusSuccess {
			return
		}
		var cqe nvme.Completion
		if wc.ByteLen != nvme.CQESize || cqe.Unmarshal(q.recvBuf[idx*nvme.CQESize:(idx+1)*nvme.CQESize]) != nil {
			q.postRecv(idx)
			return
		}
		q.postRecv(idx)
		if int(cqe.CID) >= len(q.calls) {
			return // not a command of ours
		}
		q.mu.Lock()
		c := q.calls[cqe.CID]
		if !c.Finished() && q.failed == nil {
			c.cqe = cqe
			q.finishLocked(c, nil)
		}
		q.mu.Unlock()
	case wrRead:
		if idx >= len(q.reads) {
			return
		}
		q.mu.Lock()
		c := q.reads[idx]
		if !c.Finished() {
			c.st = wc.Status
			q.finishLocked(c, nil)
		}
		q.mu.Unlock()
	case wrSend:
		if wc.Status != nprdma.StatusSuccess && wc.Status != nprdma.StatusWRFlushed && idx < len(q.calls) {
			// The capsule never reached the controller.
			q.mu.Lock()
			q.finishLocked(q.calls[idx], fmt.Errorf("queue %d to %s: %w: capsule send: %s", q.qid, q.addr, ErrQueueFailed, wc.Status))
			q.mu.Unlock()
		}
	}
}

// finishLocked records c's outcome and signals its waiter; an abandoned
// call is recycled here instead. Calls that are idle (not submitted) are
// skipped: they are finished already.
func (q *HostQueue) finishLocked(c *call, err error) {
	if c.Finished() {
		return
	}
	c.err = err
	if c.FinishLocked() {
		q.recycleAbandonedLocked(c)
	}
}

func (q *HostQueue) recycleAbandonedLocked(c *call) {
	if c.capsule != nil {
		c.capsule.Release()
		c.capsule = nil
	}
	if c.data != nil {
		c.data.Release()
		c.data = nil
	}
	for i, cc := range q.calls {
		if cc == c {
			q.cids <- uint16(i)
			return
		}
	}
	for i, cc := range q.reads {
		if cc == c {
			q.rslot <- i
			return
		}
	}
}
