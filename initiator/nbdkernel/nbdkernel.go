// Package nbdkernel attaches an NBD server of this process (initiator/nbd)
// to the kernel's NBD client, driven over generic netlink: /dev/nbdN. Each
// connection is a unix socket pair; this process serves one end
// (nbd.Server.ServeConn), runs the client's handshake on the other
// (nbd.Handshake) and hands it to the kernel with NBD_CMD_CONNECT, which
// picks a free device. NBD_CMD_DISCONNECT takes it down; the device is
// created destroy-on-disconnect, so /dev/nbdN goes with it.
//
// A connection the kernel loses is replaced (NBD_CMD_RECONFIGURE with a new
// socket pair) while the device lives. If this process dies, the kernel
// holds the device's I/O for DeadConnTimeout waiting for new connections:
// a new process resumes the device within that time (Resume), or removes
// it (Disconnect).
package nbdkernel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nprdma/nprdma/initiator/nbd"
	"golang.org/x/sys/unix"
)

// Generic netlink of the kernel's NBD client (include/uapi/linux/nbd-netlink.h).
const (
	familyName = "nbd"
	version    = 1

	cmdConnect     = 1
	cmdDisconnect  = 2
	cmdReconfigure = 3

	attrIndex           = 1
	attrSizeBytes       = 2
	attrBlockSizeBytes  = 3
	attrTimeout         = 4
	attrServerFlags     = 5
	attrClientFlags     = 6
	attrSockets         = 7
	attrDeadConnTimeout = 8
	attrBackendID       = 10

	sockItem = 1
	sockFD   = 1

	clientFlagDestroyOnDisconnect = 1 << 0
)

// DeadConnTimeout is how long the kernel holds a device's I/O once every
// connection is lost (this process died), waiting for Resume.
const DeadConnTimeout = 60 * time.Second

// BlockSize is the devices' logical block size: the nprdma page.
const BlockSize = 4096

type config struct {
	connections int
	logger      *slog.Logger
	backendID   string
}

// Option configures Attach and Resume.
type Option func(*config)

// WithConnections sets the number of connections (socket pairs), each a
// hardware queue of the device (default 1).
func WithConnections(n int) Option { return func(c *config) { c.connections = n } }

// WithLogger logs connection events (default: none).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithBackendID names the device's backend, shown in
// /sys/block/nbdN/backend (default "nprdma:" and the export's name): what
// Backend reads and Remove checks to know the device is ours.
func WithBackendID(id string) Option { return func(c *config) { c.backendID = id } }

// Device is a kernel NBD device connected to this process's server.
type Device struct {
	cfg    config
	nl     *genl
	family uint16
	srv    *nbd.Server
	export string
	size   int64
	index  int

	mu        sync.Mutex
	detaching bool
	serving   sync.WaitGroup
	failed    chan error
}

// Path is the block device: /dev/nbdN.
func (d *Device) Path() string { return BlockPath(d.index) }

// Index is N of /dev/nbdN.
func (d *Device) Index() int { return d.index }

// BlockPath is the block device of index.
func BlockPath(index int) string { return "/dev/nbd" + strconv.Itoa(index) }

// ParseBlockPath returns N of /dev/nbdN.
func ParseBlockPath(path string) (int, error) {
	s, ok := strings.CutPrefix(path, "/dev/nbd")
	n, err := strconv.Atoi(s)
	if !ok || err != nil || n < 0 {
		return 0, fmt.Errorf("nbdkernel: %q is not an NBD device (/dev/nbdN)", path)
	}
	return n, nil
}

