package ublk

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
	"unsafe"

	"github.com/nprdma/nprdma/internal/uring"
	"golang.org/x/sys/unix"
)

// ControlPath is ublk's control device.
const ControlPath = "/dev/ublk-control"

// Control sends control commands to /dev/ublk-control: each is an
// IORING_OP_URING_CMD on a ring of 128-byte entries (the driver refuses
// others), and the caller waits for its completion. The buffers the
// commands point at are in a page mapped outside the Go heap. Safe for
// concurrent use (commands are serialised).
type Control struct {
	mu   sync.Mutex
	f    *os.File
	ring *uring.Ring
	buf  []byte // a page for the commands' buffers
}

// OpenControl opens the control device. It fails where the kernel has no
// ublk (modprobe ublk_drv) or the caller is not privileged.
func OpenControl() (*Control, error) {
	f, err := os.OpenFile(ControlPath, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("ublk: %w", err)
	}
	ring, err := uring.New(uring.Params{Entries: 4, SQE128: true})
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("ublk: control ring: %w", err)
	}
	buf, err := unix.Mmap(-1, 0, pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		ring.Close()
		f.Close()
		return nil, fmt.Errorf("ublk: %w", err)
	}
	return &Control{f: f, ring: ring, buf: buf}, nil
}

// Close releases the control device.
func (c *Control) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ring.Close()
	unix.Munmap(c.buf)
	return c.f.Close()
}

// CmdError is a control command the driver failed.
type CmdError struct {
	Cmd   string
	DevID uint32
	Err   unix.Errno
}

func (e *CmdError) Error() string {
	if e.DevID == noDevice {
		return fmt.Sprintf("ublk: %s: %v", e.Cmd, e.Err)
	}
	return fmt.Sprintf("ublk: %s of device %d: %v", e.Cmd, e.DevID, e.Err)
}

func (e *CmdError) Unwrap() error { return e.Err }

const noDevice = ^uint32(0)

var cmdNames = map[uint32]string{
	cmdGetDevInfo: "GET_DEV_INFO", cmdAddDev: "ADD_DEV", cmdDelDev: "DEL_DEV", cmdStartDev: "START_DEV",
	cmdStopDev: "STOP_DEV", cmdSetParams: "SET_PARAMS", cmdGetParams: "GET_PARAMS",
	cmdStartRecovery: "START_USER_RECOVERY", cmdEndRecovery: "END_USER_RECOVERY", cmdGetFeatures: "GET_FEATURES",
}

// do runs control command nr for device id with len bytes of c.buf as its
// buffer (0: none) and data as its inline argument, and waits for it.
func (c *Control) do(nr, id uint32, length int, data uint64) error {
	e := c.ring.Prepare()
	e.Opcode, e.FD = uring.OpURingCmd, int32(c.f.Fd())
	e.SetCmdOp(ctrlOp(nr))
	cmd := ctrlCmd{devID: id, queueID: 0xffff, data: data}
	if length > 0 {
		cmd.len, cmd.addr = uint16(length), uint64(uintptr(unsafe.Pointer(&c.buf[0])))
	}
	cmd.put(c.ring.Cmd(e))
	wait := uint32(1)
	var res int32
	for got := 0; got == 0; {
		if _, err := c.ring.Submit(wait); err != nil && !errors.Is(err, unix.EINTR) {
			c.ring.Withdraw()
			return fmt.Errorf("ublk: %s: io_uring_enter: %w", cmdNames[nr], err)
		}
		got = c.ring.Completions(func(q uring.CQE) { res = q.Res })
	}
	if res < 0 {
		return &CmdError{Cmd: cmdNames[nr], DevID: id, Err: unix.Errno(-res)}
	}
	return nil
}

// Features returns the UBLK_F_* flags the driver supports (Linux 6.5+).
func (c *Control) Features() (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.do(cmdGetFeatures, noDevice, 8, 0); err != nil {
		return 0, err
	}
	return *(*uint64)(unsafe.Pointer(&c.buf[0])), nil
}

// AddDev creates a device (/dev/ublkcN; the block device comes with
// StartDev) and returns it as the driver made it: its ID, and the queues,
// depth, buffer size and flags it accepted.
func (c *Control) AddDev(want DevInfo) (DevInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	want.put(c.buf)
	if err := c.do(cmdAddDev, want.ID, devInfoSize, 0); err != nil {
		return DevInfo{}, err
	}
	return parseDevInfo(c.buf)
}

// DevInfo reports device id.
func (c *Control) DevInfo(id uint32) (DevInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.buf[:devInfoSize])
	if err := c.do(cmdGetDevInfo, id, devInfoSize, 0); err != nil {
		return DevInfo{}, err
	}
	return parseDevInfo(c.buf)
}

func (c *Control) setParams(id uint32, p params) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	p.put(c.buf)
	return c.do(cmdSetParams, id, paramsSize, 0)
}

func (c *Control) getParams(id uint32) (params, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.buf[:paramsSize])
	*(*uint32)(unsafe.Pointer(&c.buf[0])) = paramsSize
	if err := c.do(cmdGetParams, id, paramsSize, 0); err != nil {
		return params{}, err
	}
	return parseParams(c.buf[:paramsSize])
}

// The commands below wait in the kernel, holding the Control meanwhile:
// StartDev and EndRecovery until every queue has fetched all its requests,
// StopDev until the requests in flight are done, DelDev until /dev/ublkcN
// is closed.

func (c *Control) simple(nr, id uint32, data uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.do(nr, id, 0, data)
}

// StartDev starts device id, served by process pid: /dev/ublkbN appears.
func (c *Control) StartDev(id uint32, pid int) error { return c.simple(cmdStartDev, id, uint64(pid)) }

// StopDev removes the block device: requests in flight complete, the
// queues' fetches are aborted.
func (c *Control) StopDev(id uint32) error { return c.simple(cmdStopDev, id, 0) }

// DelDev deletes the device once /dev/ublkcN is closed.
func (c *Control) DelDev(id uint32) error { return c.simple(cmdDelDev, id, 0) }

// StartRecovery prepares a quiesced device (its server died, UBLK_F_USER_
// RECOVERY) for a new server. The driver answers EBUSY until the dead
// server's files are released; it is retried for up to wait.
func (c *Control) StartRecovery(id uint32, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		err := c.simple(cmdStartRecovery, id, 0)
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// EndRecovery hands the device to server pid, whose queues have fetched:
// the requests queued meanwhile are served.
func (c *Control) EndRecovery(id uint32, pid int) error {
	return c.simple(cmdEndRecovery, id, uint64(pid))
}
