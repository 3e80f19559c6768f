// Package fuseblk exposes a blockio.Backend as a local block device on
// kernels without NBD or ublk: a FUSE filesystem holding one regular file
// (served with direct I/O, never cached) and a loop device over that file
// with direct I/O on. mkfs, mount and fio then use /dev/loopN like any disk;
// flushes of the loop device arrive as fsync of the file and reach
// Backend.Flush, discards arrive as fallocate(PUNCH_HOLE) and reach
// Backend.Trim.
package fuseblk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/nprdma/nprdma/initiator/blockio"
)

type config struct {
	mountDir      string
	fileName      string
	loop          bool
	loopBlockSize int
	readOnly      bool
	logger        *slog.Logger
	debug         bool
	detachTimeout time.Duration
}

// Option configures Attach.
type Option func(*config)

// WithMountDir mounts the FUSE filesystem on dir (an existing empty
// directory, left in place by Detach). By default a fresh directory under
// os.TempDir() is created and removed by Detach.
func WithMountDir(dir string) Option { return func(c *config) { c.mountDir = dir } }

// WithFileName names the file inside the mount (default "disk").
func WithFileName(name string) Option { return func(c *config) { c.fileName = name } }

// WithoutLoop serves only the FUSE file, with no loop device. It works
// without root where fusermount3 is installed.
func WithoutLoop() Option { return func(c *config) { c.loop = false } }

// WithLoopBlockSize sets the loop device's logical block size: a power of
// two in [512, 4096] (default 4096, the nprdma page size, so that the
// kernel never sends partial blocks).
func WithLoopBlockSize(n int) Option { return func(c *config) { c.loopBlockSize = n } }

// WithReadOnly makes the file and the loop device read-only.
func WithReadOnly() Option { return func(c *config) { c.readOnly = true } }

// WithLogger logs backend errors and teardown steps (default: none).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithFUSEDebug logs every FUSE request (go-fuse's debug output).
func WithFUSEDebug() Option { return func(c *config) { c.debug = true } }

// WithDetachTimeout bounds how long Detach waits for the kernel to release
// the loop device (default 30 s).
func WithDetachTimeout(d time.Duration) Option { return func(c *config) { c.detachTimeout = d } }

// Attachment is a backend attached as a FUSE file and a loop device.
type Attachment struct {
	cfg      config
	server   *fuse.Server
	mountDir string
	ownDir   bool
	file     string
	backend  blockio.Backend
	fuseConn uint64 // fusectl connection id, to abort a stuck mount
	obs      *observer
	disk     *diskNode
	size     atomic.Int64 // what the file serves of the backend (Resize)

	mu       sync.Mutex
	loop     *loopDevice
	detached bool
}

// Stats counts what reached the backend through the FUSE file.
type Stats struct {
	Flushes, Trims, WriteZeroes, Errors uint64
}

// MountedError is returned by Detach without force while the loop device
// is mounted.
type MountedError struct {
	Device      string
	MountPoints []string
}

func (e *MountedError) Error() string {
	return fmt.Sprintf("detach %s: it is mounted at %s; unmount it first, or detach with force to unmount it",
		e.Device, strings.Join(e.MountPoints, ", "))
}

// observer counts and logs what the FUSE file passes to the backend.
type observer struct {
	log                             *slog.Logger
	flushes, trims, zeroes, failure atomic.Uint64
}

func (o *observer) fail(op string, off, length int64, err error) syscall.Errno {
	o.failure.Add(1)
	o.log.Warn("fuseblk: backend request failed", "op", op, "off", off, "len", length, "err", err)
	return blockio.Errno(err)
}

