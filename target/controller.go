package target

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nvme"
)

// connectDataTimeout bounds the RDMA READ of Connect's data.
const connectDataTimeout = 10 * time.Second

// queueConn is a queue accepted on one of the target's ports; Connect binds
// it to a controller.
type queueConn struct {
	t     *Target
	q     Queue
	port  *port
	admin bool
	ctrl  atomic.Pointer[controller]
	auth  queueAuth // in-band authentication (auth.go)

	// The queue's workers (see handle). idle counts the workers parked on
	// work or about to be, less the commands waiting in work.
	work chan Request
	idle atomic.Int64

	// Fencing (fence.go): fenced is set once the queue has failed;
	// fenceDone (guarded by the subsystem's fenceMu) once that is recorded.
	fenced    atomic.Bool
	fenceDone bool
	wmu       sync.Mutex
	workers   []*worker // guarded by wmu
	// onLoop is the record of the commands the receive loop executes
	// itself (inline.go), one at a time.
	onLoop *worker
}

func newQueueConn(t *Target, q Queue, p *port) *queueConn {
	qc := &queueConn{t: t, q: q, port: p, admin: q.QID() == 0, work: make(chan Request, q.Entries())}
	qc.onLoop = qc.addWorker()
	return qc
}

// watch fences the queue as soon as its connection is lost (the host may
// retry its commands from then on), forgets it once it is gone and, for an
// admin queue, tears its controller down: the host lost the controller with
// it.
func (qc *queueConn) watch() {
	select {
	case <-qc.q.Lost():
	case <-qc.q.Done():
	}
	qc.fence()
	<-qc.q.Done()
	t := qc.t
	t.mu.Lock()
	delete(t.queues, qc)
	t.mu.Unlock()
	if t.met != nil {
		t.met.connections.Dec()
	}
	if c := qc.ctrl.Load(); c != nil {
		if qc.admin {
			c.teardown("admin queue lost: " + errString(qc.q.Err()))
		} else {
			c.dropIOQueue(qc)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return "closed"
	}
	return err.Error()
}

// maxIdleWorkers is how many idle workers a queue keeps parked; more go
// once idle (a burst deeper than this starts goroutines again).
const maxIdleWorkers = 16

// handle is the queue's Handler. It runs on the receive loop, so a command
// that may wait executes on a worker goroutine, never behind another command
// (a fault or a flush must not hold up the commands behind it); one that
// completes without waiting executes right here (inline.go). A worker is an
// idle one if there is one, else a new one. There are never more workers
// than commands that ran at once on the queue, which the host bounds by its
// queue depth (a command holds its receive buffer until it completes), and
// idle ones stay parked (up to maxIdleWorkers) until the queue goes: a
// goroutine per command cost an allocation and a start each.
func (qc *queueConn) handle(r Request) {
	t := qc.t
	// Counted in flight under the drain lock, so that Shutdown's wait
	// either counts this command or it sees the drain: none slips past the
	// final flush.
	t.drainMu.RLock()
	if t.draining.Load() {
		t.drainMu.RUnlock()
		r.Fail(nvme.Errorf(nvme.StatusAbortedSQDeleted, "target shutting down"))
		return
	}
	t.inflight.Add(1)
	t.drainMu.RUnlock()
	if qc.inline(r) {
		return
	}
	if t.met != nil {
		t.met.handedOff.WithLabelValues(r.Command().Name(qc.admin)).Inc()
	}
	if qc.idle.Add(-1) >= 0 {
		// Never blocks: each command in work holds one of the queue's
		// Entries() receive buffers, work's capacity.
		qc.work <- r
		return
	}
	qc.idle.Add(1)
	go qc.worker(r)
}

// worker runs r, then the commands handed to it, until the queue is gone
// or enough others are idle.
func (qc *queueConn) worker(r Request) {
	w := qc.addWorker()
	defer qc.removeWorker(w)
	for {
		qc.run(w, r)
		// Leaving takes one off idle: with more than maxIdleWorkers idle,
		// those staying still outnumber the commands handed out to them.
		if n := qc.idle.Load(); n > maxIdleWorkers && qc.idle.CompareAndSwap(n, n-1) {
			return
		}
		select {
		case r = <-qc.work:
			continue
		case <-qc.q.Done():
		}
		// The receive loop has stopped: nothing is handed out any more,
		// but what it handed out before may still be waiting.
		select {
		case r = <-qc.work:
		default:
			return
		}
	}
}

// run executes r. The worker counts itself idle just before the completion
// goes out: the host's next command, which may follow it at once, then
// finds it (so that a queue at depth 1 keeps one worker) and waits for it
// only as long as posting the completion takes.
func (qc *queueConn) run(w *worker, r Request) {
	t := qc.t
	defer t.inflight.Done()
	start := time.Now()
	name, res := qc.execute(w, r, false)
	if res.parked {
		qc.idle.Add(1)
		return // an AER: completed later
	}
	c := res.completion()
	// Counted before the host can see the completion, so that a host
	// reading the metrics after its command finds it counted.
	if t.met != nil {
		t.met.observe(name, c.Status, time.Since(start))
	}
	qc.idle.Add(1)
	r.Complete(c)
}

// execute runs one command and returns its metric name and outcome. On the
// receive loop (inline) it runs only what completes without waiting; the
// outcome of anything else is wait, with nothing done that a worker must
// undo.
func (qc *queueConn) execute(w *worker, r Request, inline bool) (string, result) {
	cmd := r.Command()
	name := cmd.Name(qc.admin)
	c := qc.ctrl.Load()
	if c == nil {
		if inline {
			return name, result{wait: true} // Connect fetches its data
		}
		if cmd.IsFabrics() && cmd.FabricsType() == nvme.FabricsConnect {
			return name, qc.connect(r)
		}
		// Nothing but Connect on a queue that is not connected (nvmet).
		return name, result{err: nvme.Errorf(nvme.StatusInvalidOpcode.WithDNR(), "queue %d not connected: %s before Connect", qc.q.QID(), name)}
	}
	if cmd.IsFabrics() && cmd.FabricsType() == nvme.FabricsConnect {
		return name, result{err: nvme.Errorf(nvme.StatusInvalidOpcode.WithDNR(), "queue %d is connected already", qc.q.QID())}
	}
	if inline && cmd.IsFabrics() && cmd.FabricsType() != nvme.FabricsPropertyGet {
		return name, result{wait: true} // Authentication Send fetches its data; both compute
	}
	if res, done := qc.authGate(c, r); done {
		return name, res
	}
	if qc.admin {
		return name, c.admin(r, inline)
	}
	return name, c.io(w, r, inline)
}

// result is a command's outcome.
type result struct {
	err      error
	dw0, dw1 uint32
	parked   bool // an AER: completed later
	wait     bool // on the receive loop: it would wait, a worker runs it
}

func (res result) completion() nvme.Completion {
	c := nvme.Completion{DW0: res.dw0, DW1: res.dw1}
	if res.err != nil {
		c.SetError(res.err)
	}
	return c
}

// controller is one host's association with a subsystem (or with the
// discovery service): an admin queue, I/O queues, its state, and its
// registrations of the namespaces' regions.
type controller struct {
	t         *Target
	sub       *Subsystem // nil for a discovery controller
	host      *hostFence // the host's fencing state on sub; nil for a discovery controller
	id        uint16
	hostNQN   string
	hostID    nvme.UUID
	tag       uint64 // access tag of its queue pairs and region MRs
	token     uint64 // names it for its host (nvme.NPControllerRef); never 0
	adminConn *queueConn
	port      *port // the port of its admin queue: its I/O queues use the same transport
	// frameReader: the host read a namespace's frame table, so its Reads
	// fill the frames (frames.go).
	frameReader atomic.Bool

	mu       sync.Mutex
	cc       nvme.CC
	csts     nvme.CSTS
	kato     time.Duration
	kaTimer  *time.Timer
	ioGrant  int // I/O queues granted (Number of Queues)
	ioQueues map[uint16]*queueConn
	mrs      map[uint32]*nprdma.MR
	retired  map[uint32][]*nprdma.MR // registrations of a namespace before it grew (retireRegion)
	aers     []Request
	events   nsEvents
	aec      uint32
	vwc      bool
	gone     bool
}

func (c *controller) subNQN() string {
	if c.sub == nil {
		return nvme.DiscoveryNQN
	}
	return c.sub.nqn
}

func (c *controller) discovery() bool { return c.sub == nil }

// connect executes Fabrics Connect on an unconnected queue.
func (qc *queueConn) connect(r Request) result {
	t := qc.t
	p := r.Command().Connect()
	raw, err := r.HostData(connectDataTimeout)
	if err != nil {
		return result{err: err}
	}
	var d nvme.ConnectData
	if err := d.Unmarshal(raw); err != nil {
		return result{err: err}
	}
	switch {
	case p.RECFMT != 0:
		return result{err: nvme.Errorf(nvme.StatusConnectIncompatibleFormat.WithDNR(), "connect RECFMT %d", p.RECFMT)}
	case p.QID != qc.q.QID():
		return result{err: nvme.ConnectInvalidParameter(false, nvme.ConnectOffsetQID, "connect QID %d on queue %d", p.QID, qc.q.QID())}
	case p.SQSIZE == 0 || p.QueueEntries() > qc.q.Entries():
		return result{err: nvme.ConnectInvalidParameter(false, nvme.ConnectOffsetSQSIZE, "connect SQSIZE %d: the queue holds %d entries", p.SQSIZE, qc.q.Entries())}
	}
	if err := nvme.ValidateNQN(d.HostNQN); err != nil {
		return result{err: nvme.ConnectInvalidParameter(true, nvme.ConnectDataOffsetHostNQN, "host NQN %q: %v", d.HostNQN, err)}
	}
	var sub *Subsystem
	if d.SubNQN != nvme.DiscoveryNQN {
		if sub = t.Subsystem(d.SubNQN); sub == nil || qc.port.discoveryOnly {
			return result{err: nvme.ConnectInvalidParameter(true, nvme.ConnectDataOffsetSubNQN, "subsystem %q unknown on this port", d.SubNQN)}
		}
		if !sub.Allows(d.HostNQN) {
			t.log.Warn("target: host refused: not on the subsystem's allow-list", "host", d.HostNQN, "subsystem", sub.nqn, "from", qc.q.RemoteAddr())
			if t.met != nil {
				t.met.refused.Inc()
			}
			return result{err: nvme.Errorf(nvme.StatusConnectInvalidHost.WithDNR(), "host %s may not access %s", d.HostNQN, sub.nqn)}
		}
	}
	if p.QID == 0 {
		return qc.connectAdmin(p, d, sub)
	}
	return qc.connectIO(p, d, sub)
}

func (qc *queueConn) connectAdmin(p nvme.ConnectParams, d nvme.ConnectData, sub *Subsystem) result {
	t := qc.t
	if d.CNTLID != nvme.DynamicControllerID {
		return result{err: nvme.ConnectInvalidParameter(true, nvme.ConnectDataOffsetCNTLID, "admin connect with CNTLID %#x: this target allocates controllers dynamically (0xffff)", d.CNTLID)}
	}
	kato := nvme.KeepAliveTimeout(p.KATO)
	if kato > t.cfg.maxKATO {
		kato = t.cfg.maxKATO
	}
	c := &controller{t: t, sub: sub, hostNQN: d.HostNQN, hostID: d.HostID, adminConn: qc, port: qc.port, kato: kato,
		ioQueues: map[uint16]*queueConn{}, mrs: map[uint32]*nprdma.MR{}, vwc: true,
		tag: t.tags.Add(1), token: rand.Uint64() | 1}
	if sub != nil {
		c.host = sub.hostFence(d.HostNQN)
	}
	if err := t.allocController(c); err != nil {
		if c.host != nil {
			c.host.release()
		}
		return result{err: err}
	}
	if sub != nil {
		t.replace(c, d.Replaces)
		t.fenceLost(sub, d.HostNQN)
	}
	atr := qc.requireAuth(c)
	qc.ctrl.Store(c)
	c.mu.Lock()
	c.armKeepAliveLocked()
	c.mu.Unlock()
	t.log.Info("target: controller created", "cntlid", c.id, "subsystem", c.subNQN(), "host", c.hostNQN,
		"from", qc.q.RemoteAddr(), "kato", kato, "authenticate", atr)
	// The host may have gone already (its queue pair failed before we bound
	// the queue to the controller): then nothing else would tear it down.
	select {
	case <-qc.q.Done():
		c.teardown("admin queue lost during connect")
	default:
	}
	return result{dw0: nvme.ConnectResponse{CNTLID: c.id, AuthRequired: atr}.DW0()}
}

func (qc *queueConn) connectIO(p nvme.ConnectParams, d nvme.ConnectData, sub *Subsystem) result {
	t := qc.t
	t.mu.Lock()
	c := t.ctrls[d.CNTLID]
	t.mu.Unlock()
	if c == nil || c.sub != sub || c.hostNQN != d.HostNQN || sub == nil || c.port.transport != qc.port.transport {
		return result{err: nvme.ConnectInvalidParameter(true, nvme.ConnectDataOffsetCNTLID, "no controller %d of %s for host %s over %s", d.CNTLID, d.SubNQN, d.HostNQN, qc.port.transport)}
	}
	t.fenceLost(sub, d.HostNQN)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.gone:
		return result{err: nvme.ConnectInvalidParameter(true, nvme.ConnectDataOffsetCNTLID, "controller %d is gone", d.CNTLID)}
	case !c.csts.RDY:
		return result{err: nvme.Errorf(nvme.StatusCommandSequenceError.WithDNR(), "controller %d is not enabled", c.id)}
	case int(p.QID) > c.ioGrant:
		return result{err: nvme.ConnectInvalidParameter(false, nvme.ConnectOffsetQID, "queue %d beyond the %d I/O queues granted", p.QID, c.ioGrant)}
	case c.ioQueues[p.QID] != nil:
		return result{err: nvme.Errorf(nvme.StatusCommandSequenceError.WithDNR(), "queue %d of controller %d is connected already", p.QID, c.id)}
	}
	c.ioQueues[p.QID] = qc
	atr := qc.requireAuth(c)
	qc.ctrl.Store(c)
	return result{dw0: nvme.ConnectResponse{CNTLID: c.id, AuthRequired: atr}.DW0()}
}

