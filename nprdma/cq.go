package nprdma

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// CQ is a completion queue, shareable by many queue pairs.
//
// Overflow: the queue holds at most depth completions. A completion that
// finds it full is dropped, the queue becomes overflowed for good (as a
// verbs CQ in error) and takes no completion any more, and each queue pair
// whose completion is dropped moves to the error state (ErrCQOverflow).
// Poll still returns what the queue held; Wait returns ErrCQOverflow once it
// is empty, so a waiter never hangs on a completion that was lost.
type softCQ struct {
	dev      *softDevice
	depth    int
	busyPoll time.Duration

	mu         sync.Mutex
	buf        []WC
	head, n    int
	overflowed bool
	closed     bool

	avail    atomic.Int32 // n, readable without the lock
	sleepers atomic.Int32
	bell     chan struct{}
	users    atomic.Int32 // queue pairs attached
	dead     atomic.Bool  // overflowed or closed: Wait must not park

	qps    map[*softQP]int        // attached queue pairs (as send and/or receive CQ), under mu
	solo   atomic.Pointer[softQP] // the only queue pair attached, if there is one
	waiter cqWaiter               // what Wait passes to Driver.Drive
}

// cqWaiter is a CQ's goroutine in Wait, as a link driver sees it.
type cqWaiter struct{ cq *softCQ }

// Done implements DriveWaiter: the queue has a completion or an error.
func (w *cqWaiter) Done() bool { return w.cq.avail.Load() > 0 || w.cq.dead.Load() }

// Wake implements DriveWaiter.
func (w *cqWaiter) Wake() { w.cq.ring() }

// BusyPoll implements DriveWaiter: a busy-polling CQ's waiter spins on the
// link too.
func (w *cqWaiter) BusyPoll() time.Duration { return w.cq.spinBudget() }

// spinBudget is how long Wait may spin before it blocks: the CQ's busy-poll
// time when there is a spare P, else 0 (with a single P spinning would only
// delay the goroutine that delivers the completion).
func (cq *softCQ) spinBudget() time.Duration {
	if cq.busyPoll > 0 && runtime.GOMAXPROCS(0) > 1 {
		return cq.busyPoll
	}
	return 0
}

// attach and detach keep track of the queue pairs using the CQ: a waiter
// may drive the link of the only one (direct completion, see Wait).
func (cq *softCQ) attach(qp *softQP) {
	cq.mu.Lock()
	if cq.qps == nil {
		cq.qps = map[*softQP]int{}
	}
	cq.qps[qp]++
	cq.setSoloLocked()
	cq.mu.Unlock()
}

func (cq *softCQ) detach(qp *softQP) {
	cq.mu.Lock()
	if cq.qps[qp]--; cq.qps[qp] <= 0 {
		delete(cq.qps, qp)
	}
	cq.setSoloLocked()
	cq.mu.Unlock()
}

func (cq *softCQ) setSoloLocked() {
	var solo *softQP
	if len(cq.qps) == 1 {
		for qp := range cq.qps {
			solo = qp
		}
	}
	cq.solo.Store(solo)
}

// NewCQ creates a completion queue holding up to depth completions (at least
// 1).
func (d *softDevice) NewCQ(depth int, busyPoll time.Duration) (CQDriver, error) {
	if depth < 1 {
		depth = 1
	}
	cq := &softCQ{dev: d, depth: depth, busyPoll: busyPoll, buf: make([]WC, depth), bell: make(chan struct{}, 1)}
	cq.waiter.cq = cq
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("nprdma: create completion queue: device %s: %w", d.name, ErrClosed)
	}
	d.cqs[cq] = struct{}{}
	return cq, nil
}

// Depth is the capacity of the queue.
func (cq *softCQ) Depth() int { return cq.depth }

// push appends completions; it reports false if any was dropped because the
// queue is full (or closed).
func (cq *softCQ) push(wcs ...WC) bool {
	cq.mu.Lock()
	ok := true
	for _, wc := range wcs {
		if cq.closed || cq.overflowed || cq.n == cq.depth {
			if !cq.closed {
				cq.overflowed = true
				cq.dead.Store(true)
			}
			ok = false
			continue
		}
		cq.buf[(cq.head+cq.n)%cq.depth] = wc
		cq.n++
	}
	cq.avail.Store(int32(cq.n))
	cq.mu.Unlock()
	if cq.sleepers.Load() > 0 {
		cq.ring()
	}
	return ok
}

func (cq *softCQ) ring() {
	select {
	case cq.bell <- struct{}{}:
	default:
	}
}

