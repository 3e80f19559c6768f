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

	"golang.org/x/sys/unix"
)

// A goroutine blocked in pread keeps its P until the runtime's monitor hands
// it off, so with few Ps the reads that a Go program wants in flight at once
// queue for a P instead of for the disk (docs/blockdev.md, "Queue depth and io_uring").
// uring issues them through an io_uring instead: the submitting goroutine
// parks on a channel (its P is free at once), the kernel runs the read, and
// one reaper goroutine, woken through an eventfd in the network poller,
// hands each completion to its waiter. It is a minimal wrapper over the
// system calls (IORING_OP_READ and IORING_OP_WRITE, no SQ polling, no fixed
// buffers).

const (
	uringOpRead  = 22 // IORING_OP_READ (Linux 5.6)
	uringOpWrite = 23 // IORING_OP_WRITE

	uringOffSQRing = 0
	uringOffCQRing = 0x8000000
	uringOffSQEs   = 0x10000000

	uringRegisterEventFD  = 4 // IORING_REGISTER_EVENTFD
	uringSQESize          = 64
	uringCQESize          = 16
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

// uringParams is struct io_uring_params.
type uringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFD uint32
	resv                                                                   [3]uint32
	sqOff                                                                  struct {
		head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
		userAddr                                                        uint64
	}
	cqOff struct {
		head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
		userAddr                                                        uint64
	}
}

// uringSQE is struct io_uring_sqe (the fields used here).
type uringSQE struct {
	opcode, flags uint8
	ioprio        uint16
	fd            int32
	off, addr     uint64
	len, rwFlags  uint32
	userData      uint64
	bufIndex      uint16
	personality   uint16
	spliceFDIn    int32
	addr3, pad    uint64
}

// uringCQE is struct io_uring_cqe.
type uringCQE struct {
	userData uint64
	res      int32
	flags    uint32
}

// uringWaiter is one submitted operation's completion.
type uringWaiter struct {
	// res is atomic although done orders it: a reused slot's next
	// submission reaches the reaper through the kernel, which the race
	// detector cannot see.
	res  atomic.Int32
	done chan struct{} // buffered by one; reused
}

type uring struct {
	fd             int
	sqRing, cqRing []byte
	sqes           []byte
	sqHead, sqTail *uint32
	sqMask, cqMask uint32
	sqArray        unsafe.Pointer
	cqHead, cqTail *uint32
	cqes           unsafe.Pointer
	events         eventSource // eventfd the kernel signals on every completion
	reaped         chan struct{}
	slots          chan uint32 // free waiter slots: bounds what is in flight to the ring's size
	waiters        []uringWaiter
	mu             sync.Mutex    // submission
	broken         bool          // guarded by mu: a submission failed, use pread from now on
	submitted      atomic.Uint64 // operations that went through the ring (tests)
}

