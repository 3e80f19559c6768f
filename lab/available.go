package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Available reports why the lab cannot run here with the default kernel,
// or nil. It fetches the kernel into the cache on first use (see Fetch;
// progress on stderr), so its first call may take a minute; later calls in
// the process return at once. NPRDMA_LAB=off makes it report the lab
// switched off.
func Available() error {
	k, _ := lookupKernel("")
	return available(k)
}

// Require skips the test, with the reason, when Available reports the lab
// cannot run here.
func Require(t testing.TB) {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("guest lab unavailable: %v", err)
	}
}

// RequireKernel is Require for a named kernel ("7.3").
func RequireKernel(t testing.TB, name string) {
	t.Helper()
	k, err := lookupKernel(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := available(k); err != nil {
		t.Skipf("guest lab unavailable: %v", err)
	}
}

var availability sync.Map // kernel name -> *availableOnce

type availableOnce struct {
	once sync.Once
	err  error
}

func available(k kernel) error {
	v, _ := availability.LoadOrStore(k.Name, &availableOnce{})
	a := v.(*availableOnce)
	a.once.Do(func() { a.err = checkAvailable(k) })
	return a.err
}

func checkAvailable(k kernel) error {
	if v := os.Getenv("NPRDMA_LAB"); v == "off" || v == "0" {
		return errors.New("switched off by NPRDMA_LAB=" + v)
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return errors.New("qemu-system-x86_64 not found (package qemu-system-x86; make deps installs it)")
	}
	if _, err := exec.LookPath("bash"); err != nil {
		return errors.New("bash not found: the guest runs the host's bash")
	}
	if err := checkBusybox(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := fetch(ctx, k, os.Stderr); err != nil {
		return fmt.Errorf("kernel %s not cached in %s and not fetchable: %w", k.Name, CacheDir(), err)
	}
	return nil
}

// FreePort returns a TCP port of 127.0.0.1 that nothing listens on now,
// for a Forward's HostPort.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// terminalSize is the size of this process's terminal, if stdin is one.
func terminalSize() (rows, cols int, ok bool) {
	ws, err := unix.IoctlGetWinsize(int(os.Stdin.Fd()), unix.TIOCGWINSZ)
	if err != nil || ws.Row == 0 {
		return 0, 0, false
	}
	return int(ws.Row), int(ws.Col), true
}
