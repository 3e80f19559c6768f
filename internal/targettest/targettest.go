// Package targettest runs nprdma-target as a process for tests: built with
// gobuild, on loopback, with its management socket in the test's
// directory; stopped (SIGTERM, then SIGKILL) when the test ends.
package targettest

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nprdma/nprdma/internal/banner"
	"github.com/nprdma/nprdma/internal/gobuild"
)

// Proc is a running nprdma-target.
type Proc struct {
	Addr    string // where hosts connect
	Socket  string // its management socket
	DataDir string
	cmd     *exec.Cmd
	out     *banner.Watcher
	exited  chan struct{}
	err     error
}

// FreeAddr is a loopback address with a port nobody listens on.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Start runs nprdma-target with its data in dataDir, listening on listen
// (FreeAddr), its management socket dataDir/manage.sock, and args, and
// waits until it serves.
func Start(t testing.TB, dataDir, listen string, args ...string) *Proc {
	t.Helper()
	bin := gobuild.Command(t, "nprdma-target", "NPRDMA_TARGET_BIN")
	p := &Proc{Socket: filepath.Join(dataDir, "manage.sock"), DataDir: dataDir, exited: make(chan struct{})}
	all := append([]string{"--data-dir", dataDir, "--listen", listen, "--manage-socket", p.Socket, "--log-level", "warn"}, args...)
	p.cmd = exec.Command(bin, all...)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.out = banner.Watch(stderr)
	go func() {
		<-p.out.Done()
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited: // the test saw to its end
		default:
			p.Stop(t)
		}
	})
	select {
	case <-p.out.Ready():
		p.Addr = p.out.Addr()
	case <-p.exited:
		t.Fatalf("nprdma-target exited before serving (%v):\n%s", p.err, p.out.Log())
	case <-time.After(60 * time.Second):
		p.cmd.Process.Kill()
		t.Fatalf("nprdma-target did not start within 60 s:\n%s", p.out.Log())
	}
	return p
}

// Log is what the target wrote on standard error.
func (p *Proc) Log() string { return p.out.Log() }

// Signal sends sig to the target (SIGHUP: read the key files again).
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop sends SIGTERM and waits for a clean exit; a stop that is not clean
// fails the test. A target still running when the test ends is stopped so.
func (p *Proc) Stop(t testing.TB) {
	t.Helper()
	if code := p.Exit(t); code != 0 {
		t.Errorf("nprdma-target stopped with exit status %d:\n%s", code, p.out.Log())
	}
}

// Exit sends SIGTERM (SIGKILL after 30 s, failing the test) and returns the
// exit status; after an exit it returns the status again.
func (p *Proc) Exit(t testing.TB) int {
	t.Helper()
	select {
	case <-p.exited:
	default:
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			p.cmd.Process.Kill()
			<-p.exited
			t.Errorf("nprdma-target did not stop within 30 s of SIGTERM:\n%s", p.out.Log())
		}
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	return 0
}
