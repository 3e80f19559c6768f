package attach

import (
	"os"
	"strings"
)

// Kernel is what the machine offers for exposing a block device.
type Kernel struct {
	Root bool // every block-device mode needs CAP_SYS_ADMIN
	UBLK bool // ublk (/dev/ublk-control)
	NBD  bool // the kernel's NBD client (/sys/module/nbd)
	FUSE bool // /dev/fuse
	Loop bool // /dev/loop-control
}

// ProbeKernel looks at this machine.
func ProbeKernel() Kernel {
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	return Kernel{
		Root: os.Geteuid() == 0,
		UBLK: exists("/dev/ublk-control"),
		NBD:  exists("/sys/module/nbd"),
		FUSE: exists("/dev/fuse"),
		Loop: exists("/dev/loop-control"),
	}
}

// ChooseMode picks the mode for --mode auto and says why: a kernel block
// device rather than a socket, and of the block devices the one with the
// shortest path to this process: ublk (io_uring commands, no socket), then
// the kernel's NBD client (a socket pair), then a loop device over a FUSE
// file (the loop driver, then FUSE). docs/attach.md has what each costs.
func ChooseMode(k Kernel) (Mode, string) {
	if !k.Root {
		return ModeNBD, "auto chose nbd (an NBD socket, no block device): the block-device modes (ublk, nbd-kernel, fuse) need root"
	}
	switch {
	case k.UBLK:
		return ModeUBLK, "auto chose ublk (a ublk block device, /dev/ublkbN): this kernel has ublk (/dev/ublk-control)"
	case k.NBD:
		return ModeNBDKernel, "auto chose nbd-kernel (the kernel's NBD client, /dev/nbdN): this kernel has no ublk (/dev/ublk-control), but has the NBD client (/sys/module/nbd)"
	case k.FUSE && k.Loop:
		return ModeFUSE, "auto chose fuse (a loop device over a FUSE file): this kernel has neither ublk (/dev/ublk-control) nor an NBD client (/sys/module/nbd)"
	}
	var missing []string
	if !k.FUSE {
		missing = append(missing, "/dev/fuse")
	}
	if !k.Loop {
		missing = append(missing, "/dev/loop-control")
	}
	return ModeNBD, "auto chose nbd (an NBD socket, no block device): this kernel has neither ublk (/dev/ublk-control) nor an NBD client (/sys/module/nbd), and the fuse mode needs " +
		strings.Join(missing, " and ")
}
