// Package uring is the project's minimal io_uring wrapper over the system
// calls (golang.org/x/sys/unix, no cgo): a ring set up and mapped into the
// process, submission entries prepared in place and submitted, completions
// read in place. blockdev issues reads and writes through it; the ublk
// server issues IORING_OP_URING_CMD through rings of 128-byte entries.
//
// A Ring is not safe for concurrent use: its user serialises preparing and
// submitting entries, and reading completions (one goroutine each, or a
// lock). No SQ polling, no fixed buffers or files.
package uring

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Opcodes (enum io_uring_op).
const (
	OpRead     = 22 // IORING_OP_READ (Linux 5.6)
	OpWrite    = 23 // IORING_OP_WRITE
	OpURingCmd = 46 // IORING_OP_URING_CMD (Linux 5.19): a command for the file's driver
)

// Setup flags (io_uring_params.flags).
const (
	setupCQSize = 1 << 3  // IORING_SETUP_CQSIZE
	setupSQE128 = 1 << 10 // IORING_SETUP_SQE128 (Linux 5.19)
)

// io_uring_enter flags.
const enterGetEvents = 1 << 0 // IORING_ENTER_GETEVENTS

const (
	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000

	registerEventFD = 4 // IORING_REGISTER_EVENTFD

	cqeSize = 16
)

// Params configures New.
type Params struct {
	// Entries is the submission queue's size (rounded up to a power of
	// two by the kernel).
	Entries int
	// CQEntries is the completion queue's size; 0: the kernel's default
	// (twice Entries).
	CQEntries int
	// SQE128 makes every entry 128 bytes, with an 80-byte command area
	// (Ring.Cmd), as IORING_OP_URING_CMD of ublk's control device needs.
	SQE128 bool
}

// params is struct io_uring_params.
type params struct {
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

// SQE is struct io_uring_sqe (its first 64 bytes; a 128-byte entry's
// command area continues past Pad, see Cmd).
type SQE struct {
	Opcode, Flags uint8
	IOPrio        uint16
	FD            int32
	// Off is the file offset; for IORING_OP_URING_CMD its low 32 bits are
	// the command's opcode (cmd_op).
	Off, Addr   uint64
	Len, OpFlag uint32
	UserData    uint64
	BufIndex    uint16
	Personality uint16
	SpliceFDIn  int32
	// Addr3 and Pad are where the command area of IORING_OP_URING_CMD
	// begins (sqe->cmd).
	Addr3, Pad uint64
}

// SetCmdOp sets the command opcode of an IORING_OP_URING_CMD entry.
func (e *SQE) SetCmdOp(op uint32) { e.Off = uint64(op) }

// CQE is struct io_uring_cqe.
type CQE struct {
	UserData uint64
	Res      int32
	Flags    uint32
}

// Ring is an io_uring instance mapped into this process.
type Ring struct {
	fd             int
	sqe128         bool
	sqRing, cqRing []byte
	sqes           []byte
	sqHead, sqTail *uint32
	sqMask         uint32
	sqEntries      uint32
	sqArray        unsafe.Pointer
	cqHead, cqTail *uint32
	cqMask         uint32
	cqes           unsafe.Pointer
	tail           uint32 // our tail: entries prepared, published at Submit
}

// New sets up a ring. An error means the kernel (or a sandbox) does not
// offer io_uring, or not the features asked for.
func New(p Params) (*Ring, error) {
	var kp params
	if p.CQEntries > 0 {
		kp.cqEntries = uint32(p.CQEntries)
		kp.flags |= setupCQSize
	}
	if p.SQE128 {
		kp.flags |= setupSQE128
	}
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(p.Entries), uintptr(unsafe.Pointer(&kp)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r := &Ring{fd: int(fd), sqe128: p.SQE128}
	ok := false
	defer func() {
		if !ok {
			r.Close()
		}
	}()
	var err error
	mmap := func(off int64, size int) ([]byte, error) {
		return unix.Mmap(r.fd, off, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	}
	if r.sqRing, err = mmap(offSQRing, int(kp.sqOff.array+kp.sqEntries*4)); err != nil {
		return nil, fmt.Errorf("mmap io_uring SQ ring: %w", err)
	}
	if r.cqRing, err = mmap(offCQRing, int(kp.cqOff.cqes+kp.cqEntries*cqeSize)); err != nil {
		return nil, fmt.Errorf("mmap io_uring CQ ring: %w", err)
	}
	if r.sqes, err = mmap(offSQEs, int(kp.sqEntries)*r.sqeSize()); err != nil {
		return nil, fmt.Errorf("mmap io_uring SQEs: %w", err)
	}
	r.sqHead = (*uint32)(unsafe.Pointer(&r.sqRing[kp.sqOff.head]))
	r.sqTail = (*uint32)(unsafe.Pointer(&r.sqRing[kp.sqOff.tail]))
	r.sqMask = *(*uint32)(unsafe.Pointer(&r.sqRing[kp.sqOff.ringMask]))
	r.sqEntries = kp.sqEntries
	r.sqArray = unsafe.Pointer(&r.sqRing[kp.sqOff.array])
	r.cqHead = (*uint32)(unsafe.Pointer(&r.cqRing[kp.cqOff.head]))
	r.cqTail = (*uint32)(unsafe.Pointer(&r.cqRing[kp.cqOff.tail]))
	r.cqMask = *(*uint32)(unsafe.Pointer(&r.cqRing[kp.cqOff.ringMask]))
	r.cqes = unsafe.Pointer(&r.cqRing[kp.cqOff.cqes])
	r.tail = atomic.LoadUint32(r.sqTail)
	ok = true
	return r, nil
}

func (r *Ring) sqeSize() int {
	if r.sqe128 {
		return 128
	}
	return 64
}

// Entries is the submission queue's size.
func (r *Ring) Entries() int { return int(r.sqEntries) }

// FD is the ring's descriptor.
func (r *Ring) FD() int { return r.fd }

// Prepare returns the next free submission entry, zeroed (all 128 bytes of
// a 128-byte entry), or nil when the queue is full. The kernel sees it at
// the next Submit.
func (r *Ring) Prepare() *SQE {
	head := atomic.LoadUint32(r.sqHead)
	if r.tail-head >= r.sqEntries {
		return nil
	}
	i := r.tail & r.sqMask
	size := r.sqeSize()
	b := r.sqes[int(i)*size : int(i+1)*size]
	clear(b)
	*(*uint32)(unsafe.Add(r.sqArray, uintptr(i)*4)) = i
	r.tail++
	return (*SQE)(unsafe.Pointer(&b[0]))
}

// Cmd is the command area of e, an entry of this ring: what a driver reads
// for IORING_OP_URING_CMD. It is 16 bytes in a 64-byte entry, 80 in a
// 128-byte one (Params.SQE128).
func (r *Ring) Cmd(e *SQE) []byte {
	n := 16
	if r.sqe128 {
		n = 80
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&e.Addr3)), n)
}

// Pending is the number of prepared entries the kernel has not consumed.
func (r *Ring) Pending() int { return int(r.tail - atomic.LoadUint32(r.sqHead)) }

// Submit publishes the prepared entries and hands them to the kernel with
// io_uring_enter, waiting until at least wait completions are there. It
// returns how many entries the kernel consumed. An interrupted wait
// (EINTR) is an error after the entries were consumed; the caller calls
// Submit again to wait on.
func (r *Ring) Submit(wait uint32) (int, error) {
	atomic.StoreUint32(r.sqTail, r.tail)
	n := r.Pending()
	var flags uintptr
	if wait > 0 {
		flags = enterGetEvents
	}
	ret, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(n), uintptr(wait), flags, 0, 0)
	if errno != 0 {
		return n - r.Pending(), errno
	}
	return int(ret), nil
}

