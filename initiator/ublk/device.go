// Package ublk serves a blockio.Backend as a Linux ublk block device
// (/dev/ublkbN): a userspace block driver over io_uring (Linux 6.0+; this
// server needs 6.5+ for GET_FEATURES and the ioctl-encoded commands). It is
// a server in Go over golang.org/x/sys/unix and the project's io_uring
// wrapper (internal/uring): no cgo, no liburing.
//
// The device is created with ADD_DEV, described with SET_PARAMS (4 KiB
// logical blocks, a volatile write cache with FUA, discard and write
// zeroes), and started with START_DEV once each queue has fetched all its
// requests; STOP_DEV and DEL_DEV take it down (Device.Stop). Each queue is
// served by a loop on its own OS thread (queue). With UBLK_F_USER_RECOVERY
// a device survives its server's death (its I/O waits, nothing fails) and a
// new server resumes it (Resume); Remove deletes what a dead server left.
//
// docs/attach.md has the measurements behind the choices (plain copy or
// UBLK_F_USER_COPY, requests served on the queue's thread or by workers).
package ublk

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nprdma/nprdma/initiator/blockio"
	"github.com/nprdma/nprdma/internal/uring"
	"golang.org/x/sys/unix"
)

type config struct {
	queues, depth, maxIO int
	userCopy             bool
	recovery             bool
	affinity             bool
	logger               *slog.Logger
	recoveryWait         time.Duration
}

// Option configures Serve and Resume.
type Option func(*config)

// WithQueues sets the number of hardware queues, each served by its own
// thread (default: one per CPU; the driver allows at most one per CPU).
func WithQueues(n int) Option { return func(c *config) { c.queues = n } }

// WithQueueDepth sets the requests in flight per queue (default 128, at
// most 4096).
func WithQueueDepth(n int) Option { return func(c *config) { c.depth = n } }

// WithMaxIO sets the largest request in bytes, a multiple of 4096 (default
// 256 KiB). Each tag of each queue has a buffer this large (touched only as
// far as requests reach).
func WithMaxIO(n int) Option { return func(c *config) { c.maxIO = n } }

// WithUserCopy moves the requests' data with pread and pwrite on
// /dev/ublkcN in the worker serving the request (UBLK_F_USER_COPY), instead
// of having the driver copy it to and from each tag's buffer on the
// queue's thread (the default).
func WithUserCopy(on bool) Option { return func(c *config) { c.userCopy = on } }

// WithRecovery asks for UBLK_F_USER_RECOVERY and _REISSUE (default on,
// where the driver supports them): if the serving process dies, the device
// stays, its requests wait (those in flight are reissued), and Resume in a
// new process serves them.
func WithRecovery(on bool) Option { return func(c *config) { c.recovery = on } }

// WithCPUAffinity pins each queue's thread to the CPU the block layer maps
// to the queue, when there is one queue per CPU (default on): the driver
// then completes commands on the CPU that issued the I/O.
func WithCPUAffinity(on bool) Option { return func(c *config) { c.affinity = on } }

// WithLogger logs failed requests and queue events (default: none).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// Device is a ublk device this process serves.
type Device struct {
	cfg     config
	info    DevInfo
	ctrl    *Control
	char    *os.File
	backend blockio.Backend
	queues  []*queue
	maps    [][]byte // descriptor arrays and buffers, to unmap
	efds    []int
	wg      sync.WaitGroup
	errs    chan error // a queue's loop that ended with an error
	stopped bool
	mu      sync.Mutex
}

// ID is the device's number: /dev/ublkbID, /dev/ublkcID.
func (d *Device) ID() int { return int(d.info.ID) }

// Path is the block device.
func (d *Device) Path() string { return BlockPath(d.ID()) }

// Info is the device as the driver created it.
func (d *Device) Info() DevInfo { return d.info }

// BlockPath is the block device of ublk device id.
func BlockPath(id int) string { return "/dev/ublkb" + strconv.Itoa(id) }

// CharPath is the character device of ublk device id.
func CharPath(id int) string { return "/dev/ublkc" + strconv.Itoa(id) }

