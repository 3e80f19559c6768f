package blockdev

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

var _ interface {
	Device
	FileDescriptor
} = (*File)(nil)

// File is a Device over a block device or a regular file, opened with
// O_DIRECT where the file system allows it. I/O goes straight to pread/pwrite
// from the calling goroutine: a goroutine blocked in a system call gets its
// own thread, so concurrent callers form a thread pool that the Go runtime
// sizes; WithMaxInflight bounds it.
type File struct {
	path      string
	f         *os.File
	fd        int          // f's descriptor, cached: valid while mu is held shared and !closed
	size      atomic.Int64 // grows only (Grow)
	blockSize int
	isDevice  bool
	direct    bool
	readOnly  bool
	inflight  chan struct{} // counting semaphore; nil = unbounded

	// mu is held shared by every operation and exclusively by Close, so the
	// descriptor is never closed (and its number reused by another open)
	// under a system call in flight.
	mu     sync.RWMutex
	closed bool // guarded by mu

	// noDsyncFlag is set once pwritev2(RWF_DSYNC) turned out unsupported;
	// FUA writes then become pwrite + fdatasync.
	noDsyncFlag atomic.Bool

	sys sysCalls

	ring       *uringFile // nil: pread and pwrite
	ringActive atomic.Int64
	ringOn     atomic.Bool // see useRing
	ringAbove  int64       // ringAboveDefault; tests lower it
	ringBelow  int64
}

// sysCalls are the system calls File makes for I/O. Tests replace them to
// reach fallbacks that this machine's kernel never takes.
type sysCalls struct {
	pread       func(fd int, p []byte, off int64) (int, error)
	pwrite      func(fd int, p []byte, off int64) (int, error)
	pwriteDsync func(fd int, p []byte, off int64) (int, error)
	fallocate   func(fd int, mode uint32, off, length int64) error
	zeroOut     func(fd int, off, length int64) error
}

var realSysCalls = sysCalls{
	pread:  unix.Pread,
	pwrite: unix.Pwrite,
	pwriteDsync: func(fd int, p []byte, off int64) (int, error) {
		return unix.Pwritev2(fd, [][]byte{p}, off, unix.RWF_DSYNC)
	},
	fallocate: unix.Fallocate,
	zeroOut: func(fd int, off, length int64) error {
		rng := [2]uint64{uint64(off), uint64(length)}
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKZEROOUT, uintptr(unsafe.Pointer(&rng[0]))); errno != 0 {
			return errno
		}
		return nil
	},
}

type options struct {
	readOnly     bool
	noDirect     bool
	notExclusive bool
	minSize      int64
	maxInflight  int
	uring        bool
	logger       *slog.Logger
}

// Option configures Open.
type Option func(*options)

// WithReadOnly opens the device read-only; writes fail with ErrReadOnly.
func WithReadOnly() Option { return func(o *options) { o.readOnly = true } }

// WithoutDirectIO opens the device through the page cache (tests, tmpfs).
func WithoutDirectIO() Option { return func(o *options) { o.noDirect = true } }

// WithoutExclusive lets a writable block device or file be opened while
// another program holds it exclusively (a mounted file system, another
// target). By default Open claims writable block devices with O_EXCL, so
// that it fails with EBUSY instead of overwriting a mounted file system, and
// writable files with an exclusive flock, so that it fails with ErrInUse
// instead of serving a file another target serves.
func WithoutExclusive() Option { return func(o *options) { o.notExclusive = true } }

// WithMinSize makes Open fail with ErrTooSmall if the device holds fewer than
// n bytes.
func WithMinSize(n int64) Option { return func(o *options) { o.minSize = n } }

// WithMaxInflight bounds the number of concurrent system calls (default 64).
// 0 means unbounded.
func WithMaxInflight(n int) Option { return func(o *options) { o.maxInflight = n } }

// WithIOUring makes reads and writes go through an io_uring where the
// kernel offers one (pread and pwrite otherwise, with a warning): the
// caller's goroutine parks while the kernel works, so many goroutines keep
// many operations in flight even with few Ps. FUA writes, flushes and
// discards stay system calls.
func WithIOUring() Option { return func(o *options) { o.uring = true } }

// WithLogger sets where Open reports fallbacks (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// The ring's thresholds (File.useRing).
const (
	ringAboveDefault = 8
	ringBelowDefault = 2
)

