package turns

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// queue is a leader whose "completions" are slots sent on a channel.
type queue struct {
	mu   sync.Mutex
	done chan *Slot
}

func (q *queue) Lead(ctx context.Context, s *Slot) error {
	for !s.Finished() {
		select {
		case d := <-q.done:
			q.mu.Lock()
			d.FinishLocked()
			q.mu.Unlock()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func started(q *queue) *Slot {
	s := &Slot{}
	s.Init()
	q.mu.Lock()
	s.StartLocked()
	q.mu.Unlock()
	return s
}

// TestWaitersTakeTurns: of two waiters, one leads and finishes the other's
// slot too; both return nil whatever order the completions come in.
func TestWaitersTakeTurns(t *testing.T) {
	q := &queue{done: make(chan *Slot, 4)}
	tr := New()
	a, b := started(q), started(q)
	errs := make(chan error, 2)
	for _, s := range []*Slot{a, b} {
		go func() { errs <- tr.Wait(context.Background(), s, &q.mu, q) }()
	}
	q.done <- b
	q.done <- a
	for range 2 {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a waiter was never woken")
		}
	}
	if !a.Finished() || !b.Finished() {
		t.Fatal("slots not finished")
	}
}

// TestGivingUp: a waiter whose context ends gets its error and the slot is
// left abandoned: finishing it later reports so (the caller recycles it)
// and wakes nobody.
func TestGivingUp(t *testing.T) {
	q := &queue{done: make(chan *Slot, 1)}
	tr := New()
	s := started(q)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := tr.Wait(ctx, s, &q.mu, q); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait: %v, want the deadline", err)
	}
	q.mu.Lock()
	abandoned := s.FinishLocked()
	q.mu.Unlock()
	if !abandoned || len(s.done) != 0 {
		t.Fatalf("finishing an abandoned slot: abandoned %v, %d signals", abandoned, len(s.done))
	}
}

// TestAbandonedSlotsAreRead: when every waiter gives up before its
// completion comes, the completions are still read (a goroutine leads for
// the abandoned slots), so that the queue can recycle the slots; a
// submitter waiting for a free slot reads nothing itself.
func TestAbandonedSlotsAreRead(t *testing.T) {
	q := &queue{done: make(chan *Slot, 2)}
	tr := New()
	a, b := started(q), started(q)
	for _, s := range []*Slot{a, b} {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := tr.Wait(ctx, s, &q.mu, q); !errors.Is(err, context.Canceled) {
			t.Fatalf("wait: %v, want canceled", err)
		}
	}
	q.done <- a
	q.done <- b
	deadline := time.Now().Add(10 * time.Second)
	for !a.Finished() || !b.Finished() {
		if time.Now().After(deadline) {
			t.Fatalf("abandoned slots finished: %v, %v; nobody read their completions", a.Finished(), b.Finished())
		}
		time.Sleep(time.Millisecond)
	}
}
