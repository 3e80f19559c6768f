package swap

import "sync/atomic"

// An eviction policy orders the tracked pages (those with StateTracked). It
// is used under Region.polMu only. Its memory is O(budget): it holds only
// pages that were made resident, never the whole region. Access information
// is the referenced bit of the state word, set by reads and writes and
// cleared here; new pages start unreferenced, so the access that faulted a
// page in does not count as a reuse.
type evictionPolicy interface {
	// insert adds a page that just became tracked.
	insert(page uint32)
	// next removes and returns the page the policy would evict now, after
	// giving referenced pages their second chance. The caller owns the
	// candidate until it returns it through putBack, evicted or dropped.
	next(ref referenced) (candidate, bool)
	// putBack returns a candidate that could not be evicted now.
	putBack(c candidate)
	// evicted records that a candidate left memory.
	evicted(c candidate)
	// dropped records that a candidate's page was found absent (trimmed).
	dropped(c candidate)
	len() int
}

type queueID uint8

const (
	queueMain queueID = iota
	queueSmall
)

type candidate struct {
	page uint32
	q    queueID
}

func newPolicy(p Policy, budget int) evictionPolicy {
	if p == PolicyCLOCK {
		return &clockPolicy{}
	}
	small := max(1, budget/10)
	return &s3fifoPolicy{smallTarget: small, ghost: newGhostSet(max(1, budget-small))}
}

// referenced is where the policy learns of accesses: the referenced bit of
// the state words, and for a shareable region the access map that readers
// in other processes set (they cannot write the state words).
type referenced struct {
	states []uint64
	access []uint64 // one bit per page; nil unless shareable
}

// testAndClear clears the page's referenced bit and access bit and reports
// whether either was set on a present page.
func (ref referenced) testAndClear(page uint32) bool {
	w := &ref.states[page]
	peer := false
	if ref.access != nil {
		// Written only when set: a store would allocate a hole of the map.
		a, bit := &ref.access[page/64], uint64(1)<<(page%64)
		if atomic.LoadUint64(a)&bit != 0 {
			peer = atomic.AndUint64(a, ^bit)&bit != 0
		}
	}
	if !peer && atomic.LoadUint64(w)&StateReferenced == 0 {
		return false
	}
	old := atomic.AndUint64(w, ^StateReferenced)
	return (peer || old&StateReferenced != 0) && old&StatePresent != 0
}

// clockPolicy is CLOCK written as a FIFO with reinsertion: the head is the
// hand; a referenced page loses its bit and goes to the tail.
type clockPolicy struct{ q deque }

func (p *clockPolicy) insert(page uint32) { p.q.pushBack(page) }
func (p *clockPolicy) len() int           { return p.q.len() }
func (p *clockPolicy) putBack(c candidate) {
	p.q.pushBack(c.page)
}
func (p *clockPolicy) evicted(candidate) {}
func (p *clockPolicy) dropped(candidate) {}

func (p *clockPolicy) next(ref referenced) (candidate, bool) {
	// Every reinsertion clears a bit, so two laps always find a victim
	// unless accessors keep setting bits as fast as the hand clears them.
	for laps := 2*p.q.len() + 1; laps > 0 && p.q.len() > 0; laps-- {
		page := p.q.popFront()
		if ref.testAndClear(page) {
			p.q.pushBack(page)
			continue
		}
		return candidate{page: page, q: queueMain}, true
	}
	if p.q.len() == 0 {
		return candidate{}, false
	}
	return candidate{page: p.q.popFront(), q: queueMain}, true
}

// s3fifoPolicy is S3-FIFO (Yang et al., SOSP'23) with a one-bit frequency:
// new pages enter a small FIFO (10% of the budget); a page referenced while
// there moves to the main FIFO, an unreferenced one is evicted and remembered
// in a ghost set. A page that faults in again while remembered goes straight
// to main. Main is CLOCK. One-time accesses (scans) thus pass through the
// small queue without displacing the working set in main.
type s3fifoPolicy struct {
	small, main deque
	smallTarget int
	ghost       *ghostSet
}

