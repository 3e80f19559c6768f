package fabric

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nvme"
)

// Work request IDs carry their kind in the top byte and an index below.
const (
	wrRecv  uint64 = 1 << 56
	wrSend  uint64 = 2 << 56
	wrWrite uint64 = 3 << 56
	wrRead  uint64 = 4 << 56
	wrKind  uint64 = 0xff << 56
)

// ErrQueueFailed is wrapped by the errors of operations on a queue whose
// queue pair failed or that was closed (with the queue pair's reason): it is
// nvme.ErrQueueFailed, shared by every transport binding.
var ErrQueueFailed = nvme.ErrQueueFailed

// Handler receives the commands of a queue. It is called on the queue's
// receive loop, one command at a time, and must not block: anything that
// waits (Request.HostData, a backing device, a fault) belongs on another
// goroutine.
type Handler func(*Request)

// QueueStats are a controller queue's counters.
type QueueStats struct {
	Capsules      uint64 // capsules received
	Malformed     uint64 // answered by the binding with an error status
	ShortCapsules uint64 // shorter than an SQE: dropped (no CID to answer)
	Completions   uint64 // completions posted
	HostReads     uint64 // RDMA READs of host data
	HostWrites    uint64 // RDMA WRITEs of data to the host
}

// ControllerQueue is the controller side of one queue: it receives command
// capsules, hands each to the handler as a Request, and sends completions
// (with the data, for commands that return some).
type ControllerQueue struct {
	l          *Listener
	qid        uint16
	entries    int
	icd        int
	stride     int
	remote     string
	hostRecvs  int
	invalidate bool // the device answers with SEND with invalidate
	qp         *nprdma.QP
	cq         *nprdma.CQ
	recvBuf    []byte
	recvMR     *nprdma.MR
	handler    Handler
	head       uint16 // SQ head, advanced per capsule (receive loop only)
	ctx        context.Context
	cancel     context.CancelFunc
	loopDone   chan struct{}
	started    atomic.Bool
	closeOnce  sync.Once
	inflight   sync.WaitGroup
	stats      queueCounters
	mu         sync.Mutex
	reqs       []*Request // by slot: the commands handed out, nil when free
	free       []*Request // released, kept for the next commands (slot included)
	failed     error
	failedFlag atomic.Bool
}

type queueCounters struct {
	capsules, malformed, short, completions, hostReads, hostWrites atomic.Uint64
}

func newControllerQueue(l *Listener, cm nvme.CMRequest, entries, icd int, remote string) (*ControllerQueue, error) {
	dev := l.pd.Device()
	stride := (nvme.SQESize + icd + 63) &^ 63
	recvBuf, err := nprdma.AllocBuffer(entries * stride)
	if err != nil {
		return nil, fmt.Errorf("queue %d: receive buffers: %w", cm.QID, err)
	}
	q := &ControllerQueue{
		l: l, qid: cm.QID, entries: entries, icd: icd, stride: stride, remote: remote,
		hostRecvs:  int(cm.HRQSIZE),
		invalidate: dev.Caps().SendWithInvalidate,
		recvBuf:    recvBuf,
		loopDone:   make(chan struct{}),
	}
	// Handlers read in-capsule data from the receive buffers until they
	// complete, after the queue is gone: the mapping goes with the queue.
	runtime.AddCleanup(q, func(b []byte) { nprdma.FreeBuffer(b) }, recvBuf)
	q.recvMR, err = l.pd.Register(q.recvBuf, nprdma.AccessLocalWrite)
	if err != nil {
		return nil, fmt.Errorf("queue %d: register receive buffers: %w", cm.QID, err)
	}
	// Per command at most: a READ of host data, a WRITE of data, the SEND
	// of the completion. Errors complete every request, so the CQ holds all.
	sendDepth := 3*entries + 8
	var cqOpts []nprdma.CQOption
	if l.cfg.busyPoll > 0 {
		cqOpts = append(cqOpts, nprdma.WithBusyPoll(l.cfg.busyPoll))
	}
	q.cq = dev.NewCQ(sendDepth+entries+8, cqOpts...)
	q.qp, err = l.pd.NewQP(nprdma.QPConfig{SendCQ: q.cq, SendDepth: sendDepth, RecvDepth: entries,
		MaxInline: nvme.CQESize * 4, Timeout: l.cfg.qpTimeout})
	if err != nil {
		q.recvMR.Deregister()
		q.cq.Close()
		return nil, fmt.Errorf("queue %d: %w", cm.QID, err)
	}
	for i := 0; i < entries; i++ {
		if err := q.postRecv(i); err != nil {
			q.destroy()
			return nil, fmt.Errorf("queue %d: post receive: %w", cm.QID, err)
		}
	}
	q.ctx, q.cancel = context.WithCancel(context.Background())
	return q, nil
}

