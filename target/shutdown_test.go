package target_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/internal/promtest"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/target"
	"github.com/prometheus/client_golang/prometheus"
)

// logCounter counts the log records whose message contains a string.
type logCounter struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCounter) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.msgs = append(l.msgs, r.Message)
	l.mu.Unlock()
	return nil
}
func (l *logCounter) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCounter) WithGroup(string) slog.Handler      { return l }

func (l *logCounter) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.Contains(m, sub) {
			n++
		}
	}
	return n
}

// TestFailedMetadataStoreRefusesChangesAndKeepsServing: once the metadata
// directory is removed, the first change that needs it (allowing a host)
// fails with ErrMetadataStore and changes nothing; the metric and the
// health state show it at once, the failure is logged once; adding a
// namespace or a subsystem is refused too; the namespace keeps taking
// writes; Shutdown flushes them to the backing file and says that the
// clean-shutdown marker was not written and why.
func TestFailedMetadataStoreRefusesChangesAndKeepsServing(t *testing.T) {
	dir := t.TempDir()
	metaDir := filepath.Join(dir, "meta")
	reg := prometheus.NewRegistry()
	logs := &logCounter{}
	tg, err := target.New(target.WithProvider(loop.New(loop.WithFabric(loop.NewFabric()))), target.WithListen("meta-fail"),
		target.WithLogger(slog.New(logs)), target.WithMetrics(reg), target.WithDataDir(metaDir),
		target.WithMetadataProbeInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	sub, err := tg.AddSubsystem(target.SubsystemConfig{NQN: subNQN, AllowHosts: []string{hostNQN}})
	if err != nil {
		t.Fatal(err)
	}
	backing := filepath.Join(dir, "ns.img")
	n := addFileNamespace(t, sub, 1, backing)
	if err := tg.Start(); err != nil {
		t.Fatal(err)
	}
	if h := tg.Health(); !h.Serving || h.Metadata != nil {
		t.Fatalf("health before: %+v", h)
	}
	if promtest.Sum(t, reg, "nprdma_target_metadata_healthy") != 1 || promtest.Sum(t, reg, "nprdma_target_metadata_write_errors_total") != 0 {
		t.Fatal("metadata metrics wrong before the failure")
	}

	if err := os.RemoveAll(metaDir); err != nil {
		t.Fatal(err)
	}
	const other = "nqn.2026-11.io.nprdma:other-host"
	err = sub.AllowHost(other)
	if !errors.Is(err, target.ErrMetadataStore) || !strings.Contains(err.Error(), "was removed") {
		t.Fatalf("AllowHost with the metadata directory removed: %v, want ErrMetadataStore saying it was removed", err)
	}
	if sub.Allows(other) || len(sub.Hosts()) != 1 {
		t.Fatalf("a refused AllowHost changed the host list: %v", sub.Hosts())
	}
	if h := tg.Health(); h.Metadata == nil || !h.Metadata.Removed || !h.Serving {
		t.Fatalf("health after the first failed write: %+v", h)
	}
	if promtest.Sum(t, reg, "nprdma_target_metadata_healthy") != 0 || promtest.Sum(t, reg, "nprdma_target_metadata_write_errors_total") != 1 {
		t.Fatal("metadata metrics did not move at the first failed write")
	}

	// Block I/O goes on.
	data := bytes.Repeat([]byte("acknowledged"), 64<<10/12+1)[:64<<10]
	if _, err := n.Region().WriteAt(data, 128<<10); err != nil {
		t.Fatalf("write after the metadata store failed: %v", err)
	}
	other2 := filepath.Join(dir, "ns2.img")
	if err := blockdev.Create(other2, 1<<20); err != nil {
		t.Fatal(err)
	}
	dev2, err := blockdev.Open(other2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.AddNamespace(target.NamespaceConfig{NSID: 2, Backing: dev2}); !errors.Is(err, target.ErrMetadataStore) {
		t.Fatalf("AddNamespace with the store failed: %v", err)
	}
	dev2.Close()
	if sub.Namespace(2) != nil {
		t.Fatal("a refused AddNamespace added the namespace")
	}
	if _, err := tg.AddSubsystem(target.SubsystemConfig{NQN: subNQN + "-2"}); !errors.Is(err, target.ErrMetadataStore) || tg.Subsystem(subNQN+"-2") != nil {
		t.Fatalf("AddSubsystem with the store failed: %v", err)
	}
	if got := promtest.Sum(t, reg, "nprdma_target_metadata_write_errors_total"); got != 3 {
		t.Fatalf("%v metadata write errors counted, want 3 (host, namespace, subsystem)", got)
	}
	if c := logs.count("metadata store failed"); c != 1 {
		t.Fatalf("the failure was logged %d times, want once", c)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = tg.Shutdown(ctx)
	var se *target.ShutdownError
	if !errors.As(err, &se) {
		t.Fatalf("Shutdown with the metadata store failed: %v, want a ShutdownError", err)
	}
	if se.TimedOut || se.Marker != target.MarkerNotWritten || se.Metadata == nil || se.Refused != 3 ||
		len(se.Namespaces) != 1 || !se.Namespaces[0].Flushed {
		t.Fatalf("shutdown report %+v", se)
	}
	for _, want := range []string{"page data: every namespace (1) flushed", "clean-shutdown marker: not written (the metadata store failed)",
		"was removed or replaced", "3 refused after the store failed", "left to process exit"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("shutdown message lacks %q:\n%v", want, err)
		}
	}
	if tg.Health().Serving {
		t.Fatal("Health says serving after Shutdown")
	}
	f, err := os.ReadFile(backing)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(f[128<<10:192<<10], data) {
		t.Fatal("a write acknowledged after the metadata store failed is not on the backing file")
	}
}

func addFileNamespace(t *testing.T, sub *target.Subsystem, nsid uint32, path string) *target.Namespace {
	t.Helper()
	if err := blockdev.Create(path, 1<<20); err != nil {
		t.Fatal(err)
	}
	dev, err := blockdev.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := sub.AddNamespace(target.NamespaceConfig{NSID: nsid, Backing: dev})
	if err != nil {
		dev.Close()
		t.Fatal(err)
	}
	return n
}
