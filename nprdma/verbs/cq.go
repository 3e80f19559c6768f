//go:build cgo && !noverbs

package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nprdma/nprdma/nprdma"
)

// cqSlack is how many completions beyond its depth a CQ's hardware queue
// holds: a queue pair's drain markers (see QP.Close) and the completions a
// hidden signal produces (see QP.PostSend). An overrun would put every
// queue pair on the CQ in error, so the hardware queue is never sized
// exactly.
const cqSlack = 256

// CQ is a completion queue with a completion channel.
//
// Waiting: a goroutine of the CQ's own reads the channel (through Go's
// network poller) and rings a bell after every event, with the CQ armed
// again first, so that a completion is never missed between a waiter's
// last poll and its sleep. Waiters poll the CQ themselves; a CQ made with a
// busy-poll time spins on ibv_poll_cq that long before it sleeps.
type CQ struct {
	dev      *Device
	cq       *C.struct_ibv_cq
	ch       *C.struct_ibv_comp_channel
	chFile   *os.File
	depth    int
	busyPoll time.Duration

	mu    sync.Mutex // polling, the stash
	stash []nprdma.WC
	raw   [64]C.np_wc
	qps   map[uint32]*QP // queue pairs using the CQ, by number (under mu)

	bell     chan struct{}
	sleepers atomic.Int32
	users    atomic.Int32
	closed   atomic.Bool
	done     chan struct{} // the event goroutine stopped
}

// NewCQ implements nprdma.DeviceDriver: a completion queue of depth
// completions whose waiters spin for busyPoll before they sleep (0: never
// spin).
func (d *Device) NewCQ(depth int, busyPoll time.Duration) (nprdma.CQDriver, error) {
	if depth < 1 {
		depth = 1
	}
	hwDepth := depth + cqSlack
	if d.info.MaxCQE > 0 && hwDepth > d.info.MaxCQE {
		if depth > d.info.MaxCQE {
			return nil, fmt.Errorf("verbs: %s: completion queue of %d entries: the device holds at most %d", d.info.Name, depth, d.info.MaxCQE)
		}
		hwDepth = d.info.MaxCQE
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("verbs: %s: create completion queue: %w", d.info.Name, nprdma.ErrClosed)
	}
	var e C.int
	ch := C.np_create_channel(d.ctx, &e)
	if ch == nil {
		return nil, fmt.Errorf("verbs: %s: create completion channel: %w", d.info.Name, syscall.Errno(e))
	}
	cq := C.np_create_cq(d.ctx, C.int(hwDepth), ch, &e)
	if cq == nil {
		C.np_destroy_channel(ch)
		return nil, fmt.Errorf("verbs: %s: create completion queue of %d entries: %w", d.info.Name, hwDepth, syscall.Errno(e))
	}
	f, err := pollable(int(ch.fd), "completion channel")
	if err == nil {
		if rc := C.np_req_notify(cq); rc != 0 {
			f.Close()
			err = fmt.Errorf("request notification: %w", errnoErr(rc))
		}
	}
	if err != nil {
		C.np_destroy_cq(cq)
		C.np_destroy_channel(ch)
		return nil, fmt.Errorf("verbs: %s: %w", d.info.Name, err)
	}
	c := &CQ{dev: d, cq: cq, ch: ch, chFile: f, depth: depth, busyPoll: busyPoll,
		qps: map[uint32]*QP{}, bell: make(chan struct{}, 1), done: make(chan struct{})}
	d.cqs[c] = struct{}{}
	go c.events()
	return c, nil
}

// Depth is the number of completions the queue is sized for.
func (cq *CQ) Depth() int { return cq.depth }

// events takes the channel's events, arms the CQ again and rings the bell.
func (cq *CQ) events() {
	defer close(cq.done)
	waitReadable(cq.chFile, func() bool {
		got := false
		for {
			rc := C.np_get_cq_event(cq.ch)
			if rc <= 0 {
				break
			}
			got = true
		}
		if got {
			C.np_req_notify(cq.cq)
			cq.ring()
		}
		return false
	})
}

func (cq *CQ) ring() {
	select {
	case cq.bell <- struct{}{}:
	default:
	}
}

func (cq *CQ) attach(qp *QP) {
	cq.mu.Lock()
	cq.qps[qp.num] = qp
	cq.mu.Unlock()
}

func (cq *CQ) detach(qp *QP) {
	cq.mu.Lock()
	if cq.qps[qp.num] == qp {
		delete(cq.qps, qp.num)
	}
	cq.mu.Unlock()
}

