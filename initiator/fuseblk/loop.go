package fuseblk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// loopDevice is a /dev/loopN bound to the FUSE file. We keep the device
// open for the attachment's lifetime: it is configured with autoclear, so
// if this process dies the kernel unbinds the device at the last close
// instead of leaving it behind.
type loopDevice struct {
	path     string
	file     string // our backing file: the device is ours only while bound to it
	number   int
	dev      uint64 // device number, to find mounts of it
	f        *os.File
	directIO bool
}

// attachLoop binds a free loop device to file with LOOP_CONFIGURE (one ioctl:
// backing file, logical block size, direct I/O and autoclear together, so
// the device is never visible half-configured).
func attachLoop(ctx context.Context, file string, blockSize int, readOnly bool) (*loopDevice, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("loop: %w", err)
	}
	defer ctl.Close()
	mode := os.O_RDWR
	if readOnly {
		mode = os.O_RDONLY
	}
	backing, err := os.OpenFile(file, mode, 0)
	if err != nil {
		return nil, fmt.Errorf("loop: open backing file: %w", err)
	}
	defer backing.Close() // the loop device holds its own reference

	flags := uint32(unix.LO_FLAGS_DIRECT_IO | unix.LO_FLAGS_AUTOCLEAR)
	if readOnly {
		flags |= unix.LO_FLAGS_READ_ONLY
	}
	cfg := unix.LoopConfig{Fd: uint32(backing.Fd()), Size: uint32(blockSize)}
	cfg.Info.Flags = flags
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], file)

	// Another process may take the free device between GET_FREE and
	// CONFIGURE; then the device is busy and we ask again.
	for attempt := 0; ; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("loop: LOOP_CTL_GET_FREE: %w", err)
		}
		path := "/dev/loop" + strconv.Itoa(n)
		f, err := os.OpenFile(path, mode, 0)
		if err != nil {
			return nil, fmt.Errorf("loop: %w", err)
		}
		err = unix.IoctlLoopConfigure(int(f.Fd()), &cfg)
		if errors.Is(err, unix.EBUSY) && attempt < 20 && ctx.Err() == nil {
			f.Close()
			continue
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("loop: LOOP_CONFIGURE %s (block size %d, direct I/O): %w", path, blockSize, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0)
			f.Close()
			return nil, fmt.Errorf("loop: stat %s: %w", path, err)
		}
		ld := &loopDevice{path: path, file: file, number: n, dev: st.Rdev, f: f}
		// Compare later with the kernel's own spelling of the path.
		if b := ld.backingFile(); b != "" {
			ld.file = b
		}
		ld.directIO = ld.checkDirectIO()
		return ld, nil
	}
}

// checkDirectIO reads back whether the kernel kept direct I/O on: it may
// silently fall back to buffered I/O when the backing file cannot do it.
func (ld *loopDevice) checkDirectIO() bool {
	if b, err := os.ReadFile(ld.sysfs("dio")); err == nil {
		return strings.TrimSpace(string(b)) == "1"
	}
	info, err := unix.IoctlLoopGetStatus64(int(ld.f.Fd()))
	return err == nil && info.Flags&unix.LO_FLAGS_DIRECT_IO != 0
}

func (ld *loopDevice) sysfs(name string) string {
	return filepath.Join("/sys/block", filepath.Base(ld.path), "loop", name)
}

// backingFile returns the file the device is bound to, or "" once unbound.
func (ld *loopDevice) backingFile() string {
	b, err := os.ReadFile(ld.sysfs("backing_file"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// ours reports whether the device is still bound to our backing file. Once
// a detach was refused (another program held the device), the kernel
// unbinds it at that program's close, and the number may then serve another
// attachment: from then on the device is not ours to check, unmount or wait
// for.
func (ld *loopDevice) ours() bool { return ld.backingFile() == ld.file }

// detach unbinds the device and waits until the kernel has released our
// backing file (the unbind happens at the last close of the device). It
// gives up, with the device still bound, when ctx ends first: then something
// else still has the device open.
func (ld *loopDevice) detach(ctx context.Context) error {
	if ld.f != nil {
		// ENXIO: already unbound. Otherwise autoclear does it at the
		// last close, which is ours unless someone else holds it.
		if err := unix.IoctlSetInt(int(ld.f.Fd()), unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
			return fmt.Errorf("loop: LOOP_CLR_FD %s: %w", ld.path, err)
		}
		ld.f.Close()
		ld.f = nil
	}
	for delay := time.Millisecond; ld.ours(); delay = min(2*delay, 100*time.Millisecond) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("loop: %s is still in use; it will be released when its last user closes it", ld.path)
		case <-time.After(delay):
		}
	}
	return nil
}

// loopDevicesFor lists the loop devices whose backing file is file.
func loopDevicesFor(file string) ([]string, error) {
	matches, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return nil, err
	}
	var devs []string
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil {
			continue // unbound meanwhile
		}
		if string(bytes.TrimSpace(b)) == file {
			devs = append(devs, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(m))))
		}
	}
	return devs, nil
}
