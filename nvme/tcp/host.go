package tcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/internal/turns"
)

// The host side: HostQueue is one queue (one TCP connection) of a host's
// controller. Submit may be called from many goroutines at once.
//
// Completions are read without a goroutine of the queue's own: the
// goroutines waiting for their commands take turns reading the connection
// (leader/follower, package turns, as nvme/fabric's HostQueue polls its
// completion queue). The leader handles every PDU that arrives — it places
// C2HData, answers R2Ts with H2CData, completes commands and wakes their
// submitters — and hands the role over when its own command is done, so
// with one command in flight its submitter is woken by the network poller
// directly and no hand-off between goroutines sits on the path. Capsules go out through a
// combining writer: a submitter that finds another one writing leaves its
// PDU in the batch that one writes next, so that under load one writev
// carries many capsules.

// Host-side limits and defaults.
const (
	// MaxTransfer is the largest data transfer of one command the host
	// sends or receives.
	MaxTransfer = 1 << 20
	// DefaultHostStallTimeout bounds how long a PDU from the controller may
	// take to arrive once its first byte has (WithHostStallTimeout).
	DefaultHostStallTimeout = 10 * time.Second
)

// QueueConfig describes the queue a host dials.
type QueueConfig struct {
	// QID is the queue ID: 0 for the admin queue.
	QID uint16
	// Entries is the submission queue's size (2..65536), sent as Connect's
	// SQSIZE (Entries−1); at most Entries−1 commands are in flight, so the
	// queue never overruns a controller that enforces SQ flow control.
	Entries int
	// InCapsuleData is the in-capsule data limit of an I/O queue
	// (nvme.ICDLimit of Identify IOCCSZ). Fabrics commands and the admin
	// queue always have FabricsInCapsuleData (InCapsuleLimit).
	InCapsuleData int
}

// DialOption configures Dial.
type DialOption func(*dialConfig)

type dialConfig struct {
	digests Digests
	stall   time.Duration
}

// WithDigests asks the controller for header and/or data digests (CRC32C;
// default none). The controller must grant exactly those, or the dial
// fails.
func WithDigests(d Digests) DialOption { return func(c *dialConfig) { c.digests = d } }

// WithHostStallTimeout bounds how long a PDU from the controller may take
// to arrive once its first byte has (default DefaultHostStallTimeout; 0: no
// bound). An idle connection is never timed out: noticing a silent
// controller is the keep-alive's job.
func WithHostStallTimeout(d time.Duration) DialOption { return func(c *dialConfig) { c.stall = d } }

// HostQueue is the host side of one NVMe/TCP queue.
type HostQueue struct {
	qid     uint16
	addr    string
	entries int
	icd     int
	digests Digests
	maxH2C  int // the controller's MAXH2CDATA
	conn    net.Conn
	raw     syscall.RawConn // nil when conn has none: waits then ignore ctx
	rd      *Reader         // the leader's

	wmu      sync.Mutex
	w, spare *Writer // the batch being filled, and the one being written
	flushing bool
	flushed  *sync.Cond // of wmu: broadcast when flushing ends
	ended    bool       // a termination request is written: nothing may follow it

	turns turns.Turns // the goroutine reading the connection holds the role
	cids  chan uint16
	calls []*call // by CID

	mu     sync.Mutex
	failed error

	closeOnce sync.Once
	closed    chan struct{}
}

// call is one command slot (its CID is its index); its wait state is
// guarded by q.mu.
type call struct {
	turns.Slot
	cmd    nvme.Command
	in     []byte      // data the controller asks for with R2T
	out    []byte      // where C2HData lands
	own    []byte      // a pooled copy of the caller's data (a submitter that may give up)
	length int         // the command's data transfer
	moved  int         // bytes received (C2HData) or asked for (R2T) so far
	local  nvme.Status // a failure seen here (a data digest): the command's status whatever the completion says
	cqe    nvme.Completion
	err    error
}

// Dial connects a queue to the NVMe/TCP controller at addr (host:port) and
// initializes the connection (ICReq/ICResp). The caller then sends Fabrics
// Connect on it.
func Dial(ctx context.Context, addr string, qc QueueConfig, opts ...DialOption) (*HostQueue, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("nvme/tcp: dial queue %d at %s: %w", qc.QID, addr, err)
	}
	q, err := newHostQueue(ctx, conn, addr, qc, opts...)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return q, nil
}