// replace stops the controller ref names if the host of c gave it up
// (nvme.NPControllerRef): a controller of the same subsystem, host NQN and
// host ID, with that token. Its queues are fenced before c serves
// anything, even when their links still look alive here (a silent link:
// the host timed out first); otherwise they would be fenced only when this
// side noticed, and a write of theirs still in the device could land over
// what the host writes through c meanwhile.
func (t *Target) replace(c *controller, ref nvme.NPControllerRef) {
	if ref.Token == 0 {
		return
	}
	t.mu.Lock()
	old := t.ctrls[ref.CNTLID]
	t.mu.Unlock()
	if old == nil || old == c || old.sub != c.sub || old.hostNQN != c.hostNQN || old.hostID != c.hostID || old.token != ref.Token {
		return // gone already, or not the host's to give up
	}
	finish := old.stop()
	if finish == nil {
		return // torn down meanwhile
	}
	if t.met != nil {
		t.met.replaced.Inc()
	}
	t.log.Warn("target: controller replaced by its host before its failure was seen here; tearing it down",
		"cntlid", old.id, "by", c.id, "subsystem", c.subNQN(), "host", c.hostNQN)
	// Stopped and fenced now; closing its queues waits for their receive
	// loops, which a silent link can hold up: not the new Connect's wait.
	t.retiring.Add(1)
	go func() {
		defer t.retiring.Done()
		finish(fmt.Sprintf("replaced by controller %d of its host", c.id))
	}()
}