// Withdraw takes back the prepared entries the kernel has not consumed (a
// Submit failed and they must never be submitted later).
func (r *Ring) Withdraw() {
	r.tail = atomic.LoadUint32(r.sqHead)
	atomic.StoreUint32(r.sqTail, r.tail)
}

// Completions calls f for each completion there is, in order, and marks
// them seen. It returns how many there were.
func (r *Ring) Completions(f func(CQE)) int {
	n := 0
	for {
		head := atomic.LoadUint32(r.cqHead)
		if head == atomic.LoadUint32(r.cqTail) {
			return n
		}
		c := *(*CQE)(unsafe.Add(r.cqes, uintptr(head&r.cqMask)*cqeSize))
		atomic.StoreUint32(r.cqHead, head+1)
		f(c)
		n++
	}
}

// RegisterEventFD has the kernel signal efd on every completion.
func (r *Ring) RegisterEventFD(efd int) error {
	e32 := int32(efd)
	if _, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), registerEventFD,
		uintptr(unsafe.Pointer(&e32)), 1, 0, 0); errno != 0 {
		return fmt.Errorf("io_uring_register eventfd: %w", errno)
	}
	return nil
}

// Close unmaps and closes the ring. Operations still in flight are
// cancelled by the kernel; their buffers must stay valid until then, so
// callers close a ring only when nothing is in flight, or when the buffers
// are not Go memory.
func (r *Ring) Close() error {
	for _, m := range [][]byte{r.sqes, r.cqRing, r.sqRing} {
		if m != nil {
			unix.Munmap(m)
		}
	}
	r.sqes, r.cqRing, r.sqRing = nil, nil, nil
	if r.fd < 0 {
		return nil
	}
	err := unix.Close(r.fd)
	r.fd = -1
	return err
}