// ParseBlockPath returns the device number of /dev/ublkbN.
func ParseBlockPath(path string) (int, error) {
	s, ok := strings.CutPrefix(path, "/dev/ublkb")
	n, err := strconv.Atoi(s)
	if !ok || err != nil || n < 0 {
		return 0, fmt.Errorf("ublk: %q is not a ublk block device (/dev/ublkbN)", path)
	}
	return n, nil
}

func newConfig(opts []Option) config {
	c := config{queues: runtime.NumCPU(), depth: 128, maxIO: 256 << 10, recovery: true, affinity: true, recoveryWait: 30 * time.Second}
	for _, o := range opts {
		o(&c)
	}
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Serve creates a ublk device over b and serves it until Stop. b's size
// must be a multiple of 4096, the device's logical block size.
func Serve(b blockio.Backend, opts ...Option) (*Device, error) {
	cfg := newConfig(opts)
	switch {
	case b.Size() <= 0 || b.Size()%4096 != 0:
		return nil, fmt.Errorf("ublk: backend size %d is not a positive multiple of 4096", b.Size())
	case cfg.depth < 1 || cfg.depth > maxQueueDepth:
		return nil, fmt.Errorf("ublk: queue depth %d outside [1, %d]", cfg.depth, maxQueueDepth)
	case cfg.maxIO < 4096 || cfg.maxIO%4096 != 0 || cfg.maxIO > 1<<ioBufBits:
		return nil, fmt.Errorf("ublk: maximum I/O size %d is not a multiple of 4096 up to 32 MiB", cfg.maxIO)
	case cfg.queues < 1:
		return nil, fmt.Errorf("ublk: %d queues", cfg.queues)
	}
	ctrl, err := OpenControl()
	if err != nil {
		return nil, err
	}
	features, err := ctrl.Features()
	if err != nil {
		ctrl.Close()
		return nil, fmt.Errorf("%w (this server needs Linux 6.5 or later)", err)
	}
	flags := uint64(FlagCmdIoctlEncode)
	if cfg.userCopy {
		if features&FlagUserCopy == 0 {
			ctrl.Close()
			return nil, errors.New("ublk: the driver does not offer UBLK_F_USER_COPY")
		}
		flags |= FlagUserCopy
	}
	if cfg.recovery && features&FlagUserRecovery != 0 && features&FlagUserRecoveryReissue != 0 {
		flags |= FlagUserRecovery | FlagUserRecoveryReissue
	}
	info, err := ctrl.AddDev(DevInfo{Queues: uint16(cfg.queues), QueueDepth: uint16(cfg.depth), MaxIOBytes: uint32(cfg.maxIO),
		ID: noDevice, Flags: flags})
	if err != nil {
		ctrl.Close()
		return nil, err
	}
	d := &Device{cfg: cfg, info: info, ctrl: ctrl, backend: b}
	cfg.userCopy = info.Flags&FlagUserCopy != 0
	d.cfg.userCopy = cfg.userCopy
	d.cfg.maxIO = int(info.MaxIOBytes)
	p := params{
		attrs:        attrVolatileCache | attrFUA,
		logicalShift: 12, physicalShift: 12, optShift: 12, minShift: 12,
		maxSectors:         uint32(d.cfg.maxIO >> 9),
		devSectors:         uint64(b.Size() >> 9),
		discardGranularity: 4096, maxDiscardSectors: 1 << 21, maxWriteZeroesSectors: 1 << 21,
		maxDiscardSegments: 1,
	}
	if err := ctrl.setParams(info.ID, p); err != nil {
		d.remove()
		return nil, err
	}
	if err := d.startQueues(); err != nil {
		d.Stop()
		return nil, err
	}
	if err := ctrl.StartDev(info.ID, os.Getpid()); err != nil {
		d.Stop()
		return nil, err
	}
	if err := waitForNode(d.Path()); err != nil {
		d.Stop()
		return nil, err
	}
	return d, nil
}

// Resume serves device id again, which a process that died left quiesced
// (UBLK_F_USER_RECOVERY): its requests waited meanwhile and are served
// now; the file system on it never saw it go. The device keeps the queues,
// depth, buffer size and copy mode it was created with; b must be as large.
func Resume(id int, b blockio.Backend, opts ...Option) (*Device, error) {
	cfg := newConfig(opts)
	ctrl, err := OpenControl()
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Device, error) { ctrl.Close(); return nil, err }
	info, err := ctrl.DevInfo(uint32(id))
	if err != nil {
		return fail(err)
	}
	if info.Flags&FlagUserRecovery == 0 {
		return fail(fmt.Errorf("ublk: device %d was created without UBLK_F_USER_RECOVERY: it cannot be resumed", id))
	}
	p, err := ctrl.getParams(uint32(id))
	if err != nil {
		return fail(err)
	}
	if int64(p.devSectors)<<9 != b.Size() {
		return fail(fmt.Errorf("ublk: device %d has %d bytes, the namespace %d: not resuming it over another namespace", id, int64(p.devSectors)<<9, b.Size()))
	}
	if err := ctrl.StartRecovery(uint32(id), cfg.recoveryWait); err != nil {
		return fail(err)
	}
	cfg.queues, cfg.depth, cfg.maxIO = int(info.Queues), int(info.QueueDepth), int(info.MaxIOBytes)
	cfg.userCopy = info.Flags&FlagUserCopy != 0
	d := &Device{cfg: cfg, info: info, ctrl: ctrl, backend: b}
	if err := d.startQueues(); err != nil {
		d.Stop()
		return nil, err
	}
	if err := ctrl.EndRecovery(uint32(id), os.Getpid()); err != nil {
		d.Stop()
		return nil, err
	}
	d.info.ServerPID = int32(os.Getpid())
	return d, nil
}

