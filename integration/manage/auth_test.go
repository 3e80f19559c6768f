package manage_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/internal/targettest"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/tcp"
	"github.com/nprdma/nprdma/nvme/dhchap"
)

// TestCtlAddHostWithKeyFile: `ctl add-host --dhchap-secret-file` makes the
// host authenticate on the real target: with the file's secret it writes
// and reads back; without a secret, or with another, it is refused. SIGHUP
// reads a replaced file (the old secret is refused from then on, the
// connection made before goes on); after a restart the host must still
// authenticate, with the secret in the file. No secret reaches the log.
func TestCtlAddHostWithKeyFile(t *testing.T) {
	dir := t.TempDir()
	p := startKeyed(t, dir)
	key := filepath.Join(dir, "host.key")
	old := writeSecret(t, key)
	mustCtl(t, p, "add-host", keyed, keyedHost, "--dhchap-secret-file", key)

	c, err := connectKeyed(t, p, keyed, keyedHost, old)
	if err != nil {
		t.Fatal(err)
	}
	n, err := c.Namespace(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("keyed-ns"), 1024)
	if _, err := n.WriteAt(data, 4096); err != nil {
		t.Fatal(err)
	}
	readBack := func(n *initiator.Namespace) {
		t.Helper()
		got := make([]byte, len(data))
		if _, err := n.ReadAt(got, 4096); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read back: %v (equal %v)", err, bytes.Equal(got, data))
		}
	}
	readBack(n)
	refused := func(when string, s *dhchap.Secret, want error) {
		t.Helper()
		if _, err := connectKeyed(t, p, keyed, keyedHost, s); !errors.Is(err, want) {
			t.Fatalf("%s: %v, want %v", when, err, want)
		}
	}
	refused("no secret", nil, initiator.ErrAuthenticationRequired)
	refused("another secret", newSecret(t), dhchap.ErrRejected)

	replaced := writeSecret(t, key)
	reloadKeys(t, p)
	refused("the secret before SIGHUP", old, dhchap.ErrRejected)
	if _, err := connectKeyed(t, p, keyed, keyedHost, replaced); err != nil {
		t.Fatalf("the secret read on SIGHUP: %v", err)
	}
	readBack(n)
	c.Close()

	p.Stop(t)
	p = startTarget(t, dir, "--log-level", "info")
	refused("after a restart, no secret", nil, initiator.ErrAuthenticationRequired)
	c, err = connectKeyed(t, p, keyed, keyedHost, replaced)
	if err != nil {
		t.Fatalf("after a restart: %v", err)
	}
	if n, err = c.Namespace(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	readBack(n)
	for _, s := range []*dhchap.Secret{old, replaced} {
		if strings.Contains(p.Log(), s.Encode()[10:40]) {
			t.Fatal("a secret is in the target's log")
		}
	}
}

