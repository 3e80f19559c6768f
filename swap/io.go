package swap

import (
	"fmt"
	"sync/atomic"

	"github.com/nprdma/nprdma/blockdev"
)

// ReadAt copies [off, off+len(p)) of the region into p, faulting absent pages
// in (minor for zero pages, major from the backing device, reading ahead
// within the request). A failed fault-in returns the bytes copied so far and
// an error wrapping the device's.
func (r *Region) ReadAt(p []byte, off int64) (int, error) {
	if err := r.checkRange("read", off, int64(len(p))); err != nil {
		return 0, err
	}
	if !r.enter() {
		return 0, r.errorf("read", 0, 0, ErrClosed)
	}
	defer r.exit()
	end := off + int64(len(p))
	lastPage := int((end - 1) / PageSize)
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		page, in := int(pos/PageSize), int(pos%PageSize)
		n := min(PageSize-in, len(p)-done)
		if err := r.readPage(page, in, p[done:done+n], lastPage-page+1); err != nil {
			return done, err
		}
		done += n
	}
	return done, nil
}

// readPage copies part of one page under a reader reference, which keeps the
// page resident during the copy; a copy that raced with a writer (the version
// moved) is repeated.
func (r *Region) readPage(page, in int, dst []byte, ahead int) error {
	w := &r.states[page]
	src := r.mem[page*PageSize+in : page*PageSize+in+len(dst)]
	var saturated spinWait
	for {
		s := atomic.LoadUint64(w)
		if s&StatePresent != 0 && s&StateBusy == 0 && StateReaders(s) < maxReaders {
			if !atomic.CompareAndSwapUint64(w, s, (s+readerOne)|StateReferenced) {
				continue
			}
			copyPagePart(dst, src, s)
			after := atomic.AddUint64(w, readerDec)
			if StateVersion(after) != StateVersion(s) {
				continue
			}
			if s&StateTracked == 0 {
				r.track(page) // filled through the raw view and not yet drained
			}
			return nil
		}
		if s&StateBusy != 0 {
			r.waiters.wait(page, w, notBusy)
			continue
		}
		if s&StatePresent != 0 {
			saturated.pause() // 255 readers: they finish within microseconds
			continue
		}
		held, err := r.faultIn(page, ahead, holdReader)
		if err != nil {
			return err
		}
		if held {
			// Faulted in for us and held resident: copy without marking
			// the page referenced (the fault was its first use, not a
			// reuse). A writer may have started since; then the copy is
			// not trusted and the loop starts over.
			s = atomic.LoadUint64(w)
			if s&StateBusy == 0 {
				copyPagePart(dst, src, s)
			}
			after := atomic.AddUint64(w, readerDec)
			if s&StateBusy == 0 && StateVersion(after) == StateVersion(s) {
				return nil
			}
		}
	}
}

// TryReadAt copies [off, off+len(p)) of the region into p, like ReadAt, if
// it can do so without waiting: every page present, not busy and tracked by
// the eviction policy. Otherwise, and on any error, it returns false at the
// first page that would wait, fault or lock, with p partly written: the
// caller then reads with ReadAt, which reports the error if there is one.
// It never blocks, faults or takes a lock (a caller on a connection's receive
// loop must not hold up the commands behind it).
func (r *Region) TryReadAt(p []byte, off int64) bool {
	if r.checkRange("read", off, int64(len(p))) != nil || !r.enter() {
		return false
	}
	defer r.exit()
	for done := 0; done < len(p); {
		pos := off + int64(done)
		page, in := int(pos/PageSize), int(pos%PageSize)
		n := min(PageSize-in, len(p)-done)
		if !r.tryReadPage(page, in, p[done:done+n]) {
			return false
		}
		done += n
	}
	return true
}

// tryRetries bounds how often a try-variant repeats a page copy that raced
// with a writer before it leaves the page to the blocking path.
const tryRetries = 3

// tryReadPage is readPage for a page that is resident: false instead of
// waiting for busy, faulting, or taking the policy's lock to track it.
func (r *Region) tryReadPage(page, in int, dst []byte) bool {
	w := &r.states[page]
	src := r.mem[page*PageSize+in : page*PageSize+in+len(dst)]
	for range tryRetries {
		s := atomic.LoadUint64(w)
		if s&(StatePresent|StateBusy|StateTracked) != StatePresent|StateTracked || StateReaders(s) == maxReaders {
			return false
		}
		if !atomic.CompareAndSwapUint64(w, s, (s+readerOne)|StateReferenced) {
			continue
		}
		copyPagePart(dst, src, s)
		if StateVersion(atomic.AddUint64(w, readerDec)) == StateVersion(s) {
			return true
		}
	}
	return false
}