func (q *ControllerQueue) postRecv(i int) error {
	return q.qp.PostRecv(nprdma.RecvWR{ID: wrRecv | uint64(i), SG: []nprdma.SGE{q.recvMR.SGE(i*q.stride, q.stride)}})
}

// destroy releases a queue that never started.
func (q *ControllerQueue) destroy() {
	q.qp.Close()
	q.cq.Close()
	q.recvMR.Deregister()
}

// QID is the queue ID from the connection request (0: admin).
func (q *ControllerQueue) QID() uint16 { return q.qid }

// Entries is the submission queue size (HSQSIZE+1).
func (q *ControllerQueue) Entries() int { return q.entries }

// InCapsuleData is the queue's in-capsule data limit (0 on the admin queue).
func (q *ControllerQueue) InCapsuleData() int { return q.icd }

// RemoteAddr is the host's address.
func (q *ControllerQueue) RemoteAddr() string { return q.remote }

// QP is the queue's queue pair (for diagnostics).
func (q *ControllerQueue) QP() *nprdma.QP { return q.qp }

// Lost is closed as soon as the queue pair is down, before the receive loop
// may have stopped (Done).
func (q *ControllerQueue) Lost() <-chan struct{} { return q.qp.Done() }

// SetAccessTag sets the access tag of the queue pair: memory registered
// with that tag (nprdma.WithAccessTag) is readable over this queue only.
func (q *ControllerQueue) SetAccessTag(tag uint64) { q.qp.SetAccessTag(tag) }

// Done is closed once the queue has failed or been closed and its receive
// loop has stopped.
func (q *ControllerQueue) Done() <-chan struct{} { return q.loopDone }

// Err says why the queue stopped (nil while it runs).
func (q *ControllerQueue) Err() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.failed
}

// Stats returns the queue's counters.
func (q *ControllerQueue) Stats() QueueStats {
	return QueueStats{
		Capsules: q.stats.capsules.Load(), Malformed: q.stats.malformed.Load(), ShortCapsules: q.stats.short.Load(),
		Completions: q.stats.completions.Load(), HostReads: q.stats.hostReads.Load(), HostWrites: q.stats.hostWrites.Load(),
	}
}

// Start runs the receive loop, handing every well-formed command to h.
// Malformed capsules are answered by the binding itself with the status
// nvme.ParseCapsule gives (by CID), so the host's command completes and the
// queue goes on.
func (q *ControllerQueue) Start(h Handler) {
	if !q.started.CompareAndSwap(false, true) {
		return
	}
	q.handler = h
	go q.watch()
	go q.loop()
}

// Close tears the queue down: the queue pair is closed (the host sees its
// link go), commands still executing complete into nothing and release
// their buffers. It returns once the receive loop has stopped.
func (q *ControllerQueue) Close() error {
	q.fail(fmt.Errorf("queue %d from %s: %w: closed by the controller", q.qid, q.remote, ErrQueueFailed))
	if q.started.Load() {
		<-q.loopDone
	} else {
		q.closeOnce.Do(func() { q.teardown() })
	}
	return nil
}

// Wait waits until every command handed out has completed (after Close: has
// released its buffers).
func (q *ControllerQueue) Wait() { q.inflight.Wait() }

// watch turns the queue pair's failure into the end of the receive loop.
// A queue pair that failed by itself is still sending what it had queued
// (the NAK that tells the host why) until its link is down, which the
// flushed receives show; closing it at once would drop that NAK, so the
// loop waits for them, or for linkGrace.
func (q *ControllerQueue) watch() {
	select {
	case <-q.qp.Done():
		q.markFailed(fmt.Errorf("queue %d from %s: %w: %w", q.qid, q.remote, ErrQueueFailed, q.qp.Err()))
		t := time.NewTimer(linkGrace)
		defer t.Stop()
		select {
		case <-t.C:
			q.cancel()
		case <-q.ctx.Done():
		}
	case <-q.ctx.Done():
	}
}

// linkGrace bounds the wait for a failed queue pair's link to go down (the
// queue pair itself gives up after at most 2 s).
const linkGrace = 3 * time.Second

func (q *ControllerQueue) markFailed(err error) {
	q.mu.Lock()
	if q.failed == nil {
		q.failed = err
		q.failedFlag.Store(true)
	}
	q.mu.Unlock()
}

func (q *ControllerQueue) fail(err error) {
	q.markFailed(err)
	q.cancel()
}