// TestCtlAddHostWithCtrlKeyFile: `ctl add-host --dhchap-ctrl-secret-file`
// (a relative path, which ctl makes absolute) gives the target the
// controller's secret for the host: the host authenticates bidirectionally
// and writes and reads back; with another controller secret it finds that
// the target did not prove itself. Without --dhchap-secret-file the
// command is refused. SIGHUP reads a replaced file, and a restart keeps
// it. No secret reaches the log.
func TestCtlAddHostWithCtrlKeyFile(t *testing.T) {
	dir := t.TempDir()
	p := startKeyed(t, dir)
	key, ctrlKey := filepath.Join(dir, "host.key"), filepath.Join(dir, "ctrl.key")
	hs, old := writeSecret(t, key), writeSecret(t, ctrlKey)
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	relCtrlKey, err := filepath.Rel(wd, ctrlKey)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctl(t, p, "add-host", keyed, keyedHost, "--dhchap-ctrl-secret-file", ctrlKey); err == nil || !strings.Contains(err.Error(), "needs the host's key file") {
		t.Fatalf("--dhchap-ctrl-secret-file alone: %v", err)
	}
	mustCtl(t, p, "add-host", keyed, keyedHost, "--dhchap-secret-file", key, "--dhchap-ctrl-secret-file", relCtrlKey)

	connect := func(when string, ctrl *dhchap.Secret, want error) {
		t.Helper()
		c, err := connectKeyed(t, p, keyed, keyedHost, hs, initiator.WithDHCHAPControllerSecret(ctrl))
		if !errors.Is(err, want) {
			t.Fatalf("%s: %v, want %v", when, err, want)
		}
		if err != nil {
			if want == dhchap.ErrControllerNotAuthenticated && !strings.Contains(err.Error(), "did not prove") {
				t.Fatalf("%s: %v does not say the target did not prove itself", when, err)
			}
			return
		}
		n, err := c.Namespace(context.Background(), 1)
		if err != nil {
			t.Fatal(err)
		}
		data := bytes.Repeat([]byte(when), 4096/len(when)+1)[:4096]
		got := make([]byte, len(data))
		if _, err := n.WriteAt(data, 0); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if _, err := n.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s: read back: %v (equal %v)", when, err, bytes.Equal(got, data))
		}
		c.Close()
	}
	connect("bidirectionally", old, nil)
	connect("with another controller secret", newSecret(t), dhchap.ErrControllerNotAuthenticated)

	replaced := writeSecret(t, ctrlKey)
	reloadKeys(t, p)
	connect("with the controller secret before SIGHUP", old, dhchap.ErrControllerNotAuthenticated)
	connect("with the controller secret read on SIGHUP", replaced, nil)

	p.Stop(t)
	log := p.Log()
	p = startTarget(t, dir, "--log-level", "info")
	connect("after a restart", replaced, nil)
	connect("after a restart, with the controller secret before", old, dhchap.ErrControllerNotAuthenticated)
	log += p.Log()
	if !strings.Contains(log, "bidirectional=true") {
		t.Fatalf("no bidirectional authentication logged:\n%s", log)
	}
	for _, s := range []*dhchap.Secret{hs, old, replaced} {
		if strings.Contains(log, s.Encode()[10:40]) {
			t.Fatal("a secret is in the target's log")
		}
	}
}

// The subsystem the key file tests create, and the host they allow on it.
const keyed, keyedHost = "nqn.2026-11.io.nprdma:keyed", "nqn.2026-11.io.nprdma:keyed-host"

// startKeyed starts a target in dir (logging at info) and creates keyed
// with a 4 MiB namespace through ctl.
func startKeyed(t *testing.T, dir string) *targettest.Proc {
	t.Helper()
	p := startTarget(t, dir, "--log-level", "info")
	mustCtl(t, p, "create-subsys", keyed)
	mustCtl(t, p, "create-ns", keyed, "--name", "k", "--size", "4MiB")
	return p
}

func newSecret(t *testing.T) *dhchap.Secret {
	t.Helper()
	s, err := dhchap.GenerateSecret(dhchap.HashSHA256, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// writeSecret writes a new secret to path, owner-only as the target
// requires, and returns it.
func writeSecret(t *testing.T, path string) *dhchap.Secret {
	t.Helper()
	s := newSecret(t)
	if err := os.WriteFile(path, []byte(s.Encode()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

// reloadKeys sends p SIGHUP and waits until it logs that it read the
// management API's key files again.
func reloadKeys(t *testing.T, p *targettest.Proc) {
	t.Helper()
	const reloaded = "management API's DH-HMAC-CHAP key files reloaded"
	before := strings.Count(p.Log(), reloaded)
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(p.Log(), reloaded) == before {
		if time.Now().After(deadline) {
			t.Fatalf("no reload logged:\n%s", p.Log())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// connectKeyed connects host to sub on p over the nprdma fabric, with s
// its DH-HMAC-CHAP secret (nil: none) and opts.
func connectKeyed(t *testing.T, p *targettest.Proc, sub, host string, s *dhchap.Secret, opts ...initiator.Option) (*initiator.Controller, error) {
	t.Helper()
	dev := nprdma.NewDevice(tcp.New(), nprdma.WithPinning(false))
	t.Cleanup(func() { dev.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	opts = append([]initiator.Option{initiator.WithIOQueues(1), initiator.WithHostNQN(host),
		initiator.WithStateFile(filepath.Join(t.TempDir(), "hostid")), initiator.WithControllerLossTimeout(time.Second),
		initiator.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)
	if s != nil {
		opts = append(opts, initiator.WithDHCHAPSecret(s))
	}
	c, err := initiator.Connect(ctx, dev, p.Addr, sub, opts...)
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}
