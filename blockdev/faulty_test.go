package blockdev

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// wantInjected checks that err is an injected fault of op.
func wantInjected(t *testing.T, err error, op Op) {
	t.Helper()
	wantErr(t, err, op.String(), "mem", ErrInjected)
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("injected fault %q does not wrap EIO", err)
	}
}

func TestFaultyPassesThrough(t *testing.T) {
	mem := newMemDevice(64 * PageSize)
	f := NewFaulty(mem)
	want := patterned(4*PageSize, PageSize, 1)
	if _, err := f.WriteAt(want, PageSize); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAtFUA(want, 8*PageSize); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := f.ReadAt(got, PageSize); err != nil {
		t.Fatal(err)
	}
	checkBytes(t, "through Faulty", got, want)
	if err := f.Flush(); err != nil || mem.flushes != 1 {
		t.Fatalf("flush: err=%v, device saw %d flushes", err, mem.flushes)
	}
	if err := f.Discard(PageSize, PageSize); err != nil || !isZero(mem.data[PageSize:2*PageSize]) {
		t.Fatalf("discard: err=%v", err)
	}
	if f.Size() != mem.Size() || f.BlockSize() != mem.BlockSize() || f.Path() != "mem" || f.Unwrap() != mem {
		t.Fatal("Faulty does not report the device underneath")
	}
	// Errors of the device underneath are not injected faults.
	_, err := f.ReadAt(got, mem.Size())
	if !errors.Is(err, ErrOutOfRange) || errors.Is(err, ErrInjected) {
		t.Fatalf("out-of-range read through Faulty: %v", err)
	}
	if err := f.Close(); err != nil || !mem.closed {
		t.Fatalf("close: %v", err)
	}
	if f.Injected() != 0 {
		t.Fatalf("Injected() = %d with no rules", f.Injected())
	}
}

