package swap

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// waitTable lets Go code wait for another goroutine to clear a page's busy or
// writeback bit. Waiting is Go waiting on Go (never C, never a fault), so a
// condition variable is fine; it is sharded by page so that unrelated pages do
// not contend, and a waker pays for a lock only when someone waits in its shard.
type waitTable struct {
	shards [256]waitShard
}

type waitShard struct {
	mu      sync.Mutex
	cond    sync.Cond
	waiting atomic.Int32
	_       [40]byte // keep shards on separate cache lines
}

func (t *waitTable) init() {
	for i := range t.shards {
		t.shards[i].cond.L = &t.shards[i].mu
	}
}

func (t *waitTable) shard(page int) *waitShard { return &t.shards[uint(page)%uint(len(t.shards))] }

// wait blocks until ok(state of word) holds and returns that state. The waker
// changes the word before it calls wake, and wait announces itself before it
// loads the word; with sequentially consistent atomics one of the two sees the
// other, so no wakeup is lost.
func (t *waitTable) wait(page int, word *uint64, ok func(uint64) bool) uint64 {
	if s := atomic.LoadUint64(word); ok(s) {
		return s
	}
	sh := t.shard(page)
	sh.mu.Lock()
	sh.waiting.Add(1)
	s := atomic.LoadUint64(word)
	for !ok(s) {
		sh.cond.Wait()
		s = atomic.LoadUint64(word)
	}
	sh.waiting.Add(-1)
	sh.mu.Unlock()
	return s
}

// wake wakes the waiters of page's shard after its word changed.
func (t *waitTable) wake(page int) {
	sh := t.shard(page)
	if sh.waiting.Load() == 0 {
		return
	}
	sh.mu.Lock()
	sh.cond.Broadcast()
	sh.mu.Unlock()
}

func notBusy(s uint64) bool      { return s&StateBusy == 0 }
func notWriteback(s uint64) bool { return s&StateWriteback == 0 }

// spinWait backs off while waiting for something another goroutine finishes
// within microseconds (a reader's page copy).
type spinWait struct{ n int }

func (s *spinWait) pause() {
	s.n++
	switch {
	case s.n < 16:
		// busy retry
	case s.n < 64:
		runtime.Gosched()
	default:
		time.Sleep(time.Duration(min(s.n-63, 100)) * time.Microsecond)
	}
}
