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

// File is a Device over a block device or a regular file, opened with
// O_DIRECT where the file system allows it. I/O goes straight to pread/pwrite
// from the calling goroutine: a goroutine blocked in a system call gets its
// own thread, so concurrent callers form a thread pool that the Go runtime
// sizes; WithMaxInflight bounds it.
type File struct {
	path      string
	f         *os.File
	syncf     *os.File // O_DSYNC twin of f for FUA writes; nil when read-only
	size      int64
	blockSize int
	isDevice  bool
	direct    bool
	readOnly  bool
	inflight  chan struct{} // counting semaphore; nil = unbounded
	closed    atomic.Bool
	closeOnce sync.Once
}

type options struct {
	readOnly    bool
	noDirect    bool
	minSize     int64
	maxInflight int
	logger      *slog.Logger
}

// Option configures Open.
type Option func(*options)

// WithReadOnly opens the device read-only; writes fail with ErrReadOnly.
func WithReadOnly() Option { return func(o *options) { o.readOnly = true } }

// WithoutDirectIO opens the device through the page cache (tests, tmpfs).
func WithoutDirectIO() Option { return func(o *options) { o.noDirect = true } }

// WithMinSize makes Open fail with ErrTooSmall if the device holds fewer than
// n bytes.
func WithMinSize(n int64) Option { return func(o *options) { o.minSize = n } }

// WithMaxInflight bounds the number of concurrent system calls (default 64).
// 0 means unbounded.
func WithMaxInflight(n int) Option { return func(o *options) { o.maxInflight = n } }

// WithLogger sets where Open reports fallbacks (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// Open opens a block device or a regular file.
func Open(path string, opts ...Option) (*File, error) {
	o := options{maxInflight: 64, logger: slog.Default()}
	for _, opt := range opts {
		opt(&o)
	}
	fail := func(err error) (*File, error) {
		return nil, &Error{Op: "open", Path: path, Off: -1, Err: err}
	}
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
	direct := !o.noDirect
	f, err := openFile(path, flags, direct)
	if err != nil && direct && errors.Is(err, unix.EINVAL) {
		// tmpfs and a few others refuse O_DIRECT; they have no device cache to
		// bypass, so buffered I/O there is still honest about durability.
		o.logger.Warn("file system refuses O_DIRECT; using buffered I/O", "path", path)
		direct = false
		f, err = openFile(path, flags, false)
	}
	if err != nil {
		if errors.Is(err, unix.EROFS) || errors.Is(err, unix.EACCES) && !o.readOnly {
			return fail(fmt.Errorf("%w: %v (open it read-only or fix permissions)", ErrReadOnly, unwrapPathError(err)))
		}
		return fail(unwrapPathError(err))
	}
	d := &File{path: path, f: f, isDevice: isDevice, direct: direct, readOnly: o.readOnly, blockSize: 512}
	if o.maxInflight > 0 {
		d.inflight = make(chan struct{}, o.maxInflight)
	}
	if isDevice {
		var size uint64
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size))); errno != 0 {
			err = errno
			f.Close()
			return fail(fmt.Errorf("BLKGETSIZE64: %w", err))
		}
		bs, err := unix.IoctlGetInt(int(f.Fd()), unix.BLKSSZGET)
		if err != nil {
			f.Close()
			return fail(fmt.Errorf("BLKSSZGET: %w", err))
		}
		d.size, d.blockSize = int64(size), bs
		if ro, err := unix.IoctlGetInt(int(f.Fd()), unix.BLKROGET); err == nil && ro != 0 && !o.readOnly {
			f.Close()
			return fail(fmt.Errorf("%w: the kernel marks it read-only (BLKROGET)", ErrReadOnly))
		}
	} else {
		d.size = st.Size()
		if direct {
			// A file's direct-I/O alignment is the logical block size of the
			// device under it; 4 KiB is safe for every device we meet and is
			// the page size the layers above use anyway.
			d.blockSize = PageSize
		}
	}
	d.size -= d.size % int64(d.blockSize)
	if o.minSize > 0 && d.size < o.minSize {
		f.Close()
		return fail(fmt.Errorf("%w: %d bytes, %d needed", ErrTooSmall, d.size, o.minSize))
	}
	if !o.readOnly {
		d.syncf, err = openFile(path, os.O_RDWR|unix.O_DSYNC, direct)
		if err != nil {
			f.Close()
			return fail(unwrapPathError(err))
		}
	}
	return d, nil
}

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
	if size <= 0 || size%PageSize != 0 {
		return &Error{Op: "create", Path: path, Off: -1, Err: fmt.Errorf("size %d is not a positive multiple of %d", size, PageSize)}
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return &Error{Op: "create", Path: path, Off: -1, Err: unwrapPathError(err)}
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return &Error{Op: "create", Path: path, Off: -1, Err: err}
	}
	if st.Size() < size {
		if err := f.Truncate(size); err != nil {
			return &Error{Op: "create", Path: path, Off: -1, Err: unwrapPathError(err)}
		}
	}
	return nil
}