func (q *ControllerQueue) loop() {
	defer close(q.loopDone)
	wcs := make([]nprdma.WC, 64)
	for {
		n, err := q.cq.Wait(q.ctx, wcs)
		for i := 0; i < n; i++ {
			q.dispatch(&wcs[i])
		}
		if err != nil {
			break
		}
	}
	q.closeOnce.Do(func() { q.teardown() })
}

// teardown closes the queue pair (after which no completion follows and
// nothing more lands in or leaves our buffers), delivers the flushed
// completions, and releases what was waiting for them.
func (q *ControllerQueue) teardown() {
	q.fail(fmt.Errorf("queue %d from %s: %w", q.qid, q.remote, ErrQueueFailed))
	q.qp.Close()
	wcs := make([]nprdma.WC, 64)
	for {
		n := q.cq.Poll(wcs)
		if n == 0 {
			break
		}
		for i := 0; i < n; i++ {
			q.dispatch(&wcs[i])
		}
	}
	q.mu.Lock()
	var stranded []*Request
	for _, r := range q.reqs {
		if r != nil {
			stranded = append(stranded, r)
		}
	}
	q.mu.Unlock()
	for _, r := range stranded {
		r.abort()
	}
	q.cq.Close()
	// Executing handlers may still read their in-capsule data from
	// recvBuf: it is unmapped once the queue is unreachable.
	q.recvMR.Deregister()
	q.l.live.Add(-1)
}

func (q *ControllerQueue) dispatch(wc *nprdma.WC) {
	idx := int(wc.ID &^ wrKind)
	switch wc.ID & wrKind {
	case wrRecv:
		if wc.Status != nprdma.StatusSuccess {
			// Flushed: the link is down, nothing more will arrive.
			q.cancel()
			return
		}
		if q.failedFlag.Load() {
			return // nobody could receive the completion
		}
		q.onCapsule(idx, int(wc.ByteLen))
	case wrSend:
		if r := q.lookup(idx); r != nil {
			r.sent()
		}
	case wrRead:
		if r := q.lookup(idx); r != nil {
			select {
			case r.readDone <- wc.Status:
			default:
			}
		}
	case wrWrite:
		// Unsignaled; an error completion is followed by the flushed SEND.
	}
}

func (q *ControllerQueue) lookup(idx int) *Request {
	q.mu.Lock()
	defer q.mu.Unlock()
	if idx < len(q.reqs) {
		return q.reqs[idx]
	}
	return nil
}

func (q *ControllerQueue) onCapsule(recv, n int) {
	q.stats.capsules.Add(1)
	b := q.recvBuf[recv*q.stride : recv*q.stride+n]
	cmd, icd, perr := nvme.ParseCapsule(b, q.icd)
	if perr != nil && errors.Is(perr, nvme.ErrShortCapsule) {
		q.stats.short.Add(1)
		q.postRecv(recv)
		return
	}
	q.head++
	if int(q.head) == q.entries {
		q.head = 0
	}
	r := q.newRequest(recv, cmd, icd)
	if perr != nil {
		q.stats.malformed.Add(1)
		r.Fail(perr)
		return
	}
	q.handler(r)
}

// newRequest hands out a released Request (and its slot) again, or a new
// one: the queue never holds more than its entries plus those whose
// completion is still being sent, so they stop growing in the steady state
// and a command allocates nothing here.
func (q *ControllerQueue) newRequest(recv int, cmd nvme.Command, icd []byte) *Request {
	q.inflight.Add(1)
	q.mu.Lock()
	var r *Request
	if n := len(q.free); n > 0 {
		r = q.free[n-1]
		q.free = q.free[:n-1]
	} else {
		r = &Request{q: q, slot: len(q.reqs), readDone: make(chan nprdma.Status, 1)}
		q.reqs = append(q.reqs, nil)
	}
	q.reqs[r.slot] = r
	q.mu.Unlock()
	r.Cmd, r.icd, r.recv, r.sqhd = cmd, icd, recv, q.head
	r.dataLen = 0
	// A READ that HostData stopped waiting for may have completed into
	// readDone since: drop that. Nothing more can come: RC ordering
	// delivered it before the SEND whose completion released r, and the
	// receive loop, which runs this, delivered both.
	select {
	case <-r.readDone:
	default:
	}
	r.state.Store(reqExecuting)
	return r
}

func (q *ControllerQueue) release(r *Request) {
	q.mu.Lock()
	if q.reqs[r.slot] == r {
		q.reqs[r.slot] = nil
		q.free = append(q.free, r)
	}
	q.mu.Unlock()
	q.inflight.Done()
}

