package swap

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// dirtySet holds the dirty pages, so that Flush and the writeback workers
// find them without scanning the region. The dirty bit and set membership
// change together under the page's shard lock, so a page is in the set
// exactly when its dirty bit is set.
type dirtySet struct {
	shards [64]dirtyShard
	count  atomic.Int64
}

type dirtyShard struct {
	mu    sync.Mutex
	pages map[int]struct{}
	_     [40]byte
}

func (d *dirtySet) init() {
	for i := range d.shards {
		d.shards[i].pages = make(map[int]struct{})
	}
}

// shard keeps runs of 64 neighbouring pages together, so a worker that owns
// a shard can coalesce their writeback.
func (d *dirtySet) shard(page int) (int, *dirtyShard) {
	i := (page >> 6) % len(d.shards)
	return i, &d.shards[i]
}

// snapshot returns every dirty page, sorted.
func (d *dirtySet) snapshot() []int {
	var out []int
	for i := range d.shards {
		sh := &d.shards[i]
		sh.mu.Lock()
		for p := range sh.pages {
			out = append(out, p)
		}
		sh.mu.Unlock()
	}
	slices.Sort(out)
	return out
}

// pick returns up to n dirty pages from the shards worker owns, sorted.
func (d *dirtySet) pick(worker, workers, n int) []int {
	var out []int
	for i := worker; i < len(d.shards) && len(out) < n; i += workers {
		sh := &d.shards[i]
		sh.mu.Lock()
		for p := range sh.pages {
			out = append(out, p)
			if len(out) == n {
				break
			}
		}
		sh.mu.Unlock()
	}
	slices.Sort(out)
	return out
}

// finishWrite ends a write of a present page: it clears busy (and zero), sets
// dirty and referenced, starts tracking the page, and wakes waiters.
func (r *Region) finishWrite(page int) {
	_, sh := r.dirty.shard(page)
	sh.mu.Lock()
	s := r.finishWriteLocked(page, sh)
	sh.mu.Unlock()
	if s&StateTracked == 0 {
		r.insert(page)
	}
	r.afterWrite(page)
}

// finishWriteLocked is the part of finishWrite under the page's dirty-set
// shard lock sh: the state change and the dirty set. It returns the state
// before.
func (r *Region) finishWriteLocked(page int, sh *dirtyShard) uint64 {
	w := &r.states[page]
	var s uint64
	for {
		s = atomic.LoadUint64(w)
		ns := (s &^ (StateBusy | StateZero)) | StateDirty | StateReferenced | StateTracked
		if atomic.CompareAndSwapUint64(w, s, ns) {
			break
		}
	}
	if s&StateDirty == 0 {
		sh.pages[page] = struct{}{}
		r.dirty.count.Add(1)
	}
	return s
}

// afterWrite wakes the page's waiters and, over the dirty limit, the
// writeback workers.
func (r *Region) afterWrite(page int) {
	r.waiters.wake(page)
	if r.dirty.count.Load() > r.dirtyLimit {
		r.kickWriteback()
	}
}

// clearDirty clears page's dirty bit if its version is still version (the
// content written back is the current one).
func (r *Region) clearDirty(page int, version uint64) bool {
	w := &r.states[page]
	_, sh := r.dirty.shard(page)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for {
		s := atomic.LoadUint64(w)
		if s&StateDirty == 0 || StateVersion(s) != version {
			return false
		}
		if atomic.CompareAndSwapUint64(w, s, s&^StateDirty) {
			delete(sh.pages, page)
			r.dirty.count.Add(-1)
			return true
		}
	}
}

// discardDirty clears page's dirty bit whatever its version (trim: the
// content is being thrown away). The caller holds busy.
func (r *Region) discardDirty(page int) {
	w := &r.states[page]
	_, sh := r.dirty.shard(page)
	sh.mu.Lock()
	if old := atomic.AndUint64(w, ^StateDirty); old&StateDirty != 0 {
		delete(sh.pages, page)
		r.dirty.count.Add(-1)
	}
	sh.mu.Unlock()
}