// startQueues opens /dev/ublkcN and starts each queue's loop, returning
// once every queue has submitted its fetches.
func (d *Device) startQueues() error {
	var err error
	for try := 0; ; try++ {
		d.char, err = os.OpenFile(CharPath(d.ID()), os.O_RDWR, 0)
		if err == nil || !errors.Is(err, os.ErrNotExist) || try == 100 {
			break
		}
		time.Sleep(10 * time.Millisecond) // the node appears with the device
	}
	if err != nil {
		return fmt.Errorf("ublk: %w", err)
	}
	d.errs = make(chan error, d.cfg.queues)
	fetched := make(chan error, d.cfg.queues)
	for i := range d.cfg.queues {
		q, err := d.newQueue(i)
		if err != nil {
			return err
		}
		d.queues = append(d.queues, q)
		d.wg.Add(1)
		go d.runQueue(q, fetched)
		if err := <-fetched; err != nil {
			return err
		}
	}
	return nil
}

func (d *Device) newQueue(i int) (*queue, error) {
	c := d.cfg
	ring, err := uring.New(uring.Params{Entries: c.depth + 1})
	if err != nil {
		return nil, fmt.Errorf("ublk: queue %d: %w", i, err)
	}
	descs, err := unix.Mmap(int(d.char.Fd()), descArrayOffset(i), descArraySize(c.depth), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		ring.Close()
		return nil, fmt.Errorf("ublk: queue %d: mapping its descriptors: %w", i, err)
	}
	d.maps = append(d.maps, descs)
	// The tags' buffers and the eventfd's 8 bytes, outside the Go heap:
	// the driver and the ring write them.
	mem, err := unix.Mmap(-1, 0, c.depth*c.maxIO+pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		ring.Close()
		return nil, fmt.Errorf("ublk: queue %d: buffers: %w", i, err)
	}
	d.maps = append(d.maps, mem)
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		ring.Close()
		return nil, fmt.Errorf("ublk: queue %d: eventfd: %w", i, err)
	}
	d.efds = append(d.efds, efd)
	q := &queue{
		id: i, depth: c.depth, maxIO: c.maxIO, charFD: int32(d.char.Fd()), ring: ring,
		descs: descs, bufs: mem[:c.depth*c.maxIO], evbuf: mem[c.depth*c.maxIO:][:8],
		userCopy: c.userCopy, data: d.char, backend: d.backend, log: c.logger, efd: efd,
		work: make(chan handoff, c.depth),
	}
	q.serveNanos.Store(int64(time.Millisecond)) // until measured: assume a slow backend
	return q, nil
}

