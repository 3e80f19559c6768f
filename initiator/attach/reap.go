package attach

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

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

// mount is one line of /proc/self/mountinfo: the device and the mount point.
type mount struct {
	dev   uint64
	point string
}

func readMountinfo() ([]mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseMountinfo(f)
}

// parseMountinfo reads the third (MAJOR:MINOR) and fifth (mount point,
// octal-escaped) fields of each line of a mountinfo file (proc(5)).
func parseMountinfo(r io.Reader) ([]mount, error) {
	var out []mount
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			return nil, fmt.Errorf("mountinfo: short line %q", sc.Text())
		}
		maj, min, ok := strings.Cut(f[2], ":")
		ma, err1 := strconv.ParseUint(maj, 10, 32)
		mi, err2 := strconv.ParseUint(min, 10, 32)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("mountinfo: device %q", f[2])
		}
		out = append(out, mount{dev: unix.Mkdev(uint32(ma), uint32(mi)), point: unescapeOctal(f[4])})
	}
	return out, sc.Err()
}

// unescapeOctal undoes the kernel's \ooo escapes of space, tab, newline and
// backslash in mount points.
func unescapeOctal(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// IsMountPoint reports whether dir is a mount point in this mount namespace.
func IsMountPoint(dir string) (bool, error) {
	mounts, err := readMountinfo()
	if err != nil {
		return false, err
	}
	for _, m := range mounts {
		if m.point == dir {
			return true, nil
		}
	}
	return false, nil
}

// MountPointsOfDevice returns where the block device with number dev is
// mounted, in mount order.
func MountPointsOfDevice(dev uint64) ([]string, error) {
	mounts, err := readMountinfo()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range mounts {
		if m.dev == dev {
			out = append(out, m.point)
		}
	}
	return out, nil
}

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
