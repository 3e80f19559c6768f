package attach

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/initiator/blockio"
)

// fakeNamespace is a memory backend with what the life cycle asks of an
// initiator namespace.
type fakeNamespace struct {
	*blockio.Memory
	unflushed    atomic.Int64
	lossReported chan struct{}
	changed      chan struct{}
}

func newFakeNamespace() *fakeNamespace {
	return &fakeNamespace{Memory: blockio.NewMemory(1<<20, 4096), lossReported: make(chan struct{}, 1), changed: make(chan struct{})}
}

func (n *fakeNamespace) Unflushed() initiator.Unflushed {
	c := n.unflushed.Load()
	return initiator.Unflushed{Commands: c, Bytes: 4096 * c}
}
func (n *fakeNamespace) PossiblyLost() initiator.Unflushed { return initiator.Unflushed{} }
func (n *fakeNamespace) LossReported() <-chan struct{}     { return n.lossReported }
func (n *fakeNamespace) Changed() <-chan struct{}          { return n.changed }
func (n *fakeNamespace) Resized() <-chan struct{}          { return nil }
func (n *fakeNamespace) Change() (time.Time, error)        { return time.Time{}, nil }

type fakeController struct {
	lost   chan struct{}
	lossMu sync.Mutex
	since  time.Time
	reason error
	closed atomic.Bool
}

func (c *fakeController) Lost() <-chan struct{} { return c.lost }
func (c *fakeController) Loss() (time.Time, error) {
	c.lossMu.Lock()
	defer c.lossMu.Unlock()
	return c.since, c.reason
}
func (c *fakeController) HostNQN() string        { return "nqn.test:host" }
func (c *fakeController) Stats() initiator.Stats { return initiator.Stats{} }
func (c *fakeController) Close() error           { c.closed.Store(true); return nil }

func (c *fakeController) lose(err error) {
	c.lossMu.Lock()
	c.since, c.reason = time.Now(), err
	c.lossMu.Unlock()
	close(c.lost)
}

// fakeFrontend exposes nothing; its device is "mounted" while mounted is set.
type fakeFrontend struct {
	mounted  atomic.Bool
	detached atomic.Int32
	failed   chan error
}

func (f *fakeFrontend) Mode() Mode   { return ModeNBD }
func (f *fakeFrontend) What() string { return "nothing" }
func (f *fakeFrontend) Start(ctx context.Context, b blockio.Backend, cfg Config) (Exposure, error) {
	return fakeExposure{f}, nil
}
func (f *fakeFrontend) Reap(*Dir, Record, bool) ([]string, error) { return nil, nil }

type fakeExposure struct{ f *fakeFrontend }

func (e fakeExposure) Fill(rec *Record) { rec.Device = "/dev/fake0" }
func (e fakeExposure) Detach(force bool) error {
	if e.f.mounted.Load() && !force {
		return &RefusedError{Err: errors.New("/dev/fake0 is mounted at /mnt")}
	}
	e.f.detached.Add(1)
	return nil
}
func (e fakeExposure) Failed() <-chan error { return e.f.failed }

type lifecycle struct {
	dir      *Dir
	ns       *fakeNamespace
	ctrl     *fakeController
	fe       *fakeFrontend
	a        *Attachment
	requests chan Request
	done     chan error
	mu       sync.Mutex
	said     []string
}

func startLifecycle(t *testing.T) *lifecycle {
	t.Helper()
	l := &lifecycle{dir: testDir(t), ns: newFakeNamespace(), ctrl: &fakeController{lost: make(chan struct{})},
		fe: &fakeFrontend{failed: make(chan error, 1)}, requests: make(chan Request), done: make(chan error, 1)}
	a, err := Claim(l.dir, liveRecord(t, "life"), func(s string) { l.mu.Lock(); l.said = append(l.said, s); l.mu.Unlock() })
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := l.dir.Load("life"); err != nil || rec.State != StateStarting {
		t.Fatalf("claimed record %+v, %v: want state starting", rec, err)
	}
	a.Connected(l.ctrl, l.ns)
	if err := a.Expose(context.Background(), l.fe, l.ns, Config{}); err != nil {
		t.Fatal(err)
	}
	rec, err := l.dir.Load("life")
	if err != nil || rec.State != StateAttached || rec.Device != "/dev/fake0" || rec.Size != 1<<20 || rec.HostNQN != "nqn.test:host" {
		t.Fatalf("record after Expose %+v, %v", rec, err)
	}
	l.a = a
	go func() { l.done <- a.Run(context.Background(), l.requests) }()
	return l
}

