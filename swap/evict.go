package swap

import (
	"slices"
	"sync/atomic"
	"time"
)

func (r *Region) kickEvictor() {
	select {
	case r.evictKick <- struct{}{}:
	default:
	}
}

// evictor keeps freeMargin budget slots free so that faults rarely have to
// reclaim directly, and brings resident back under the budget after raw-view
// fills (which the fault threads cannot refuse) pushed it above.
func (r *Region) evictor() {
	defer r.wg.Done()
	for {
		select {
		case <-r.stop:
			return
		case <-r.evictKick:
		case <-r.fillNotify:
		}
		r.drainFills()
		idle := time.Millisecond
		for {
			excess := atomic.LoadInt64(r.resident) - (r.budget - r.freeMargin())
			if excess <= 0 {
				break
			}
			freed := r.reclaim(int(min(excess, 64)))
			r.drainFills()
			if freed > 0 {
				idle = time.Millisecond
				continue
			}
			// Nothing evictable now (all busy, or dirty with failing
			// writeback): back off instead of spinning.
			select {
			case <-r.stop:
				return
			case <-time.After(idle):
			}
			idle = min(2*idle, 100*time.Millisecond)
		}
	}
}

// reclaim evicts up to want pages in the policy's order and returns how many
// it released. Eviction order: (1) a dirty victim is written back first while
// readers keep reading, (2) busy is set with a version bump, which
// invalidates the page for NIC readers, (3) the readers drain and the memory
// is released (MADV_DONTNEED), (4) the page is absent.
func (r *Region) reclaim(want int) int {
	var cleanBuf, dirtyBuf [64]candidate
	clean, dirty := cleanBuf[:0], dirtyBuf[:0]
	want = min(want, len(cleanBuf))

	r.polMu.Lock()
	for limit := r.pol.len() + 1; len(clean)+len(dirty) < want && limit > 0; limit-- {
		c, ok := r.pol.next(referenced{r.states, r.shared.access})
		if !ok {
			break
		}
		w := &r.states[c.page]
		s := atomic.LoadUint64(w)
		switch {
		case s&(StatePresent|StateBusy) == 0:
			// A stale entry: the page was trimmed while tracked.
			if atomic.CompareAndSwapUint64(w, s, s&^StateTracked) {
				r.pol.dropped(c)
			} else {
				r.pol.putBack(c)
			}
		case s&StatePresent == 0, s&(StateBusy|StateWriteback) != 0, StateReaders(s) > 0:
			r.pol.putBack(c)
		case s&StateDirty != 0:
			dirty = append(dirty, c)
		default:
			clean = append(clean, c)
		}
	}
	r.polMu.Unlock()

	if len(dirty) > 0 {
		pages := make([]int, len(dirty))
		for i, c := range dirty {
			pages[i] = int(c.page)
		}
		slices.Sort(pages)
		// Errors are counted and logged by writeback; the pages stay dirty
		// and go back to the policy below.
		r.writeback(pages, false)
		clean = append(clean, dirty...)
	}
	return r.evict(clean)
}

// evict releases the candidates that are still present, clean and idle, and
// returns the others to the policy.
func (r *Region) evict(cands []candidate) int {
	if len(cands) == 0 {
		return 0
	}
	var wonBuf [64]candidate
	won := wonBuf[:0]
	var keep []candidate
	for _, c := range cands {
		w := &r.states[c.page]
		taken := false
		for {
			s := atomic.LoadUint64(w)
			if s&StatePresent == 0 || s&(StateBusy|StateDirty|StateWriteback) != 0 || StateReaders(s) > 0 {
				break
			}
			if atomic.CompareAndSwapUint64(w, s, (s|StateBusy)+versionOne) {
				taken = true
				break
			}
		}
		if taken {
			won = append(won, c)
		} else {
			keep = append(keep, c)
		}
	}
	slices.SortFunc(won, func(a, b candidate) int { return int(a.page) - int(b.page) })
	pages := make([]uint64, len(won))
	for i, c := range won {
		pages[i] = uint64(c.page)
		r.drainReaders(int(c.page))
	}
	released := r.c.release(pages, false)
	for _, c := range won {
		atomic.AndUint64(&r.states[c.page], ^(StateBusy | StateTracked | StateReferenced))
	}
	r.polMu.Lock()
	for _, c := range won {
		r.pol.evicted(c)
	}
	for _, c := range keep {
		r.pol.putBack(c)
	}
	r.polMu.Unlock()
	for _, c := range won {
		r.waiters.wake(int(c.page))
	}
	if len(won) > 0 {
		r.evictions.Add(uint64(len(won)))
		r.obs.Evicted(len(won))
	}
	return released
}

// drainReaders waits until no reader holds page. The caller holds busy, so no
// new reader can start; the ones inside finish a page copy within
// microseconds.
func (r *Region) drainReaders(page int) {
	w := &r.states[page]
	var sw spinWait
	for StateReaders(atomic.LoadUint64(w)) > 0 {
		sw.pause()
	}
}
