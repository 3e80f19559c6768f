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
	const keyed, host = "nqn.2026-11.io.nprdma:keyed", "nqn.2026-11.io.nprdma:keyed-host"
	dir := t.TempDir()
	p := startTarget(t, dir, "--log-level", "info")
	mustCtl(t, p, "create-subsys", keyed)
	mustCtl(t, p, "create-ns", keyed, "--name", "k", "--size", "4MiB")
	key := filepath.Join(dir, "host.key")
	old := writeSecret(t, key)
	mustCtl(t, p, "add-host", keyed, host, "--dhchap-secret-file", key)

	c, err := connectKeyed(t, p, keyed, host, old)
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
		if _, err := connectKeyed(t, p, keyed, host, s); !errors.Is(err, want) {
			t.Fatalf("%s: %v, want %v", when, err, want)
		}
	}
	refused("no secret", nil, initiator.ErrAuthenticationRequired)
	refused("another secret", newSecret(t), dhchap.ErrRejected)

	replaced := writeSecret(t, key)
	if err := p.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.Log(), "management API's DH-HMAC-CHAP key files reloaded") {
		if time.Now().After(deadline) {
			t.Fatalf("no reload logged:\n%s", p.Log())
		}
		time.Sleep(10 * time.Millisecond)
	}
	refused("the secret before SIGHUP", old, dhchap.ErrRejected)
	if _, err := connectKeyed(t, p, keyed, host, replaced); err != nil {
		t.Fatalf("the secret read on SIGHUP: %v", err)
	}
	readBack(n)
	c.Close()

	p.Stop(t)
	p = startTarget(t, dir, "--log-level", "info")
	refused("after a restart, no secret", nil, initiator.ErrAuthenticationRequired)
	c, err = connectKeyed(t, p, keyed, host, replaced)
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

// connectKeyed connects host to sub on p over the nprdma fabric, with s
// its DH-HMAC-CHAP secret (nil: none).
func connectKeyed(t *testing.T, p *targettest.Proc, sub, host string, s *dhchap.Secret) (*initiator.Controller, error) {
	t.Helper()
	dev := nprdma.NewDevice(tcp.New(), nprdma.WithPinning(false))
	t.Cleanup(func() { dev.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	opts := []initiator.Option{initiator.WithIOQueues(1), initiator.WithHostNQN(host),
		initiator.WithStateFile(filepath.Join(t.TempDir(), "hostid")), initiator.WithControllerLossTimeout(time.Second),
		initiator.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}
	if s != nil {
		opts = append(opts, initiator.WithDHCHAPSecret(s))
	}
	c, err := initiator.Connect(ctx, dev, p.Addr, sub, opts...)
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}
