package shm

import (
	"errors"
	"os"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// A doorbell is an eventfd: the side that waits reads it (parked in Go's
// network poller, holding no thread), the other side writes it. It is rung
// only when the waiter said it sleeps (a flag in the ring's control block
// that the waiter sets before its last look, the ringer reads after
// publishing: with sequentially consistent atomics on both sides one of the
// two always sees the other), so a side that keeps up costs its peer no
// system call.
type bell struct{ f *os.File }

func newBell() (bell, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return bell{}, os.NewSyscallError("eventfd", err)
	}
	return bell{os.NewFile(uintptr(fd), "nprdma-shm-bell")}, nil
}

var one = []byte{1, 0, 0, 0, 0, 0, 0, 0}

// ring wakes the waiter. An eventfd write fails only when its counter
// would overflow: the waiter is then far behind and awake anyway.
func (b bell) ring() { b.f.Write(one) }

// wait blocks until the bell was rung since the last wait.
func (b bell) wait() error {
	var buf [8]byte
	_, err := b.f.Read(buf[:])
	return err
}

func (b bell) close() {
	if b.f != nil {
		b.f.Close()
	}
}

var epoch = time.Now()

func nanotime() int64 { return int64(time.Since(epoch)) }

// errStop: the wait was ended because the link is going down.
var errStop = errors.New("shm: link going down")

// spinner adapts how long a waiter spins before it sleeps. Spinning pays
// when the peer answers within the spin from a CPU of its own: no wake-up
// on either side. It costs the spin, and on a machine without a spare CPU
// it delays the very peer it waits for (measured here, two busy vCPUs: a
// two-sided READ across processes took 30 µs sleeping at once, 54 µs
// spinning 20 µs first and 116 µs spinning 50 µs). So the spin doubles
// after a wait that it satisfied and halves after one it did not; once it
// is down to nothing, every 64th wait probes with the longest spin again.
// Used by one goroutine at a time.
type spinner struct {
	max, cur int64 // nanoseconds
	waits    uint32
}

func newSpinner(max time.Duration) spinner { return spinner{max: int64(max), cur: int64(max)} }

// budget is how long the next wait spins.
func (s *spinner) budget() int64 {
	s.waits++
	if s.cur == 0 && s.waits%64 == 0 {
		return s.max
	}
	return s.cur
}

func (s *spinner) hit() { s.cur = min(s.max, 2*s.cur+int64(time.Microsecond)) }

func (s *spinner) miss() { s.cur /= 2 }

// await waits until ready reports true: it spins for up to the spinner's
// current time first (a peer that answers within it is seen within a
// microsecond, no wake-up on either side), then says it sleeps in
// *sleeping and blocks on b. stopped is checked throughout; whoever stops
// the link rings b. ready's error ends the wait.
func await(ready func() (bool, error), stopped func() bool, b bell, sleeping *uint32, sp *spinner) error {
	if spin := sp.budget(); spin > 0 {
		until := nanotime() + spin
		for i := 1; ; i++ {
			if ok, err := ready(); ok || err != nil {
				sp.hit()
				return err
			}
			if stopped() {
				return errStop
			}
			if i%64 == 0 {
				if nanotime() > until {
					break
				}
				// The goroutine that will make it ready may be waiting
				// for this P (both ends in one process).
				runtime.Gosched()
			}
		}
		sp.miss()
	}
	for {
		atomic.StoreUint32(sleeping, 1)
		ok, err := ready()
		if ok || err != nil {
			atomic.StoreUint32(sleeping, 0)
			return err
		}
		if stopped() {
			atomic.StoreUint32(sleeping, 0)
			return errStop
		}
		if err := b.wait(); err != nil {
			atomic.StoreUint32(sleeping, 0)
			return err
		}
		atomic.StoreUint32(sleeping, 0)
	}
}