// Poll moves up to len(wcs) completions into wcs without waiting.
func (cq *CQ) Poll(wcs []nprdma.WC) int {
	if len(wcs) == 0 || cq.closed.Load() {
		return 0
	}
	cq.mu.Lock()
	n := copy(wcs, cq.stash)
	cq.stash = cq.stash[:copy(cq.stash, cq.stash[n:])]
	for n < len(wcs) {
		k := cq.pollLocked(wcs[n:])
		if k <= 0 {
			break
		}
		n += k
	}
	more := len(cq.stash) > 0
	cq.mu.Unlock()
	if more && cq.sleepers.Load() > 0 {
		cq.ring()
	}
	return n
}

// pollLocked polls the hardware queue once, turning its completions into
// the application's: internal ones (drain markers, hidden signals) are
// dropped, and an error fails its queue pair. It returns how many it put
// in out, or -1 when the hardware queue was empty.
func (cq *CQ) pollLocked(out []nprdma.WC) int {
	want := min(len(out), len(cq.raw))
	got := int(C.np_poll(cq.cq, C.int(want), &cq.raw[0]))
	if got <= 0 {
		return -1
	}
	n := 0
	for i := 0; i < got; i++ {
		w := &cq.raw[i]
		qp := cq.qps[uint32(w.qp_num)]
		if qp == nil {
			continue // a queue pair closed since (its completions went before)
		}
		wc, ok := qp.complete(w)
		if ok {
			out[n] = wc
			n++
		}
	}
	return n
}

// reap polls the hardware queue into the stash until it is empty.
func (cq *CQ) reap() {
	var buf [64]nprdma.WC
	got := false
	cq.mu.Lock()
	for {
		k := cq.pollLocked(buf[:])
		if k < 0 {
			break
		}
		cq.stash = append(cq.stash, buf[:k]...)
		got = got || k > 0
	}
	cq.mu.Unlock()
	if got && cq.sleepers.Load() > 0 {
		cq.ring()
	}
}

// drainUntil polls the hardware queue into the stash until done reports
// true (QP.Close waits for its drain markers this way).
func (cq *CQ) drainUntil(done func() bool, deadline time.Time) bool {
	var buf [64]nprdma.WC
	for !done() {
		cq.mu.Lock()
		k := cq.pollLocked(buf[:])
		if k > 0 {
			cq.stash = append(cq.stash, buf[:k]...)
		}
		cq.mu.Unlock()
		if k > 0 && cq.sleepers.Load() > 0 {
			cq.ring()
		}
		if k < 0 {
			if time.Now().After(deadline) {
				return false
			}
			runtime.Gosched()
			time.Sleep(50 * time.Microsecond)
		}
	}
	return true
}

// Wait returns at least one completion, waiting until one arrives, ctx
// ends or the queue is closed.
func (cq *CQ) Wait(ctx context.Context, wcs []nprdma.WC) (int, error) {
	if len(wcs) == 0 {
		return 0, fmt.Errorf("verbs: cq wait: empty completion slice")
	}
	spin := cq.busyPoll
	if runtime.GOMAXPROCS(0) < 2 {
		spin = 0
	}
	for {
		if n := cq.Poll(wcs); n > 0 {
			return n, nil
		}
		if cq.closed.Load() {
			return 0, fmt.Errorf("verbs: completion queue: %w", nprdma.ErrClosed)
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if spin > 0 {
			deadline := time.Now().Add(spin)
			for i := 1; ; i++ {
				if n := cq.Poll(wcs); n > 0 {
					return n, nil
				}
				if i%64 == 0 && (time.Now().After(deadline) || ctx.Err() != nil) {
					break
				}
			}
			spin = 0
			continue
		}
		cq.sleepers.Add(1)
		if n := cq.Poll(wcs); n > 0 {
			cq.sleepers.Add(-1)
			return n, nil
		}
		select {
		case <-cq.bell:
		case <-ctx.Done():
		case <-cq.done:
		}
		cq.sleepers.Add(-1)
	}
}

// Overflowed reports whether the hardware queue overran. Queues are sized
// with slack (cqSlack), so it is always false for a CQ sized for its work.
func (cq *CQ) Overflowed() bool { return false }

// Close destroys the queue; it fails while queue pairs use it.
func (cq *CQ) Close() error {
	if n := cq.users.Load(); n > 0 {
		return fmt.Errorf("verbs: close completion queue: used by %d queue pairs", n)
	}
	if !cq.closed.CompareAndSwap(false, true) {
		return nil
	}
	cq.chFile.Close()
	<-cq.done
	cq.ring()
	cq.dev.mu.Lock()
	delete(cq.dev.cqs, cq)
	cq.dev.mu.Unlock()
	var err error
	if rc := C.np_destroy_cq(cq.cq); rc != 0 {
		err = fmt.Errorf("verbs: destroy completion queue: %w", errnoErr(rc))
	}
	if rc := C.np_destroy_channel(cq.ch); rc != 0 && err == nil {
		err = fmt.Errorf("verbs: destroy completion channel: %w", errnoErr(rc))
	}
	return err
}