// Attach mounts a FUSE filesystem holding one file as large as b and, unless
// WithoutLoop, binds a loop device to it with direct I/O on and a 4 KiB
// logical block size. It needs root for the loop device (and mounts FUSE
// directly as root, with fusermount3 as the fallback).
func Attach(ctx context.Context, b blockio.Backend, opts ...Option) (*Attachment, error) {
	cfg := config{fileName: "disk", loop: true, loopBlockSize: 4096, detachTimeout: 30 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case cfg.fileName == "" || strings.ContainsRune(cfg.fileName, '/') || cfg.fileName == "." || cfg.fileName == "..":
		return nil, fmt.Errorf("fuseblk: invalid file name %q", cfg.fileName)
	case cfg.loopBlockSize < 512 || cfg.loopBlockSize > 4096 || cfg.loopBlockSize&(cfg.loopBlockSize-1) != 0:
		return nil, fmt.Errorf("fuseblk: loop block size %d is not a power of two in [512, 4096]", cfg.loopBlockSize)
	case b.Size() <= 0:
		return nil, fmt.Errorf("fuseblk: backend size %d: nothing to attach", b.Size())
	case cfg.loop && b.Size()%int64(cfg.loopBlockSize) != 0:
		return nil, fmt.Errorf("fuseblk: backend size %d is not a multiple of the loop block size %d", b.Size(), cfg.loopBlockSize)
	case cfg.loop && os.Geteuid() != 0:
		return nil, errors.New("fuseblk: a loop device needs root (use WithoutLoop for the FUSE file alone)")
	}

	a := &Attachment{cfg: cfg, mountDir: cfg.mountDir, backend: b, obs: &observer{log: cfg.logger}}
	if a.mountDir == "" {
		dir, err := os.MkdirTemp("", "nprdma-fuse-")
		if err != nil {
			return nil, fmt.Errorf("fuseblk: %w", err)
		}
		a.mountDir, a.ownDir = dir, true
	}
	a.file = filepath.Join(a.mountDir, cfg.fileName)
	if err := a.mount(b); err != nil {
		a.removeDir()
		return nil, err
	}
	if !cfg.loop {
		return a, nil
	}
	ld, err := attachLoop(ctx, a.file, cfg.loopBlockSize, cfg.readOnly)
	if err == nil && !ld.directIO {
		// Buffered loop I/O would put a second page cache between the
		// block device and the backend: refuse rather than risk it.
		ld.detach(context.Background())
		err = fmt.Errorf("fuseblk: the kernel did not enable direct I/O on %s", ld.path)
	}
	if err != nil {
		a.server.Unmount()
		a.server.Wait()
		a.removeDir()
		return nil, err
	}
	a.loop = ld
	return a, nil
}

// mount mounts the filesystem and starts serving it.
func (a *Attachment) mount(b blockio.Backend) error {
	a.size.Store(b.Size())
	now := time.Now()
	root := &rootNode{size: &a.size}
	disk := &diskNode{b: blockio.NewAligned(b), size: &a.size, readOnly: a.cfg.readOnly, mtime: now, obs: a.obs}
	a.disk = disk
	// Nothing about the file changes but its size, and Resize tells the
	// kernel when it does.
	timeout := time.Hour
	opts := &fs.Options{
		MountOptions: fuse.MountOptions{
			FsName:        "nprdma",
			Name:          "nprdma",
			DirectMount:   true,
			MaxWrite:      fuse.MAX_KERNEL_WRITE,
			MaxBackground: 64, // async direct I/O requests in flight (loop's queue depth)
			DisableXAttrs: true,
			// Replies carry data from memory: writev them. Splicing
			// would copy them into a pipe first (and cannot take a
			// 1 MiB read plus its header).
			DisableSplice: true,
			// Let the kernel keep several direct I/O requests of one
			// file in flight; and no parallel directory operations,
			// which have hung go-fuse (go-fuse #281) and buy nothing
			// with one file.
			ExtraCapabilities:    fuse.CAP_ASYNC_DIO,
			DisabledCapabilities: fuse.CAP_PARALLEL_DIROPS,
			Debug:                a.cfg.debug,
		},
		EntryTimeout: &timeout,
		AttrTimeout:  &timeout,
		OnAdd: func(ctx context.Context) {
			child := root.NewPersistentInode(ctx, disk, fs.StableAttr{Mode: syscall.S_IFREG, Ino: 2})
			root.AddChild(a.cfg.fileName, child, true)
		},
	}
	server, err := fs.Mount(a.mountDir, root, opts)
	if err != nil {
		return fmt.Errorf("fuseblk: mount FUSE on %s: %w", a.mountDir, err)
	}
	a.server = server
	var st unix.Stat_t
	if err := unix.Stat(a.mountDir, &st); err == nil {
		a.fuseConn = uint64(unix.Major(st.Dev))<<20 | uint64(unix.Minor(st.Dev))
	}
	return nil
}