// newHostQueue initializes a queue over conn, already connected to the
// controller.
func newHostQueue(ctx context.Context, conn net.Conn, addr string, qc QueueConfig, opts ...DialOption) (*HostQueue, error) {
	cfg := dialConfig{stall: DefaultHostStallTimeout}
	for _, o := range opts {
		o(&cfg)
	}
	if qc.Entries < 2 || qc.Entries > 1<<16 {
		return nil, fmt.Errorf("nvme/tcp: dial queue %d at %s: %d entries outside [2, 65536]", qc.QID, addr, qc.Entries)
	}
	if cfg.digests&^(HeaderDigest|DataDigest) != 0 {
		return nil, fmt.Errorf("nvme/tcp: dial queue %d at %s: digests %#x", qc.QID, addr, uint8(cfg.digests))
	}
	q := &HostQueue{qid: qc.QID, addr: addr, entries: qc.Entries, icd: qc.InCapsuleData, conn: conn,
		closed: make(chan struct{}), turns: turns.New()}
	if qc.QID == 0 {
		q.icd = FabricsInCapsuleData
	}
	if sc, ok := conn.(syscall.Conn); ok {
		q.raw, _ = sc.SyscallConn()
	}
	q.rd = NewReader(conn, RoleHost, WithPDUTimeout(cfg.stall))
	q.w, q.spare = NewWriter(conn), NewWriter(conn)
	q.flushed = sync.NewCond(&q.wmu)
	if err := q.initialize(ctx, cfg.digests); err != nil {
		return nil, fmt.Errorf("nvme/tcp: queue %d at %s: %w", qc.QID, addr, err)
	}
	n := q.entries - 1
	q.cids = make(chan uint16, n)
	q.calls = make([]*call, n)
	for i := range q.calls {
		q.cids <- uint16(i)
		c := &call{}
		c.Init()
		q.calls[i] = c
	}
	return q, nil
}

// initialize exchanges ICReq and ICResp within ctx: HPDA 0 (any alignment
// of the controller's data is fine), one R2T at a time (MAXR2T 0), the
// digests asked for.
func (q *HostQueue) initialize(ctx context.Context, want Digests) error {
	if dl, ok := ctx.Deadline(); ok {
		q.conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { q.conn.SetDeadline(time.Unix(1, 0)) })
	err := q.exchange(want)
	if !stop() { // ctx ended: the connection's deadline is past, whatever the exchange did
		return fmt.Errorf("initialize connection: %w", ctx.Err())
	}
	q.conn.SetDeadline(time.Time{})
	if err != nil {
		return fmt.Errorf("initialize connection: %w", err)
	}
	return nil
}

func (q *HostQueue) exchange(want Digests) error {
	q.w.ICReq(&ICReq{PFV: PFV10, HPDA: 0, Digests: want, MAXR2T: 0})
	if err := q.w.Flush(); err != nil {
		return err
	}
	h, err := q.rd.Next()
	if err != nil {
		return q.terminate(err)
	}
	if h.Type == TypeC2HTermReq {
		return q.termReceived(h)
	}
	var resp ICResp
	if err := resp.Unmarshal(h.Bytes()); err != nil {
		return err
	}
	if err := resp.Check(h.Bytes(), want); err != nil {
		return q.terminate(err)
	}
	q.digests, q.maxH2C = want, int(resp.MAXH2CDATA)
	q.rd.Negotiated(want, 0, Limits{MaxC2HData: MaxTransfer})
	q.w.Negotiated(want, resp.CPDA)
	q.spare.Negotiated(want, resp.CPDA)
	return nil
}

// QID is the queue ID.
func (q *HostQueue) QID() uint16 { return q.qid }

// Entries is the submission queue's size (Connect's SQSIZE + 1).
func (q *HostQueue) Entries() int { return q.entries }

// InCapsuleData is the in-capsule data limit of the queue's commands
// other than Fabrics ones.
func (q *HostQueue) InCapsuleData() int { return q.icd }

// Digests are the digests the connection uses.
func (q *HostQueue) Digests() Digests { return q.digests }

// Done is closed when the queue has failed or was closed; Err says why.
func (q *HostQueue) Done() <-chan struct{} { return q.closed }

// Err is the reason the queue failed (nil while it works).
func (q *HostQueue) Err() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.failed
}

// Close closes the connection: commands in flight fail with an error
// wrapping nvme.ErrQueueFailed.
func (q *HostQueue) Close() error {
	q.fail(fmt.Errorf("closed by the host"), false)
	return nil
}

// queueError wraps a cause of the queue's failure.
func (q *HostQueue) queueError(cause error) error {
	return fmt.Errorf("nvme/tcp: queue %d to %s: %w: %w", q.qid, q.addr, nvme.ErrQueueFailed, cause)
}

// fail takes the queue down for cause (the first cause is kept): it closes
// the connection, waits for the goroutine reading it to stop (unless the
// caller is that goroutine: leader), so that nothing lands in a caller's
// buffer any more, and then completes every command in flight with the
// error.
func (q *HostQueue) fail(cause error, leader bool) {
	q.mu.Lock()
	if q.failed == nil {
		q.failed = q.queueError(cause)
	}
	q.mu.Unlock()
	q.conn.Close()
	if !leader {
		q.turns.Take()
	}
	q.finishAll()
	if !leader {
		q.turns.Give()
	}
	q.closeOnce.Do(func() { close(q.closed) })
}

// finishAll completes every command in flight with the queue's error.
func (q *HostQueue) finishAll() {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, c := range q.calls {
		q.finishLocked(c, q.failed)
	}
}

