// Package turns is how the host queues of nvme/fabric and nvme/tcp wait
// for their commands without a completion goroutine of their own: the
// goroutines waiting take turns at reading completions (leader/follower).
// The leader reads (a completion queue, a connection) and finishes every
// command it finds done, waking its waiter; it hands the role over when its
// own command is done. With one command in flight its submitter is the
// leader and is woken by the completion itself, with no hand-off between
// goroutines, which on a two-vCPU machine costs 40–60 µs when the woken
// goroutine lands on the other CPU.
package turns

import (
	"context"
	"sync"
	"sync/atomic"
)

// Slot is one command slot's wait state; a queue embeds one in each of its
// command slots and guards it with its own lock (the mu given to Wait).
type Slot struct {
	done      chan struct{} // one signal per completion
	finished  atomic.Bool
	abandoned bool // under the queue's lock: the waiter gave up
}

// Init makes s idle: finished, so that a failing queue skips it.
func (s *Slot) Init() {
	s.done = make(chan struct{}, 1)
	s.finished.Store(true)
}

// Finished reports whether the slot's command is done (or the slot idle).
func (s *Slot) Finished() bool { return s.finished.Load() }

// StartLocked marks the slot's command in flight, with the queue's lock
// held.
func (s *Slot) StartLocked() {
	s.finished.Store(false)
	s.abandoned = false
}

// FinishLocked marks the slot's command finished, with the queue's lock
// held and its outcome recorded, and wakes its waiter; it reports instead
// that the waiter gave up, and then the caller recycles the slot.
func (s *Slot) FinishLocked() (abandoned bool) {
	s.finished.Store(true)
	if s.abandoned {
		s.abandoned = false
		return true
	}
	s.done <- struct{}{}
	return false
}

// Leader is a queue that reads completions: Lead reads them until s is
// finished (returning nil) or ctx ends (returning its error: the caller
// gives up on s).
type Leader interface {
	Lead(ctx context.Context, s *Slot) error
}

// Turns is a queue's leader role.
type Turns struct{ token chan struct{} }

// New returns the role, free.
func New() Turns { return Turns{token: make(chan struct{}, 1)} }

// Take waits until the role is free and takes it; Give gives it back.
func (t Turns) Take() { t.token <- struct{}{} }

// Give gives the role back.
func (t Turns) Give() { <-t.token }

// Wait waits for s's command: it is either woken by the leader that
// finished it, or takes the role and leads (l.Lead) until it is done. A nil
// error means s finished (its outcome is recorded); otherwise the waiter
// gave up (ctx ended) and the slot is recycled by whoever finishes it.
func (t Turns) Wait(ctx context.Context, s *Slot, mu *sync.Mutex, l Leader) error {
	for {
		select {
		case <-s.done:
			return nil
		case t.token <- struct{}{}:
			err := l.Lead(ctx, s)
			<-t.token
			if err != nil {
				return t.abandon(s, mu, l, err)
			}
			<-s.done // sent by whoever finished s
			return nil
		case <-ctx.Done():
			return t.abandon(s, mu, l, ctx.Err())
		}
	}
}

// abandon gives up waiting for s; if it finished meanwhile the outcome is
// taken after all. Otherwise a goroutine takes the role when it is free and
// leads until s finishes: a submitter waiting for a free slot reads no
// completions, so when every slot is held by a command whose waiter gave up
// nobody would read the completions that free them.
func (t Turns) abandon(s *Slot, mu *sync.Mutex, l Leader, err error) error {
	mu.Lock()
	if s.finished.Load() {
		mu.Unlock()
		<-s.done
		return nil
	}
	s.abandoned = true
	mu.Unlock()
	go func() {
		t.Take()
		defer t.Give()
		l.Lead(context.Background(), s)
	}()
	return err
}