// Poll moves up to len(wcs) completions into wcs without waiting and returns
// how many.
func (cq *softCQ) Poll(wcs []WC) int {
	if cq.avail.Load() == 0 || len(wcs) == 0 {
		return 0
	}
	cq.mu.Lock()
	k := min(cq.n, len(wcs))
	for i := 0; i < k; i++ {
		wcs[i] = cq.buf[cq.head]
		cq.head = (cq.head + 1) % cq.depth
	}
	cq.n -= k
	cq.avail.Store(int32(cq.n))
	more := cq.n > 0
	cq.mu.Unlock()
	if more && cq.sleepers.Load() > 0 {
		cq.ring() // let the next waiter take the rest
	}
	return k
}

// Wait returns at least one completion, waiting until one arrives, ctx ends,
// or the queue overflows or is closed (then its error once the queue is
// empty).
//
// Direct completion: when a single queue pair uses the CQ and its link
// allows it (nprdma/tcp does), the waiting goroutine receives the link's
// packets itself instead of being woken by the link's goroutine; see
// Driver. This does not change what Wait returns, only who runs the
// receive path. A busy-polling CQ's waiter then spins on the link itself
// (DriveWaiter.BusyPoll); when it cannot drive it spins on the queue.
func (cq *softCQ) Wait(ctx context.Context, wcs []WC) (int, error) {
	if len(wcs) == 0 {
		return 0, fmt.Errorf("nprdma: cq wait: empty completion slice")
	}
	spin := cq.spinBudget()
	for {
		if n := cq.Poll(wcs); n > 0 {
			return n, nil
		}
		if err := cq.err(); err != nil {
			return 0, err
		}
		if cq.drive(ctx) {
			if ctx.Err() != nil && cq.avail.Load() == 0 {
				return 0, ctx.Err()
			}
			continue
		}
		if spin > 0 {
			if n := cq.spin(ctx, wcs, spin); n > 0 {
				return n, nil
			}
			spin = 0
			continue
		}
		cq.sleepers.Add(1)
		if cq.avail.Load() > 0 || cq.dead.Load() {
			cq.sleepers.Add(-1)
			continue
		}
		select {
		case <-cq.bell:
			cq.sleepers.Add(-1)
		case <-ctx.Done():
			cq.sleepers.Add(-1)
			if n := cq.Poll(wcs); n > 0 {
				return n, nil
			}
			return 0, ctx.Err()
		}
	}
}

// spin polls the queue for up to d: the goroutine delivering completions
// runs on another P and needs to wake nobody when it pushes one. It stops
// early at the bell: the link the waiter could not drive may be free now
// (DriveWaiter.Wake). It yields its P now and then: the goroutine that will
// deliver the completion is often runnable on this very P (the waiter's own
// post made it so), and without the yield it would wait for another P to
// steal it, or for the spin to end (loop READ 1.4 µs → 120 µs).
func (cq *softCQ) spin(ctx context.Context, wcs []WC, d time.Duration) int {
	deadline := nanotime() + int64(d)
	for i := 1; ; i++ {
		if cq.avail.Load() > 0 {
			if n := cq.Poll(wcs); n > 0 {
				return n
			}
		}
		if i%128 == 0 {
			if cq.dead.Load() || nanotime() > deadline || ctx.Err() != nil {
				return 0
			}
			select {
			case <-cq.bell:
				return 0
			default:
			}
			runtime.Gosched()
		}
	}
}

// drive receives on the link of the CQ's only queue pair until a completion
// arrives or ctx ends; false if it cannot (several queue pairs, a link that
// does not allow it or is busy receiving elsewhere).
func (cq *softCQ) drive(ctx context.Context) bool {
	qp := cq.solo.Load()
	if qp == nil || qp.State() != QPStateRTS {
		return false
	}
	d := qp.driver.Load()
	if d == nil {
		return false
	}
	return d.Drive(ctx, &cq.waiter)
}

func (cq *softCQ) err() error {
	if !cq.dead.Load() {
		return nil
	}
	cq.mu.Lock()
	defer cq.mu.Unlock()
	switch {
	case cq.closed:
		return fmt.Errorf("nprdma: completion queue: %w", ErrClosed)
	case cq.overflowed:
		return fmt.Errorf("nprdma: completion queue of depth %d: %w", cq.depth, ErrCQOverflow)
	}
	return nil
}

// Overflowed reports whether a completion was ever dropped.
func (cq *softCQ) Overflowed() bool {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return cq.overflowed
}

// Close releases the queue. Like ibv_destroy_cq it fails while queue pairs
// that are not closed use it. Waiters return ErrClosed.
func (cq *softCQ) Close() error {
	if n := cq.users.Load(); n > 0 {
		return fmt.Errorf("nprdma: close completion queue: used by %d queue pairs", n)
	}
	cq.mu.Lock()
	cq.closed = true
	cq.mu.Unlock()
	cq.dead.Store(true)
	cq.ring()
	cq.dev.mu.Lock()
	delete(cq.dev.cqs, cq)
	cq.dev.mu.Unlock()
	return nil
}