// copyPagePart copies a resident page's bytes, read under a reader reference
// whose state word was s. A zero page is not read: its content is known, and
// on a virtual machine the first touch of a newly mapped page can cost more
// than the fault that mapped it (docs/swap.md, "Zero pages").
func copyPagePart(dst, src []byte, s uint64) {
	if s&StateZero != 0 {
		clear(dst)
		return
	}
	copy(dst, src)
}

// WriteAt copies p into the region at off. The write is volatile (the region
// is a write-back cache): Flush or WriteAtFUA make it durable. A full-page
// write to an absent page installs the new content without reading the old.
func (r *Region) WriteAt(p []byte, off int64) (int, error) {
	if err := r.checkRange("write", off, int64(len(p))); err != nil {
		return 0, err
	}
	if !r.enter() {
		return 0, r.errorf("write", 0, 0, ErrClosed)
	}
	defer r.exit()
	return r.write(p, off)
}

func (r *Region) write(p []byte, off int64) (int, error) {
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		page, in := int(pos/PageSize), int(pos%PageSize)
		n := min(PageSize-in, len(p)-done)
		if err := r.writePage(page, in, p[done:done+n]); err != nil {
			return done, err
		}
		done += n
	}
	return done, nil
}

// WriteAtFUA writes p like WriteAt and returns once it is durable on the
// backing device (forced unit access), without flushing anything else.
func (r *Region) WriteAtFUA(p []byte, off int64) (int, error) {
	if err := r.checkRange("write-fua", off, int64(len(p))); err != nil {
		return 0, err
	}
	if !r.enter() {
		return 0, r.errorf("write-fua", 0, 0, ErrClosed)
	}
	defer r.exit()
	n, err := r.write(p, off)
	if err != nil || n == 0 {
		return n, err
	}
	if err := r.writeThrough(int(off/PageSize), int((off+int64(n)-1)/PageSize)); err != nil {
		return 0, err
	}
	return n, nil
}

// TryWriteAt copies p into the region at off, like WriteAt, if it can do so
// without waiting: every page present, not busy and tracked, and each page's
// dirty-set shard lock free at once. Otherwise, and on any error, it returns
// false, having written nothing when a page was found wanting before the
// first copy, or a prefix of p when the state changed in between: the caller
// then writes the whole of p with WriteAt (the same bytes again). It never
// faults, waits for busy or waits for a lock held for long (waking a page's
// waiters takes their shard's lock, which they hold only to check a word).
func (r *Region) TryWriteAt(p []byte, off int64) bool {
	if r.checkRange("write", off, int64(len(p))) != nil || !r.enter() {
		return false
	}
	defer r.exit()
	if len(p) == 0 {
		return true
	}
	first, last := int(off/PageSize), int((off+int64(len(p))-1)/PageSize)
	for page := first; page <= last; page++ {
		if s := atomic.LoadUint64(&r.states[page]); s&(StatePresent|StateBusy|StateTracked) != StatePresent|StateTracked {
			return false
		}
	}
	for done := 0; done < len(p); {
		pos := off + int64(done)
		page, in := int(pos/PageSize), int(pos%PageSize)
		n := min(PageSize-in, len(p)-done)
		if !r.tryWritePage(page, in, p[done:done+n]) {
			return false
		}
		done += n
	}
	return true
}

// tryWritePage is writePage for a page that is resident: false instead of
// waiting for busy, faulting, or waiting for the dirty-set shard's lock
// (which Flush's snapshot holds over a whole shard). The lock is taken before
// busy, so a page is never left busy by a failed try.
func (r *Region) tryWritePage(page, in int, data []byte) bool {
	w := &r.states[page]
	dst := r.mem[page*PageSize+in : page*PageSize+in+len(data)]
	_, sh := r.dirty.shard(page)
	if !sh.mu.TryLock() {
		return false
	}
	taken := false
	for range tryRetries {
		s := atomic.LoadUint64(w)
		if s&(StatePresent|StateBusy|StateTracked) != StatePresent|StateTracked {
			break
		}
		// Busy with a version bump, as writePage.
		if atomic.CompareAndSwapUint64(w, s, (s|StateBusy)+versionOne) {
			taken = true
			break
		}
	}
	if !taken {
		sh.mu.Unlock()
		return false
	}
	copy(dst, data)
	r.finishWriteLocked(page, sh) // tracked: no policy insert
	sh.mu.Unlock()
	r.afterWrite(page)
	return true
}

