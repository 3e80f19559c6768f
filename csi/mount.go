package csi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nprdma/nprdma/internal/mountinfo"
)

// run runs a tool and returns its output; a failure carries it.
func run(ctx context.Context, name string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// mountAt is the mount at path (the innermost), or nil.
func mountAt(path string) (*mountinfo.Entry, error) {
	mounts, err := mountinfo.Read()
	if err != nil {
		return nil, err
	}
	path = filepath.Clean(path)
	var found *mountinfo.Entry
	for i := range mounts {
		if mounts[i].MountPoint == path {
			found = &mounts[i]
		}
	}
	return found, nil
}

// devNumber is a block device's number (st_rdev).
func devNumber(dev string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return 0, err
	}
	return st.Rdev, nil
}

// mountedFrom reports whether path is a mount of device dev.
func mountedFrom(path, dev string) (bool, error) {
	m, err := mountAt(path)
	if err != nil || m == nil {
		return false, err
	}
	rdev, err := devNumber(dev)
	if err != nil {
		return false, err
	}
	return m.Dev() == rdev, nil
}

// holds reports whether path serves device dev: a mount of its file
// system, or (a published block volume) a mount of the device node itself.
func holds(path, dev string) (bool, error) {
	if ok, err := mountedFrom(path, dev); err != nil || ok {
		return ok, err
	}
	m, err := mountAt(path)
	if err != nil || m == nil {
		return false, err
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return false, err
	}
	rdev, err := devNumber(dev)
	return err == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK && st.Rdev == rdev, err
}

// fsType is the file system on dev ("" : none), as blkid sees it.
func fsType(ctx context.Context, dev string) (string, error) {
	out, err := exec.CommandContext(ctx, "blkid", "-p", "-o", "value", "-s", "TYPE", dev).Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 2 {
		return "", nil // nothing found
	}
	if err != nil {
		return "", fmt.Errorf("blkid %s: %w", dev, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// makeFS makes a file system of type fs on dev.
func makeFS(ctx context.Context, fs, dev string) error {
	args := []string{dev}
	switch fs {
	case "ext4", "ext3", "ext2":
		args = []string{"-q", "-F", "-E", "nodiscard", dev} // a new namespace reads zeros already
	case "xfs":
		args = []string{"-q", "-K", dev}
	}
	_, err := run(ctx, "mkfs."+fs, args...)
	return err
}

// growFS grows the file system mounted at path from dev to the device's
// size.
func growFS(ctx context.Context, fs, dev, path string) error {
	switch fs {
	case "ext4", "ext3", "ext2":
		_, err := run(ctx, "resize2fs", dev)
		return err
	case "xfs":
		_, err := run(ctx, "xfs_growfs", path)
		return err
	}
	return fmt.Errorf("growing a %s file system is not supported (ext4, ext3, ext2, xfs)", fs)
}

// blockDeviceSize is a block device's size in bytes.
func blockDeviceSize(dev string) (int64, error) {
	f, err := os.Open(dev)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var size uint64
	if err := ioctlGetSize(f.Fd(), &size); err != nil {
		return 0, fmt.Errorf("BLKGETSIZE64 %s: %w", dev, err)
	}
	return int64(size), nil
}

// waitDeviceSize waits until dev holds at least want bytes (the attach
// process grows its loop device when the target tells it the namespace
// grew) or ctx ends.
func waitDeviceSize(ctx context.Context, dev string, want int64) (int64, error) {
	for {
		size, err := blockDeviceSize(dev)
		if err != nil || size >= want {
			return size, err
		}
		select {
		case <-ctx.Done():
			return size, fmt.Errorf("%s is %d bytes, %d wanted: the namespace did not grow (was ControllerExpandVolume done?): %w", dev, size, want, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// unmount unmounts path if it is a mount point.
func unmount(path string) error {
	m, err := mountAt(path)
	if err != nil || m == nil {
		return err
	}
	if err := unix.Unmount(path, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	return nil
}
