package reliability_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/target"
)

// The backing device failing during the final flush (docs/reliability.md
// §2): Shutdown ends within its deadline, names what did not reach the
// device, and records no clean shutdown; nothing it reports as flushed is
// missing from the backing file.

// shutdownTimeout is the deadline given to Shutdown here; the bound
// asserted is this plus 1 s, as for the process (the slack is for a loaded
// machine waking the waiting goroutine).
const shutdownTimeout = 2 * time.Second

func shutdownWithin(t *testing.T, r *targetRig) (*target.ShutdownError, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	start := time.Now()
	err := r.tg.Shutdown(ctx)
	took := time.Since(start)
	if took > shutdownTimeout+time.Second {
		t.Errorf("Shutdown took %v, beyond its %v deadline + 1 s", took.Round(time.Millisecond), shutdownTimeout)
	}
	var se *target.ShutdownError
	if !errors.As(err, &se) {
		t.Fatalf("Shutdown with a failing backing device: %v, want a ShutdownError", err)
	}
	t.Logf("Shutdown took %v:\n%v", took.Round(time.Millisecond), err)
	return se, took
}

// onFile checks that [off, off+n) of the backing file holds the pattern.
func onFile(t *testing.T, path string, off, n int64, seed uint64) error {
	t.Helper()
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return checkPattern(file[off:off+n], off, seed)
}

// TestFinalFlushFailureReportsTheUnflushedRange: 512 KiB are written and
// acknowledged; the device fails every write touching [64 KiB, 96 KiB).
// The host's Flush fails with Write Fault; Shutdown's flush fails too and
// reports the namespace not flushed with byte ranges that cover the failing
// range and lie within what was written. Every written byte outside them is
// on the backing file; the failing range is not. The next start reports an
// unclean shutdown.
func TestFinalFlushFailureReportsTheUnflushedRange(t *testing.T) {
	r := newTarget(t, loopFabric, []subSpec{{NQN: subNQN, Hosts: []string{hostNQN("a")}, NS: []nsSpec{
		{NSID: 1, Size: 4 << 20, Budget: 2 << 20, Faulty: true},
	}}})
	dev, _ := r.hostDevice(t)
	n := openNamespace(t, r.connect(t, dev, subNQN, "a"), 1)
	const written, failOff, failLen = 512 << 10, 64 << 10, 32 << 10
	r.faulty[1].FailRange(blockdev.OpWrite|blockdev.OpWriteFUA, failOff, failLen)
	data := make([]byte, written)
	fillPattern(data, 0, 7)
	if _, err := n.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	requireMediaError(t, "flush with the device failing", n.Flush(), nvme.StatusWriteFault)

	se, _ := shutdownWithin(t, r)
	if se.TimedOut || len(se.Namespaces) != 1 || se.Marker != target.MarkerNotWritten {
		t.Fatalf("report %+v", se)
	}
	ns := se.Namespaces[0]
	if ns.Flushed || ns.Err == nil || !errors.Is(ns.Err, blockdev.ErrInjected) || len(ns.Unflushed) == 0 {
		t.Fatalf("namespace report %+v: want not flushed, the injected error, the unflushed ranges", ns)
	}
	covered := func(off int64) bool {
		for _, u := range ns.Unflushed {
			if off >= u.Off && off < u.Off+u.Len {
				return true
			}
		}
		return false
	}
	for _, u := range ns.Unflushed {
		if u.Off < 0 || u.Off+u.Len > written {
			t.Fatalf("unflushed range %v lies outside what was written [0, %d)", u, written)
		}
	}
	path := r.backingPath(0, 1)
	for off := int64(0); off < written; off += blockSize {
		inFailing := off >= failOff && off < failOff+failLen
		if inFailing && !covered(off) {
			t.Fatalf("page at %d failed to write but is not reported unflushed (%v)", off, ns.Unflushed)
		}
		if covered(off) {
			continue
		}
		if err := onFile(t, path, off, blockSize, 7); err != nil {
			t.Fatalf("page at %d is not reported unflushed but is not on the backing file: %v", off, err)
		}
	}
	if onFile(t, path, failOff, failLen, 7) == nil {
		t.Fatal("the failing range reached the backing file: the fault was not injected")
	}
	for _, want := range []string{"NOT flushed: bytes [", "clean-shutdown marker: not written (namespace 1 of " + subNQN + " was not flushed)"} {
		if !strings.Contains(se.Error(), want) {
			t.Errorf("message lacks %q", want)
		}
	}
	if err := r.start(""); err != nil {
		t.Fatal(err)
	}
	if got := r.tg.PreviousRun(); got != target.PreviousRunUnclean {
		t.Fatalf("restart after a failed final flush: previous run %v", got)
	}
}

