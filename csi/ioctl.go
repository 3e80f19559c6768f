package csi

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

func ioctlGetSize(fd uintptr, size *uint64) error {
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, unix.BLKGETSIZE64, uintptr(unsafe.Pointer(size))); errno != 0 {
		return errno
	}
	return nil
}