func (r *Region) writePage(page, in int, data []byte) error {
	w := &r.states[page]
	full := in == 0 && len(data) == PageSize
	dst := r.mem[page*PageSize+in : page*PageSize+in+len(data)]
	for {
		s := atomic.LoadUint64(w)
		if s&StateBusy != 0 {
			r.waiters.wait(page, w, notBusy)
			continue
		}
		if s&StatePresent != 0 {
			// Busy with a version bump: NIC readers that began before
			// will see the version move and retry; new ones are refused.
			if !atomic.CompareAndSwapUint64(w, s, (s|StateBusy)+versionOne) {
				continue
			}
			copy(dst, data)
			r.finishWrite(page)
			return nil
		}
		if full {
			if !atomic.CompareAndSwapUint64(w, s, (s|StateBusy)+versionOne) {
				continue
			}
			return r.installWrite(page, data)
		}
		held, err := r.faultIn(page, 1, holdBusy)
		if err != nil {
			return err
		}
		if held {
			copy(dst, data)
			r.finishWrite(page)
			return nil
		}
	}
}

// installWrite maps a full page of new content over an absent page (busy
// held), skipping the read of the old content.
func (r *Region) installWrite(page int, data []byte) error {
	if err := r.reserve(); err != nil {
		r.abortFault(page, 1)
		return r.errorf("write", page, 1, err)
	}
	buf := r.bufs.get(1)
	defer r.bufs.put(buf)
	copy(*buf, data)
	mapped, err := r.c.install(page, *buf, true)
	if err != nil {
		r.unreserve(1)
		r.abortFault(page, 1)
		return r.errorf("write", page, 1, fmt.Errorf("map the page: %w", err))
	}
	if !mapped {
		r.unreserve(1)
	}
	r.finishWrite(page)
	return nil
}

// Trim deallocates [off, off+length): it reads back zeros afterwards. Whole
// pages are released, marked zero and discarded on the backing device;
// partial pages at the edges are zeroed by a write.
func (r *Region) Trim(off, length int64) error { return r.zeroRange("trim", off, length) }

// WriteZeroes makes [off, off+length) read zeros. It deallocates like Trim:
// the backing device's discard must leave zeros, which blockdev guarantees
// (BLKZEROOUT on devices, hole punching on files), and a device that refuses
// the discard gets the zeros written instead.
func (r *Region) WriteZeroes(off, length int64) error {
	return r.zeroRange("write-zeroes", off, length)
}

func (r *Region) zeroRange(op string, off, length int64) error {
	if err := r.checkRange(op, off, length); err != nil {
		return err
	}
	if !r.enter() {
		return r.errorf(op, 0, 0, ErrClosed)
	}
	defer r.exit()
	if length == 0 {
		return nil
	}
	end := off + length
	first := int((off + PageSize - 1) / PageSize) // first whole page
	last := int(end / PageSize)                   // end of the whole pages
	if first >= last {
		_, err := r.write(make([]byte, length), off)
		return err
	}
	if head := int64(first)*PageSize - off; head > 0 {
		if _, err := r.write(make([]byte, head), off); err != nil {
			return err
		}
	}
	if tail := end - int64(last)*PageSize; tail > 0 {
		if _, err := r.write(make([]byte, tail), int64(last)*PageSize); err != nil {
			return err
		}
	}
	for lo := first; lo < last; lo += trimChunk {
		if err := r.trimPages(op, lo, min(lo+trimChunk, last)); err != nil {
			return err
		}
	}
	return nil
}

