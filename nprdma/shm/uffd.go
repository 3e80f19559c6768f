package shm

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// userfaultfd, just enough of it to make a missing page of a mapping raise
// SIGBUS instead of being allocated (UFFD_FEATURE_SIGBUS with MISSING
// mode): no thread ever reads the descriptor.
const (
	uffdAPI             = 0xAA
	uffdFeatureSigbus   = 1 << 7
	uffdRegisterMissing = 1
	uffdioAPI           = 0xc018aa3f // _IOWR(0xAA, 0x3F, struct uffdio_api)
	uffdioRegister      = 0xc020aa00 // _IOWR(0xAA, 0x00, struct uffdio_register)
	userfaultfdIocNew   = 0xaa00     // _IO(0xAA, 0x00), on /dev/userfaultfd
)

type uffdioAPIArg struct{ api, features, ioctls uint64 }

type uffdioRange struct{ start, len uint64 }

type uffdioRegisterArg struct {
	rng          uffdioRange
	mode, ioctls uint64
}

// openSigbusUffd opens a userfaultfd whose MISSING registrations raise
// SIGBUS. With vm.unprivileged_userfaultfd=0 an unprivileged process may
// still get one through /dev/userfaultfd.
func openSigbusUffd() (*os.File, error) {
	fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if errno == unix.EPERM {
		if dev, err := unix.Open("/dev/userfaultfd", unix.O_RDWR|unix.O_CLOEXEC, 0); err == nil {
			fd, _, errno = unix.Syscall(unix.SYS_IOCTL, uintptr(dev), userfaultfdIocNew, unix.O_CLOEXEC|unix.O_NONBLOCK)
			unix.Close(dev)
		}
	}
	if errno != 0 {
		return nil, os.NewSyscallError("userfaultfd", errno)
	}
	api := uffdioAPIArg{api: uffdAPI, features: uffdFeatureSigbus}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, uffdioAPI, uintptr(unsafe.Pointer(&api))); errno != 0 {
		unix.Close(int(fd))
		return nil, os.NewSyscallError("UFFDIO_API", errno)
	}
	if api.features&uffdFeatureSigbus == 0 {
		unix.Close(int(fd))
		return nil, os.NewSyscallError("UFFDIO_API", unix.ENOTSUP)
	}
	return os.NewFile(fd, "nprdma-shm-uffd"), nil
}

// uffdRegister registers mem for MISSING faults (SIGBUS) on u.
func uffdRegister(u *os.File, mem []byte) error {
	reg := uffdioRegisterArg{rng: uffdioRange{start: uint64(uintptr(unsafe.Pointer(&mem[0]))), len: uint64(len(mem))}, mode: uffdRegisterMissing}
	fd, err := rawFD(u)
	if err != nil {
		return err
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uffdioRegister, uintptr(unsafe.Pointer(&reg))); errno != 0 {
		return os.NewSyscallError("UFFDIO_REGISTER", errno)
	}
	return nil
}
