package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/internal/logtest"
	"github.com/nprdma/nprdma/nprdma/tcp"
	"github.com/nprdma/nprdma/nprdma/verbs"
	"github.com/nprdma/nprdma/target"
	"github.com/urfave/cli/v2"
)

func TestHelpDocumentsEveryFlag(t *testing.T) {
	app := newApp()
	check := func(args []string, flags []cli.Flag) {
		t.Helper()
		var out bytes.Buffer
		a := newApp()
		a.Writer = &out
		if err := a.Run(args); err != nil {
			t.Fatal(err)
		}
		for _, f := range flags {
			for _, name := range f.Names() {
				if name == "help" || name == "h" || len(name) == 1 {
					continue
				}
				if !strings.Contains(out.String(), "--"+name) {
					t.Errorf("%v does not mention --%s", args, name)
				}
			}
		}
	}
	check([]string{"nprdma-initiator", "--help"}, app.Flags)
	for _, c := range app.Commands {
		check([]string{"nprdma-initiator", c.Name, "--help"}, c.Flags)
	}
}

// TestUnknownCommandIsAUsageError: a mistyped command names itself and the
// commands there are, and exits 2 (not the library's "No help topic", exit 3).
func TestUnknownCommandIsAUsageError(t *testing.T) {
	a := newApp()
	var errOut bytes.Buffer
	a.ErrWriter = &errOut
	code := -1
	defer func(old func(int)) { cli.OsExiter = old }(cli.OsExiter)
	cli.OsExiter = func(c int) { code = c }
	a.Run([]string{"nprdma-initiator", "atach"})
	if code != 2 || !strings.Contains(errOut.String(), `unknown command "atach"`) || !strings.Contains(errOut.String(), "attach") {
		t.Fatalf("exit %d, said %q", code, errOut.String())
	}
}

// TestProviderVerbsSaysWhatIsMissing: on a machine without rdma-core or an
// RDMA device, --provider verbs fails before it dials and names what is
// missing.
func TestProviderVerbsSaysWhatIsMissing(t *testing.T) {
	if _, err := verbs.Devices(); err == nil {
		t.Skip("this machine has an RDMA device")
	}
	a := newApp()
	a.Writer = io.Discard
	err := a.Run([]string{"nprdma-initiator", "--provider", "verbs", "discover", "--target", "127.0.0.1:1"})
	if err == nil {
		t.Fatal("discover over --provider verbs without RDMA succeeded")
	}
	msg := err.Error()
	if !strings.Contains(msg, "--provider verbs") || !errors.Is(err, verbs.ErrUnavailable) {
		t.Fatalf("--provider verbs without RDMA: %v", err)
	}
	for _, what := range []string{"no RDMA device", "libibverbs", "librdmacm", "without verbs support"} {
		if strings.Contains(msg, what) {
			return
		}
	}
	t.Fatalf("the error names nothing missing: %v", err)
}

const subA, subB = "nqn.2024-01.io.nprdma:a", "nqn.2024-01.io.nprdma:b"