// Submit sends cmd with data and waits for its completion. For a command
// that moves data to the controller, data is the payload: in the capsule
// when it fits the queue's in-capsule limit, else sent in H2CData PDUs as
// the controller asks with R2T; for one that moves data to the host, data
// is filled from C2HData PDUs. cmd.DPTR and cmd.CID are set here. The
// error wraps nvme.ErrQueueFailed when the queue failed, or is cqe.Err()
// for an unsuccessful completion.
//
// With a ctx that can end, the data travels through a copy of the queue's,
// so that a Submit that gives up (returning ctx's error) leaves nothing
// behind that still reads or writes data; the CID comes back when the
// completion (or the queue's failure) arrives. With one that cannot, the
// data moves straight between data and the connection.
func (q *HostQueue) Submit(ctx context.Context, cmd nvme.Command, data []byte) (nvme.Completion, error) {
	if err := q.Err(); err != nil {
		return nvme.Completion{}, err
	}
	if len(data) > MaxTransfer {
		return nvme.Completion{}, fmt.Errorf("nvme/tcp: queue %d: transfer of %d bytes beyond %d", q.qid, len(data), MaxTransfer)
	}
	var cid uint16
	select {
	case cid = <-q.cids:
	case <-q.closed:
		return nvme.Completion{}, q.Err()
	case <-ctx.Done():
		return nvme.Completion{}, ctx.Err()
	}
	c := q.calls[cid]
	cmd.CID = cid
	dir := cmd.Direction()
	buf := data
	if ctx.Done() != nil && len(data) > 0 {
		c.own = hostBuffers.get(len(data))
		buf = c.own
		if dir == nvme.HostToController {
			copy(buf, data)
		}
	}
	var icd []byte
	switch {
	case len(data) == 0:
		cmd.DPTR = nvme.TransportSGL(0)
	case dir == nvme.HostToController && len(data) <= InCapsuleLimit(&cmd, q.icd):
		cmd.DPTR = nvme.InCapsuleSGL(0, uint32(len(data)))
		icd = buf
	case dir == nvme.HostToController:
		cmd.DPTR = nvme.TransportSGL(uint32(len(data)))
		c.in = buf
	default:
		cmd.DPTR = nvme.TransportSGL(uint32(len(data)))
		c.out = buf
	}
	c.cmd, c.length, c.moved, c.local = cmd, len(data), 0, 0
	q.mu.Lock()
	if q.failed != nil {
		err := q.failed
		q.mu.Unlock()
		q.recycle(c, cid)
		return nvme.Completion{}, err
	}
	c.StartLocked()
	q.mu.Unlock()
	q.wmu.Lock()
	if q.ended {
		q.wmu.Unlock() // the queue is failing: that completes c
	} else {
		q.w.CapsuleCmd(&c.cmd, icd)
		if err := q.flushLocked(); err != nil {
			q.fail(fmt.Errorf("send: %w", err), false)
		}
	}
	if err := q.turns.Wait(ctx, &c.Slot, &q.mu, (*leader)(q)); err != nil {
		return nvme.Completion{}, err // abandoned: recycled when it completes
	}
	cqe, err := c.cqe, c.err
	if err == nil && c.own != nil && c.out != nil && cqe.Status.OK() {
		copy(data, buf)
	}
	q.recycle(c, cid)
	if err != nil {
		return nvme.Completion{}, err
	}
	return cqe, cqe.Err()
}

// flushLocked writes the batch, and whatever other goroutines add to it
// meanwhile, unless another goroutine is writing already (it will write
// ours too). Called with wmu held; returns with it released.
func (q *HostQueue) flushLocked() error {
	if q.flushing {
		q.wmu.Unlock()
		return nil
	}
	q.flushing = true
	var err error
	for err == nil && q.w.Buffered() > 0 {
		w := q.w
		q.w, q.spare = q.spare, w
		q.wmu.Unlock()
		err = w.Flush()
		q.wmu.Lock()
	}
	q.flushing = false
	q.flushed.Broadcast()
	q.wmu.Unlock()
	return err
}

// recycle releases a call's data and returns its CID.
func (q *HostQueue) recycle(c *call, cid uint16) {
	c.release()
	q.cids <- cid
}

func (c *call) release() {
	if c.own != nil {
		hostBuffers.put(c.own)
		c.own = nil
	}
	c.in, c.out, c.err = nil, nil, nil
}

// finishLocked records c's outcome and signals its waiter; an abandoned
// call is recycled here instead. Idle calls are finished already and are
// skipped.
func (q *HostQueue) finishLocked(c *call, err error) {
	if c.Finished() {
		return
	}
	c.err = err
	if c.FinishLocked() {
		c.release()
		for i, cc := range q.calls {
			if cc == c {
				q.cids <- uint16(i)
				break
			}
		}
		return
	}
}

// hostBuffers holds the copies of submitters that may give up.
var hostBuffers bufferPool

// errStalled explains a timeout of the stall bound.
var errStalled = errors.New("the controller stopped in the middle of a PDU")
