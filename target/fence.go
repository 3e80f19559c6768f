package target

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/nprdma/nprdma/nvme"
)

// Fencing the queues that failed.
//
// Once a queue has failed (its connection is lost, or it was closed) no
// completion of its reaches the host, which takes its commands for lost,
// retries them on another queue or a new controller, and goes on writing. A
// command of the failed queue that changed a namespace after that could
// overwrite what the host wrote since and was told was done. So from then on
// the queue's commands that have not begun changing a namespace never do
// (beginChange drops them: they were never acknowledged), and the host's
// writes, write-zeroes and deallocates that overlap blocks one of them is
// still changing wait for it (hold), at most the fence timeout, after which
// they fail with Namespace Not Ready, a status hosts retry. "The host" is a
// host NQN on a subsystem: its other queues and controllers, old and new.
// Reads, other blocks, other namespaces and other hosts never wait; the
// steady-state cost is a few atomic operations per changing command.

// worker is a worker goroutine's (or the receive loop's, inline.go) record
// of the change its command is making now, read by fence and hold.
type worker struct {
	qc     *queueConn
	ns     atomic.Pointer[Namespace] // the namespace being changed; nil: none
	lo, hi atomic.Uint64             // the blocks [lo, hi), stored before ns
}

// hostFence is a host's fencing state on a subsystem: its failed queues
// whose commands are still changing a namespace. Every field but stale is
// guarded by the subsystem's fenceMu.
type hostFence struct {
	sub  *Subsystem
	host string

	stale    atomic.Int32 // len(draining), for the command path to check without the lock
	draining map[*queueConn]struct{}
	changed  chan struct{} // closed (and replaced) when the fencing state changes
	refs     int           // the host's controllers and the draining queues
}

// hostFence returns host's fencing state, held until release.
func (s *Subsystem) hostFence(host string) *hostFence {
	s.fenceMu.Lock()
	defer s.fenceMu.Unlock()
	hf := s.fences[host]
	if hf == nil {
		hf = &hostFence{sub: s, host: host, draining: map[*queueConn]struct{}{}, changed: make(chan struct{})}
		s.fences[host] = hf
	}
	hf.refs++
	return hf
}

func (hf *hostFence) release() {
	hf.sub.fenceMu.Lock()
	defer hf.sub.fenceMu.Unlock()
	hf.releaseLocked()
}

func (hf *hostFence) releaseLocked() {
	hf.refs--
	if hf.refs == 0 && hf.sub.fences[hf.host] == hf {
		delete(hf.sub.fences, hf.host)
	}
}

func (hf *hostFence) broadcastLocked() {
	close(hf.changed)
	hf.changed = make(chan struct{})
}

func (qc *queueConn) addWorker() *worker {
	w := &worker{qc: qc}
	qc.wmu.Lock()
	qc.workers = append(qc.workers, w)
	qc.wmu.Unlock()
	return w
}

func (qc *queueConn) removeWorker(w *worker) {
	qc.wmu.Lock()
	if i := slices.Index(qc.workers, w); i >= 0 {
		qc.workers = slices.Delete(qc.workers, i, i+1)
	}
	qc.wmu.Unlock()
}

// changing reports whether a command of the queue is changing blocks
// [lo, hi) of n (with n nil: anything).
func (qc *queueConn) changing(n *Namespace, lo, hi uint64) bool {
	qc.wmu.Lock()
	defer qc.wmu.Unlock()
	for _, w := range qc.workers {
		wn := w.ns.Load()
		if wn != nil && (n == nil || wn == n && w.lo.Load() < hi && lo < w.hi.Load()) {
			return true
		}
	}
	return false
}

// fence marks the queue failed, once it is (see the top of this file). A
// queue with commands still changing a namespace joins its host's draining
// queues until they are done. It returns once that is recorded, so a
// controller that fences its queues before releasing its hostFence cannot
// let the record go with it.
func (qc *queueConn) fence() {
	c := qc.ctrl.Load()
	if c == nil || c.host == nil {
		qc.fenced.Store(true)
		// Connect may have bound the queue since: then record it below.
		if c = qc.ctrl.Load(); c == nil || c.host == nil {
			return
		}
	}
	hf := c.host
	hf.sub.fenceMu.Lock()
	defer hf.sub.fenceMu.Unlock()
	if qc.fenceDone {
		return
	}
	qc.fenceDone = true
	// Set before looking (and beginChange publishes its change before
	// checking it): either a command sees the fence and drops out, or it is
	// seen here.
	qc.fenced.Store(true)
	if qc.changing(nil, 0, 0) {
		hf.draining[qc] = struct{}{}
		hf.stale.Store(int32(len(hf.draining)))
		hf.refs++
		c.t.log.Info("target: queue failed while commands of it change a namespace: the host's writes to the same blocks wait for them",
			"host", c.hostNQN, "subsystem", c.sub.nqn, "cntlid", c.id, "qid", qc.q.QID())
	}
	// Commands of this queue held in hold drop out too.
	hf.broadcastLocked()
}

