package e2ebench

import (
	"github.com/nprdma/nprdma/bench"
	"os"

	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/internal/banner"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/tcp"
)

// benchNQN is the subsystem every experiment's target serves.
const benchNQN = "nqn.2024-01.io.nprdma:bench"

// targetConfig is one start of nprdma-target.
type targetConfig struct {
	bin     string
	backing string
	memory  int64
	dataDir string
	listen  string   // default 127.0.0.1:0
	also    []string // more --listen addresses (unix:PATH: shared memory)
	// listenNVMeTCP also serves NVMe/TCP there ("": not served).
	listenNVMeTCP string
	pin           bool
	cpus          []int
}

func (c targetConfig) argv() []string {
	listen := c.listen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	argv := []string{c.bin, "--backing", c.backing, "--memory", fmt.Sprintf("%dKiB", c.memory>>10),
		"--listen", listen, "--nqn", benchNQN, "--allow-any-host", "--data-dir", c.dataDir, "--log-level", "warn"}
	for _, a := range c.also {
		argv = append(argv, "--listen", a)
	}
	if c.pin {
		argv = append(argv, "--pin")
	}
	if c.listenNVMeTCP != "" {
		argv = append(argv, "--listen-nvme-tcp", c.listenNVMeTCP)
	}
	return argv
}

// targetProc is a running nprdma-target.
type targetProc struct {
	*bench.Child
	addr    string // where hosts connect
	tcpAddr string // the NVMe/TCP port's ("" when not served)
	banner  string // the "serving ..." line
}

// startTarget starts the target and waits for its "connect with" line.
func startTarget(ctx context.Context, c targetConfig, timeout time.Duration) (*targetProc, error) {
	ch, err := bench.StartChild("nprdma-target", c.argv(), c.cpus)
	if err != nil {
		return nil, err
	}
	p := &targetProc{Child: ch}
	l, err := ch.WaitLine(ctx, timeout, func(l string) bool { _, ok := banner.Addr(l); return ok })
	if err != nil {
		ch.Stop(syscall.SIGKILL, time.Second)
		return nil, err
	}
	p.addr, _ = banner.Addr(l)
	p.banner, _ = ch.WaitLine(ctx, time.Second, banner.IsServing)
	if c.listenNVMeTCP != "" {
		l, err := ch.WaitLine(ctx, timeout, func(l string) bool { _, ok := banner.NVMeTCPAddr(l); return ok })
		if err != nil {
			ch.Stop(syscall.SIGKILL, time.Second)
			return nil, err
		}
		p.tcpAddr, _ = banner.NVMeTCPAddr(l)
	}
	return p, nil
}

// shutdown ends the target cleanly (SIGTERM: drain, flush, exit 0).
func (p *targetProc) shutdown() error { return p.Stop(syscall.SIGTERM, 2*time.Minute) }

// host is an in-process initiator connected to a target.
type host struct {
	dev *nprdma.Device
	c   *initiator.Controller
	ns  *initiator.Namespace
}

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// connectHost connects to the bench subsystem at addr and opens namespace 1.
// stateDir keeps the host ID file out of the user's home.
func connectHost(ctx context.Context, addr, stateDir string, opts ...initiator.Option) (*host, error) {
	dev := nprdma.NewDevice(tcp.New(), nprdma.WithName("initiator"), nprdma.WithPinning(false))
	opts = append([]initiator.Option{initiator.WithStateFile(filepath.Join(stateDir, "hostid")),
		initiator.WithLogger(quietLog)}, opts...)
	c, err := initiator.Connect(ctx, dev, addr, benchNQN, opts...)
	if err != nil {
		dev.Close()
		return nil, err
	}
	ns, err := c.Namespace(ctx, 1)
	if err != nil {
		c.Close()
		dev.Close()
		return nil, err
	}
	return &host{dev: dev, c: c, ns: ns}, nil
}

func (h *host) close() {
	h.c.Close()
	h.dev.Close()
}

// attachNBD starts nprdma-initiator attach --mode nbd for the bench's
// namespace at addr, serving NBD on a unix socket under dir, with flags
// before the command (--transport, --provider). It has its own run
// directory (attachment records), given through the environment so that
// versions without --run-dir work too, and is stopped when rig closes.
// It returns the process and its socket's path.
func attachNBD(ctx context.Context, rig *e2eRig, iniBin, name, dir, addr string, flags ...string) (*bench.Child, string, error) {
	sock := filepath.Join(dir, "nbd.sock")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, "", err
	}
	argv := append([]string{iniBin, "--hostid-file", filepath.Join(dir, "hostid")}, flags...)
	argv = append(argv, "attach", "--mode", "nbd", "--target", addr, "--nqn", benchNQN, "--socket", sock)
	ap, err := bench.StartChild("nprdma-initiator attach ("+name+")", argv, nil, "NPRDMA_RUN_DIR="+filepath.Join(dir, "run"))
	if err != nil {
		return nil, "", err
	}
	rig.onClose(func() error { return ap.Stop(syscall.SIGTERM, 30*time.Second) })
	if err := waitUnixSocket(ctx, ap, sock, 30*time.Second); err != nil {
		return nil, "", err
	}
	return ap, sock, nil
}

// nbdUnixURI is the NBD URI of a server on the unix socket at path.
func nbdUnixURI(path string) string { return "nbd+unix:///?socket=" + path }