func (d *Device) runQueue(q *queue, fetched chan<- error) {
	defer d.wg.Done()
	runtime.LockOSThread()
	// The thread ends with the loop (it is not unlocked): its CPU affinity
	// must not leak to other goroutines.
	if d.cfg.affinity && d.cfg.queues == runtime.NumCPU() {
		var set unix.CPUSet
		set.Set(q.id)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			d.cfg.logger.Warn("ublk: pinning the queue's thread", "queue", q.id, "err", err)
		}
	}
	err := q.run(fetched)
	close(q.work)
	d.cfg.logger.Info("ublk: queue stopped", "queue", q.id, "requests", q.served.Load(), "on its thread", q.inline.Load(),
		"serve avg", time.Duration(q.serveNanos.Load()), "hand-off avg", time.Duration(q.handoffNanos.Load()))
	q.ring.Close()
	if err != nil {
		d.cfg.logger.Error("ublk: queue loop ended", "queue", q.id, "err", err)
		d.errs <- err
	}
}

// Failed yields the error of a queue whose loop ended before Stop.
func (d *Device) Failed() <-chan error { return d.errs }

// Stop takes the device down: STOP_DEV (the block device goes; requests in
// flight complete, and the queues' loops end), then DEL_DEV once the
// queues' files are closed. The caller makes sure nothing has the block
// device mounted.
func (d *Device) Stop() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return nil
	}
	d.stopped = true
	var errs []error
	if err := d.ctrl.StopDev(d.info.ID); err != nil {
		errs = append(errs, err)
	}
	d.wg.Wait()
	d.release()
	errs = append(errs, d.ctrl.DelDev(d.info.ID), d.ctrl.Close())
	return errors.Join(errs...)
}

// remove deletes a device whose queues never started.
func (d *Device) remove() {
	d.ctrl.DelDev(d.info.ID)
	d.ctrl.Close()
}

// release unmaps the queues' memory and closes their descriptors and
// /dev/ublkcN: DEL_DEV waits for the last reference to the device.
func (d *Device) release() {
	for _, m := range d.maps {
		unix.Munmap(m)
	}
	for _, fd := range d.efds {
		unix.Close(fd)
	}
	if d.char != nil {
		d.char.Close()
	}
	d.maps, d.efds, d.char = nil, nil, nil
}

// waitForNode waits for devtmpfs to show path (START_DEV adds the disk).
func waitForNode(path string) error {
	for try := 0; ; try++ {
		_, err := os.Stat(path)
		if err == nil || !errors.Is(err, os.ErrNotExist) || try == 200 {
			if err != nil {
				return fmt.Errorf("ublk: %w", err)
			}
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Remove deletes device id, whose server (pid) is gone: STOP_DEV fails the
// requests that waited for a new server, DEL_DEV frees the device. A device
// served by another process now (the number was reused) is left alone.
func Remove(id, pid int) error {
	ctrl, err := OpenControl()
	if err != nil {
		return err
	}
	defer ctrl.Close()
	info, err := ctrl.DevInfo(uint32(id))
	if errors.Is(err, unix.ENODEV) {
		return nil // gone already
	}
	if err != nil {
		return err
	}
	if int(info.ServerPID) != pid && info.ServerPID > 0 {
		return fmt.Errorf("ublk: device %d is served by pid %d now, not %d: left alone", id, info.ServerPID, pid)
	}
	if err := ctrl.StopDev(uint32(id)); err != nil {
		return err
	}
	return ctrl.DelDev(uint32(id))
}

// Orphaned reports whether device id waits for a new server because its
// server, pid, died: it was created with UBLK_F_USER_RECOVERY and is still
// there, quiesced (or about to be, while the dead process's files are
// released).
func Orphaned(id, pid int) bool {
	ctrl, err := OpenControl()
	if err != nil {
		return false
	}
	defer ctrl.Close()
	info, err := ctrl.DevInfo(uint32(id))
	return err == nil && info.Flags&FlagUserRecovery != 0 && int(info.ServerPID) == pid &&
		(info.State == StateQuiesced || info.State == StateLive)
}