func newConfig(export string, opts []Option) config {
	c := config{connections: 1, backendID: "nprdma:" + export}
	for _, o := range opts {
		o(&c)
	}
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func open(srv *nbd.Server, export string, size int64, cfg config) (*Device, error) {
	if size <= 0 || size%BlockSize != 0 {
		return nil, fmt.Errorf("nbdkernel: size %d is not a positive multiple of %d", size, BlockSize)
	}
	if cfg.connections < 1 {
		return nil, fmt.Errorf("nbdkernel: %d connections", cfg.connections)
	}
	nl, err := openGenl()
	if err != nil {
		return nil, fmt.Errorf("nbdkernel: %w", err)
	}
	family, err := nl.familyID(familyName)
	if err != nil {
		nl.close()
		return nil, fmt.Errorf("nbdkernel: %w (is the nbd module loaded?)", err)
	}
	return &Device{cfg: cfg, nl: nl, family: family, srv: srv, export: export, size: size, failed: make(chan error, 1)}, nil
}

// Attach connects srv's export (of size bytes) to a free kernel NBD device.
// srv serves the connections from then on; Disconnect ends them.
func Attach(srv *nbd.Server, export string, size int64, opts ...Option) (*Device, error) {
	d, err := open(srv, export, size, newConfig(export, opts))
	if err != nil {
		return nil, err
	}
	fds, links, flags, err := d.connect(d.cfg.connections, 0)
	if err != nil {
		d.serving.Wait()
		d.close()
		return nil, err
	}
	attrs := []attr{
		attrU64(attrSizeBytes, uint64(size)),
		attrU64(attrBlockSizeBytes, BlockSize),
		// No request timeout: the kernel would cut the connection of a
		// request the target takes long over, where the initiator has its
		// own controller-loss timeout.
		attrU64(attrTimeout, 0),
		attrU64(attrServerFlags, uint64(flags)),
		attrU64(attrClientFlags, clientFlagDestroyOnDisconnect),
		attrU64(attrDeadConnTimeout, uint64(DeadConnTimeout/time.Second)),
		attrString(attrBackendID, d.cfg.backendID),
		sockets(fds),
	}
	replies, err := d.nl.request(d.family, cmdConnect, version, attrs)
	if err == nil {
		handed(links)
	}
	closeAll(fds) // the kernel holds its own references
	if err != nil {
		d.serving.Wait() // our ends see theirs closed
		d.close()
		return nil, fmt.Errorf("nbdkernel: NBD_CMD_CONNECT: %w", err)
	}
	d.index = -1
	for _, r := range replies {
		if a, ok := findAttr(r, attrIndex); ok {
			if v, err := a.u32(); err == nil {
				d.index = int(v)
			}
		}
	}
	if d.index < 0 {
		d.Disconnect()
		return nil, errors.New("nbdkernel: NBD_CMD_CONNECT's reply names no device")
	}
	if err := waitForNode(d.Path()); err != nil {
		d.Disconnect()
		return nil, err
	}
	return d, nil
}

// Resume connects srv's export to device index again, whose server (a
// process that died) lost every connection: the kernel held the device's
// I/O for up to DeadConnTimeout and serves it now.
func Resume(index int, srv *nbd.Server, export string, size int64, opts ...Option) (*Device, error) {
	d, err := open(srv, export, size, newConfig(export, opts))
	if err != nil {
		return nil, err
	}
	d.index = index
	if got, err := deviceSize(index); err != nil || got != size {
		d.close()
		return nil, fmt.Errorf("nbdkernel: %s has %d bytes (%v), the export %d: not resuming it over another", d.Path(), got, err, size)
	}
	if err := d.reconfigure(d.cfg.connections, 0); err != nil {
		d.serving.Wait()
		d.close()
		return nil, err
	}
	return d, nil
}

// link is one connection, as this process serves it.
type link struct {
	handed  atomic.Bool // the kernel took it: its end is a lost connection
	attempt int         // replacements in a row that ended at once
}

// connect makes n socket pairs: this process serves one end of each, and
// the client's handshake is run on the other, which is returned for the
// kernel, with the export's transmission flags. The caller marks the links
// handed once the kernel has them, and closes the descriptors.
func (d *Device) connect(n, attempt int) (fds []int, links []*link, flags uint16, err error) {
	defer func() {
		if err != nil {
			closeAll(fds) // their connections end; not handed, they are not replaced
		}
	}()
	for range n {
		pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fds, nil, 0, fmt.Errorf("nbdkernel: socketpair: %w", err)
		}
		fds = append(fds, pair[1])
		f := os.NewFile(uintptr(pair[0]), "nbd-server")
		ours, err := net.FileConn(f) // a duplicate, in the network poller
		f.Close()
		if err != nil {
			return fds, nil, 0, fmt.Errorf("nbdkernel: %w", err)
		}
		l := &link{attempt: attempt}
		links = append(links, l)
		d.serve(ours, l)
		// The kernel's end stays blocking, as the kernel expects: the
		// handshake's reads and writes block their thread.
		ex, err := nbd.Handshake(fdReadWriter(pair[1]), d.export)
		if err != nil {
			return fds, nil, 0, err
		}
		flags = ex.Flags
	}
	return fds, links, flags, nil
}

// fdReadWriter reads and writes a blocking descriptor directly.
type fdReadWriter int

func (f fdReadWriter) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(int(f), p)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if n == 0 && err == nil && len(p) > 0 {
			return 0, io.EOF
		}
		return max(n, 0), err
	}
}

func (f fdReadWriter) Write(p []byte) (int, error) {
	written := 0
	for written < len(p) {
		n, err := unix.Write(int(f), p[written:])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return written, err
		}
		written += n
	}
	return written, nil
}

func handed(links []*link) {
	for _, l := range links {
		l.handed.Store(true)
	}
}

// serve serves one connection until it ends; one the kernel had that ends
// while the device lives is replaced.
func (d *Device) serve(c net.Conn, l *link) {
	d.serving.Add(1)
	go func() {
		defer d.serving.Done()
		start := time.Now()
		err := d.srv.ServeConn(context.Background(), c)
		d.mu.Lock()
		detaching := d.detaching
		d.mu.Unlock()
		if detaching || !l.handed.Load() || errors.Is(err, nbd.ErrServerClosed) {
			return
		}
		attempt := l.attempt + 1
		if time.Since(start) > time.Second {
			attempt = 1
		}
		if attempt > maxReplaceAttempts {
			// The kernel did not take the replacements: it had no dead
			// connection to replace.
			d.cfg.logger.Info("nbdkernel: the kernel takes no replacement connection", "device", d.Path())
			return
		}
		d.cfg.logger.Warn("nbdkernel: a connection of the kernel's ended; replacing it", "device", d.Path(), "err", err)
		go d.replace(attempt)
	}()
}

