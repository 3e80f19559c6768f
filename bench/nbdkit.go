package bench

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// NBDKit is a running nbdkit server: the peer the end-to-end experiments
// compare against (memory plugin for the resident case, file plugin for the
// SSD case). It listens on a unix socket or on loopback TCP only.
type NBDKit struct {
	// URI is the NBD URI clients use: nbd+unix:///?socket=PATH or
	// nbd://127.0.0.1:PORT.
	URI string
	// Socket is the unix socket path ("" when on TCP).
	Socket string
	// Addr is host:port on loopback ("" when on a unix socket).
	Addr string
	// PID is nbdkit's process ID (only this PID is ever signalled).
	PID int

	proc     *Child
	tmpDir   string
	stopOnce sync.Once
	stopErr  error
}

type nbdkitConfig struct {
	path    string
	socket  string
	tcp     bool
	flags   []string
	cpus    []int
	timeout time.Duration
}

// NBDKitOption configures StartNBDKit.
type NBDKitOption func(*nbdkitConfig)

// WithUnixSocket listens on the unix socket at path (the default is a socket
// in a fresh temporary directory).
func WithUnixSocket(path string) NBDKitOption {
	return func(c *nbdkitConfig) { c.socket, c.tcp = path, false }
}

// WithLoopbackTCP listens on 127.0.0.1 on a free port instead of a socket.
func WithLoopbackTCP() NBDKitOption { return func(c *nbdkitConfig) { c.tcp, c.socket = true, "" } }

// WithNBDKitFlags adds server flags before the plugin name, e.g. "-r",
// "--threads=16", "--filter=delay".
func WithNBDKitFlags(flags ...string) NBDKitOption {
	return func(c *nbdkitConfig) { c.flags = append(c.flags, flags...) }
}

// WithNBDKitCPUs pins nbdkit to cpus.
func WithNBDKitCPUs(cpus []int) NBDKitOption { return func(c *nbdkitConfig) { c.cpus = cpus } }

// WithNBDKitPath uses this nbdkit binary instead of the one in PATH.
func WithNBDKitPath(path string) NBDKitOption { return func(c *nbdkitConfig) { c.path = path } }

// WithStartTimeout bounds how long StartNBDKit waits for the server to
// accept connections (default 10 s).
func WithStartTimeout(d time.Duration) NBDKitOption { return func(c *nbdkitConfig) { c.timeout = d } }

