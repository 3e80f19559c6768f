package nprdma

import (
	"fmt"

	"unsafe"

	"golang.org/x/sys/unix"
)

// AllocBuffer returns n bytes of page-aligned memory outside the Go heap
// (an anonymous mapping), zeroed, for registration. Release it with
// FreeBuffer once every region over it is deregistered; do not reslice its
// capacity away.
func AllocBuffer(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("nprdma: alloc buffer of %d bytes: size must be positive", n)
	}
	size := (n + osPageSize - 1) / osPageSize * osPageSize
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("nprdma: alloc buffer of %d bytes: mmap: %w", n, err)
	}
	return b[:n:size], nil
}

// FreeBuffer unmaps a buffer from AllocBuffer.
func FreeBuffer(b []byte) error {
	if cap(b) == 0 {
		return nil
	}
	if err := unix.Munmap(b[:cap(b)]); err != nil {
		return fmt.Errorf("nprdma: free buffer of %d bytes: munmap: %w", cap(b), err)
	}
	return nil
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