// armKeepAliveLocked (re)starts the keep-alive timer.
func (c *controller) armKeepAliveLocked() {
	if c.kato <= 0 || c.gone {
		return
	}
	if c.kaTimer == nil {
		c.kaTimer = time.AfterFunc(c.kato, c.keepAliveExpired)
		return
	}
	c.kaTimer.Reset(c.kato)
}

func (c *controller) keepAliveExpired() {
	if c.t.met != nil {
		c.t.met.kaExpired.Inc()
	}
	c.teardown(fmt.Sprintf("keep-alive timeout (%v) expired", c.kato))
}

// teardown ends the controller: stop, then the rest of it.
func (c *controller) teardown(why string) {
	if finish := c.stop(); finish != nil {
		finish(why)
	}
}

// stop ends the controller's service at once and returns the rest of its
// teardown, or nil if it was stopped already. Now: it is marked gone (no
// queue connects to it any more), its queues are fenced, its keep-alive
// stopped. The rest closes its queues (so no queue pair can use its rkeys
// any more; closing waits for their receive loops), then revokes its region
// registrations. The memory stays mapped: it is the namespace's.
func (c *controller) stop() (finish func(why string)) {
	c.mu.Lock()
	if c.gone {
		c.mu.Unlock()
		return nil
	}
	c.gone = true
	if c.kaTimer != nil {
		c.kaTimer.Stop()
	}
	qs := []*queueConn{c.adminConn}
	for _, q := range c.ioQueues {
		qs = append(qs, q)
	}
	// Fenced before they leave the map: a Connect of the host's checks the
	// queues there (fenceLost), and must find each still there or fenced.
	for _, q := range qs {
		q.fence()
	}
	c.ioQueues = map[uint16]*queueConn{}
	mrs := c.takeRegionsLocked()
	aers := c.aers
	c.aers = nil
	c.mu.Unlock()
	return func(why string) {
		for _, r := range aers {
			r.Fail(nvme.Errorf(nvme.StatusAbortedSQDeleted, "controller %d torn down", c.id))
		}
		for _, q := range qs {
			q.q.Close()
		}
		for _, mr := range mrs {
			mr.Deregister()
		}
		if c.host != nil {
			c.host.release()
		}
		c.t.removeController(c)
		c.t.log.Info("target: controller torn down", "cntlid", c.id, "subsystem", c.subNQN(), "host", c.hostNQN, "why", why)
	}
}

