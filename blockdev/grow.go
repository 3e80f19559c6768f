package blockdev

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Grower is implemented by devices whose size can grow while they are open.
type Grower interface {
	// Grow makes the device at least size bytes long (a multiple of its
	// block size). Size never shrinks.
	Grow(size int64) error
}

// Grow grows dev, or the device under its decorators, to at least size
// bytes. It fails with ErrTooSmall when the device cannot hold size bytes
// (a block device that was not grown first) and never shrinks anything.
func Grow(dev Device, size int64) error {
	for d := dev; d != nil; {
		if g, ok := d.(Grower); ok {
			return g.Grow(size)
		}
		w, ok := d.(Wrapper)
		if !ok {
			break
		}
		d = w.Unwrap()
	}
	return &Error{Op: "grow", Path: dev.Path(), Off: -1, Err: fmt.Errorf("the device cannot grow")}
}

// Grow makes the device at least size bytes long. A regular file is
// extended with ftruncate (the new range is a hole: it reads zeros and takes
// no space until written); a block device is not changed, only its size read
// again, so it must have been grown (lvextend, a larger disk) before. Size
// only grows: a smaller size is refused.
func (d *File) Grow(size int64) error {
	fail := func(err error) error { return &Error{Op: "grow", Path: d.path, Off: -1, Err: err} }
	bs := int64(d.blockSize)
	if size <= 0 || size%bs != 0 {
		return fail(fmt.Errorf("%w: size %d is not a positive multiple of %d", ErrUnaligned, size, bs))
	}
	cur := d.size.Load()
	if size < cur {
		return fail(fmt.Errorf("size %d is below the device's %d bytes: a device never shrinks", size, cur))
	}
	if d.readOnly {
		return fail(ErrReadOnly)
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return fail(ErrClosed)
	}
	if d.isDevice {
		n, err := deviceSize(d.fd)
		if err != nil {
			return fail(err)
		}
		n -= n % bs
		if n < size {
			return fail(fmt.Errorf("%w: the block device holds %d bytes, %d asked (grow the device itself first)", ErrTooSmall, n, size))
		}
		d.size.Store(n)
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(d.fd, &st); err != nil {
		return fail(fmt.Errorf("fstat: %w", err))
	}
	if st.Size < size {
		if err := unix.Ftruncate(d.fd, size); err != nil {
			return fail(fmt.Errorf("ftruncate to %d: %w", size, err))
		}
	}
	d.size.Store(size)
	return nil
}

// deviceSize reads a block device's size in bytes.
func deviceSize(fd int) (int64, error) {
	var size uint64
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size))); errno != 0 {
		return 0, fmt.Errorf("BLKGETSIZE64: %w", errno)
	}
	return int64(size), nil
}