// claimWriteback sets page's writeback bit; with wait it waits for a
// writeback in flight. Lock order: a goroutine may wait for a writeback bit
// only while holding no busy bit and only writeback bits of lower pages;
// holders of busy never wait for writeback bits.
func (r *Region) claimWriteback(page int, wait bool) bool {
	w := &r.states[page]
	for {
		s := atomic.LoadUint64(w)
		if s&StateWriteback != 0 {
			if !wait {
				return false
			}
			r.waiters.wait(page, w, notWriteback)
			continue
		}
		if atomic.CompareAndSwapUint64(w, s, s|StateWriteback) {
			return true
		}
	}
}

func (r *Region) releaseWriteback(page int) {
	atomic.AndUint64(&r.states[page], ^StateWriteback)
	r.waiters.wake(page)
}

// snapshotPage copies page into dst under a reader reference and returns the
// version copied. ok is false if the page is absent, or clean when onlyDirty,
// or busy when !wait. A copy that raced with a writer is repeated.
func (r *Region) snapshotPage(page int, dst []byte, onlyDirty, wait bool) (version uint64, ok bool) {
	w := &r.states[page]
	var sw spinWait
	for {
		s := atomic.LoadUint64(w)
		if s&StatePresent == 0 || onlyDirty && s&StateDirty == 0 {
			return 0, false
		}
		if s&StateBusy != 0 {
			if !wait {
				return 0, false
			}
			r.waiters.wait(page, w, notBusy)
			continue
		}
		if StateReaders(s) == maxReaders {
			sw.pause()
			continue
		}
		if !atomic.CompareAndSwapUint64(w, s, s+readerOne) {
			continue
		}
		copy(dst, r.mem[page*PageSize:(page+1)*PageSize])
		after := atomic.AddUint64(w, readerDec)
		if StateVersion(after) == StateVersion(s) {
			return StateVersion(s), true
		}
	}
}

// writeback writes the dirty pages among pages (sorted) to the backing
// device, coalescing consecutive ones, from a private copy of each page so
// that readers and writers are never held up by the I/O. A page whose content
// changed meanwhile stays dirty. With wait (Flush) it waits for writebacks in
// flight and for busy pages; otherwise it skips them. A failed write leaves
// its pages dirty; the first error is returned.
func (r *Region) writeback(pages []int, wait bool) (written int, err error) {
	var firstErr error
	claimed := make([]int, 0, maxRun)
	for i := 0; i < len(pages); {
		if !r.claimWriteback(pages[i], wait) {
			i++
			continue
		}
		claimed = append(claimed[:0], pages[i])
		// Only the first claim may wait: later ones would wait while
		// holding a bit, which the lock order allows only upwards and
		// only without busy, but a try keeps Flush simple and never slower
		// than one write per page.
		for i++; i < len(pages) && len(claimed) < maxRun && pages[i] == pages[i-1]+1 && r.claimWriteback(pages[i], false); i++ {
			claimed = append(claimed, pages[i])
		}
		n, err := r.writeClaimed(claimed, true, wait, false)
		written += n
		if err != nil && firstErr == nil {
			firstErr = err
		}
		for _, p := range claimed {
			r.releaseWriteback(p)
		}
	}
	return written, firstErr
}

// writeRun writes consecutive pages from data and clears the dirty bits of
// those whose version did not change.
func (r *Region) writeRun(first int, data []byte, versions []uint64, fua bool) error {
	n := len(versions)
	start := time.Now()
	var err error
	if fua {
		_, err = r.dev.WriteAtFUA(data, int64(first)*PageSize)
	} else {
		_, err = r.dev.WriteAt(data, int64(first)*PageSize)
	}
	r.obs.WroteBack(n, time.Since(start), err)
	if err != nil {
		r.writebackErrors.Add(uint64(n))
		r.log.Warn("writeback failed; pages stay dirty", "page", first, "pages", n, "err", err)
		return r.errorf("writeback", first, n, err)
	}
	r.writebacks.Add(uint64(n))
	for k, v := range versions {
		r.clearDirty(first+k, v)
	}
	return nil
}

