package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func requireNBDTools(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"nbdkit", "nbdcopy"} {
		if _, err := FindTool(tool); err != nil {
			t.Skipf("skipping: %v", err)
		}
	}
}

// nbdcopy copies between an NBD URI and stdin/stdout.
func nbdcopy(t *testing.T, stdin []byte, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nbdcopy", args...)
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("nbdcopy %v: %v: %s", args, err, errb.String())
	}
	return out.Bytes()
}

func processGone(pid int) bool {
	return syscall.Kill(pid, 0) == syscall.ESRCH
}

func TestNBDKitProxyChainCarriesData(t *testing.T) {
	requireNBDTools(t)
	ctx := context.Background()
	upstream, err := StartNBDKit(ctx, "memory", []string{"size=4M"}, WithLoopbackTCP())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { upstream.Stop() })
	if !strings.HasPrefix(upstream.URI, "nbd://127.0.0.1:") || upstream.Socket != "" {
		t.Fatalf("TCP server URI %q socket %q", upstream.URI, upstream.Socket)
	}
	proxy, err := StartNBDKitProxy(ctx, upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Stop() })
	if !strings.HasPrefix(proxy.URI, "nbd+unix:///?socket=") || proxy.Socket == "" {
		t.Fatalf("proxy URI %q", proxy.URI)
	}

	// Write 4 MiB of random bytes through the proxy, read them back from
	// the upstream server directly.
	data := make([]byte, 4<<20)
	rand.Read(data)
	nbdcopy(t, data, "-", proxy.URI)
	got := nbdcopy(t, nil, upstream.URI, "-")
	if !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes through the chain, differing from the %d written", len(got), len(data))
	}

	// Stop ends exactly the process we started and frees its resources.
	pid, sock := proxy.PID, proxy.Socket
	if err := proxy.Stop(); err != nil {
		t.Fatal(err)
	}
	if !proxy.Exited() || !processGone(pid) {
		t.Fatalf("nbdkit %d still running after Stop", pid)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket %s left behind: %v", sock, err)
	}
	if err := proxy.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	upstream.Stop()
	if c, err := net.DialTimeout("tcp", upstream.Addr, time.Second); err == nil {
		c.Close()
		t.Fatalf("%s still accepts connections after Stop", upstream.Addr)
	}
}

func TestNBDKitUnixProxyAndExplicitSocket(t *testing.T) {
	requireNBDTools(t)
	ctx := context.Background()
	sock := t.TempDir() + "/up.sock"
	upstream, err := StartNBDKit(ctx, "pattern", []string{"size=1M"}, WithUnixSocket(sock), WithNBDKitFlags("-r"))
	if err != nil {
		t.Fatal(err)
	}
	defer upstream.Stop()
	if upstream.Socket != sock {
		t.Fatalf("socket %q, want %q", upstream.Socket, sock)
	}
	proxy, err := StartNBDKitProxy(ctx, upstream, WithLoopbackTCP())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Stop()
	// The pattern plugin writes each 8-byte offset, big-endian, at itself.
	got := nbdcopy(t, nil, proxy.URI, "-")
	if len(got) != 1<<20 || !bytes.Equal(got[8:16], []byte{0, 0, 0, 0, 0, 0, 0, 8}) {
		t.Fatalf("pattern through a TCP proxy of a unix server: %d bytes, word 1 = %x", len(got), got[8:16])
	}
	upstream.Stop()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("explicit socket %s left behind after Stop: %v", sock, err)
	}
}

func TestNBDKitStartErrors(t *testing.T) {
	requireNBDTools(t)
	_, err := StartNBDKit(context.Background(), "no-such-plugin-xyz", nil)
	if err == nil || !strings.Contains(err.Error(), "exited before accepting connections") {
		t.Fatalf("unknown plugin: %v", err)
	}
	t.Setenv("PATH", t.TempDir())
	if _, err := StartNBDKit(context.Background(), "memory", []string{"size=1M"}); err == nil || !strings.Contains(err.Error(), "apt-get install nbdkit") {
		t.Fatalf("missing nbdkit: %v", err)
	}
}

func TestNBDKitStopsWithContext(t *testing.T) {
	requireNBDTools(t)
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := StartNBDKit(ctx, "memory", []string{"size=1M"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	cancel()
	deadline := time.Now().Add(10 * time.Second)
	for !srv.Exited() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !srv.Exited() || !processGone(srv.PID) {
		t.Fatal("nbdkit still running after its context was cancelled")
	}
}