// startTarget serves two subsystems: a (two namespaces, this host allowed)
// and b (another host only), with the target options opts.
func startTarget(t *testing.T, host string, opts ...target.Option) string {
	t.Helper()
	dir := t.TempDir()
	tg, err := target.New(append([]target.Option{target.WithProvider(tcp.New()), target.WithListen("127.0.0.1:0"),
		target.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	a, err := tg.AddSubsystem(target.SubsystemConfig{NQN: subA, AllowHosts: []string{host}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := tg.AddSubsystem(target.SubsystemConfig{NQN: subB, AllowHosts: []string{"nqn.2024-01.io.nprdma:someone-else"}})
	if err != nil {
		t.Fatal(err)
	}
	for i, sub := range []*target.Subsystem{a, a, b} {
		path := filepath.Join(dir, string(rune('a'+i))+".img")
		if err := blockdev.Create(path, int64(i+1)<<20); err != nil {
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
	return tg.Addr()
}

func runApp(t *testing.T, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	a := newApp()
	a.Writer = &out
	if err := a.Run(append([]string{"nprdma-initiator"}, args...)); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return out.String()
}

func TestDiscoverListsSubsystemsAndNamespaces(t *testing.T) {
	host := "nqn.2024-01.io.nprdma:test-host"
	addr := startTarget(t, host)
	t.Setenv("NPRDMA_STATE_DIR", t.TempDir())
	text := runApp(t, "--hostnqn", host, "discover", "--target", addr)
	for _, want := range []string{subA, "1 subsystem(s)", "  1  ", "  2  ", "1 MiB", "2 MiB", "true"} {
		if !strings.Contains(text, want) {
			t.Errorf("discover output lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, subB) {
		t.Errorf("discover shows a subsystem this host may not access:\n%s", text)
	}
	var d Discovery
	if err := json.Unmarshal([]byte(runApp(t, "--hostnqn", host, "discover", "--target", addr, "--json")), &d); err != nil {
		t.Fatal(err)
	}
	if d.HostNQN != host || len(d.Subsystems) != 1 || d.Subsystems[0].NQN != subA || len(d.Subsystems[0].Namespaces) != 2 {
		t.Fatalf("discover --json: %+v", d)
	}
	ns := d.Subsystems[0].Namespaces
	if ns[0].NSID != 1 || ns[0].Size != 1<<20 || ns[1].Size != 2<<20 || ns[0].BlockSize != 4096 || !ns[0].OneSided || len(ns[0].NGUID) != 32 {
		t.Fatalf("namespaces: %+v", ns)
	}
	// Another host sees nothing.
	if err := json.Unmarshal([]byte(runApp(t, "--hostnqn", "nqn.2024-01.io.nprdma:stranger", "discover", "--target", addr, "--json")), &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Subsystems) != 0 {
		t.Fatalf("a stranger discovers %+v", d.Subsystems)
	}
}

// TestAttachNBD attaches a namespace over NBD and reads it with nbdinfo and
// nbdcopy: the size is the namespace's and the bytes written through the
// socket come back.
func TestAttachNBD(t *testing.T) {
	for _, tool := range []string{"nbdinfo", "nbdcopy"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (libnbd-bin)", tool)
		}
	}
	host := "nqn.2024-01.io.nprdma:test-host"
	addr := startTarget(t, host)
	t.Setenv("NPRDMA_STATE_DIR", t.TempDir())
	sock := filepath.Join(t.TempDir(), "ns.sock")
	ctx, cancel := context.WithCancel(context.Background())
	var stderr logtest.Buffer
	done := make(chan error, 1)
	go func() {
		a := newApp()
		a.Writer, a.ErrWriter = io.Discard, &stderr
		done <- a.RunContext(ctx, []string{"nprdma-initiator", "--hostnqn", host, "attach", "--target", addr, "--nqn", subA, "--nsid", "2", "--socket", sock, "--io-queues", "2"})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("attach: %v", err)
		}
		if _, err := os.Stat(sock); err == nil {
			t.Error("socket left behind after attach ended")
		}
	}()
	uri := "nbd+unix:///?socket=" + sock
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("attach did not create its socket")
		}
		time.Sleep(10 * time.Millisecond)
	}
	out, err := exec.Command("nbdinfo", "--size", uri).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "2097152" {
		t.Fatalf("nbdinfo --size: %q %v", out, err)
	}
	src := filepath.Join(t.TempDir(), "src")
	data := bytes.Repeat([]byte("nprdma attach "), 2097152/14+1)[:2097152]
	os.WriteFile(src, data, 0o644)
	if out, err := exec.Command("nbdcopy", "--flush", src, uri).CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy into the export: %s %v", out, err)
	}
	back := filepath.Join(t.TempDir(), "back")
	if out, err := exec.Command("nbdcopy", uri, back).CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy out of the export: %s %v", out, err)
	}
	got, _ := os.ReadFile(back)
	if !bytes.Equal(got, data) {
		t.Fatal("bytes written through NBD did not come back")
	}
}
