package attach

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/nprdma/nprdma/initiator/blockio"
	"github.com/nprdma/nprdma/initiator/fuseblk"
	"golang.org/x/sys/unix"
)

// fuseFrontend exposes the backend as a FUSE file (direct I/O) with a loop
// device over it (direct I/O): a block device on kernels without NBD or
// ublk. Root only.
type fuseFrontend struct{}

func (fuseFrontend) Mode() Mode   { return ModeFUSE }
func (fuseFrontend) What() string { return "a loop device over a FUSE file" }

func (fuseFrontend) Start(ctx context.Context, b blockio.Backend, cfg Config) (Exposure, error) {
	mnt := cfg.Dir.MountDir(cfg.Name)
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return nil, err
	}
	fa, err := fuseblk.Attach(ctx, b, fuseblk.WithMountDir(mnt), fuseblk.WithLogger(cfg.logger()))
	if err != nil {
		os.Remove(mnt)
		return nil, err
	}
	return &fuseExposure{fa: fa, mnt: mnt}, nil
}

type fuseExposure struct {
	fa  *fuseblk.Attachment
	mnt string
}

func (e *fuseExposure) Fill(rec *Record) {
	rec.Device, rec.FUSEMount, rec.FUSEFile = e.fa.LoopDevice(), e.fa.MountPoint(), e.fa.File()
}

// Detach unbinds the loop device and unmounts the FUSE file
// (fuseblk.Attachment.Detach, which flushes too).
func (e *fuseExposure) Detach(force bool) error {
	if e.fa == nil {
		return nil
	}
	var errs []error
	if err := e.fa.Detach(force); err != nil {
		// fuseblk leaves a refused attachment intact; once its FUSE
		// mount is gone, the error is final instead.
		if mounted, _ := IsMountPoint(e.fa.MountPoint()); mounted && !force {
			return &RefusedError{Err: err}
		}
		errs = append(errs, err)
	}
	e.fa = nil
	if err := os.Remove(e.mnt); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (e *fuseExposure) Failed() <-chan error { return nil }

// Resize grows the FUSE file and the loop device to the backend's size
// (fuseblk.Attachment.Resize).
func (e *fuseExposure) Resize() error { return e.fa.Resize() }

// Reap releases the loop device if it is still bound to the dead FUSE file
// and unmounts the dead FUSE mount.
func (fuseFrontend) Reap(d *Dir, rec Record, force bool) ([]string, error) {
	var notes []string
	var errs []error
	if rec.Device != "" && rec.FUSEFile != "" {
		note, err := releaseLoop(rec.Device, rec.FUSEFile)
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
	return notes, errors.Join(errs...)
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