func TestFaultyFailNthOnce(t *testing.T) {
	mem := newMemDevice(16 * PageSize)
	f := NewFaulty(mem)
	f.FailNth(OpWrite, 3, Once)
	for i := range 6 {
		off := int64(i) * PageSize
		_, err := f.WriteAt(patterned(PageSize, off, 2), off)
		if i == 2 {
			wantInjected(t, err, OpWrite)
			if !strings.Contains(err.Error(), "write #3") {
				t.Fatalf("error %q does not name the rule", err)
			}
			// A failed write never reached the device.
			if !isZero(mem.data[off : off+PageSize]) {
				t.Fatal("an injected write fault changed the device")
			}
			continue
		}
		if err != nil {
			t.Fatalf("write %d: %v", i+1, err)
		}
	}
	// Other kinds are not counted: reads and FUA writes pass.
	if _, err := f.ReadAt(make([]byte, PageSize), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAtFUA(make([]byte, PageSize), 0); err != nil {
		t.Fatal(err)
	}
	if f.Injected() != 1 || f.InjectedOf(OpWrite) != 1 || f.InjectedOf(OpRead|OpWriteFUA) != 0 {
		t.Fatalf("Injected() = %d, of writes %d", f.Injected(), f.InjectedOf(OpWrite))
	}
}

func TestFaultyFailNthFromThenOn(t *testing.T) {
	f := NewFaulty(newMemDevice(16 * PageSize))
	// Counting starts when the rule is added.
	for range 5 {
		if err := f.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	f.FailNth(OpFlush|OpDiscard, 2, FromThenOn)
	if err := f.Flush(); err != nil {
		t.Fatalf("first flush after the rule: %v", err)
	}
	err := f.Discard(0, PageSize)
	wantInjected(t, err, OpDiscard)
	for range 3 {
		err := f.Flush()
		wantInjected(t, err, OpFlush)
		var e *Error
		if errors.As(err, &e); e.Off != -1 || strings.Contains(err.Error(), "[") {
			t.Fatalf("flush error %q carries a range", err)
		}
	}
	if f.Injected() != 4 || f.InjectedOf(OpFlush) != 3 || f.InjectedOf(OpDiscard) != 1 {
		t.Fatalf("Injected() = %d (flush %d, discard %d), want 4 (3, 1)", f.Injected(), f.InjectedOf(OpFlush), f.InjectedOf(OpDiscard))
	}
	f.Clear()
	if err := f.Flush(); err != nil {
		t.Fatalf("flush after Clear: %v", err)
	}
	if f.Injected() != 4 {
		t.Fatal("Clear reset the injected count")
	}
}

func TestFaultyFailRange(t *testing.T) {
	mem := newMemDevice(64 * PageSize)
	pattern(mem.data, 0, 3)
	f := NewFaulty(mem)
	id := f.FailRange(OpRead, 10*PageSize, 2*PageSize) // pages 10 and 11
	buf := make([]byte, 4*PageSize)
	for _, c := range []struct {
		off  int64
		n    int
		fail bool
	}{
		{0, 4 * PageSize, false},
		{6 * PageSize, 4 * PageSize, false}, // ends where the range starts
		{7 * PageSize, 4 * PageSize, true},  // overlaps its first page
		{10 * PageSize, PageSize, true},
		{11 * PageSize, 4 * PageSize, true}, // overlaps its last page
		{12 * PageSize, 4 * PageSize, false},
		{8 * PageSize, 0, false}, // empty
	} {
		_, err := f.ReadAt(buf[:c.n], c.off)
		if c.fail {
			wantInjected(t, err, OpRead)
		} else if err != nil {
			t.Fatalf("read [%d, +%d): %v", c.off, c.n, err)
		}
	}
	// Writes to the range are not affected by a read rule.
	if _, err := f.WriteAt(buf[:PageSize], 10*PageSize); err != nil {
		t.Fatal(err)
	}
	if !f.Remove(id) || f.Remove(id) {
		t.Fatal("Remove: want true once, then false")
	}
	if _, err := f.ReadAt(buf, 9*PageSize); err != nil {
		t.Fatalf("read after the rule was removed: %v", err)
	}
	if f.Injected() != 3 {
		t.Fatalf("Injected() = %d, want 3", f.Injected())
	}

	// A range rule for every kind: flushes have no range and pass.
	f.FailRange(OpAll, 0, PageSize)
	if err := f.Flush(); err != nil {
		t.Fatalf("flush with a range rule: %v", err)
	}
	wantInjected(t, f.Discard(0, 2*PageSize), OpDiscard)
	_, err := f.WriteAtFUA(buf[:PageSize], 0)
	wantInjected(t, err, OpWriteFUA)
}

func TestFaultyLatency(t *testing.T) {
	const lat = 20 * time.Millisecond
	f := NewFaulty(newMemDevice(16*PageSize), WithLatency(OpRead, lat))
	buf := make([]byte, PageSize)
	start := time.Now()
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	// A lower bound: the read cannot have taken less than the added latency.
	if took := time.Since(start); took < lat {
		t.Fatalf("read took %v with %v added", took, lat)
	}
	f.SetLatency(OpWrite|OpFlush, lat)
	start = time.Now()
	if _, err := f.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Flush(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 2*lat {
		t.Fatalf("write and flush took %v with %v added to each", took, lat)
	}
	if f.Injected() != 0 {
		t.Fatal("latency counted as an injected fault")
	}
}

func TestFaultyOffline(t *testing.T) {
	mem := newMemDevice(16 * PageSize)
	f := NewFaulty(mem)
	f.SetOffline(true)
	buf := make([]byte, PageSize)
	_, err := f.ReadAt(buf, 0)
	wantInjected(t, err, OpRead)
	if !strings.Contains(err.Error(), "offline") {
		t.Fatalf("error %q does not say the device is offline", err)
	}
	_, err = f.WriteAt(patterned(PageSize, 0, 1), 0)
	wantInjected(t, err, OpWrite)
	_, err = f.WriteAtFUA(buf, 0)
	wantInjected(t, err, OpWriteFUA)
	wantInjected(t, f.Flush(), OpFlush)
	wantInjected(t, f.Discard(0, PageSize), OpDiscard)
	if f.Injected() != 5 {
		t.Fatalf("Injected() = %d, want 5", f.Injected())
	}
	if !isZero(mem.data) || mem.flushes != 0 {
		t.Fatal("an offline device was written or flushed")
	}
	f.SetOffline(false)
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Fatalf("read back online: %v", err)
	}
}

func TestFaultyIntercept(t *testing.T) {
	f := NewFaulty(newMemDevice(16 * PageSize))
	var seen []string
	f.Intercept(OpWrite|OpFlush, func(op Op, off, length int64) error {
		seen = append(seen, op.String())
		if off == 4*PageSize {
			return syscall.ENOSPC
		}
		return nil
	})
	buf := make([]byte, PageSize)
	if _, err := f.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	_, err := f.WriteAt(buf, 4*PageSize)
	wantErr(t, err, "write", "mem", ErrInjected)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("intercepted error %q lost the errno the hook chose", err)
	}
	if err := f.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if strings.Join(seen, ",") != "write,write,flush" {
		t.Fatalf("hook saw %v", seen)
	}

	// A hook may hold an operation while the test looks around.
	f.Clear()
	entered, release := make(chan struct{}), make(chan struct{})
	f.Intercept(OpRead, func(Op, int64, int64) error {
		close(entered)
		<-release
		return nil
	})
	done := make(chan error, 1)
	go func() {
		_, err := f.ReadAt(make([]byte, PageSize), 0)
		done <- err
	}()
	<-entered
	// Faulty's lock is not held while the hook blocks.
	f.FailNth(OpWrite, 1, Once)
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestFaultyErrorShape(t *testing.T) {
	f := NewFaulty(newMemDevice(16 * PageSize))
	f.FailNth(OpRead, 1, Once)
	_, err := f.ReadAt(make([]byte, 2*PageSize), 4*PageSize)
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("%T is not *blockdev.Error", err)
	}
	if e.Op != "read" || e.Off != 4*PageSize || e.Len != 2*PageSize || e.Path != "mem" {
		t.Fatalf("error fields %+v", e)
	}
	want := "read mem [16384, +8192): input/output error: injected fault (rule 1: read #1)"
	if err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
}

// TestFaultyConcurrent changes rules while goroutines do I/O: every error
// must be an injected fault, and the count of injected faults must equal
// the errors the callers saw.
func TestFaultyConcurrent(t *testing.T) {
	mem := newMemDevice(64 * PageSize)
	f := NewFaulty(mem)
	var failures atomic.Uint64
	stop := make(chan struct{})
	var workers sync.WaitGroup
	for w := range 8 {
		workers.Go(func() {
			buf := make([]byte, PageSize)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				off := int64((w*8+i)%64) * PageSize
				var err error
				switch i % 4 {
				case 0:
					_, err = f.ReadAt(buf, off)
				case 1:
					_, err = f.WriteAt(buf, off)
				case 2:
					err = f.Flush()
				case 3:
					err = f.Discard(off, PageSize)
				}
				if err != nil {
					if !errors.Is(err, ErrInjected) {
						t.Errorf("not an injected fault: %v", err)
						return
					}
					failures.Add(1)
				}
			}
		})
	}
	stopWorkers := sync.OnceFunc(func() { close(stop); workers.Wait() })
	defer stopWorkers()
	for i := range 300 {
		ids := []RuleID{
			f.FailNth(OpRead|OpWrite, uint64(i%5+1), Repeat(i%2)),
			f.FailRange(OpAnyWrite, int64(i%64)*PageSize, 4*PageSize),
		}
		f.SetLatency(OpFlush, time.Duration(i%2)*time.Microsecond)
		f.SetOffline(i%50 == 0)
		for _, id := range ids {
			f.Remove(id)
		}
		if i%100 == 0 {
			f.Clear()
		}
	}
	f.FailNth(OpAll, 1, FromThenOn) // so that every worker sees faults
	for deadline := time.Now().Add(30 * time.Second); failures.Load() < 8; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d faults seen with every operation failing", failures.Load())
		}
	}
	stopWorkers()
	if got, want := f.Injected(), failures.Load(); got != want {
		t.Fatalf("Injected() = %d, callers saw %d injected faults", got, want)
	}
	if f.InjectedOf(OpAll) != f.Injected() {
		t.Fatalf("per-kind counts add up to %d, total %d", f.InjectedOf(OpAll), f.Injected())
	}
}

func TestOpString(t *testing.T) {
	for op, want := range map[Op]string{
		OpRead:              "read",
		OpWriteFUA:          "write-fua",
		OpWrite | OpDiscard: "write|discard",
		OpAll:               "read|write|write-fua|flush|discard",
		0:                   "none",
		OpFlush | Op(1<<7):  "flush|unknown",
	} {
		if got := op.String(); got != want {
			t.Errorf("Op(%#x).String() = %q, want %q", uint8(op), got, want)
		}
	}
}