// TestFinalFlushOnAHungDeviceIsBounded: namespace 1's device stops
// answering (every write and flush blocks) before the shutdown, with a FUA
// write of the host stuck in it; namespace 2's works. Shutdown stops
// waiting for the stuck command at half its deadline and returns at the
// deadline: namespace 2 flushed and on its file, namespace 1 reported not
// flushed (still waiting for its command), no clean shutdown recorded,
// not even when the device answers again and the abandoned stop completes.
func TestFinalFlushOnAHungDeviceIsBounded(t *testing.T) {
	r := newTarget(t, loopFabric, []subSpec{{NQN: subNQN, Hosts: []string{hostNQN("a")}, NS: []nsSpec{
		{NSID: 1, Size: 4 << 20, Budget: 2 << 20, Faulty: true},
		{NSID: 2, Size: 4 << 20, Budget: 2 << 20},
	}}})
	dev, _ := r.hostDevice(t)
	c := r.connect(t, dev, subNQN, "a", initiator.WithControllerLossTimeout(time.Second), initiator.WithQPTimeout(time.Second))
	data := make([]byte, 256<<10)
	for nsid := uint32(1); nsid <= 2; nsid++ {
		fillPattern(data, 0, uint64(nsid))
		if _, err := openNamespace(t, c, nsid).WriteAt(data, 0); err != nil {
			t.Fatal(err)
		}
	}
	release := make(chan struct{})
	released := false
	free := func() {
		if !released {
			released = true
			close(release)
		}
	}
	t.Cleanup(free)
	entered := make(chan struct{}, 1)
	r.faulty[1].Intercept(blockdev.OpWrite|blockdev.OpWriteFUA|blockdev.OpFlush, func(op blockdev.Op, _, _ int64) error {
		if op == blockdev.OpWriteFUA {
			select {
			case entered <- struct{}{}:
			default:
			}
		}
		<-release
		return nil
	})
	stuck := make(chan error, 1)
	n1 := openNamespace(t, c, 1)
	go func() {
		_, err := n1.WriteAtFUA(make([]byte, blockSize), 1<<20)
		stuck <- err
	}()
	select {
	case <-entered:
	case err := <-stuck:
		t.Fatalf("the FUA write did not reach the device: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the FUA write did not reach the device in 30 s")
	}

	se, _ := shutdownWithin(t, r)
	if !se.TimedOut || se.Waiting != "flushing the namespaces" || se.Drain == nil || se.Marker != target.MarkerNotWritten ||
		len(se.Namespaces) != 2 {
		t.Fatalf("report %+v", se)
	}
	if ns := se.Namespaces[0]; ns.Flushed || ns.Err == nil || !strings.Contains(ns.Err.Error(), "still waiting for its commands at the deadline") {
		t.Fatalf("namespace 1 on the hung device: %+v", ns)
	}
	if ns := se.Namespaces[1]; !ns.Flushed {
		t.Fatalf("namespace 2 on a working device: %+v", ns)
	}
	if err := onFile(t, r.backingPath(0, 2), 0, int64(len(data)), 2); err != nil {
		t.Fatalf("namespace 2 reported flushed: %v", err)
	}
	if !strings.Contains(se.Error(), "ns 1 on "+r.backingPath(0, 1)+": NOT flushed") {
		t.Errorf("message does not name namespace 1 as not flushed")
	}

	// The device answers again: the stuck write ends (failed or not, its
	// connection is gone), the abandoned stop finishes in the background
	// and frees the data directory, without a marker.
	free()
	select {
	case <-stuck:
	case <-time.After(30 * time.Second):
		t.Fatal("the stuck FUA write did not end within 30 s of the device answering")
	}
	if !eventually(30*time.Second, func() bool { return r.start("") == nil }) {
		t.Fatal("no restart within 30 s of the device answering again")
	}
	if got := r.tg.PreviousRun(); got != target.PreviousRunUnclean {
		t.Fatalf("restart after an abandoned final flush: previous run %v", got)
	}
}