func (c *controller) dropIOQueue(qc *queueConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, q := range c.ioQueues {
		if q == qc {
			delete(c.ioQueues, id)
		}
	}
}

// resetLocked is CC.EN going from 1 to 0: the I/O queues go away and the
// rkeys handed out are revoked.
func (c *controller) reset() {
	c.mu.Lock()
	qs := make([]*queueConn, 0, len(c.ioQueues))
	for _, q := range c.ioQueues {
		q.fence() // before it leaves the map (see teardown)
		qs = append(qs, q)
	}
	c.ioQueues = map[uint16]*queueConn{}
	mrs := c.takeRegionsLocked()
	c.csts.RDY = false
	c.mu.Unlock()
	for _, q := range qs {
		q.q.Close()
	}
	for _, mr := range mrs {
		mr.Deregister()
	}
}

// revokeRegion deregisters the controller's registration of namespace
// nsid, if it has one: its rkey is refused from then on.
func (c *controller) revokeRegion(nsid uint32) {
	c.mu.Lock()
	mrs := c.retired[nsid]
	if mr := c.mrs[nsid]; mr != nil {
		mrs = append(mrs, mr)
	}
	delete(c.mrs, nsid)
	delete(c.retired, nsid)
	c.mu.Unlock()
	for _, mr := range mrs {
		mr.Deregister()
	}
}

func (c *controller) abortAERs() {
	c.mu.Lock()
	aers := c.aers
	c.aers = nil
	c.mu.Unlock()
	for _, r := range aers {
		r.Fail(nvme.Errorf(nvme.StatusAbortedSQDeleted, "target shutting down"))
	}
}

// regionMR returns the controller's registration of namespace n, creating
// it on first use: per controller, so that its rkey works only on this
// controller's queue pairs and dies with the controller.
func (c *controller) regionMR(n *Namespace) (*nprdma.MR, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gone {
		return nil, fmt.Errorf("controller %d is gone", c.id)
	}
	if n.removed.Load() {
		// RemoveNamespace revokes under c.mu after setting removed, so a
		// registration made here would escape it.
		return nil, fmt.Errorf("namespace %d is being removed", n.nsid)
	}
	if mr := c.mrs[n.nsid]; mr != nil {
		return mr, nil
	}
	mr, err := n.register(c.t.pd, c.tag)
	if err != nil {
		return nil, err
	}
	c.mrs[n.nsid] = mr
	return mr, nil
}
