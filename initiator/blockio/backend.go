// Package blockio holds what the attach backends (initiator/nbd,
// initiator/fuseblk) share: the Backend interface they serve, a decorator that
// turns arbitrary byte ranges into block-aligned calls, an in-memory Backend
// for tests, and a metrics decorator.
//
// It deliberately knows nothing about NVMe or nprdma: anything that can read,
// write, flush and trim a fixed-size range of blocks can be attached.
package blockio

import (
	"context"
	"errors"
	"fmt"
	"syscall"
)

// Backend is a fixed-size block store exposed by an attach backend.
// Implementations are safe for concurrent use.
type Backend interface {
	// Size is the size in bytes; a multiple of BlockSize.
	Size() int64
	// BlockSize is the alignment the backend requires for offsets and
	// lengths (4096 for nprdma namespaces; 1 when any range is accepted).
	BlockSize() int
	// ReadAt reads len(p) bytes at off. A short read is an error.
	ReadAt(p []byte, off int64) (int, error)
	// WriteAt writes len(p) bytes at off. The data may sit in a volatile
	// cache until Flush.
	WriteAt(p []byte, off int64) (int, error)
	// WriteAtFUA writes len(p) bytes at off and returns once they are
	// durable, without flushing anything else.
	WriteAtFUA(p []byte, off int64) (int, error)
	// Flush makes every write completed before the call durable.
	Flush() error
	// Trim deallocates [off, off+length). Afterwards the range reads back
	// zeros: the FUSE backend relies on this for fallocate(PUNCH_HOLE).
	Trim(off, length int64) error
	// WriteZeroes makes [off, off+length) read back zeros.
	WriteZeroes(off, length int64) error
}

// Wrapper is implemented by decorators so that callers can reach the backend
// underneath (for example to learn its native block size).
type Wrapper interface {
	Unwrap() Backend
}

// NativeBlockSize is the largest BlockSize along the chain of decorators
// starting at b: the granularity at which I/O to b avoids read-modify-write,
// even when an outer decorator accepts any alignment.
func NativeBlockSize(b Backend) int {
	size := 1
	for b != nil {
		size = max(size, b.BlockSize())
		w, ok := b.(Wrapper)
		if !ok {
			break
		}
		b = w.Unwrap()
	}
	return size
}

// Errors returned by the backends in this package, wrapped with the operation
// and range. Test with errors.Is.
var (
	ErrOutOfRange = errors.New("range beyond the end of the backend")
	ErrUnaligned  = errors.New("offset or length not a multiple of the block size")
	ErrReadOnly   = errors.New("backend is read-only")
)

// Errno maps an error from a Backend to the errno a frontend reports: an errno
// wrapped anywhere in the chain wins; range and alignment errors are EINVAL,
// read-only is EROFS, a timeout is ETIMEDOUT; anything else is EIO.
func Errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var errno syscall.Errno
	switch {
	case errors.As(err, &errno) && errno != 0:
		return errno
	case errors.Is(err, ErrOutOfRange), errors.Is(err, ErrUnaligned):
		return syscall.EINVAL
	case errors.Is(err, ErrReadOnly):
		return syscall.EROFS
	case errors.Is(err, context.DeadlineExceeded):
		return syscall.ETIMEDOUT
	}
	return syscall.EIO
}

// CheckRange reports whether [off, off+length) lies within a backend of the
// given size, without overflowing.
func CheckRange(off, length, size int64) bool {
	return off >= 0 && length >= 0 && off <= size && length <= size-off
}

// rangeError names the operation and range in an error wrapping cause.
func rangeError(who, op string, off, length int64, cause error) error {
	return fmt.Errorf("%s: %s [%d, +%d): %w", who, op, off, length, cause)
}