// DefaultMaxInflight is the default bound on concurrent system calls per
// device: twice the queue depth at which the reference disk saturates (see
// docs/blockdev.md), so a device never waits on the bound, while a burst of
// callers queues on a channel instead of each pinning an OS thread.
const DefaultMaxInflight = 64

// Open opens a block device or a regular file.
func Open(path string, opts ...Option) (*File, error) {
	o := options{maxInflight: DefaultMaxInflight, logger: slog.Default()}
	for _, opt := range opts {
		opt(&o)
	}
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	fail := func(err error) (*File, error) {
		return nil, &Error{Op: "open", Path: path, Off: -1, Err: err}
	}
	// Stat before opening: opening a character device or a FIFO read-write
	// can have side effects.
	st, err := os.Stat(path)
	if err != nil {
		return fail(unwrapPathError(err))
	}
	isDevice := st.Mode()&os.ModeDevice != 0 && st.Mode()&os.ModeCharDevice == 0
	if !isDevice && !st.Mode().IsRegular() {
		return fail(fmt.Errorf("not a block device or regular file (mode %v)", st.Mode()))
	}

	flags := os.O_RDWR
	if o.readOnly {
		flags = os.O_RDONLY
	}
	if isDevice && !o.readOnly && !o.notExclusive {
		flags |= os.O_EXCL
	}
	direct := !o.noDirect
	if direct && !isDevice {
		align, supported := directIOAlign(path)
		switch {
		case !supported:
			o.logger.Warn("file system does not support O_DIRECT (statx); using buffered I/O", "path", path)
			direct = false
		case align > PageSize:
			// The layers above do 4 KiB I/O, which such a file could not
			// take directly.
			o.logger.Warn("file system needs O_DIRECT alignment beyond the page size; using buffered I/O",
				"path", path, "alignment", align)
			direct = false
		}
	}
	f, err := openForIO(path, flags, direct)
	if err != nil && direct && errors.Is(err, unix.EINVAL) {
		// Some file systems refuse O_DIRECT at open. Where they do, there is
		// no device cache under them to bypass (tmpfs before Linux 6.6), so
		// buffered I/O is still honest about durability.
		o.logger.Warn("file system refuses O_DIRECT; using buffered I/O", "path", path)
		direct = false
		f, err = openForIO(path, flags, false)
	}
	if err != nil {
		switch {
		case errors.Is(err, unix.EROFS), errors.Is(err, unix.EACCES) && !o.readOnly:
			return fail(fmt.Errorf("%w: %v (open it read-only or fix permissions)", ErrReadOnly, unwrapPathError(err)))
		case errors.Is(err, unix.EBUSY) && flags&os.O_EXCL != 0:
			return fail(fmt.Errorf("%w: in use (mounted, or opened exclusively by another program)", unwrapPathError(err)))
		}
		return fail(unwrapPathError(err))
	}
	d := &File{path: path, f: f, fd: int(f.Fd()), isDevice: isDevice, direct: direct,
		readOnly: o.readOnly, blockSize: 512, sys: realSysCalls}
	if o.maxInflight > 0 {
		d.inflight = make(chan struct{}, o.maxInflight)
	}
	closeAndFail := func(err error) (*File, error) {
		f.Close()
		return fail(err)
	}
	var size int64
	if isDevice {
		if size, err = deviceSize(d.fd); err != nil {
			return closeAndFail(err)
		}
		bs, err := unix.IoctlGetInt(d.fd, unix.BLKSSZGET)
		if err != nil {
			return closeAndFail(fmt.Errorf("BLKSSZGET: %w", err))
		}
		if bs <= 0 || bs > PageSize || bs&(bs-1) != 0 {
			return closeAndFail(fmt.Errorf("logical block size %d is not a power of two up to %d", bs, PageSize))
		}
		d.blockSize = bs
		// A read-only block device (losetup -r, a write-protected disk)
		// opens read-write without complaint; writes would fail later, one
		// by one, with EPERM.
		if ro, err := unix.IoctlGetInt(d.fd, unix.BLKROGET); err == nil && ro != 0 && !o.readOnly {
			return closeAndFail(fmt.Errorf("%w: the kernel marks it read-only (BLKROGET); open it with WithReadOnly", ErrReadOnly))
		}
	} else {
		// A writable file is claimed with an exclusive flock, as a writable
		// block device is with O_EXCL: two targets (or two namespaces of
		// one) serving the same file would each cache pages of it and
		// overwrite each other's writes. The lock goes with the descriptor.
		if !o.readOnly && !o.notExclusive {
			if err := unix.Flock(d.fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
				if errors.Is(err, unix.EWOULDBLOCK) {
					return closeAndFail(fmt.Errorf("%w (another target or namespace serves it: flock)", ErrInUse))
				}
				return closeAndFail(fmt.Errorf("flock: %w", err))
			}
		}
		// Size from the open descriptor: the path may have changed since
		// the Stat above.
		fst, err := f.Stat()
		if err != nil {
			return closeAndFail(unwrapPathError(err))
		}
		size = fst.Size()
		if direct {
			// The layers above work in pages, so 4 KiB is the natural unit
			// even where the file system would take 512 bytes; more than a
			// page was refused above.
			d.blockSize = PageSize
		}
	}
	size -= size % int64(d.blockSize)
	d.size.Store(size)
	if o.minSize > 0 && size < o.minSize {
		return closeAndFail(fmt.Errorf("%w: %d bytes, %d needed", ErrTooSmall, size, o.minSize))
	}
	if o.uring {
		depth := uringDefaultDepth
		if o.maxInflight > 0 {
			depth = max(o.maxInflight, 2)
		}
		d.ringAbove, d.ringBelow = ringAboveDefault, ringBelowDefault
		if d.ring, err = newUring(depth); err != nil { // d.ring stays nil
			o.logger.Warn("no io_uring; using pread and pwrite", "path", path, "err", err)
		}
	}
	return d, nil
}