func (l *lifecycle) saidAny(sub string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.said {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

func (l *lifecycle) waitRecord(t *testing.T, what string, ok func(Record) bool) Record {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if rec, err := l.dir.Load("life"); err == nil && ok(rec) {
			return rec
		}
	}
	t.Fatalf("the record never showed %s", what)
	return Record{}
}

// A teardown refused while the device is mounted changes nothing but the
// record (attempts and why); a forced one then tears down, flushes the
// namespace, closes the controller and removes the record.
func TestRunRefusesWhileMountedThenForced(t *testing.T) {
	l := startLifecycle(t)
	l.fe.mounted.Store(true)
	l.requests <- Request{Cause: "terminated"}
	rec := l.waitRecord(t, "a refused detach", func(r Record) bool { return r.DetachAttempts == 1 })
	if !strings.Contains(rec.DetachError, "mounted at /mnt") || l.fe.detached.Load() != 0 || l.ctrl.closed.Load() || l.ns.Stats().Flushes != 0 {
		t.Fatalf("after a refusal: record %+v, detached %d, controller closed %v, flushes %d", rec, l.fe.detached.Load(), l.ctrl.closed.Load(), l.ns.Stats().Flushes)
	}
	l.requests <- Request{Force: true, Cause: "user defined signal 1"}
	if err := <-l.done; err != nil {
		t.Fatalf("forced teardown: %v", err)
	}
	if _, err := l.dir.Load("life"); err == nil {
		t.Fatal("the record is still there after a clean teardown")
	}
	if l.fe.detached.Load() != 1 || !l.ctrl.closed.Load() || l.ns.Stats().Flushes != 1 || !l.saidAny("detached life") {
		t.Fatalf("after teardown: detached %d, controller closed %v, flushes %d, said %q", l.fe.detached.Load(), l.ctrl.closed.Load(), l.ns.Stats().Flushes, l.said)
	}
}

// A lost controller is recorded at once; its teardown's failed final flush
// loses nothing when nothing acknowledged was unflushed, and fails naming
// what was otherwise (keeping the record, with the error, for detach).
func TestRunJudgesTheFinalFlushOfALostController(t *testing.T) {
	for _, unflushed := range []int64{0, 3} {
		t.Run(fmt.Sprint(unflushed, " unflushed"), func(t *testing.T) {
			l := startLifecycle(t)
			l.ns.unflushed.Store(unflushed)
			lost := fmt.Errorf("%w: not reconnected within 2s", initiator.ErrControllerLost)
			l.ns.FailWith(lost)
			l.ctrl.lose(lost)
			rec := l.waitRecord(t, "state lost", func(r Record) bool { return r.State == StateLost })
			if !strings.Contains(rec.LostReason, "not reconnected") || rec.LostSince.IsZero() {
				t.Fatalf("lost record %+v", rec)
			}
			l.requests <- Request{Cause: "terminated"}
			err := <-l.done
			if unflushed == 0 {
				if err != nil || !l.saidAny("nothing acknowledged was left unflushed") || !l.saidAny("its controller had been lost since") {
					t.Fatalf("teardown: %v; said %q", err, l.said)
				}
				if _, err := l.dir.Load("life"); err == nil {
					t.Fatal("the record is still there after a clean teardown")
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "3 writes or trims (12 KiB)") {
				t.Fatalf("teardown: %v, want it to name 3 writes or trims (12 KiB)", err)
			}
			rec, lerr := l.dir.Load("life")
			if lerr != nil || !strings.Contains(rec.DetachError, "may be lost") || rec.DetachAttempts != 0 {
				t.Fatalf("record after a failed teardown: %+v, %v", rec, lerr)
			}
		})
	}
}

// An exposure that fails by itself (the NBD server's listener) tears the
// attachment down, forced.
func TestRunTearsDownWhenTheExposureFails(t *testing.T) {
	l := startLifecycle(t)
	l.fe.mounted.Store(true)
	l.fe.failed <- errors.New("NBD server stopped: accept: too many open files")
	if err := <-l.done; err != nil {
		t.Fatal(err)
	}
	if l.fe.detached.Load() != 1 || !l.saidAny("too many open files: detaching (forced)") {
		t.Fatalf("detached %d; said %q", l.fe.detached.Load(), l.said)
	}
}
