package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/nprdma/tcp"
	"github.com/nprdma/nprdma/target"
	"github.com/urfave/cli/v2"
)

// startNVMeTCPTarget serves subsystem a (host allowed, one 2 MiB namespace)
// and b (another host only) on the nprdma fabric, an NVMe/TCP port and an
// NVMe/TCP discovery port.
func startNVMeTCPTarget(t *testing.T, host string) *target.Target {
	t.Helper()
	tg, err := target.New(target.WithProvider(tcp.New()), target.WithListen("127.0.0.1:0"),
		target.WithListenNVMeTCP("127.0.0.1:0"), target.WithListenNVMeTCPDiscovery("127.0.0.1:0"),
		target.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	for _, s := range []target.SubsystemConfig{{NQN: subA, AllowHosts: []string{host}}, {NQN: subB, AllowHosts: []string{"nqn.2024-01.io.nprdma:someone-else"}}} {
		sub, err := tg.AddSubsystem(s)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "ns.img")
		if err := blockdev.Create(path, 2<<20); err != nil {
			t.Fatal(err)
		}
		dev, err := blockdev.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sub.AddNamespace(target.NamespaceConfig{Backing: dev}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tg.Start(); err != nil {
		t.Fatal(err)
	}
	return tg
}

// TestDiscoverOverNVMeTCP: discover --transport tcp at the discovery port
// lists the allowed subsystem at the NVMe/TCP port its entry names, with
// its namespace and no nprdma provider; digests are asked for and granted.
func TestDiscoverOverNVMeTCP(t *testing.T) {
	host := "nqn.2024-01.io.nprdma:test-host"
	tg := startNVMeTCPTarget(t, host)
	t.Setenv("NPRDMA_STATE_DIR", t.TempDir())
	var d Discovery
	out := runApp(t, "--hostnqn", host, "--transport", "tcp", "--hdr-digest", "--data-digest", "discover", "--target", tg.NVMeTCPDiscoveryAddr(), "--json")
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if len(d.Subsystems) != 1 {
		t.Fatalf("discover lists %+v, want subsystem a only", d.Subsystems)
	}
	s := d.Subsystems[0]
	if s.NQN != subA || s.Transport != "tcp" || s.Provider != "" || s.Error != "" || s.Address+":"+s.Service != tg.NVMeTCPAddr() ||
		len(s.Namespaces) != 1 || s.Namespaces[0].Size != 2<<20 || s.Namespaces[0].OneSided {
		t.Fatalf("discover lists %+v, want %s at %s with one 2 MiB namespace, two-sided", s, subA, tg.NVMeTCPAddr())
	}
	text := runApp(t, "--hostnqn", host, "--transport", "tcp", "discover", "--target", tg.NVMeTCPDiscoveryAddr())
	if want := "subsystem " + subA + " at " + tg.NVMeTCPAddr() + " (NVMe-oF transport tcp)\n"; !strings.Contains(text, want) {
		t.Errorf("discover output lacks %q:\n%s", want, text)
	}
}

// TestTransportFlags: the flags of one transport are refused with the
// other, an unknown transport is named, and with --transport tcp a target
// without a port gets NVMe/TCP's conventional one.
func TestTransportFlags(t *testing.T) {
	t.Setenv("NPRDMA_STATE_DIR", t.TempDir())
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--transport", "tcp", "--provider", "loop"}, "--provider is for --transport nprdma"},
		{[]string{"--hdr-digest"}, "are for --transport tcp"},
		{[]string{"--transport", "rdma"}, `--transport "rdma": want nprdma or tcp`},
	} {
		a := newApp()
		a.Writer, a.ErrWriter = io.Discard, io.Discard
		err := a.Run(append(append([]string{"nprdma-initiator"}, tc.args...), "discover", "--target", "127.0.0.1:1"))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error saying %q", tc.args, err, tc.want)
		}
	}
	for _, tc := range []struct {
		transport, target string
		port              int
		want              string
	}{
		{"tcp", "10.1.2.3", 4420, "10.1.2.3:4420"},
		{"tcp", "::1", 8009, "[::1]:8009"},
		{"tcp", "10.1.2.3:4421", 4420, "10.1.2.3:4421"},
		{"nprdma", "10.1.2.3", 4420, "10.1.2.3"},
	} {
		var got string
		a := &cli.App{Flags: []cli.Flag{&cli.StringFlag{Name: "transport"}, &cli.StringFlag{Name: "target"}},
			Action: func(cc *cli.Context) error { got = targetAddr(cc, tc.port); return nil }}
		if err := a.Run([]string{"x", "--transport", tc.transport, "--target", tc.target}); err != nil || got != tc.want {
			t.Errorf("--transport %s --target %s: %q %v, want %q", tc.transport, tc.target, got, err, tc.want)
		}
	}
}

// TestAttachNBDOverNVMeTCP attaches a namespace over NVMe/TCP (with
// digests) in NBD socket mode: bytes written with nbdcopy come back.
func TestAttachNBDOverNVMeTCP(t *testing.T) {
	if _, err := exec.LookPath("nbdcopy"); err != nil {
		t.Skip("nbdcopy not installed (libnbd-bin)")
	}
	host := "nqn.2024-01.io.nprdma:test-host"
	tg := startNVMeTCPTarget(t, host)
	t.Setenv("NPRDMA_STATE_DIR", t.TempDir())
	sock := filepath.Join(t.TempDir(), "ns.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		a := newApp()
		a.Writer, a.ErrWriter = io.Discard, io.Discard
		done <- a.RunContext(ctx, []string{"nprdma-initiator", "--hostnqn", host, "--transport", "tcp", "--hdr-digest", "--data-digest",
			"attach", "--target", tg.NVMeTCPAddr(), "--nqn", subA, "--socket", sock, "--io-queues", "2"})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("attach: %v", err)
		}
	}()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("attach did not create its socket")
		}
	}
	uri := "nbd+unix:///?socket=" + sock
	src, back := filepath.Join(t.TempDir(), "src"), filepath.Join(t.TempDir(), "back")
	data := bytes.Repeat([]byte("over NVMe/TCP "), 2<<20/14+1)[:2<<20]
	os.WriteFile(src, data, 0o644)
	if out, err := exec.Command("nbdcopy", "--flush", src, uri).CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy into the export: %s %v", out, err)
	}
	if out, err := exec.Command("nbdcopy", uri, back).CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy out of the export: %s %v", out, err)
	}
	if got, _ := os.ReadFile(back); !bytes.Equal(got, data) {
		t.Fatal("bytes written through NBD over NVMe/TCP did not come back")
	}
}
