// Package blockdev is the backing store everything above it stands on: a block
// device or a regular file opened for O_DIRECT I/O, plus decorators that add
// metrics, latency and injected faults.
package blockdev

import (
	"errors"
	"fmt"
)

// PageSize is the I/O alignment the layers above use. Every offset, length and
// buffer address handed to a Device is a multiple of its BlockSize, which is
// never larger than PageSize for devices this package opens.
const PageSize = 4096

// Device is a backing store. Offsets and lengths must be multiples of
// BlockSize and buffers must be aligned for direct I/O (see AlignedBuffer).
// Implementations are safe for concurrent use.
type Device interface {
	// ReadAt reads len(p) bytes at off. A short read is an error.
	ReadAt(p []byte, off int64) (int, error)
	// WriteAt writes len(p) bytes at off into the device's volatile cache.
	WriteAt(p []byte, off int64) (int, error)
	// WriteAtFUA writes len(p) bytes at off and returns once they are durable
	// (force unit access), without flushing anything else.
	WriteAtFUA(p []byte, off int64) (int, error)
	// Flush makes every completed write durable (fdatasync).
	Flush() error
	// Discard deallocates [off, off+length); the range then reads back zeros.
	Discard(off, length int64) error
	// Size is the usable size in bytes.
	Size() int64
	// BlockSize is the logical block size: the alignment of offsets, lengths
	// and buffers.
	BlockSize() int
	// Path names the device in errors and metrics.
	Path() string
	// Close releases the device. Flush first if the data matters.
	Close() error
}

// Wrapper is implemented by decorators so that callers can reach the device
// underneath (for example to find its file descriptor).
type Wrapper interface {
	Unwrap() Device
}

// FileDescriptor is implemented by devices backed by a file descriptor. The
// descriptor stays owned by the device.
type FileDescriptor interface {
	Fd() uintptr
	// Direct reports whether the descriptor was opened with O_DIRECT.
	Direct() bool
}

// FdOf returns the file descriptor under dev, unwrapping decorators.
func FdOf(dev Device) (fd uintptr, direct bool, ok bool) {
	for dev != nil {
		if f, isFd := dev.(FileDescriptor); isFd {
			return f.Fd(), f.Direct(), true
		}
		w, isWrapper := dev.(Wrapper)
		if !isWrapper {
			break
		}
		dev = w.Unwrap()
	}
	return 0, false, false
}

// Errors returned by devices, wrapped in *Error. Test with errors.Is.
var (
	ErrUnaligned  = errors.New("unaligned offset, length or buffer")
	ErrOutOfRange = errors.New("range beyond the end of the device")
	ErrReadOnly   = errors.New("device is read-only")
	ErrTooSmall   = errors.New("device is smaller than required")
	ErrInUse      = errors.New("device is in use")
	ErrClosed     = errors.New("device is closed")
	ErrInjected   = errors.New("injected fault")
)

// Error describes a failed operation on a named device.
type Error struct {
	Op   string // "read", "write", "flush", "discard", "open", ...
	Path string
	Off  int64 // -1 when the operation has no range
	Len  int64
	Err  error
}

func (e *Error) Error() string {
	if e.Off < 0 {
		return fmt.Sprintf("%s %s: %v", e.Op, e.Path, e.Err)
	}
	return fmt.Sprintf("%s %s [%d, +%d): %v", e.Op, e.Path, e.Off, e.Len, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// CheckRange validates an I/O of n bytes at off against dev's block size and
// size. Decorators and implementations share it so that every layer reports
// the same errors.
func CheckRange(dev Device, op string, off, n int64) error {
	bs := int64(dev.BlockSize())
	switch {
	case off < 0 || n < 0 || off%bs != 0 || n%bs != 0:
		return &Error{Op: op, Path: dev.Path(), Off: off, Len: n,
			Err: fmt.Errorf("%w: offset and length must be multiples of %d", ErrUnaligned, bs)}
	case off > dev.Size() || n > dev.Size()-off:
		return &Error{Op: op, Path: dev.Path(), Off: off, Len: n,
			Err: fmt.Errorf("%w (size %d)", ErrOutOfRange, dev.Size())}
	}
	return nil
}