// newUring sets up a ring of depth entries; an error means the kernel (or
// a sandbox) does not offer io_uring, and the caller uses pread.
func newUring(depth int) (*uring, error) {
	var p uringParams
	p.cqEntries = uint32(2 * depth) // room for every completion: the ring never overflows
	const setupCQSize = 1 << 3      // IORING_SETUP_CQSIZE
	p.flags = setupCQSize
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(depth), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	u := &uring{fd: int(fd)}
	ok := false
	defer func() {
		if !ok {
			u.unmap()
			unix.Close(u.fd)
		}
	}()
	var err error
	mmap := func(off int64, size int) ([]byte, error) {
		return unix.Mmap(u.fd, off, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	}
	if u.sqRing, err = mmap(uringOffSQRing, int(p.sqOff.array+p.sqEntries*4)); err != nil {
		return nil, fmt.Errorf("mmap io_uring SQ ring: %w", err)
	}
	if u.cqRing, err = mmap(uringOffCQRing, int(p.cqOff.cqes+p.cqEntries*uringCQESize)); err != nil {
		return nil, fmt.Errorf("mmap io_uring CQ ring: %w", err)
	}
	if u.sqes, err = mmap(uringOffSQEs, int(p.sqEntries*uringSQESize)); err != nil {
		return nil, fmt.Errorf("mmap io_uring SQEs: %w", err)
	}
	u.sqHead = (*uint32)(unsafe.Pointer(&u.sqRing[p.sqOff.head]))
	u.sqTail = (*uint32)(unsafe.Pointer(&u.sqRing[p.sqOff.tail]))
	u.sqMask = *(*uint32)(unsafe.Pointer(&u.sqRing[p.sqOff.ringMask]))
	u.sqArray = unsafe.Pointer(&u.sqRing[p.sqOff.array])
	u.cqHead = (*uint32)(unsafe.Pointer(&u.cqRing[p.cqOff.head]))
	u.cqTail = (*uint32)(unsafe.Pointer(&u.cqRing[p.cqOff.tail]))
	u.cqMask = *(*uint32)(unsafe.Pointer(&u.cqRing[p.cqOff.ringMask]))
	u.cqes = unsafe.Pointer(&u.cqRing[p.cqOff.cqes])

	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	e32 := int32(efd)
	if _, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(u.fd), uringRegisterEventFD,
		uintptr(unsafe.Pointer(&e32)), 1, 0, 0); errno != 0 {
		unix.Close(efd)
		return nil, fmt.Errorf("io_uring_register eventfd: %w", errno)
	}
	u.events = os.NewFile(uintptr(efd), "io_uring-events") // non-blocking: read through the poller
	if wrapUringEvents != nil {
		u.events = wrapUringEvents(u.events)
	}
	n := int(p.sqEntries)
	u.waiters = make([]uringWaiter, n)
	u.slots = make(chan uint32, n)
	for i := range u.waiters {
		u.waiters[i].done = make(chan struct{}, 1)
		u.slots <- uint32(i)
	}
	u.reaped = make(chan struct{})
	go u.reap()
	ok = true
	return u, nil
}

// do runs one read or write of p at off on fd and returns the kernel's
// result like pread/pwrite. submitted is false when the operation was not
// submitted (the ring broke): the caller then does it with pread/pwrite.
func (u *uring) do(op uint8, fd int, p []byte, off int64) (n int, err error, submitted bool) {
	slot := <-u.slots
	w := &u.waiters[slot]
	u.mu.Lock()
	if u.broken {
		u.mu.Unlock()
		u.slots <- slot
		return 0, nil, false
	}
	tail := atomic.LoadUint32(u.sqTail)
	i := tail & u.sqMask
	sqe := (*uringSQE)(unsafe.Pointer(&u.sqes[uintptr(i)*uringSQESize]))
	*sqe = uringSQE{opcode: op, fd: int32(fd), off: uint64(off), addr: uint64(uintptr(unsafe.Pointer(&p[0]))),
		len: uint32(len(p)), userData: uint64(slot)}
	*(*uint32)(unsafe.Add(u.sqArray, uintptr(i)*4)) = i
	atomic.StoreUint32(u.sqTail, tail+1)
	for {
		_, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(u.fd), 1, 0, 0, 0, 0)
		if errno == 0 {
			break
		}
		if errno == unix.EINTR || errno == unix.EAGAIN || errno == unix.EBUSY {
			time.Sleep(uringSubmitRetryPause)
			continue
		}
		// Nothing was consumed: take the entry back, and never call
		// io_uring_enter again, so it cannot be submitted later.
		atomic.StoreUint32(u.sqTail, tail)
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
func (u *uring) reap() {
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
		for {
			head := atomic.LoadUint32(u.cqHead)
			if head == atomic.LoadUint32(u.cqTail) {
				break
			}
			cqe := (*uringCQE)(unsafe.Add(u.cqes, uintptr(head&u.cqMask)*uringCQESize))
			w := &u.waiters[cqe.userData]
			w.res.Store(cqe.res)
			atomic.StoreUint32(u.cqHead, head+1)
			w.done <- struct{}{}
		}
	}
}

// close releases the ring; nothing may be in flight.
func (u *uring) close() {
	u.events.Close()
	<-u.reaped
	u.unmap()
	unix.Close(u.fd)
}

func (u *uring) unmap() {
	for _, m := range [][]byte{u.sqes, u.cqRing, u.sqRing} {
		if m != nil {
			unix.Munmap(m)
		}
	}
}
