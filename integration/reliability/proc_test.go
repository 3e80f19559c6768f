package reliability_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/nprdma/nprdma/internal/banner"
	"github.com/nprdma/nprdma/internal/gobuild"
)

// childEnv makes the test binary run a child role instead of the tests (see
// runChild): the initiator that TestTargetSurvivesInitiatorSIGKILL kills.
const childEnv = "NPRDMA_RELIABILITY_CHILD"

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(runChild(role))
	}
	code := m.Run()
	gobuild.Clean()
	os.Exit(code)
}

// targetBinary is the nprdma-target command: NPRDMA_TARGET_BIN, or built
// from this module's ./cmd/nprdma-target into a temporary directory.
func targetBinary(t testing.TB) string {
	t.Helper()
	return gobuild.Command(t, "nprdma-target", "NPRDMA_TARGET_BIN")
}

// freeAddr is a loopback address with a port nobody listens on (for a
// target that must come back on the same address after a restart).
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// targetProc is an nprdma-target process this test started.
type targetProc struct {
	cmd    *exec.Cmd
	addr   string // once started
	banner string // once started
	out    *banner.Watcher
	exited chan struct{}
	err    error // of Wait, once exited is closed
}

// targetArgs are the flags of a target serving the file backing as the one
// namespace of subNQN to any host, its metadata in dataDir.
func targetArgs(backing, dataDir, listen, memory string) []string {
	return []string{"--backing", backing, "--memory", memory, "--listen", listen, "--nqn", subNQN,
		"--allow-any-host", "--data-dir", dataDir, "--log-level", "warn"}
}

// startTargetProc starts the target and waits until it serves. It is
// killed, if still running, when the test ends.
func startTargetProc(t testing.TB, args ...string) *targetProc {
	t.Helper()
	p, err := startTargetProcE(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func startTargetProcE(t testing.TB, args ...string) (*targetProc, error) {
	t.Helper()
	cmd := exec.Command(targetBinary(t), args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &targetProc{cmd: cmd, exited: make(chan struct{})}
	t.Cleanup(func() { p.kill(syscall.SIGKILL) })
	p.out = banner.Watch(stderr)
	go func() {
		<-p.out.Done()
		p.err = cmd.Wait()
		close(p.exited)
	}()
	select {
	case <-p.out.Ready():
		p.addr, p.banner = p.out.Addr(), p.out.Banner()
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("nprdma-target exited before serving (%v):\n%s", p.err, p.output())
	case <-time.After(60 * time.Second):
		p.kill(syscall.SIGKILL)
		return nil, fmt.Errorf("nprdma-target did not start within 60 s:\n%s", p.output())
	}
}

func (p *targetProc) output() string { return p.out.Log() }

// kill sends sig and, for SIGKILL, waits for the process to be gone.
func (p *targetProc) kill(sig syscall.Signal) {
	select {
	case <-p.exited:
		return
	default:
	}
	p.cmd.Process.Signal(sig)
	if sig == syscall.SIGKILL {
		<-p.exited
	}
}

// wait waits up to d for the process to exit and returns its exit code.
func (p *targetProc) wait(t testing.TB, d time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(d):
		t.Fatalf("nprdma-target did not exit within %v:\n%s", d, p.output())
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	return 0
}
