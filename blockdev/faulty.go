package blockdev

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var _ interface {
	Device
	Wrapper
} = (*Faulty)(nil)

// Faulty is a Device decorator that injects faults for tests of the layers
// above: the Nth operation of a kind fails, operations touching a byte range
// fail, operations take extra time, or the whole device goes offline. Rules
// are added and removed while I/O runs; every method is safe for concurrent
// use.
//
// An injected fault fails the operation before it reaches the device
// underneath, so a failed write leaves the old data in place. The error is an
// *Error wrapping both ErrInjected and syscall.EIO.
type Faulty struct {
	dev Device

	latency [numOps]atomic.Int64 // nanoseconds added before each kind
	offline atomic.Bool

	// active counts rules, so that an operation with no rules skips mu.
	active atomic.Int32
	mu     sync.Mutex
	rules  []*faultRule // by ascending id; guarded by mu
	nextID RuleID       // guarded by mu

	injected   atomic.Uint64
	injectedOp [numOps]atomic.Uint64
}

// RuleID names a rule for Remove.
type RuleID uint64

// Repeat says whether a FailNth rule fires once or keeps firing.
type Repeat int

const (
	// Once fails only the Nth operation; later ones succeed.
	Once Repeat = iota
	// FromThenOn fails the Nth operation and every later one.
	FromThenOn
)

type faultRule struct {
	id  RuleID
	ops Op
	// FailNth: seen counts matching operations since the rule was added.
	nth    uint64
	repeat Repeat
	seen   uint64
	// FailRange: [off, end).
	isRange  bool
	off, end int64
	// Intercept.
	fn func(op Op, off, length int64) error
}

func (r *faultRule) String() string {
	switch {
	case r.fn != nil:
		return fmt.Sprintf("rule %d: intercept %v", r.id, r.ops)
	case r.isRange:
		return fmt.Sprintf("rule %d: %v touching [%d, %d)", r.id, r.ops, r.off, r.end)
	case r.repeat == Once:
		return fmt.Sprintf("rule %d: %v #%d", r.id, r.ops, r.nth)
	default:
		return fmt.Sprintf("rule %d: %v #%d and later", r.id, r.ops, r.nth)
	}
}

// FaultyOption configures NewFaulty.
type FaultyOption func(*Faulty)

// WithLatency adds d before every operation of the kinds in ops, as
// SetLatency does (default: no latency added).
func WithLatency(ops Op, d time.Duration) FaultyOption {
	return func(f *Faulty) { f.SetLatency(ops, d) }
}

// NewFaulty wraps dev. Without rules it passes every operation through.
func NewFaulty(dev Device, opts ...FaultyOption) *Faulty {
	f := &Faulty{dev: dev}
	for _, opt := range opts {
		opt(f)
	}
	return f
}

// FailNth fails the nth operation (counting from 1; 0 counts as 1) of the
// kinds in ops issued after the call; with FromThenOn every later one fails
// too.
func (f *Faulty) FailNth(ops Op, n uint64, repeat Repeat) RuleID {
	if n == 0 {
		n = 1
	}
	return f.add(&faultRule{ops: ops, nth: n, repeat: repeat})
}

// FailRange fails every operation of the kinds in ops that touches a byte of
// [off, off+length). Flushes have no range and are never matched.
func (f *Faulty) FailRange(ops Op, off, length int64) RuleID {
	return f.add(&faultRule{ops: ops, isRange: true, off: off, end: off + length})
}

// Intercept calls fn before every operation of the kinds in ops (off is -1
// for a flush). A non-nil result fails the operation with that error
// wrapped as an injected fault; fn may also block, to hold an operation
// while a test looks at the layers above. fn runs without Faulty's lock.
func (f *Faulty) Intercept(ops Op, fn func(op Op, off, length int64) error) RuleID {
	return f.add(&faultRule{ops: ops, fn: fn})
}

func (f *Faulty) add(r *faultRule) RuleID {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	r.id = f.nextID
	f.rules = append(f.rules, r)
	f.active.Add(1)
	return r.id
}

// Remove deletes a rule and reports whether it existed.
func (f *Faulty) Remove(id RuleID) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := slices.IndexFunc(f.rules, func(r *faultRule) bool { return r.id == id })
	if i < 0 {
		return false
	}
	f.rules = slices.Delete(f.rules, i, i+1)
	f.active.Add(-1)
	return true
}

// SetLatency adds d before every operation of the kinds in ops (0 removes
// it). The delay is a lower bound: the operation itself takes its own time
// on top.
func (f *Faulty) SetLatency(ops Op, d time.Duration) {
	for i := range numOps {
		if ops&(1<<i) != 0 {
			f.latency[i].Store(int64(d))
		}
	}
}

