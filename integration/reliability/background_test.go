package reliability_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nprdma/nprdma/initiator"
)

// bystander is a host doing verified I/O on its own range while a test
// breaks something else: every write is read back and compared, every
// sixteenth operation is a flush. Its figures show that the target went on
// serving it.
type bystander struct {
	name      string
	stop      chan struct{}
	done      chan struct{}
	ops       atomic.Int64
	mu        sync.Mutex
	errs      []error
	latencies []time.Duration
}

// startBystander runs the bystander on [off, off+length) of n until the
// test ends or Stop.
func startBystander(t testing.TB, name string, n *initiator.Namespace, off, length int64) *bystander {
	b := &bystander{name: name, stop: make(chan struct{}), done: make(chan struct{})}
	go b.run(n, off, length)
	t.Cleanup(func() { b.Stop() })
	return b
}

func (b *bystander) run(n *initiator.Namespace, off, length int64) {
	defer close(b.done)
	rng := rand.New(rand.NewPCG(uint64(off), uint64(length)))
	buf := make([]byte, 8192)
	got := make([]byte, len(buf))
	blocks := length / blockSize
	for i := uint64(1); ; i++ {
		select {
		case <-b.stop:
			return
		default:
		}
		start := time.Now()
		pos := off + rng.Int64N(blocks-1)*blockSize
		seed := i*0x2545f4914f6cdd1d ^ uint64(off)
		fillPattern(buf, pos, seed)
		var err error
		if _, err = n.WriteAt(buf, pos); err == nil {
			if _, err = n.ReadAt(got, pos); err == nil {
				err = checkPattern(got, pos, seed)
			}
		}
		if err == nil && i%16 == 0 {
			err = n.Flush()
		}
		b.mu.Lock()
		b.latencies = append(b.latencies, time.Since(start))
		if err != nil {
			b.errs = append(b.errs, err)
		}
		b.mu.Unlock()
		if err != nil {
			return
		}
		b.ops.Add(1)
	}
}

// Stop ends the loop and waits for it.
func (b *bystander) Stop() {
	select {
	case <-b.stop:
	default:
		close(b.stop)
	}
	<-b.done
}

// check stops the bystander and fails the test if it saw an error or did
// not get at least min rounds done.
func (b *bystander) check(t testing.TB, min int64) {
	t.Helper()
	b.Stop()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.errs) > 0 {
		t.Fatalf("bystander %s failed after %d rounds: %v", b.name, b.ops.Load(), b.errs[0])
	}
	if got := b.ops.Load(); got < min {
		t.Fatalf("bystander %s did %d rounds, want at least %d", b.name, got, min)
	}
	t.Logf("bystander %s: %d verified write+read rounds, p50 %v p99 %v", b.name, b.ops.Load(),
		percentile(b.latencies, 50), percentile(b.latencies, 99))
}

// waitRounds waits until the bystander has done k more rounds than now (so
// that it demonstrably ran during what the test does next).
func (b *bystander) waitRounds(t testing.TB, k int64) {
	t.Helper()
	target := b.ops.Load() + k
	if !eventually(30*time.Second, func() bool { return b.ops.Load() >= target || b.failed() }) || b.failed() {
		b.mu.Lock()
		defer b.mu.Unlock()
		t.Fatalf("bystander %s: %d rounds, errors %v", b.name, b.ops.Load(), fmt.Sprint(b.errs))
	}
}

func (b *bystander) failed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.errs) > 0
}
