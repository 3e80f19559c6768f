package blockdev

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openRing opens a temporary file with WithIOUring, every operation through
// the ring (thresholds 0), and skips where the kernel has no io_uring.
func openRing(t *testing.T, size int64, opts ...Option) *File {
	t.Helper()
	d := openTemp(t, size, append([]Option{WithIOUring()}, opts...)...)
	if d.ring == nil {
		t.Skip("no io_uring here (the file fell back to pread and pwrite)")
	}
	d.ringAbove, d.ringBelow = 0, -1
	return d
}

func TestIOUringConcurrentWritesReadBack(t *testing.T) {
	const blocks, workers = 256, 32
	d := openRing(t, blocks*PageSize)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			buf := AlignedBuffer(2 * PageSize)
			for b := w; b < blocks-1; b += workers {
				off := int64(b) * PageSize
				pattern(buf, off, 7)
				if _, err := d.WriteAt(buf[:PageSize], off); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	before := d.ring.submitted.Load()
	for w := range workers {
		wg.Go(func() {
			buf := AlignedBuffer(PageSize)
			for b := w; b < blocks-1; b += workers {
				off := int64(b) * PageSize
				if n, err := d.ReadAt(buf, off); err != nil || n != PageSize {
					t.Errorf("read block %d: %d bytes, %v", b, n, err)
					return
				}
				checkBytes(t, "block", buf, patterned(PageSize, off, 7))
			}
		})
	}
	wg.Wait()
	if got := d.ring.submitted.Load() - before; got != blocks-1 {
		t.Fatalf("%d reads went through the ring, want %d", got, blocks-1)
	}
	// The last block was never written: it reads as zeros.
	buf := AlignedBuffer(PageSize)
	if _, err := d.ReadAt(buf, (blocks-1)*PageSize); err != nil || !isZero(buf) {
		t.Fatalf("unwritten block: %v, zero %v", err, isZero(buf))
	}
}

// TestIOUringErrorsCarryTheErrno: the kernel's error for one operation is
// that operation's error, and the ring goes on serving.
func TestIOUringErrorsCarryTheErrno(t *testing.T) {
	d := openRing(t, 16*PageSize)
	buf := AlignedBuffer(PageSize)
	_, err, submitted := d.ring.do(uringOpRead, -1, buf, 0)
	if !submitted || !errors.Is(err, unix.EBADF) {
		t.Fatalf("read of descriptor -1: submitted %v, err %v; want EBADF", submitted, err)
	}
	if _, err := d.WriteAt(patterned(PageSize, 0, 3), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	checkBytes(t, "block 0 after an error", buf, patterned(PageSize, 0, 3))
}

// TestIOUringBrokenFallsBackToSystemCalls: once a submission has failed,
// every operation is a plain system call again, with the same result.
func TestIOUringBrokenFallsBackToSystemCalls(t *testing.T) {
	d := openRing(t, 16*PageSize)
	d.ring.mu.Lock()
	d.ring.broken = true
	d.ring.mu.Unlock()
	before := d.ring.submitted.Load()
	buf := AlignedBuffer(PageSize)
	if _, err := d.WriteAt(patterned(PageSize, PageSize, 5), PageSize); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ReadAt(buf, PageSize); err != nil {
		t.Fatal(err)
	}
	checkBytes(t, "block 1", buf, patterned(PageSize, PageSize, 5))
	if got := d.ring.submitted.Load(); got != before {
		t.Fatalf("%d operations went through a broken ring", got-before)
	}
}

func TestIOUringCloseStopsTheReaper(t *testing.T) {
	d := openRing(t, 16*PageSize)
	r := d.ring
	fd := r.ring.FD()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.reaped:
	default:
		t.Fatal("the reaper goroutine is still running after Close")
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		// (A descriptor opened since might reuse the number; the test
		// opens none.)
		t.Fatalf("ring descriptor still open after Close: %v", err)
	}
	if _, err := d.ReadAt(AlignedBuffer(PageSize), 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("read after Close: %v, want ErrClosed", err)
	}
}

// failingEvents is an eventfd whose reads fail until it is closed.
type failingEvents struct {
	eventSource
	closed atomic.Bool
	reads  atomic.Int64
}

func (f *failingEvents) Read([]byte) (int, error) {
	f.reads.Add(1)
	if f.closed.Load() {
		return 0, os.ErrClosed
	}
	return 0, errors.New("injected eventfd failure")
}

func (f *failingEvents) Close() error {
	f.closed.Store(true)
	return f.eventSource.Close()
}

// TestIOUringReaperSurvivesEventfdErrors: with every read of the eventfd
// failing, operations still complete (the reaper looks at the completion
// queue anyway) and the reaper does not spin on the error.
func TestIOUringReaperSurvivesEventfdErrors(t *testing.T) {
	var ev *failingEvents
	wrapUringEvents = func(s eventSource) eventSource {
		ev = &failingEvents{eventSource: s}
		return ev
	}
	defer func() { wrapUringEvents = nil }()
	d := openRing(t, 16*PageSize)
	before := d.ring.submitted.Load()
	want := patterned(PageSize, 3*PageSize, 9)
	start := time.Now()
	if _, err := d.WriteAt(want, 3*PageSize); err != nil {
		t.Fatal(err)
	}
	buf := AlignedBuffer(PageSize)
	if _, err := d.ReadAt(buf, 3*PageSize); err != nil {
		t.Fatal(err)
	}
	checkBytes(t, "block 3", buf, want)
	if got := d.ring.submitted.Load() - before; got != 2 {
		t.Fatalf("%d operations through the ring, want 2", got)
	}
	// A reaper spinning on the error reads millions of times a second;
	// one that pauses reads at most once per uringReapPollPause.
	if n, most := ev.reads.Load(), int64(time.Since(start)/uringReapPollPause)+10; n > most {
		t.Fatalf("%d failed eventfd reads in %v: the reaper spins on the error (at most %d)", n, time.Since(start), most)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestUseRingHysteresis: the file switches to the ring above ringAbove
// operations in flight and back at ringBelow, not in between.
func TestUseRingHysteresis(t *testing.T) {
	d := &File{ringAbove: 8, ringBelow: 2}
	for i, step := range []struct {
		active int64
		want   bool
	}{{1, false}, {8, false}, {9, true}, {5, true}, {3, true}, {2, false}, {7, false}, {12, true}, {1, false}} {
		if got := d.useRing(step.active); got != step.want {
			t.Fatalf("step %d: %d in flight: ring %v, want %v", i, step.active, got, step.want)
		}
	}
}
