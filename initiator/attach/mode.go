package attach

import (
	"os"
	"strings"
)

// Kernel is what the machine offers for exposing a block device.
type Kernel struct {
	Root bool // loop devices need CAP_SYS_ADMIN
	FUSE bool // /dev/fuse
	Loop bool // /dev/loop-control
	NBD  bool // the kernel's NBD client (/sys/module/nbd)
	UBLK bool // ublk (/dev/ublk-control)
}

// ProbeKernel looks at this machine.
func ProbeKernel() Kernel {
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	return Kernel{
		Root: os.Geteuid() == 0,
		FUSE: exists("/dev/fuse"),
		Loop: exists("/dev/loop-control"),
		NBD:  exists("/sys/module/nbd"),
		UBLK: exists("/dev/ublk-control"),
	}
}

// ChooseMode picks the mode for --mode auto and says why. A kernel block
// device is preferred over a socket; of the block devices, only the loop
// device over a FUSE file is implemented (ublk and the kernel NBD client are
// later work), so auto means fuse where it can work and nbd otherwise.
func ChooseMode(k Kernel) (Mode, string) {
	var missing []string
	if !k.Root {
		missing = append(missing, "root (loop devices need CAP_SYS_ADMIN)")
	}
	if !k.FUSE {
		missing = append(missing, "/dev/fuse")
	}
	if !k.Loop {
		missing = append(missing, "/dev/loop-control")
	}
	if len(missing) > 0 {
		return ModeNBD, "auto chose nbd (an NBD socket, no block device): the fuse mode needs " + strings.Join(missing, ", ")
	}
	var kernel []string
	if k.UBLK {
		kernel = append(kernel, "ublk")
	}
	if k.NBD {
		kernel = append(kernel, "an NBD client")
	}
	if len(kernel) > 0 {
		return ModeFUSE, "auto chose fuse (a loop device over a FUSE file): the kernel has " + strings.Join(kernel, " and ") +
			", but attaching through it is not implemented yet"
	}
	return ModeFUSE, "auto chose fuse (a loop device over a FUSE file): this kernel has neither ublk (/dev/ublk-control) nor an NBD client (/sys/module/nbd)"
}
