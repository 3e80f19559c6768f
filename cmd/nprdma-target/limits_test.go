package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/tcp"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/target"
	"github.com/urfave/cli/v2"
)

// TestLimitFlagDefaults: each limit flag defaults to the target's own
// default, so that leaving the flag out changes nothing.
func TestLimitFlagDefaults(t *testing.T) {
	want := map[string]int{
		"max-connections": target.DefaultMaxConnections,
		"max-controllers": target.DefaultMaxControllers,
		"max-io-queues":   target.DefaultMaxIOQueues,
		"max-namespaces":  target.DefaultMaxNamespaces,
	}
	found := 0
	for _, f := range newApp().Flags {
		def, ok := want[f.Names()[0]]
		if !ok {
			continue
		}
		found++
		if v := f.(*cli.IntFlag).Value; v != def {
			t.Errorf("--%s defaults to %d, the target's default is %d", f.Names()[0], v, def)
		}
	}
	if found != len(want) {
		t.Fatalf("%d of the %d limit flags are registered", found, len(want))
	}
}

// runLimitArgs runs the command in this process with args after a base that
// would serve; it must fail before serving, so it returns the error.
func runLimitArgs(t *testing.T, args ...string) error {
	t.Helper()
	dir := t.TempDir()
	app := newApp()
	app.Writer, app.ErrWriter = io.Discard, io.Discard
	base := []string{"nprdma-target", "--gomaxprocs", "0", "--listen", "127.0.0.1:0", "--log-level", "error",
		"--data-dir", filepath.Join(dir, "data"), "--default-size", "1MiB"}
	done := make(chan error, 1)
	go func() { done <- app.Run(append(base, args...)) }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		// It is serving: end it the way an operator would.
		syscall.Kill(syscall.Getpid(), syscall.SIGINT)
		<-done
		t.Fatalf("%v: the target started", args)
		return nil
	}
}

// TestLimitFlagsRefuseOutOfRange: zero, negative and too large values are
// refused before anything is served, with an error naming the flag.
func TestLimitFlagsRefuseOutOfRange(t *testing.T) {
	for _, tc := range []struct{ flag, value, want string }{
		{"max-connections", "0", "--max-connections 0: want 1 to"},
		{"max-connections", "-1", "--max-connections -1: want 1 to"},
		{"max-controllers", "0", "--max-controllers 0: want 1 to 65519"},
		{"max-controllers", "65520", "--max-controllers 65520: want 1 to 65519"},
		{"max-io-queues", "-4", "--max-io-queues -4: want 1 to 65535"},
		{"max-io-queues", "65536", "--max-io-queues 65536: want 1 to 65535"},
		{"max-namespaces", "0", "--max-namespaces 0: want 1 to"},
		{"max-namespaces", "-2", "--max-namespaces -2: want 1 to"},
		{"max-connections", "many", "max-connections"}, // urfave's own parse error names it
	} {
		err := runLimitArgs(t, "--"+tc.flag, tc.value)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--%s %s: %v, want an error containing %q", tc.flag, tc.value, err, tc.want)
		}
	}
}

func TestLimitsFromFlags(t *testing.T) {
	vals := map[string]int{"max-connections": 3, "max-controllers": 2, "max-io-queues": 1, "max-namespaces": 1}
	ls, err := limitsFromFlags(func(name string) int { return vals[name] })
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range vals {
		if ls[name] != v {
			t.Errorf("%s = %d, want %d", name, ls[name], v)
		}
	}
	if n := len(ls.options()); n != len(vals) {
		t.Errorf("%d target options, want %d", n, len(vals))
	}
	one := namespaceSpec{Backing: "/a"}
	if err := ls.checkNamespaces([]subsystemSpec{{NQN: "a", Namespaces: []namespaceSpec{one}}}); err != nil {
		t.Errorf("one namespace under --max-namespaces 1: %v", err)
	}
	err = ls.checkNamespaces([]subsystemSpec{{NQN: "a", Namespaces: []namespaceSpec{one}}, {NQN: "b", Namespaces: []namespaceSpec{one, one}}})
	if err == nil || !strings.Contains(err.Error(), "subsystem b has 2 namespaces, more than --max-namespaces 1") {
		t.Errorf("two namespaces under --max-namespaces 1: %v", err)
	}
}

// TestMaxNamespacesRefusesStart: more --backing namespaces than
// --max-namespaces stop the command before it opens anything.
func TestMaxNamespacesRefusesStart(t *testing.T) {
	dir := t.TempDir()
	err := runLimitArgs(t, "--max-namespaces", "1",
		"--backing", filepath.Join(dir, "missing-a.img"), "--backing", filepath.Join(dir, "missing-b.img"))
	// The backings do not exist: reaching them would fail differently.
	if err == nil || !strings.Contains(err.Error(), "2 namespaces, more than --max-namespaces 1") {
		t.Fatalf("two namespaces with --max-namespaces 1: %v", err)
	}
}

// TestMaxConnectionsRefusesAQueueBeyond runs the command with
// --max-connections 3: a host with two I/O queues takes all three slots and
// works; a second host's connection is refused with the REJECT status "no
// resources", the target logs the refusal naming its limit, and the first
// host goes on reading.
func TestMaxConnectionsRefusesAQueueBeyond(t *testing.T) {
	dir := t.TempDir()
	makeBacking(t, dir, 4<<20)
	p := startTargetProc(t, append(targetArgs(dir), "--max-connections", "3")...)
	_, n, done := connectNS(t, p.addr) // admin queue + 2 I/O queues
	defer done()
	want := make([]byte, 64<<10)
	fill(want, 0, 3)
	if _, err := n.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}

	dev := nprdma.NewDevice(tcp.New(), nprdma.WithPinning(false))
	defer dev.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := initiator.Connect(ctx, dev, p.addr, testNQN, initiator.WithIOQueues(1),
		initiator.WithHostNQN("nqn.2024-01.io.nprdma:second-host"),
		initiator.WithStateFile(filepath.Join(t.TempDir(), "hostid")),
		initiator.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err == nil {
		c.Close()
		t.Fatal("a second host connected beyond --max-connections 3")
	}
	var rej *nvme.CMRejectError
	if !errors.As(err, &rej) || rej.Status != nvme.CMRejectNoResources {
		t.Fatalf("second host: %v, want a REJECT with %s", err, nvme.CMRejectNoResources)
	}
	t.Logf("refused: %v", err)

	got := make([]byte, len(want))
	if _, err := n.ReadAt(got, 0); err != nil {
		t.Fatalf("the first host after the refusal: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the first host reads back other bytes than it wrote")
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, p.output())
	}
	if out := p.output(); !strings.Contains(out, "3 queues connected, the limit") {
		t.Errorf("the target's log does not report the refusal at its limit of 3:\n%s", out)
	}
}