// directIOAlign is fileDirectIOAlign; tests replace it.
var directIOAlign = fileDirectIOAlign

// fileDirectIOAlign asks statx for a regular file's direct I/O alignment.
// supported is false only when the kernel says the file cannot do direct
// I/O; when statx does not know (tmpfs, old kernels), the open decides.
func fileDirectIOAlign(path string) (align int, supported bool) {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_DIOALIGN, &stx); err != nil || stx.Mask&unix.STATX_DIOALIGN == 0 {
		return 0, true
	}
	if stx.Dio_offset_align == 0 {
		return 0, false
	}
	return int(max(stx.Dio_offset_align, stx.Dio_mem_align)), true
}

// openForIO is openFile; tests replace it to meet a file system that
// refuses O_DIRECT.
var openForIO = openFile

func openFile(path string, flags int, direct bool) (*os.File, error) {
	if direct {
		flags |= unix.O_DIRECT
	}
	return os.OpenFile(path, flags|unix.O_CLOEXEC, 0)
}

func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Create makes a sparse regular file of size bytes at path for the embedded
// default backing store. An existing file is kept (its data is the namespace)
// and grown if it is smaller; it is never shrunk.
func Create(path string, size int64) error {
	fail := func(err error) error { return &Error{Op: "create", Path: path, Off: -1, Err: err} }
	if size <= 0 || size%PageSize != 0 {
		return fail(fmt.Errorf("size %d is not a positive multiple of %d", size, PageSize))
	}
	if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() {
		return fail(fmt.Errorf("exists and is not a regular file (mode %v)", st.Mode()))
	}
	created := true
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, os.ErrExist) {
		created = false
		f, err = os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return fail(unwrapPathError(err))
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fail(unwrapPathError(err))
	}
	if st.Size() < size {
		if err := f.Truncate(size); err != nil {
			// A file this call created is removed again: left empty, it
			// would make every later start fail as too small.
			if created {
				os.Remove(path)
			}
			return fail(unwrapPathError(err))
		}
	}
	return nil
}

func (d *File) Path() string   { return d.path }
func (d *File) Size() int64    { return d.size.Load() }
func (d *File) BlockSize() int { return d.blockSize }

// Fd returns the descriptor. It stays owned by d and is valid until Close;
// I/O through it bypasses every decorator above d.
func (d *File) Fd() uintptr  { return d.f.Fd() }
func (d *File) Direct() bool { return d.direct }

// IsBlockDevice reports whether the path is a block device (not a file).
func (d *File) IsBlockDevice() bool { return d.isDevice }