// trimPages zeroes whole pages [first, end). It holds their writeback bits
// until the device discard is done, so that no writeback of older content can
// land after the discard; pages are released one at a time, so writers may
// already write the trimmed pages again (their writeback waits).
func (r *Region) trimPages(op string, first, end int) error {
	for p := first; p < end; p++ {
		r.claimWriteback(p, true) // ascending, no busy held
	}
	defer func() {
		for p := first; p < end; p++ {
			r.releaseWriteback(p)
		}
	}()
	var one [1]uint64
	for p := first; p < end; p++ {
		w := &r.states[p]
		for {
			s := atomic.LoadUint64(w)
			if s&StateBusy != 0 {
				r.waiters.wait(p, w, notBusy)
				continue
			}
			if s&StatePresent == 0 {
				// Absent: mark zero; the version bump makes a raw-view
				// fill that read the old content start again.
				if atomic.CompareAndSwapUint64(w, s, (s|StateZero)+versionOne) {
					break
				}
				continue
			}
			if !atomic.CompareAndSwapUint64(w, s, (s|StateBusy)+versionOne) {
				continue
			}
			r.drainReaders(p)
			r.discardDirty(p)
			one[0] = uint64(p)
			r.c.release(one[:], true)
			atomic.AndUint64(w, ^(StateBusy | StateReferenced))
			r.waiters.wake(p)
			break
		}
	}
	err := r.dev.Discard(int64(first)*PageSize, int64(end-first)*PageSize)
	if err == nil {
		return nil
	}
	r.log.Warn("discard failed; writing zeros instead", "page", first, "pages", end-first, "err", err)
	if werr := r.writeZerosToDevice(first, end); werr != nil {
		// The device keeps the old content: stop claiming zeros for the
		// pages still absent, so that memory and device agree again.
		for p := first; p < end; p++ {
			w := &r.states[p]
			for {
				s := atomic.LoadUint64(w)
				if s&(StatePresent|StateBusy) != 0 || s&StateZero == 0 ||
					atomic.CompareAndSwapUint64(w, s, (s&^StateZero)+versionOne) {
					break
				}
			}
		}
		return r.errorf(op, first, end-first, fmt.Errorf("discard: %v; writing zeros: %w", err, werr))
	}
	return nil
}

func (r *Region) writeZerosToDevice(first, end int) error {
	zeros := blockdev.AlignedBuffer(maxRun * PageSize)
	for p := first; p < end; p += maxRun {
		n := min(maxRun, end-p)
		if _, err := r.dev.WriteAt(zeros[:n*PageSize], int64(p)*PageSize); err != nil {
			return err
		}
	}
	return nil
}

// Prefetch faults in every page of [off, off+length) and returns when they
// are resident (unless the range exceeds the budget, in which case the
// earlier pages may already have been evicted again).
func (r *Region) Prefetch(off, length int64) error {
	if err := r.checkRange("prefetch", off, length); err != nil {
		return err
	}
	if !r.enter() {
		return r.errorf("prefetch", 0, 0, ErrClosed)
	}
	defer r.exit()
	return r.prefetch(off, length)
}

func (r *Region) prefetch(off, length int64) error {
	if length == 0 {
		return nil
	}
	first, end := int(off/PageSize), int((off+length+PageSize-1)/PageSize)
	for p := first; p < end; p++ {
		if atomic.LoadUint64(&r.states[p])&StatePresent != 0 {
			continue
		}
		if _, err := r.faultIn(p, end-p, holdNone); err != nil {
			return err
		}
	}
	return nil
}

// Advise queues a prefetch of [off, off+length) and returns at once (like
// ibv_advise_mr). When the queue is full the advice is dropped and counted.
func (r *Region) Advise(off, length int64) error {
	if err := r.checkRange("advise", off, length); err != nil {
		return err
	}
	if r.closed.Load() {
		return r.errorf("advise", 0, 0, ErrClosed)
	}
	select {
	case r.adviseQ <- span{off, length}:
	default:
		r.adviseDropped.Add(1)
	}
	return nil
}

func (r *Region) adviser() {
	defer r.wg.Done()
	for {
		select {
		case <-r.stop:
			return
		case sp := <-r.adviseQ:
			if err := r.prefetch(sp.off, sp.length); err != nil {
				r.adviseErrors.Add(1)
				r.log.Debug("advised prefetch failed", "off", sp.off, "length", sp.length, "err", err)
			}
		}
	}
}

// ReadBegin starts a NIC read of page (nprdma.Pager): it succeeds only if the
// page is present and not busy, takes a reader reference that keeps it
// resident, and returns the version as the sequence for ReadEnd, and whether
// the page is a zero page (its content need not be read). It never blocks and
// never faults.
func (r *Region) ReadBegin(page int) (seq uint64, zero, ok bool) {
	if page < 0 || int64(page) >= r.npages.Load() {
		return 0, false, false
	}
	w := &r.states[page]
	for {
		s := atomic.LoadUint64(w)
		if s&StatePresent == 0 || s&StateBusy != 0 || StateReaders(s) == maxReaders {
			return 0, false, false
		}
		if atomic.CompareAndSwapUint64(w, s, (s+readerOne)|StateReferenced) {
			return StateVersion(s), s&StateZero != 0, true
		}
	}
}

// ReadEnd ends a NIC read begun with seq and reports whether the page still
// has that version, i.e. the copy is one complete version of the page.
func (r *Region) ReadEnd(page int, seq uint64) bool {
	after := atomic.AddUint64(&r.states[page], readerDec)
	return StateVersion(after) == seq
}