// StartNBDKit starts `nbdkit PLUGIN ARGS...` in the foreground and returns
// once it accepts connections. nbdkit exits with its parent, so a killed
// benchmark does not leave it behind; Stop ends it normally. ctx bounds the
// server's life: when it is cancelled the server is stopped.
func StartNBDKit(ctx context.Context, plugin string, pluginArgs []string, opts ...NBDKitOption) (*NBDKit, error) {
	cfg := nbdkitConfig{timeout: 10 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.path == "" {
		p, err := FindTool("nbdkit")
		if err != nil {
			return nil, err
		}
		cfg.path = p
	}
	// A port picked by listening on :0 and closing can be taken by someone
	// else before nbdkit binds it; try a few ports.
	attempts := 1
	if cfg.tcp {
		attempts = 5
	}
	var lastErr error
	for range attempts {
		n, err := startNBDKitOnce(ctx, plugin, pluginArgs, cfg)
		if err == nil {
			return n, nil
		}
		lastErr = err
		if !strings.Contains(err.Error(), "Address already in use") {
			break
		}
	}
	return nil, lastErr
}

func startNBDKitOnce(ctx context.Context, plugin string, pluginArgs []string, cfg nbdkitConfig) (*NBDKit, error) {
	tmpDir, err := os.MkdirTemp("", "nprdma-nbdkit-")
	if err != nil {
		return nil, fmt.Errorf("nbdkit %s: %w", plugin, err)
	}
	n := &NBDKit{tmpDir: tmpDir}
	fail := func(err error) (*NBDKit, error) {
		os.RemoveAll(tmpDir)
		return nil, err
	}
	pidFile := filepath.Join(tmpDir, "nbdkit.pid")
	// --exit-with-parent uses PR_SET_PDEATHSIG, which fires when the forking
	// thread exits; Go ends threads only for goroutines that exit while
	// locked to one, which nothing in the bench does.
	args := []string{"--foreground", "--exit-with-parent", "--pidfile", pidFile}
	if cfg.tcp {
		port, err := FreeLoopbackPort()
		if err != nil {
			return fail(fmt.Errorf("nbdkit %s: %w", plugin, err))
		}
		n.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		n.URI = "nbd://" + n.Addr
		args = append(args, "--ipaddr", "127.0.0.1", "--port", strconv.Itoa(port))
	} else {
		n.Socket = cfg.socket
		if n.Socket == "" {
			n.Socket = filepath.Join(tmpDir, "nbd.sock")
		}
		n.URI = "nbd+unix:///?socket=" + url.QueryEscape(n.Socket)
		args = append(args, "--unix", n.Socket)
	}
	args = append(args, cfg.flags...)
	args = append(args, plugin)
	args = append(args, pluginArgs...)
	proc, err := StartChild("nbdkit "+plugin, append([]string{cfg.path}, args...), cfg.cpus)
	if err != nil {
		return fail(err)
	}
	n.proc, n.PID = proc, proc.PID()
	// Stop the server when the caller's context ends.
	go func() {
		select {
		case <-ctx.Done():
			n.Stop()
		case <-proc.done:
		}
	}()

	// nbdkit writes its pid file once it accepts connections; polling for
	// it avoids probe connections that would show up in nbdkit's log.
	deadline := time.NewTimer(cfg.timeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if b, err := os.ReadFile(pidFile); err == nil && len(bytes.TrimSpace(b)) > 0 {
			return n, nil
		}
		select {
		case <-proc.done:
			os.RemoveAll(tmpDir)
			return nil, fmt.Errorf("nbdkit %s %s exited before accepting connections (%v): %s",
				plugin, strings.Join(pluginArgs, " "), proc.waitErr, proc.Output(0))
		case <-deadline.C:
			n.Stop()
			return nil, fmt.Errorf("nbdkit %s: not accepting connections after %v: %s", plugin, cfg.timeout, proc.Output(0))
		case <-ctx.Done():
			n.Stop()
			return nil, fmt.Errorf("nbdkit %s: %w", plugin, ctx.Err())
		case <-tick.C:
		}
	}
}

// StartNBDKitProxy starts an nbdkit whose nbd plugin forwards every request
// to upstream: the proxy chain used to put a TCP hop (or a filter) in front
// of a peer.
func StartNBDKitProxy(ctx context.Context, upstream *NBDKit, opts ...NBDKitOption) (*NBDKit, error) {
	var args []string
	if upstream.Socket != "" {
		args = []string{"socket=" + upstream.Socket}
	} else {
		host, port, err := net.SplitHostPort(upstream.Addr)
		if err != nil {
			return nil, fmt.Errorf("nbdkit proxy: upstream address %q: %w", upstream.Addr, err)
		}
		args = []string{"hostname=" + host, "port=" + port}
	}
	return StartNBDKit(ctx, "nbd", args, opts...)
}

// Stop ends the server: SIGTERM to its PID, SIGKILL after 5 s, then waits
// for it and removes its temporary directory. It is safe to call twice.
func (n *NBDKit) Stop() error {
	n.stopOnce.Do(func() {
		// An unclean exit of a peer taken down here is not the caller's
		// concern: the measurements it served are done.
		_ = n.proc.Stop(syscall.SIGTERM, 5*time.Second)
		if n.Socket != "" && !strings.HasPrefix(n.Socket, n.tmpDir+string(filepath.Separator)) {
			os.Remove(n.Socket)
		}
		n.stopErr = os.RemoveAll(n.tmpDir)
	})
	return n.stopErr
}

// Exited reports whether the server has exited (on its own or by Stop).
func (n *NBDKit) Exited() bool { return n.proc.Exited() }

// FreeLoopbackPort returns a TCP port on 127.0.0.1 that nothing listens on
// now; someone may take it before the caller binds it, so a server started
// on it should be retried on "address already in use".
func FreeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
