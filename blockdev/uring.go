package blockdev

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/nprdma/nprdma/internal/uring"
	"golang.org/x/sys/unix"
)

// A goroutine blocked in pread keeps its P until the runtime's monitor hands
// it off, so with few Ps the reads that a Go program wants in flight at once
// queue for a P instead of for the disk (docs/blockdev.md, "Queue depth and io_uring").
// uring issues them through an io_uring instead: the submitting goroutine
// parks on a channel (its P is free at once), the kernel runs the read, and
// one reaper goroutine, woken through an eventfd in the network poller,
// hands each completion to its waiter. The ring is internal/uring's
// (IORING_OP_READ and IORING_OP_WRITE, no SQ polling, no fixed buffers).

const (
	uringOpRead           = uring.OpRead
	uringOpWrite          = uring.OpWrite
	uringDefaultDepth     = 64
	uringSubmitRetryPause = 20 * time.Microsecond
	uringReapPollPause    = 50 * time.Microsecond
)

// eventSource is the ring's eventfd as the reaper reads it.
type eventSource interface {
	Read(p []byte) (int, error)
	Close() error
}

// wrapUringEvents, when set (tests), wraps a new ring's eventfd.
var wrapUringEvents func(eventSource) eventSource

// uringWaiter is one submitted operation's completion.
type uringWaiter struct {
	// res is atomic although done orders it: a reused slot's next
	// submission reaches the reaper through the kernel, which the race
	// detector cannot see.
	res  atomic.Int32
	done chan struct{} // buffered by one; reused
}

type uringFile struct {
	ring      *uring.Ring
	events    eventSource // eventfd the kernel signals on every completion
	reaped    chan struct{}
	slots     chan uint32 // free waiter slots: bounds what is in flight to the ring's size
	waiters   []uringWaiter
	mu        sync.Mutex    // submission
	broken    bool          // guarded by mu: a submission failed, use pread from now on
	submitted atomic.Uint64 // operations that went through the ring (tests)
}

// newUring sets up a ring of depth entries; an error means the kernel (or
// a sandbox) does not offer io_uring, and the caller uses pread.
func newUring(depth int) (*uringFile, error) {
	// Room for every completion: the ring never overflows.
	r, err := uring.New(uring.Params{Entries: depth, CQEntries: 2 * depth})
	if err != nil {
		return nil, err
	}
	u := &uringFile{ring: r}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	if err := r.RegisterEventFD(efd); err != nil {
		unix.Close(efd)
		r.Close()
		return nil, err
	}
	u.events = os.NewFile(uintptr(efd), "io_uring-events") // non-blocking: read through the poller
	if wrapUringEvents != nil {
		u.events = wrapUringEvents(u.events)
	}
	n := r.Entries()
	u.waiters = make([]uringWaiter, n)
	u.slots = make(chan uint32, n)
	for i := range u.waiters {
		u.waiters[i].done = make(chan struct{}, 1)
		u.slots <- uint32(i)
	}
	u.reaped = make(chan struct{})
	go u.reap()
	return u, nil
}

// do runs one read or write of p at off on fd and returns the kernel's
// result like pread/pwrite. submitted is false when the operation was not
// submitted (the ring broke): the caller then does it with pread/pwrite.
func (u *uringFile) do(op uint8, fd int, p []byte, off int64) (n int, err error, submitted bool) {
	slot := <-u.slots
	w := &u.waiters[slot]
	u.mu.Lock()
	if u.broken {
		u.mu.Unlock()
		u.slots <- slot
		return 0, nil, false
	}
	sqe := u.ring.Prepare() // never nil: slots bound what is in flight to the ring's size
	*sqe = uring.SQE{Opcode: op, FD: int32(fd), Off: uint64(off), Addr: uint64(uintptr(unsafe.Pointer(&p[0]))),
		Len: uint32(len(p)), UserData: uint64(slot)}
	for {
		_, err := u.ring.Submit(0)
		if err == nil {
			break
		}
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EBUSY) {
			time.Sleep(uringSubmitRetryPause)
			continue
		}
		// Nothing was consumed: take the entry back, and never call
		// io_uring_enter again, so it cannot be submitted later.
		u.ring.Withdraw()
		u.broken = true
		u.mu.Unlock()
		u.slots <- slot
		return 0, nil, false
	}
	u.mu.Unlock()
	u.submitted.Add(1)
	<-w.done
	// p's memory is the kernel's until the completion: it is a heap object
	// (it escapes through the caller's function value), which does not
	// move, and must not be freed before this point.
	runtime.KeepAlive(p)
	res := w.res.Load()
	u.slots <- slot
	if res < 0 {
		return 0, unix.Errno(-res), true
	}
	return int(res), nil, true
}

// reap hands completions to their waiters until the eventfd is closed.
func (u *uringFile) reap() {
	defer close(u.reaped)
	var b [8]byte
	for {
		if _, err := u.events.Read(b[:]); err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			// Not expected of an eventfd (the poller handles EAGAIN).
			// Rather than spin on the error, or leave waiters hanging if
			// it persists, look at the completion queue now and then.
			time.Sleep(uringReapPollPause)
		}
		u.ring.Completions(func(c uring.CQE) {
			w := &u.waiters[c.UserData]
			w.res.Store(c.Res)
			w.done <- struct{}{}
		})
	}
}

// close releases the ring; nothing may be in flight.
func (u *uringFile) close() {
	u.events.Close()
	<-u.reaped
	u.ring.Close()
}