// Request is one command received on a ControllerQueue. Its methods may be
// called from any goroutine; Complete (or Fail) must be called exactly once.
// Once its completion is sent the queue hands the same Request out for a
// later command: keep no reference to it after Complete.
type Request struct {
	// Cmd is the command (valid until Complete).
	Cmd nvme.Command

	q        *ControllerQueue
	slot     int
	recv     int
	sqhd     uint16
	icd      []byte
	data     *nprdma.Buffer // host data read, or data for the host
	dataLen  int
	readDone chan nprdma.Status
	timer    *time.Timer  // bounds HostData's wait (made on first use, kept with the Request)
	state    atomic.Int32 // reqExecuting → reqSent → reqReleased
	// posting is held by Complete from marking the request sent until its
	// post returned, so that a teardown's abort cannot free the data buffer
	// the post is still reading.
	posting sync.Mutex
}

const (
	reqExecuting int32 = iota
	reqSent
	reqReleased
)

// Queue is the queue the command arrived on.
func (r *Request) Queue() *ControllerQueue { return r.q }

// Command is the command (valid until Complete): the field Cmd.
func (r *Request) Command() *nvme.Command { return &r.Cmd }

// InCapsuleData is the data the capsule carried (nil if none). It lives in
// the queue's receive buffer: do not use it after Complete.
func (r *Request) InCapsuleData() []byte { return r.icd }

// HostData returns the data the command moves from the host: the in-capsule
// data, or the bytes of the host buffer its keyed SGL names, fetched with an
// RDMA READ into a registered buffer (valid until Complete). A command
// without data gives nil. It waits for the READ, at most timeout (then the
// error is context.DeadlineExceeded); do not call it on the receive loop.
// A timer of the Request's bounds the wait rather than a context: it is
// made once and reused by the commands that get this Request after it.
func (r *Request) HostData(timeout time.Duration) ([]byte, error) {
	if r.icd != nil {
		return r.icd, nil
	}
	sgl := r.Cmd.DPTR
	n := int(sgl.Length())
	if n == 0 {
		return nil, nil
	}
	if !sgl.Keyed() {
		return nil, nvme.Errorf(nvme.StatusSGLDescriptorTypeInvalid.WithDNR(), "SGL %s does not name host memory", sgl)
	}
	if n > MaxTransfer {
		return nil, nvme.Errorf(nvme.StatusDataSGLLengthInvalid.WithDNR(), "SGL of %d bytes beyond the transfer limit of %d", n, MaxTransfer)
	}
	if r.data != nil {
		return nil, fmt.Errorf("nvme fabric: command %d: host data fetched twice", r.Cmd.CID)
	}
	buf, err := r.q.l.pool.Get(n)
	if err != nil {
		return nil, nvme.Errorf(nvme.StatusInternalError, "buffer for %d bytes of host data: %w", n, err)
	}
	r.data = buf
	err = r.q.qp.PostSend(nprdma.SendWR{ID: wrRead | uint64(r.slot), Op: nprdma.OpRead, SG: []nprdma.SGE{buf.SGE()},
		RemoteAddr: sgl.Address(), RKey: sgl.Key(), Signaled: true})
	if err != nil {
		return nil, r.q.transportError("read host data", err)
	}
	r.q.stats.hostReads.Add(1)
	if r.timer == nil {
		r.timer = time.NewTimer(timeout)
	} else {
		r.timer.Reset(timeout)
	}
	select {
	case st := <-r.readDone:
		r.timer.Stop() // a stopped timer sends nothing later (Go 1.23 timers)
		if st != nprdma.StatusSuccess {
			return nil, r.q.transportError("read host data", fmt.Errorf("RDMA READ of %d bytes at %#x: %s", n, sgl.Address(), st))
		}
		return buf.Bytes(), nil
	case <-r.timer.C:
		// The READ may still land in the buffer: keep it until the queue
		// delivers the completion or goes down (abort releases it).
		return nil, context.DeadlineExceeded
	}
}

func (q *ControllerQueue) transportError(op string, err error) error {
	return nvme.Errorf(nvme.StatusTransientTransportError, "queue %d: %s: %w", q.qid, op, errors.Join(ErrQueueFailed, err))
}

// DataBuffer returns an n-byte registered buffer whose content Complete
// sends to the host buffer the keyed SGL names (for commands that return
// data). It is valid until Complete.
func (r *Request) DataBuffer(n int) ([]byte, error) {
	if n <= 0 || n > MaxTransfer {
		return nil, nvme.Errorf(nvme.StatusDataSGLLengthInvalid.WithDNR(), "transfer of %d bytes outside [1, %d]", n, MaxTransfer)
	}
	if r.data != nil {
		r.data.Release()
		r.data = nil
	}
	buf, err := r.q.l.pool.Get(n)
	if err != nil {
		return nil, nvme.Errorf(nvme.StatusInternalError, "buffer for %d bytes of data: %w", n, err)
	}
	r.data, r.dataLen = buf, n
	return buf.Bytes(), nil
}

