package target_test

import (
	"bytes"
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nvme"
)

// TestBlockedCommandsHoldUpNothing: commands blocked in the backing device
// (24 Flushes, more than the 16 idle workers a queue keeps) hold up none of
// the commands behind them on the same queue; once they are done the queue
// keeps at most 16 workers, and none outlives the target.
func TestBlockedCommandsHoldUpNothing(t *testing.T) {
	var faulty *blockdev.Faulty
	f := loop.NewFabric()
	r := newRig(t, loop.New(loop.WithFabric(f)), loop.New(loop.WithFabric(f)), "io-test", func(d blockdev.Device) blockdev.Device {
		faulty = blockdev.NewFaulty(d)
		return faulty
	})
	o := newIOOps(t, r)
	entered, release := holdOps(t, faulty, blockdev.OpFlush, 64, func(int64) bool { return true })
	const blocked = 24
	errs := make(chan error, blocked)
	for range blocked {
		go func() {
			_, err := o.q.Submit(context.Background(), nvme.FlushCommand(3), nil)
			errs <- err
		}()
	}
	for i := range blocked {
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d flushes reached the device", i, blocked)
		}
	}
	for range 2 * ioBlocks {
		o.writeKeyed()
		o.read()
		if !bytes.Equal(o.buf.Bytes(), o.src) {
			t.Fatal("read back wrong data while flushes were blocked")
		}
	}
	release()
	for range blocked {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// The I/O queue's 16 idle workers stay, plus the admin queue's.
	waitWorkers(t, func(n int) bool { return n <= 16+2 })
	o.read()
	r.tg.Close()
	waitWorkers(t, func(n int) bool { return n == 0 })
}

// waitWorkers waits until ok holds for the number of the target's worker
// goroutines (they leave asynchronously).
func waitWorkers(t *testing.T, ok func(int) bool) {
	t.Helper()
	buf := make([]byte, 1<<20)
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := runtime.Stack(buf, true)
		w := strings.Count(string(buf[:n]), "target.(*queueConn).worker(")
		if ok(w) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d worker goroutines:\n%s", w, buf[:n])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// holdOps makes faulty's op wait, where at(off) holds, until release is
// called; entered receives once per op held (up to depth unread). release
// may be called more than once, and the test's cleanup calls it, so that a
// failing test does not leave the device blocked under the rig's close.
func holdOps(t *testing.T, faulty *blockdev.Faulty, op blockdev.Op, depth int, at func(off int64) bool) (entered <-chan struct{}, release func()) {
	in, gate := make(chan struct{}, depth), make(chan struct{})
	faulty.Intercept(op, func(_ blockdev.Op, off, _ int64) error {
		if at(off) {
			in <- struct{}{}
			<-gate
		}
		return nil
	})
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	return in, release
}