func (r *Region) kickWriteback() {
	for _, ch := range r.wbKick {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// writebackWorker keeps the dirty pages of its shards under the dirty limit
// (down to dirtyLow once it starts), retrying failed writebacks with backoff.
func (r *Region) writebackWorker(id int, kick <-chan struct{}) {
	defer r.wg.Done()
	workers := len(r.wbKick)
	backoff := time.Millisecond
	for {
		select {
		case <-r.stop:
			return
		case <-kick:
		}
		for r.dirty.count.Load() > r.dirtyLow {
			pages := r.dirty.pick(id, workers, 4*maxRun)
			if len(pages) == 0 {
				break
			}
			written, err := r.writeback(pages, false)
			if err != nil || written == 0 {
				// Failing device, or pages busy being rewritten: retry
				// later rather than spin.
				select {
				case <-r.stop:
					return
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, time.Second)
				continue
			}
			backoff = time.Millisecond
			select {
			case <-r.stop:
				return
			default:
			}
		}
	}
}

// Flush writes back every page that was dirty when it was called, then
// flushes the backing device (fdatasync). A failed writeback leaves its pages
// dirty for a later Flush and is returned naming the pages.
func (r *Region) Flush() error {
	if !r.enter() {
		return r.errorf("flush", 0, 0, ErrClosed)
	}
	defer r.exit()
	return r.flush()
}

func (r *Region) flush() error {
	pages := r.dirty.snapshot()
	// Split the work so that several writes are in flight; chunks are
	// contiguous in page order so each worker can coalesce.
	workers := min(max(len(r.wbKick), 1)*2, (len(pages)+maxRun-1)/maxRun)
	var errs []error
	if workers <= 1 {
		if _, err := r.writeback(pages, true); err != nil {
			errs = append(errs, err)
		}
	} else {
		var mu sync.Mutex
		var wg sync.WaitGroup
		per := (len(pages) + workers - 1) / workers
		for lo := 0; lo < len(pages); lo += per {
			chunk := pages[lo:min(lo+per, len(pages))]
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := r.writeback(chunk, true); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
	}
	if len(errs) > 0 {
		return r.errorf("flush", 0, 0, errors.Join(errs...))
	}
	if err := r.dev.Flush(); err != nil {
		return r.errorf("flush", 0, 0, err)
	}
	return nil
}

// writeThrough makes pages [first, last] durable now (FUA): it writes them
// with forced unit access whether dirty or not. A page that is no longer
// present was written back by someone else without FUA, so the device is
// flushed for it.
func (r *Region) writeThrough(first, last int) error {
	for lo := first; lo <= last; lo += maxRun {
		hi := min(lo+maxRun-1, last)
		pages := make([]int, 0, hi-lo+1)
		for p := lo; p <= hi; p++ {
			// Ascending, holding no busy bit: the lock order allows waiting.
			r.claimWriteback(p, true)
			pages = append(pages, p)
		}
		needFlush := false
		for _, p := range pages {
			if atomic.LoadUint64(&r.states[p])&StatePresent == 0 {
				needFlush = true
			}
		}
		_, err := r.writeClaimed(pages, false, true, true)
		for _, p := range pages {
			r.releaseWriteback(p)
		}
		if err != nil {
			return err
		}
		if needFlush {
			if err := r.dev.Flush(); err != nil {
				return r.errorf("write-fua", lo, hi-lo+1, err)
			}
		}
	}
	return nil
}

// writeClaimed writes pages (ascending, at most maxRun) whose writeback bits
// the caller holds, coalescing consecutive ones. Absent pages are skipped
// (their content is on the device already), and so are clean ones when
// onlyDirty and busy ones unless wait.
func (r *Region) writeClaimed(pages []int, onlyDirty, wait, fua bool) (written int, err error) {
	buf := r.bufs.get(len(pages))
	defer r.bufs.put(buf)
	var versions [maxRun]uint64
	var copied [maxRun]bool
	for k, p := range pages {
		versions[k], copied[k] = r.snapshotPage(p, (*buf)[k*PageSize:(k+1)*PageSize], onlyDirty, wait)
	}
	var firstErr error
	for k := 0; k < len(pages); {
		if !copied[k] {
			k++
			continue
		}
		m := k + 1
		for m < len(pages) && copied[m] && pages[m] == pages[m-1]+1 {
			m++
		}
		if err := r.writeRun(pages[k], (*buf)[k*PageSize:m*PageSize], versions[k:m], fua); err != nil {
			if firstErr == nil {
				firstErr = err
			}
		} else {
			written += m - k
		}
		k = m
	}
	return written, firstErr
}