func (p *s3fifoPolicy) len() int { return p.small.len() + p.main.len() }

func (p *s3fifoPolicy) insert(page uint32) {
	if p.ghost.remove(page) {
		p.main.pushBack(page)
		return
	}
	p.small.pushBack(page)
}

func (p *s3fifoPolicy) putBack(c candidate) {
	if c.q == queueSmall {
		p.small.pushBack(c.page)
	} else {
		p.main.pushBack(c.page)
	}
}

func (p *s3fifoPolicy) evicted(c candidate) {
	if c.q == queueSmall {
		p.ghost.add(c.page)
	}
}

func (p *s3fifoPolicy) dropped(candidate) {}

func (p *s3fifoPolicy) next(ref referenced) (candidate, bool) {
	for steps := 2*p.len() + 1; steps > 0; steps-- {
		if p.small.len() > 0 && (p.small.len() > p.smallTarget || p.main.len() == 0) {
			page := p.small.popFront()
			if ref.testAndClear(page) {
				p.main.pushBack(page)
				continue
			}
			return candidate{page: page, q: queueSmall}, true
		}
		if p.main.len() == 0 {
			return candidate{}, false
		}
		page := p.main.popFront()
		if ref.testAndClear(page) {
			p.main.pushBack(page)
			continue
		}
		return candidate{page: page, q: queueMain}, true
	}
	if p.main.len() > 0 {
		return candidate{page: p.main.popFront(), q: queueMain}, true
	}
	if p.small.len() > 0 {
		return candidate{page: p.small.popFront(), q: queueSmall}, true
	}
	return candidate{}, false
}

// ghostSet remembers the last capacity pages evicted from the small queue.
type ghostSet struct {
	capacity int
	ring     []ghostEntry
	head, n  int
	seq      uint64
	member   map[uint32]uint64 // page -> seq of its newest ring entry
}

type ghostEntry struct {
	page uint32
	seq  uint64
}

func newGhostSet(capacity int) *ghostSet {
	return &ghostSet{capacity: capacity, member: make(map[uint32]uint64)}
}

func (g *ghostSet) add(page uint32) {
	if g.ring == nil {
		// Grow with use rather than allocating the full capacity up front.
		g.ring = make([]ghostEntry, min(g.capacity, 1024))
	}
	if g.n == len(g.ring) {
		if len(g.ring) < g.capacity {
			grown := make([]ghostEntry, min(g.capacity, 2*len(g.ring)))
			for i := 0; i < g.n; i++ {
				grown[i] = g.ring[(g.head+i)%len(g.ring)]
			}
			g.ring, g.head = grown, 0
		} else {
			old := g.ring[g.head]
			if s, ok := g.member[old.page]; ok && s == old.seq {
				delete(g.member, old.page)
			}
			g.head = (g.head + 1) % len(g.ring)
			g.n--
		}
	}
	g.seq++
	g.ring[(g.head+g.n)%len(g.ring)] = ghostEntry{page: page, seq: g.seq}
	g.n++
	g.member[page] = g.seq
}

// remove reports whether page was remembered and forgets it.
func (g *ghostSet) remove(page uint32) bool {
	if _, ok := g.member[page]; ok {
		delete(g.member, page)
		return true
	}
	return false
}

// deque is a growable ring buffer of page numbers.
type deque struct {
	buf     []uint32
	head, n int
}

func (d *deque) len() int { return d.n }

func (d *deque) pushBack(v uint32) {
	if d.n == len(d.buf) {
		grown := make([]uint32, max(64, 2*len(d.buf)))
		for i := 0; i < d.n; i++ {
			grown[i] = d.buf[(d.head+i)%len(d.buf)]
		}
		d.buf, d.head = grown, 0
	}
	d.buf[(d.head+d.n)%len(d.buf)] = v
	d.n++
}

func (d *deque) popFront() uint32 {
	v := d.buf[d.head]
	d.head = (d.head + 1) % len(d.buf)
	d.n--
	return v
}