// begin admits one operation: it takes an in-flight slot, then the shared
// lock that keeps the descriptor open. end undoes both.
func (d *File) begin(op string, off, n int64) (end func(), err error) {
	if d.inflight != nil {
		d.inflight <- struct{}{}
	}
	d.mu.RLock()
	end = func() {
		d.mu.RUnlock()
		if d.inflight != nil {
			<-d.inflight
		}
	}
	if d.closed {
		end()
		return nil, &Error{Op: op, Path: d.path, Off: off, Len: n, Err: ErrClosed}
	}
	return end, nil
}

// check validates an I/O before it takes a slot.
func (d *File) check(op string, p []byte, off int64, write bool) error {
	if write && d.readOnly {
		return &Error{Op: op, Path: d.path, Off: off, Len: int64(len(p)), Err: ErrReadOnly}
	}
	if err := CheckRange(d, op, off, int64(len(p))); err != nil {
		return err
	}
	if d.direct && !IsAligned(p, d.blockSize) {
		return &Error{Op: op, Path: d.path, Off: off, Len: int64(len(p)),
			Err: fmt.Errorf("%w: buffer at %p is not aligned to %d (use AlignedBuffer)", ErrUnaligned, unsafe.Pointer(&p[0]), d.blockSize)}
	}
	return nil
}

// ReadAt implements Device.
func (d *File) ReadAt(p []byte, off int64) (int, error) {
	if d.ring != nil {
		return d.transfer("read", p, off, false, d.ringRead)
	}
	return d.transfer("read", p, off, false, d.sys.pread)
}

// WriteAt implements Device.
func (d *File) WriteAt(p []byte, off int64) (int, error) {
	if d.ring != nil {
		return d.transfer("write", p, off, true, d.ringWrite)
	}
	return d.transfer("write", p, off, true, d.sys.pwrite)
}

// useRing says whether the operation that makes active operations in
// flight goes through the ring. At a low queue depth a blocking system call
// costs less than the ring's hand-offs between goroutines (on this VM each
// can wake the other vCPU); at a high one, system calls that each hold a P
// leave too few in flight. The two are not mixed: blocked system calls
// would hold the Ps the ring's reaper needs. So the file switches to the
// ring when more than ringAbove operations are in flight and back once at
// most ringBelow are (measured in docs/blockdev.md).
func (d *File) useRing(active int64) bool {
	on := d.ringOn.Load()
	switch {
	case !on && active > d.ringAbove:
		d.ringOn.Store(true)
		return true
	case on && active <= d.ringBelow:
		d.ringOn.Store(false)
		return false
	}
	return on
}

func (d *File) ringRead(fd int, p []byte, off int64) (int, error) {
	return d.viaRing(uringOpRead, d.sys.pread, fd, p, off)
}

func (d *File) ringWrite(fd int, p []byte, off int64) (int, error) {
	return d.viaRing(uringOpWrite, d.sys.pwrite, fd, p, off)
}

// viaRing does one operation through the ring or, at low depth or with a
// broken ring, with the system call sys.
func (d *File) viaRing(op uint8, sys func(int, []byte, int64) (int, error), fd int, p []byte, off int64) (int, error) {
	defer d.ringActive.Add(-1)
	if d.useRing(d.ringActive.Add(1)) {
		if n, err, ok := d.ring.do(op, fd, p, off); ok {
			return n, err
		}
	}
	return sys(fd, p, off)
}

// WriteAtFUA implements Device with pwritev2(RWF_DSYNC), which the kernel
// turns into FUA writes on devices that support them and into a write plus
// a cache flush on the others.
func (d *File) WriteAtFUA(p []byte, off int64) (int, error) {
	if d.noDsyncFlag.Load() {
		return d.writeThenSync(p, off)
	}
	n, err := d.transfer("write-fua", p, off, true, d.sys.pwriteDsync)
	if n == 0 && (errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS)) {
		d.noDsyncFlag.Store(true)
		return d.writeThenSync(p, off)
	}
	return n, err
}

func (d *File) writeThenSync(p []byte, off int64) (int, error) {
	n, err := d.transfer("write-fua", p, off, true, d.sys.pwrite)
	if err != nil {
		return n, err
	}
	if err := d.Flush(); err != nil {
		return 0, &Error{Op: "write-fua", Path: d.path, Off: off, Len: int64(len(p)), Err: errors.Unwrap(err)}
	}
	return n, nil
}