// Fail completes the command with the status err maps to (nvme.StatusOf;
// a *nvme.StatusError's Result goes into DW0).
func (r *Request) Fail(err error) error {
	var c nvme.Completion
	c.SetError(err)
	return r.Complete(c)
}

// Complete sends the completion c (its CID, SQID and SQHD are filled in)
// and, when c is a success and a data buffer was set, first the data with an
// RDMA WRITE to the host buffer the keyed SGL names, in the same post.
// The receive buffer is reposted first, so the host may send its next
// command as soon as it sees the completion.
func (r *Request) Complete(c nvme.Completion) error {
	r.posting.Lock()
	defer r.posting.Unlock()
	if !r.state.CompareAndSwap(reqExecuting, reqSent) {
		return fmt.Errorf("nvme fabric: command %d completed twice", r.Cmd.CID)
	}
	q := r.q
	c.CID, c.SQID, c.SQHD = r.Cmd.CID, q.qid, r.sqhd
	// A local array, not an append to a slice: a store through a slice
	// makes the escape analysis move the SGE and the completion's bytes to
	// the heap (the provider copies both before PostSend returns).
	var cqe [nvme.CQESize]byte
	var wrs [2]nprdma.SendWR
	nwr := 0
	if c.Status.OK() && r.dataLen > 0 {
		sgl := r.Cmd.DPTR
		if !sgl.Keyed() || int(sgl.Length()) < r.dataLen {
			c = nvme.Completion{CID: c.CID, SQID: c.SQID, SQHD: c.SQHD}
			c.SetError(nvme.Errorf(nvme.StatusDataSGLLengthInvalid.WithDNR(), "SGL %s cannot take %d bytes", sgl, r.dataLen))
		} else {
			wrs[nwr] = nprdma.SendWR{ID: wrWrite | uint64(r.slot), Op: nprdma.OpWrite,
				SG:         []nprdma.SGE{r.data.SGE()},
				RemoteAddr: sgl.Address(), RKey: sgl.Key()}
			nwr++
			q.stats.hostWrites.Add(1)
		}
	}
	c.MarshalTo(cqe[:])
	wrs[nwr] = nprdma.SendWR{ID: wrSend | uint64(r.slot), Op: nprdma.OpSend, Inline: true, InlineData: cqe[:], Signaled: true}
	if sgl := r.Cmd.DPTR; q.invalidate && sgl.ID() == nvme.SGLIDKeyedInvalidate && sgl.Length() > 0 {
		// The host asked for its key to be invalidated with the response
		// (Linux does, for its per-command registrations): it then need
		// not invalidate it itself.
		wrs[nwr].Op, wrs[nwr].InvalidateRKey = nprdma.OpSendWithInv, sgl.Key()
	}
	nwr++
	r.icd = nil
	if q.failedFlag.Load() {
		r.releaseNow()
		return q.Err()
	}
	if err := q.postRecv(r.recv); err != nil {
		r.releaseNow()
		return q.transportError("repost receive", err)
	}
	if err := q.qp.PostSend(wrs[:nwr]...); err != nil {
		r.releaseNow()
		return q.transportError("send completion", err)
	}
	q.stats.completions.Add(1)
	return nil
}

// sent: the completion's SEND completed (or was flushed): the data buffer
// is no longer read by the queue pair.
func (r *Request) sent() {
	if r.state.CompareAndSwap(reqSent, reqReleased) {
		r.free()
	}
}

// releaseNow releases a request whose completion was not posted.
func (r *Request) releaseNow() {
	if r.state.CompareAndSwap(reqSent, reqReleased) {
		r.free()
	}
}

// abort runs at teardown, after the queue pair is closed: a request whose
// completion was posted but never completed is released; one still
// executing is released by its Complete.
func (r *Request) abort() {
	select {
	case r.readDone <- nprdma.StatusWRFlushed: // wake a HostData still waiting
	default:
	}
	// A Complete posting right now finishes first: its post fails on the
	// closed queue pair and releases the request itself.
	r.posting.Lock()
	defer r.posting.Unlock()
	if r.state.CompareAndSwap(reqSent, reqReleased) {
		r.free()
	}
}

func (r *Request) free() {
	if r.data != nil {
		r.data.Release()
		r.data = nil
	}
	r.q.release(r)
}