// changeEnded is called when a command of a fenced queue stops changing a
// namespace: the host's commands held behind it look again.
func (qc *queueConn) changeEnded() {
	c := qc.ctrl.Load()
	if c == nil || c.host == nil {
		return
	}
	hf := c.host
	hf.sub.fenceMu.Lock()
	defer hf.sub.fenceMu.Unlock()
	if _, ok := hf.draining[qc]; ok && !qc.changing(nil, 0, 0) {
		delete(hf.draining, qc)
		hf.stale.Store(int32(len(hf.draining)))
		hf.releaseLocked()
		c.t.log.Debug("target: the failed queue's commands are done", "host", c.hostNQN, "subsystem", c.sub.nqn,
			"cntlid", c.id, "qid", qc.q.QID())
	}
	hf.broadcastLocked()
}

// beginChange is called by a command of w's queue about to change blocks
// [lo, hi) of n; endChange follows once the change is done. It fails when
// the queue has failed, and holds the command while a failed queue of the
// host is still changing those blocks.
func (c *controller) beginChange(w *worker, n *Namespace, lo, hi uint64) error {
	_, err := c.startChange(w, n, lo, hi, true)
	return err
}

// startChange is beginChange; without wait (on the receive loop) it returns
// false instead of holding the command while the host has failed queues
// still changing something, and then nothing is begun.
func (c *controller) startChange(w *worker, n *Namespace, lo, hi uint64, wait bool) (ok bool, err error) {
	qc := w.qc
	if qc.fenced.Load() {
		return true, c.dropped(qc)
	}
	if hf := c.host; hf != nil && hf.stale.Load() != 0 {
		if !wait {
			return false, nil
		}
		if err := c.hold(w, n, lo, hi); err != nil {
			return true, err
		}
	}
	w.lo.Store(lo)
	w.hi.Store(hi)
	w.ns.Store(n)
	if qc.fenced.Load() {
		w.ns.Store(nil)
		qc.changeEnded()
		return true, c.dropped(qc)
	}
	return true, nil
}

// endChange ends what beginChange began.
func (w *worker) endChange() {
	w.ns.Store(nil)
	if w.qc.fenced.Load() {
		w.qc.changeEnded()
	}
}

func (c *controller) dropped(qc *queueConn) error {
	if c.t.met != nil {
		c.t.met.fenceDropped.Inc()
	}
	return nvme.Errorf(nvme.StatusAbortedSQDeleted, "queue %d of controller %d failed: command not executed", qc.q.QID(), c.id)
}

// hold waits while a command of a failed queue of the controller's host is
// changing blocks of n that [lo, hi) overlaps, at most the fence timeout.
func (c *controller) hold(w *worker, n *Namespace, lo, hi uint64) error {
	hf := c.host
	var timer *time.Timer
	var start time.Time
	for {
		if w.qc.fenced.Load() {
			return c.dropped(w.qc)
		}
		hf.sub.fenceMu.Lock()
		var stale *queueConn
		for q := range hf.draining {
			if q.changing(n, lo, hi) {
				stale = q
				break
			}
		}
		changed := hf.changed
		hf.sub.fenceMu.Unlock()
		if stale == nil {
			return nil
		}
		if timer == nil {
			start = time.Now()
			timer = time.NewTimer(c.t.cfg.fenceTimeout)
			defer timer.Stop()
			if m := c.t.met; m != nil {
				m.held.Inc()
				defer m.held.Dec()
			}
		}
		select {
		case <-changed:
		case <-timer.C:
			sc := stale.ctrl.Load()
			c.t.log.Warn("target: write held back for the fence timeout: a command of the host's failed queue is still changing the same blocks; failing it with Namespace Not Ready",
				"host", c.hostNQN, "subsystem", c.sub.nqn, "nsid", n.nsid, "blocks", [2]uint64{lo, hi}, "cntlid", c.id,
				"failed_cntlid", sc.id, "failed_qid", stale.q.QID(), "waited", time.Since(start).Round(time.Millisecond))
			if m := c.t.met; m != nil {
				m.heldTimeouts.Inc()
			}
			return nvme.Errorf(nvme.StatusNamespaceNotReady,
				"blocks [%d, %d) of namespace %d: a command of queue %d of controller %d, whose connection failed, still changes them after %v",
				lo, hi, n.nsid, stale.q.QID(), sc.id, c.t.cfg.fenceTimeout)
		}
	}
}

// fenceLost fences the I/O queues of host's controllers on sub whose
// connections are lost. Their watchers do it too, but a new controller's commands
// must not overtake a watcher that has not run yet.
func (t *Target) fenceLost(sub *Subsystem, host string) {
	for _, c := range t.controllers() {
		if c.sub != sub || c.hostNQN != host {
			continue
		}
		c.mu.Lock()
		qs := make([]*queueConn, 0, len(c.ioQueues))
		for _, q := range c.ioQueues {
			qs = append(qs, q)
		}
		c.mu.Unlock()
		for _, q := range qs {
			select {
			case <-q.q.Lost():
				q.fence()
			default:
			}
		}
	}
}