// transfer checks and admits one read or write and repeats the positional
// system call until it is complete: both may be short on regular files
// (signals, file system limits).
func (d *File) transfer(op string, p []byte, off int64, write bool, io func(int, []byte, int64) (int, error)) (int, error) {
	if err := d.check(op, p, off, write); err != nil {
		return 0, err
	}
	end, err := d.begin(op, off, int64(len(p)))
	if err != nil {
		return 0, err
	}
	defer end()
	done := 0
	for done < len(p) {
		n, err := io(d.fd, p[done:], off+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, &Error{Op: op, Path: d.path, Off: off, Len: int64(len(p)), Err: err}
		}
		if n == 0 {
			return done, &Error{Op: op, Path: d.path, Off: off, Len: int64(len(p)),
				Err: fmt.Errorf("%w: short transfer at byte %d (file shrunk under us?)", ErrOutOfRange, done)}
		}
		done += n
	}
	return done, nil
}

// Flush implements Device.
func (d *File) Flush() error {
	end, err := d.begin("flush", -1, 0)
	if err != nil {
		return err
	}
	defer end()
	if d.readOnly {
		return nil
	}
	if err := unix.Fdatasync(d.fd); err != nil {
		return &Error{Op: "flush", Path: d.path, Off: -1, Err: err}
	}
	return nil
}

// Discard implements Device. Every path below leaves the range reading
// zeros; they differ in whether the space is given back:
//   - block device: fallocate(PUNCH_HOLE), which the kernel turns into a
//     Write Zeroes that may deallocate (NVMe DEAC, a hole in a loop device's
//     file) and refuses rather than write zeros; if the device has no
//     such command, BLKZEROOUT writes zeros. BLKDISCARD is never used: it
//     does not promise that the range reads back zeros.
//   - file: fallocate(PUNCH_HOLE); else fallocate(ZERO_RANGE); else zeros
//     written with pwrite.
func (d *File) Discard(off, length int64) error {
	if d.readOnly {
		return &Error{Op: "discard", Path: d.path, Off: off, Len: length, Err: ErrReadOnly}
	}
	if err := CheckRange(d, "discard", off, length); err != nil {
		return err
	}
	end, err := d.begin("discard", off, length)
	if err != nil {
		return err
	}
	defer end()
	if length == 0 {
		return nil
	}
	err = d.sys.fallocate(d.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length)
	if errors.Is(err, unix.EOPNOTSUPP) {
		if d.isDevice {
			if err = d.sys.zeroOut(d.fd, off, length); err != nil {
				err = fmt.Errorf("BLKZEROOUT: %w", err)
			}
		} else {
			err = d.sys.fallocate(d.fd, unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, off, length)
			if errors.Is(err, unix.EOPNOTSUPP) {
				err = d.writeZeros(off, length)
			}
		}
	}
	if err != nil {
		return &Error{Op: "discard", Path: d.path, Off: off, Len: length, Err: err}
	}
	return nil
}

// zeroChunk bounds the buffer writeZeros allocates.
const zeroChunk = 1 << 20

// writeZeros is the last resort of Discard on a file system that can
// neither punch holes nor zero ranges.
func (d *File) writeZeros(off, length int64) error {
	zeros := AlignedBuffer(int(min(length, zeroChunk)))
	for length > 0 {
		chunk := zeros[:min(length, int64(len(zeros)))]
		for done := 0; done < len(chunk); {
			n, err := d.sys.pwrite(d.fd, chunk[done:], off+int64(done))
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return fmt.Errorf("writing zeros: %w", err)
			}
			if n == 0 {
				return fmt.Errorf("writing zeros: %w", ErrOutOfRange)
			}
			done += n
		}
		off += int64(len(chunk))
		length -= int64(len(chunk))
	}
	return nil
}

// Close implements Device. It waits for operations in flight; operations
// after it fail with ErrClosed. Closing twice is not an error.
func (d *File) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	if d.ring != nil {
		d.ring.close() // nothing is in flight: every operation holds mu shared
	}
	if err := d.f.Close(); err != nil {
		return &Error{Op: "close", Path: d.path, Off: -1, Err: unwrapPathError(err)}
	}
	return nil
}