// LoopDevice returns the loop device ("/dev/loop3"), or "" without one.
func (a *Attachment) LoopDevice() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.loop == nil {
		return ""
	}
	return a.loop.path
}

// MountPoint returns the directory the FUSE filesystem is mounted on.
func (a *Attachment) MountPoint() string { return a.mountDir }

// File returns the path of the file that holds the backend's bytes.
func (a *Attachment) File() string { return a.file }

// DirectIO reports whether the loop device does direct I/O (always true for
// an attachment with a loop device: Attach refuses otherwise).
func (a *Attachment) DirectIO() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.loop != nil && a.loop.directIO
}

// Stats returns what reached the backend through the FUSE file.
func (a *Attachment) Stats() Stats {
	return Stats{
		Flushes: a.obs.flushes.Load(), Trims: a.obs.trims.Load(),
		WriteZeroes: a.obs.zeroes.Load(), Errors: a.obs.failure.Load(),
	}
}

// Detach tears the attachment down: it unbinds the loop device, unmounts
// the FUSE filesystem, stops serving it and removes the directory it
// created. While the loop device is mounted it refuses with a *MountedError
// naming the mount points, unless force is set; then it unmounts them first
// (lazily if they are busy). With force it also aborts a FUSE mount that
// other processes keep busy, and goes on when another process keeps the
// loop device open (the device then unbinds itself when they close it, and
// their I/O fails meanwhile; Detach reports this). Last, it flushes the
// backend. On error the attachment stays usable and Detach may be called
// again, except after force or a failed final flush, which are reported
// once everything of ours is torn down. After that Detach does nothing.
func (a *Attachment) Detach(force bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.detached {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.detachTimeout)
	defer cancel()
	var lingering error // a forced detach could not release the loop device

	if a.loop != nil && a.loop.f == nil && !a.loop.ours() {
		// An earlier detach was refused after unbinding, and the device
		// has been released since (and may serve another attachment now):
		// nothing of ours is left on it.
		a.loop = nil
	}
	if a.loop != nil {
		mounts, err := MountPointsOf(a.loop.dev)
		if err != nil {
			return fmt.Errorf("detach %s: reading mounts: %w", a.loop.path, err)
		}
		if len(mounts) > 0 && !force {
			return &MountedError{Device: a.loop.path, MountPoints: mounts}
		}
		for i := len(mounts) - 1; i >= 0; i-- {
			a.cfg.logger.Warn("fuseblk: force detach: unmounting", "device", a.loop.path, "mountpoint", mounts[i])
			if err := unix.Unmount(mounts[i], 0); errors.Is(err, unix.EBUSY) {
				err = unix.Unmount(mounts[i], unix.MNT_DETACH)
			} else if err != nil && !errors.Is(err, unix.EINVAL) { // EINVAL: already gone
				return fmt.Errorf("detach %s: unmount %s: %w", a.loop.path, mounts[i], err)
			}
		}
		if err := a.loop.detach(ctx); err != nil {
			if !force {
				return fmt.Errorf("detach: %w", err)
			}
			// Somebody else holds the device open. Forced, we go on:
			// once the FUSE connection is aborted below, their I/O
			// fails, and autoclear unbinds the device at their close.
			lingering = err
			a.cfg.logger.Warn("fuseblk: force detach: loop device still open elsewhere", "device", a.loop.path, "err", err)
		}
		a.loop = nil
	}

	if err := a.server.Unmount(); err != nil {
		if !force {
			return fmt.Errorf("detach: unmount FUSE at %s (is %s still open?): %w", a.mountDir, a.file, err)
		}
		a.cfg.logger.Warn("fuseblk: force detach: aborting busy FUSE mount", "mountpoint", a.mountDir)
		if err := unix.Unmount(a.mountDir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("detach: lazy unmount of %s: %w", a.mountDir, err)
		}
		if err := abortFUSE(a.fuseConn); err != nil {
			return fmt.Errorf("detach: %s is lazily unmounted but still busy, and aborting its FUSE connection failed: %w", a.mountDir, err)
		}
	}
	a.server.Wait()
	a.removeDir()
	a.detached = true
	// Neither releasing the loop device nor unmounting sends a flush, so
	// writes the loop device completed may still sit in the backend's
	// volatile cache: make them durable before reporting success.
	if !a.cfg.readOnly {
		if err := a.backend.Flush(); err != nil {
			return fmt.Errorf("detach: final flush of the backend: %w", err)
		}
	}
	if lingering != nil {
		return fmt.Errorf("detach (forced): %w; the FUSE file is gone, so its I/O fails until then", lingering)
	}
	return nil
}

