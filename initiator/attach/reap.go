package attach

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nprdma/nprdma/internal/mountinfo"
	"golang.org/x/sys/unix"
)

// Reap cleans up after an attachment whose process died without tearing
// down (killed, crashed, or its teardown failed) and removes its record. It
// returns what it did, for the user. It refuses while the process lives.
// What is left depends on the mode (Frontend.Reap):
//
//   - nbd: the socket file is removed if nothing listens on it;
//   - fuse: a FUSE mount left behind ("Transport endpoint is not
//     connected") is unmounted lazily and its directory removed; the loop
//     device normally unbound itself when the process died (autoclear); one
//     that is still bound to the FUSE file is unbound unless a filesystem on
//     it is mounted, which is reported instead;
//   - ublk, nbd-kernel: the device is removed (ublk: STOP_DEV and DEL_DEV;
//     nbd: disconnected); while a filesystem on it is mounted that is
//     refused unless force, which removes it under the filesystem (whose
//     I/O then fails) after a lazy unmount.
//
// The log of a daemonised process is kept, and named, for the post-mortem.
func (d *Dir) Reap(rec Record, force bool) ([]string, error) {
	if rec.Process().Alive() {
		return nil, fmt.Errorf("attachment %q is still served by pid %d: detach it instead", rec.Name, rec.PID)
	}
	var notes []string
	var err error
	if f, ferr := FrontendOf(rec.Mode); ferr == nil {
		notes, err = f.Reap(d, rec, force)
	}
	if rec.LogFile != "" {
		if _, serr := os.Stat(rec.LogFile); serr == nil {
			notes = append(notes, "its log is "+rec.LogFile)
		}
	}
	if err != nil {
		return notes, err
	}
	return notes, d.Remove(rec.Name)
}

// Attached lists the attachments of d, as list shows them: those whose
// attach process lives, and those whose process is gone but whose device
// outlived it and waits for the next attach of the name (State
// StateOrphaned; removing it would fail the filesystem on it). The records
// of other gone processes are reaped (Reap), which say is told, as it is
// told of records that cannot be read and of reaps that fail (their
// records stay). The list is never nil.
func (d *Dir) Attached(say func(string)) []Record {
	recs, err := d.List()
	if err != nil {
		say(err.Error())
	}
	live := []Record{}
	for _, r := range recs {
		if r.Process().Alive() {
			live = append(live, r)
			continue
		}
		if d.Resumable(r) {
			r.State = StateOrphaned
			live = append(live, r)
			continue
		}
		notes, err := d.Reap(r, false)
		if err != nil {
			say(fmt.Sprintf("%s: its process (pid %d) is gone; cleaning up after it: %v", r.Name, r.PID, err))
			continue
		}
		say(fmt.Sprintf("dropped %s: its process (pid %d) is gone%s", r.Name, r.PID, joinNotes(notes)))
	}
	return live
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

// mountsOfDevice is MountPointsOf, but a device node that is gone has no
// mounts.
func mountsOfDevice(path string) ([]string, error) {
	mounts, err := MountPointsOf(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return mounts, err
}

// unmountDevice checks that nothing has the block device at path mounted
// before it is taken down: a *RefusedError naming the mount points if it
// is, unless force; then it unmounts them, innermost first (lazily if
// busy).
func unmountDevice(path string, force bool) error {
	mounts, err := mountsOfDevice(path)
	if err != nil {
		return fmt.Errorf("detach %s: reading mounts: %w", path, err)
	}
	if len(mounts) > 0 && !force {
		return &RefusedError{Err: fmt.Errorf("detach %s: it is mounted at %s; unmount it first, or detach with force to unmount it",
			path, joinPaths(mounts))}
	}
	for i := len(mounts) - 1; i >= 0; i-- {
		err := unix.Unmount(mounts[i], 0)
		if errors.Is(err, unix.EBUSY) {
			err = unix.Unmount(mounts[i], unix.MNT_DETACH)
		}
		if err != nil && !errors.Is(err, unix.EINVAL) { // EINVAL: gone already
			return fmt.Errorf("detach %s: unmount %s: %w", path, mounts[i], err)
		}
	}
	return nil
}

// lazyUnmount detaches the mounts, innermost first, and says so.
func lazyUnmount(mounts []string) []string {
	var notes []string
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := unix.Unmount(mounts[i], unix.MNT_DETACH); err == nil {
			notes = append(notes, "unmounted "+mounts[i]+" lazily")
		}
	}
	return notes
}

func joinPaths(p []string) string { return strings.Join(p, ", ") }

// reapDevice removes the kernel block device a dead attach process left,
// with remove. While a filesystem on it is mounted that is refused: the
// filesystem's I/O waits for the device, and attaching again under the same
// name resumes it. With force the device goes first (the waiting I/O
// fails), then the filesystem is unmounted lazily.
func reapDevice(rec Record, force bool, kind string, remove func() error) ([]string, error) {
	mounts, err := mountsOfDevice(rec.Device)
	if err != nil {
		return nil, err
	}
	if len(mounts) > 0 && !force {
		return nil, fmt.Errorf("%s is mounted at %s, and its I/O waits for the dead attach process: attach again with --name %s to resume it, or detach --force to remove the device (the filesystem's I/O then fails)",
			rec.Device, joinPaths(mounts), rec.Name)
	}
	if err := remove(); err != nil {
		return nil, err
	}
	notes := []string{"removed the " + kind + " device " + rec.Device}
	return append(notes, lazyUnmount(mounts)...), nil
}