func (d *File) Path() string   { return d.path }
func (d *File) Size() int64    { return d.size }
func (d *File) BlockSize() int { return d.blockSize }
func (d *File) Fd() uintptr    { return d.f.Fd() }
func (d *File) Direct() bool   { return d.direct }

// IsBlockDevice reports whether the path is a block device (not a file).
func (d *File) IsBlockDevice() bool { return d.isDevice }

func (d *File) acquire() func() {
	if d.inflight == nil {
		return func() {}
	}
	d.inflight <- struct{}{}
	return func() { <-d.inflight }
}

func (d *File) check(op string, p []byte, off int64, write bool) error {
	if d.closed.Load() {
		return &Error{Op: op, Path: d.path, Off: off, Len: int64(len(p)), Err: ErrClosed}
	}
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
	if err := d.check("read", p, off, false); err != nil {
		return 0, err
	}
	defer d.acquire()()
	return d.loop("read", d.f, p, off, unix.Pread)
}

// WriteAt implements Device.
func (d *File) WriteAt(p []byte, off int64) (int, error) {
	if err := d.check("write", p, off, true); err != nil {
		return 0, err
	}
	defer d.acquire()()
	return d.loop("write", d.f, p, off, unix.Pwrite)
}

// WriteAtFUA implements Device with an O_DSYNC descriptor, which the kernel
// turns into FUA writes on devices that support them.
func (d *File) WriteAtFUA(p []byte, off int64) (int, error) {
	if err := d.check("write-fua", p, off, true); err != nil {
		return 0, err
	}
	defer d.acquire()()
	return d.loop("write-fua", d.syncf, p, off, unix.Pwrite)
}

// loop repeats a positional read or write until it is complete: both may be
// short on regular files (signals, file system limits).
func (d *File) loop(op string, f *os.File, p []byte, off int64, io func(int, []byte, int64) (int, error)) (int, error) {
	done := 0
	for done < len(p) {
		n, err := io(int(f.Fd()), p[done:], off+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, &Error{Op: op, Path: d.path, Off: off, Len: int64(len(p)), Err: err}
		}
		if n == 0 {
			return done, &Error{Op: op, Path: d.path, Off: off, Len: int64(len(p)),
				Err: fmt.Errorf("%w: short transfer at byte %d", ErrOutOfRange, done)}
		}
		done += n
	}
	return done, nil
}

// Flush implements Device.
func (d *File) Flush() error {
	if d.closed.Load() {
		return &Error{Op: "flush", Path: d.path, Off: -1, Err: ErrClosed}
	}
	if d.readOnly {
		return nil
	}
	if err := unix.Fdatasync(int(d.f.Fd())); err != nil {
		return &Error{Op: "flush", Path: d.path, Off: -1, Err: err}
	}
	return nil
}

// Discard implements Device: BLKDISCARD on devices, a punched hole in files.
func (d *File) Discard(off, length int64) error {
	if d.closed.Load() {
		return &Error{Op: "discard", Path: d.path, Off: off, Len: length, Err: ErrClosed}
	}
	if d.readOnly {
		return &Error{Op: "discard", Path: d.path, Off: off, Len: length, Err: ErrReadOnly}
	}
	if err := CheckRange(d, "discard", off, length); err != nil || length == 0 {
		return err
	}
	var err error
	if d.isDevice {
		// BLKDISCARD does not promise zeros on every device; BLKZEROOUT does,
		// and on devices with deterministic discard it is a discard.
		rng := [2]uint64{uint64(off), uint64(length)}
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, d.f.Fd(), unix.BLKZEROOUT, uintptr(unsafe.Pointer(&rng[0])))
		if errno != 0 {
			err = fmt.Errorf("BLKZEROOUT: %w", errno)
		}
	} else {
		err = unix.Fallocate(int(d.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length)
	}
	if err != nil {
		return &Error{Op: "discard", Path: d.path, Off: off, Len: length, Err: err}
	}
	return nil
}

// Close implements Device.
func (d *File) Close() error {
	var err error
	d.closeOnce.Do(func() {
		d.closed.Store(true)
		if d.syncf != nil {
			d.syncf.Close()
		}
		err = d.f.Close()
	})
	return err
}