// maxReplaceAttempts bounds the replacements of a lost connection that the
// kernel does not take.
const maxReplaceAttempts = 20

// replace gives the kernel a new connection for one it lost. The kernel
// takes it only in place of a connection it has marked dead, which it may
// not have yet: a socket it does not take ends at once and is replaced
// again, after a pause.
func (d *Device) replace(attempt int) {
	time.Sleep(100 * time.Millisecond)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.detaching {
		return
	}
	if err := d.reconfigure(1, attempt); err != nil {
		d.cfg.logger.Error("nbdkernel: replacing a lost connection failed", "device", d.Path(), "err", err)
		select {
		case d.failed <- err:
		default:
		}
		return
	}
}

// reconfigure hands the kernel n new connections for device d.index.
func (d *Device) reconfigure(n, attempt int) error {
	fds, links, _, err := d.connect(n, attempt)
	if err != nil {
		return err
	}
	// The kernel wants the device's backend named, as it was at connect.
	attrs := []attr{attrU32(attrIndex, uint32(d.index)), attrString(attrBackendID, d.cfg.backendID), sockets(fds)}
	_, err = d.nl.request(d.family, cmdReconfigure, version, attrs)
	if err == nil {
		handed(links)
	}
	closeAll(fds) // the kernel holds its own references to those it took
	if err != nil {
		return fmt.Errorf("nbdkernel: NBD_CMD_RECONFIGURE of %s: %w", d.Path(), err)
	}
	return nil
}

// Failed yields an error if a lost connection could not be replaced.
func (d *Device) Failed() <-chan error { return d.failed }

// Disconnect takes the device down: the kernel sends NBD_CMD_DISC on each
// connection and lets go of them (requests in flight complete), and the
// device goes. It does not close the server.
func (d *Device) Disconnect() error {
	d.mu.Lock()
	if d.detaching {
		d.mu.Unlock()
		return nil
	}
	d.detaching = true
	d.mu.Unlock()
	var err error
	if d.index >= 0 {
		if _, err = d.nl.request(d.family, cmdDisconnect, version, []attr{attrU32(attrIndex, uint32(d.index))}); err != nil {
			err = fmt.Errorf("nbdkernel: NBD_CMD_DISCONNECT of %s: %w", d.Path(), err)
		}
	}
	if err == nil {
		d.serving.Wait() // the kernel closes its ends
	}
	d.close()
	return err
}

func (d *Device) close() { d.nl.close() }

// Remove disconnects device index, which a process that died left:
// requests waiting for it fail. It does so only if the device's backend is
// backendID (as WithBackendID set it): a device connected for someone else
// now is left alone, one not connected is nothing to do.
func Remove(index int, backendID string) error {
	owner, err := Backend(index)
	if err != nil || owner == "" {
		return nil // not connected, or gone
	}
	if owner != backendID {
		return fmt.Errorf("nbdkernel: %s is connected for %q now, not %q: left alone", BlockPath(index), owner, backendID)
	}
	nl, err := openGenl()
	if err != nil {
		return fmt.Errorf("nbdkernel: %w", err)
	}
	defer nl.close()
	family, err := nl.familyID(familyName)
	if err != nil {
		return fmt.Errorf("nbdkernel: %w", err)
	}
	if _, err := nl.request(family, cmdDisconnect, version, []attr{attrU32(attrIndex, uint32(index))}); err != nil {
		return fmt.Errorf("nbdkernel: NBD_CMD_DISCONNECT of %s: %w", BlockPath(index), err)
	}
	return nil
}

// Backend is what the process that connected device index named its
// backend (/sys/block/nbdN/backend, WithBackendID), or "" when the device
// is not connected.
func Backend(index int) (string, error) {
	dir := filepath.Join("/sys/block", "nbd"+strconv.Itoa(index))
	if _, err := os.Stat(filepath.Join(dir, "pid")); errors.Is(err, os.ErrNotExist) {
		return "", nil // not connected (or no such device)
	}
	b, err := os.ReadFile(filepath.Join(dir, "backend"))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// deviceSize is the size of /dev/nbdN in bytes (sysfs counts 512-byte
// sectors).
func deviceSize(index int) (int64, error) {
	b, err := os.ReadFile(filepath.Join("/sys/block", "nbd"+strconv.Itoa(index), "size"))
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n * 512, err
}

func sockets(fds []int) attr {
	a := attr{typ: attrSockets, nested: []attr{}}
	for _, fd := range fds {
		a.nested = append(a.nested, attr{typ: sockItem, nested: []attr{attrU32(sockFD, uint32(fd))}})
	}
	return a
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// waitForNode waits for devtmpfs to show path.
func waitForNode(path string) error {
	for try := 0; ; try++ {
		_, err := os.Stat(path)
		if err == nil {
			return nil
		}
		if !errors.Is(err, os.ErrNotExist) || try == 200 {
			return fmt.Errorf("nbdkernel: %w", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