func (a *Attachment) removeDir() {
	if a.ownDir && !isMountPoint(a.mountDir) {
		if err := os.Remove(a.mountDir); err != nil {
			a.cfg.logger.Warn("fuseblk: remove mount directory", "dir", a.mountDir, "err", err)
		}
	}
}

// abortFUSE aborts a FUSE connection through the fusectl filesystem, so
// that processes still using it get ENOTCONN and the server's loops end.
// When fusectl is not mounted at its usual place, it is mounted on a
// temporary directory just for this (it is a single-instance filesystem).
func abortFUSE(id uint64) error {
	name := strconv.FormatUint(id, 10)
	ctl := "/sys/fs/fuse/connections"
	if _, err := os.Stat(filepath.Join(ctl, name)); err != nil {
		dir, err := os.MkdirTemp("", "nprdma-fusectl-")
		if err != nil {
			return err
		}
		defer os.Remove(dir)
		if err := unix.Mount("fusectl", dir, "fusectl", 0, ""); err != nil {
			return fmt.Errorf("mount fusectl: %w", err)
		}
		defer unix.Unmount(dir, unix.MNT_DETACH)
		ctl = dir
	}
	return os.WriteFile(filepath.Join(ctl, name, "abort"), []byte("1"), 0)
}

// LoopDevicesFor lists the loop devices bound to file (for tools and
// tests: after Detach, none are bound to the attachment's file).
func LoopDevicesFor(file string) ([]string, error) { return loopDevicesFor(file) }

// Resize serves the backend's size again after it grew (an initiator
// namespace the target resized): the FUSE file takes the new size, the
// kernel is told to drop the attributes it cached (FUSE_NOTIFY_INVAL_INODE)
// and reads them again, and the loop device re-reads its backing file's
// size (LOOP_SET_CAPACITY), so that /dev/loopN grows while it is in use (a
// mounted file system can then be grown online, resize2fs). A backend that
// shrank is refused: data beyond its end would vanish under the device.
func (a *Attachment) Resize() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.detached {
		return errors.New("fuseblk: resize: detached")
	}
	size, old := a.backend.Size(), a.size.Load()
	switch {
	case size == old:
		return nil
	case size < old:
		return fmt.Errorf("fuseblk: resize: the backend shrank from %d to %d bytes", old, size)
	case a.loop != nil && size%int64(a.cfg.loopBlockSize) != 0:
		return fmt.Errorf("fuseblk: resize: backend size %d is not a multiple of the loop block size %d", size, a.cfg.loopBlockSize)
	}
	a.size.Store(size)
	if errno := a.disk.NotifyContent(0, 0); errno != 0 {
		return fmt.Errorf("fuseblk: resize: invalidating the file's attributes: %w", errno)
	}
	var st unix.Stat_t
	if err := unix.Stat(a.file, &st); err != nil {
		return fmt.Errorf("fuseblk: resize: %w", err)
	}
	if st.Size != size {
		return fmt.Errorf("fuseblk: resize: the kernel sees %s at %d bytes, not %d", a.file, st.Size, size)
	}
	if a.loop != nil && a.loop.f != nil {
		if err := unix.IoctlSetInt(int(a.loop.f.Fd()), unix.LOOP_SET_CAPACITY, 0); err != nil {
			return fmt.Errorf("fuseblk: resize: LOOP_SET_CAPACITY %s: %w", a.loop.path, err)
		}
	}
	a.cfg.logger.Info("fuseblk: resized", "file", a.file, "from", old, "to", size)
	return nil
}
