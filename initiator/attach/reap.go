package attach

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nprdma/nprdma/internal/mountinfo"
	"golang.org/x/sys/unix"
)

// Reap cleans up after an attachment whose process died without tearing
// down (killed, crashed, or its teardown failed) and removes its record. It
// returns what it did, for the user. It refuses while the process lives.
//
//   - the NBD socket file is removed if nothing listens on it;
//   - a FUSE mount left behind ("Transport endpoint is not connected") is
//     unmounted lazily and its directory removed;
//   - the loop device normally unbound itself when the process died
//     (autoclear); one that is still bound to the FUSE file is unbound
//     unless a filesystem on it is mounted, which is reported instead;
//   - the log of a daemonised process is kept, and named, for the post-mortem.
func (d *Dir) Reap(rec Record) ([]string, error) {
	if rec.Process().Alive() {
		return nil, fmt.Errorf("attachment %q is still served by pid %d: detach it instead", rec.Name, rec.PID)
	}
	var notes []string
	var errs []error
	if rec.Socket != "" {
		switch removed, err := removeStaleSocket(rec.Socket); {
		case err != nil:
			errs = append(errs, err)
		case removed:
			notes = append(notes, "removed socket "+rec.Socket)
		}
	}
	if rec.LoopDevice != "" && rec.FUSEFile != "" {
		note, err := releaseLoop(rec.LoopDevice, rec.FUSEFile)
		if err != nil {
			errs = append(errs, err)
		} else if note != "" {
			notes = append(notes, note)
		}
	}
	if rec.FUSEMount != "" {
		if mounted, err := IsMountPoint(rec.FUSEMount); err != nil {
			errs = append(errs, err)
		} else if mounted {
			if err := unix.Unmount(rec.FUSEMount, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				errs = append(errs, fmt.Errorf("unmount the FUSE mount %s left by pid %d: %w", rec.FUSEMount, rec.PID, err))
			} else {
				notes = append(notes, "unmounted the dead FUSE mount "+rec.FUSEMount)
			}
		}
		// Only the directory this package names is ours to remove (and only
		// empty: os.Remove refuses anything else).
		if rec.FUSEMount == d.MountDir(rec.Name) {
			if err := os.Remove(rec.FUSEMount); err == nil {
				notes = append(notes, "removed directory "+rec.FUSEMount)
			}
		}
	}
	if rec.LogFile != "" {
		if _, err := os.Stat(rec.LogFile); err == nil {
			notes = append(notes, "its log is "+rec.LogFile)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return notes, err
	}
	return notes, d.Remove(rec.Name)
}

// removeStaleSocket removes path if it is a unix socket nobody listens on.
func removeStaleSocket(path string) (bool, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if fi.Mode().Type() != os.ModeSocket {
		return false, fmt.Errorf("%s is not a socket; left alone", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return false, fmt.Errorf("socket %s: another process listens on it; left alone", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return false, fmt.Errorf("socket %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	return true, nil
}

// releaseLoop unbinds dev if it is still bound to file and not mounted.
func releaseLoop(dev, file string) (string, error) {
	bound, err := LoopBackingFile(dev)
	if err != nil || bound != file {
		return "", nil // unbound already (autoclear), or bound to something else now
	}
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return "", fmt.Errorf("loop device %s: %w", dev, err)
	}
	mounts, err := MountPointsOfDevice(st.Rdev)
	if err != nil {
		return "", err
	}
	if len(mounts) > 0 {
		return "", fmt.Errorf("%s is still mounted at %s over the dead attachment's file: unmount it (umount -l %s), then detach again",
			dev, strings.Join(mounts, ", "), mounts[0])
	}
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		return "", fmt.Errorf("loop device %s: %w", dev, err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return "", fmt.Errorf("release loop device %s: %w", dev, err)
	}
	return "released loop device " + dev, nil
}

// LoopBackingFile returns the file /dev/loopN is bound to ("" when unbound).
func LoopBackingFile(dev string) (string, error) {
	name := filepath.Base(dev)
	if !strings.HasPrefix(name, "loop") {
		return "", fmt.Errorf("%s is not a loop device", dev)
	}
	data, err := os.ReadFile(filepath.Join("/sys/block", name, "loop", "backing_file"))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(string(data), "\n"), nil
}

// IsMountPoint reports whether dir is a mount point in this mount namespace.
func IsMountPoint(dir string) (bool, error) { return mountinfo.IsMountPoint(dir) }

// MountPointsOfDevice returns where the block device with number dev is
// mounted, in mount order.
func MountPointsOfDevice(dev uint64) ([]string, error) { return mountinfo.MountPointsOf(dev) }

// MountPointsOf returns where the block device at path (e.g. /dev/loop3) is
// mounted.
func MountPointsOf(path string) ([]string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return nil, fmt.Errorf("%s is not a block device", path)
	}
	return MountPointsOfDevice(st.Rdev)
}
