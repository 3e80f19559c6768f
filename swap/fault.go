package swap

import (
	"fmt"
	"sync/atomic"
	"time"
)

// FaultKind tells how a fault was resolved.
type FaultKind int

const (
	// FaultMinor: resolved without device I/O (a zero page: never written,
	// trimmed, or a hole of the backing file).
	FaultMinor FaultKind = iota
	// FaultMajor: resolved by reading the backing device.
	FaultMajor
)

func (k FaultKind) String() string {
	if k == FaultMajor {
		return "major"
	}
	return "minor"
}

// hold says what a successful fault-in leaves its caller holding on the page.
type hold int

const (
	holdNone   hold = iota
	holdReader      // a reader reference: the page stays resident until dropped
	holdBusy        // the busy bit: the caller changes the page and clears it
)

// tryReserve takes one budget slot if one is free.
func (r *Region) tryReserve() bool {
	for {
		cur := atomic.LoadInt64(r.resident)
		if cur >= r.budget {
			r.kickEvictor()
			return false
		}
		if atomic.CompareAndSwapInt64(r.resident, cur, cur+1) {
			if cur+1 > r.budget-r.freeMargin() {
				r.kickEvictor()
			}
			return true
		}
	}
}

func (r *Region) unreserve(n int) {
	if n > 0 {
		atomic.AddInt64(r.resident, -int64(n))
	}
}

// reserve takes one budget slot, evicting synchronously (direct reclaim) when
// the background evictor has not kept a slot free. It gives up with
// ErrNoMemory after cfg.reclaimTimeout without progress.
func (r *Region) reserve() error {
	if r.tryReserve() {
		return nil
	}
	start := time.Now()
	r.reclaimStalls.Add(1)
	delay := 20 * time.Microsecond
	for {
		freed := r.reclaim(8)
		if r.tryReserve() {
			r.obs.ReclaimStalled(time.Since(start))
			return nil
		}
		if time.Since(start) > r.cfg.reclaimTimeout {
			r.obs.ReclaimStalled(time.Since(start))
			return fmt.Errorf("%w within %v (budget %d pages, resident %d, dirty %d, writeback errors %d)",
				ErrNoMemory, r.cfg.reclaimTimeout, r.budget, atomic.LoadInt64(r.resident),
				r.dirty.count.Load(), r.writebackErrors.Load())
		}
		if freed == 0 {
			time.Sleep(delay)
			delay = min(2*delay, 5*time.Millisecond)
		}
	}
}

// faultIn makes page resident. ahead is how many pages from page on the
// caller is about to need; up to maxRun of them that are absent too are read
// with the same I/O. Concurrent faults on one page share one I/O: the second
// waits for the first's busy bit. If this call faulted the page in, it
// returns held=true with the page held as h asks; otherwise (someone else made
// it present) the caller just retries its access.
func (r *Region) faultIn(page, ahead int, h hold) (held bool, err error) {
	w := &r.states[page]
	for {
		s := atomic.LoadUint64(w)
		if s&StatePresent != 0 {
			return false, nil
		}
		if s&StateBusy != 0 {
			r.waiters.wait(page, w, notBusy)
			continue
		}
		if !atomic.CompareAndSwapUint64(w, s, (s|StateBusy)+versionOne) {
			continue
		}
		if r.isZero(page, s) {
			return r.minorFault(page, h)
		}
		return r.majorFault(page, ahead, h)
	}
}

func (r *Region) minorFault(page int, h hold) (bool, error) {
	start := time.Now()
	if err := r.reserve(); err != nil {
		r.abortFault(page, 1)
		r.faultErrors.Add(1)
		return false, r.errorf("fault-in", page, 1, err)
	}
	mapped, err := r.c.install(page, nil, false)
	if err != nil {
		r.unreserve(1)
		r.abortFault(page, 1)
		r.faultErrors.Add(1)
		return false, r.errorf("fault-in", page, 1, fmt.Errorf("map the zero page: %w", err))
	}
	if !mapped {
		r.unreserve(1) // a raw-view fill mapped it and counted it
	}
	r.finishFault(page, h)
	r.minorFaults.Add(1)
	r.obs.FaultDone(FaultMinor, time.Since(start))
	return h != holdNone, nil
}

// majorFault reads page, and the absent pages after it up to ahead, from the
// backing device with one read and installs them. The caller holds busy on
// page.
func (r *Region) majorFault(page, ahead int, h hold) (bool, error) {
	start := time.Now()
	n := 1
	for limit := min(ahead, maxRun, r.NumPages()-page); n < limit; n++ {
		w := &r.states[page+n]
		s := atomic.LoadUint64(w)
		if s&(StatePresent|StateBusy) != 0 || r.isZero(page+n, s) ||
			!atomic.CompareAndSwapUint64(w, s, (s|StateBusy)+versionOne) {
			break
		}
	}
	if err := r.reserve(); err != nil {
		r.abortFault(page, n)
		r.faultErrors.Add(1)
		return false, r.errorf("fault-in", page, 1, err)
	}
	for i := 1; i < n; i++ {
		if !r.tryReserve() {
			// Read ahead only into free slots.
			r.abortFault(page+i, n-i)
			n = i
			break
		}
	}
	buf := r.bufs.get(n)
	defer r.bufs.put(buf)
	if _, err := r.dev.ReadAt((*buf)[:n*PageSize], int64(page)*PageSize); err != nil {
		r.unreserve(n)
		r.abortFault(page, n)
		r.faultErrors.Add(1)
		return false, r.errorf("fault-in", page, n, err)
	}
	for i := 0; i < n; i++ {
		mapped, err := r.c.install(page+i, (*buf)[i*PageSize:(i+1)*PageSize], false)
		if err != nil {
			r.unreserve(n - i)
			r.abortFault(page+i, n-i)
			r.faultErrors.Add(1)
			return false, r.errorf("fault-in", page+i, 1, fmt.Errorf("map the page: %w", err))
		}
		if !mapped {
			r.unreserve(1)
		}
		hh := holdNone
		if i == 0 {
			hh = h
		}
		r.finishFault(page+i, hh)
	}
	d := time.Since(start)
	r.majorFaults.Add(uint64(n))
	for i := 0; i < n; i++ {
		r.obs.FaultDone(FaultMajor, d)
	}
	return h != holdNone, nil
}

// finishFault ends a fault-in of a now present page: it clears busy (unless
// the caller keeps it), starts tracking the page, and clears referenced so
// that the access that faulted the page in does not count as a reuse.
func (r *Region) finishFault(page int, h hold) {
	w := &r.states[page]
	var newlyTracked bool
	for {
		s := atomic.LoadUint64(w)
		ns := s &^ (StateBusy | StateReferenced)
		newlyTracked = s&StatePresent != 0 && s&StateTracked == 0
		if newlyTracked {
			ns |= StateTracked
		}
		switch h {
		case holdReader:
			ns += readerOne
		case holdBusy:
			ns |= StateBusy
		}
		if atomic.CompareAndSwapUint64(w, s, ns) {
			break
		}
	}
	if newlyTracked {
		r.insert(page)
	}
	if h != holdBusy {
		r.waiters.wake(page)
	}
}

// abortFault clears busy on n pages from page after a failed fault-in; they
// stay absent.
func (r *Region) abortFault(page, n int) {
	for i := page; i < page+n; i++ {
		atomic.AndUint64(&r.states[i], ^StateBusy)
		r.waiters.wake(i)
	}
}