// SetOffline makes every operation fail (a dead disk) until set back.
func (f *Faulty) SetOffline(offline bool) { f.offline.Store(offline) }

// Clear removes every rule and latency and brings the device back online.
// The counts of injected faults are kept.
func (f *Faulty) Clear() {
	f.mu.Lock()
	f.active.Add(-int32(len(f.rules)))
	f.rules = nil
	f.mu.Unlock()
	f.SetLatency(OpAll, 0)
	f.SetOffline(false)
}

// Injected returns how many operations failed with an injected fault.
func (f *Faulty) Injected() uint64 { return f.injected.Load() }

// InjectedOf returns how many operations of the kinds in ops failed with an
// injected fault.
func (f *Faulty) InjectedOf(ops Op) uint64 {
	var n uint64
	for i := range numOps {
		if ops&(1<<i) != 0 {
			n += f.injectedOp[i].Load()
		}
	}
	return n
}

// Unwrap implements Wrapper.
func (f *Faulty) Unwrap() Device { return f.dev }

// inject applies latency and the rules to one operation and returns the
// error to fail it with, or nil to let it through.
func (f *Faulty) inject(op Op, off, length int64) error {
	if d := f.latency[op.index()].Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	cause := f.match(op, off, length)
	if cause == nil {
		return nil
	}
	f.injected.Add(1)
	f.injectedOp[op.index()].Add(1)
	return &Error{Op: op.String(), Path: f.dev.Path(), Off: off, Len: length, Err: cause}
}

// errInjectedEIO is what an injected fault looks like to errors.Is.
var errInjectedEIO = fmt.Errorf("%w: %w", syscall.EIO, ErrInjected)

func (f *Faulty) match(op Op, off, length int64) error {
	if f.offline.Load() {
		return fmt.Errorf("%w (device offline)", errInjectedEIO)
	}
	if f.active.Load() == 0 {
		return nil
	}
	var fired *faultRule
	var intercepts []*faultRule
	f.mu.Lock()
	for _, r := range f.rules {
		if r.ops&op == 0 {
			continue
		}
		hit := false
		switch {
		case r.fn != nil:
			intercepts = append(intercepts, r)
		case r.isRange:
			hit = op.hasRange() && off < r.end && r.off < off+length
		default:
			// Every Nth rule counts the operation, even when an earlier rule
			// already fails it, so that counts do not depend on rule order.
			r.seen++
			hit = r.seen == r.nth || r.repeat == FromThenOn && r.seen > r.nth
		}
		if hit && fired == nil {
			fired = r
		}
	}
	f.mu.Unlock()
	if fired != nil {
		return fmt.Errorf("%w (%v)", errInjectedEIO, fired)
	}
	for _, r := range intercepts {
		if err := r.fn(op, off, length); err != nil {
			if errors.Is(err, ErrInjected) {
				return err
			}
			return fmt.Errorf("%w: %w (%v)", ErrInjected, err, r)
		}
	}
	return nil
}

// ReadAt implements Device.
func (f *Faulty) ReadAt(p []byte, off int64) (int, error) {
	if err := f.inject(OpRead, off, int64(len(p))); err != nil {
		return 0, err
	}
	return f.dev.ReadAt(p, off)
}

// WriteAt implements Device.
func (f *Faulty) WriteAt(p []byte, off int64) (int, error) {
	if err := f.inject(OpWrite, off, int64(len(p))); err != nil {
		return 0, err
	}
	return f.dev.WriteAt(p, off)
}

// WriteAtFUA implements Device.
func (f *Faulty) WriteAtFUA(p []byte, off int64) (int, error) {
	if err := f.inject(OpWriteFUA, off, int64(len(p))); err != nil {
		return 0, err
	}
	return f.dev.WriteAtFUA(p, off)
}

// Flush implements Device.
func (f *Faulty) Flush() error {
	if err := f.inject(OpFlush, -1, 0); err != nil {
		return err
	}
	return f.dev.Flush()
}

// Discard implements Device.
func (f *Faulty) Discard(off, length int64) error {
	if err := f.inject(OpDiscard, off, length); err != nil {
		return err
	}
	return f.dev.Discard(off, length)
}

func (f *Faulty) Size() int64    { return f.dev.Size() }
func (f *Faulty) BlockSize() int { return f.dev.BlockSize() }
func (f *Faulty) Path() string   { return f.dev.Path() }

// Close closes the device underneath; it is never failed.
func (f *Faulty) Close() error { return f.dev.Close() }
