package target

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nvme"
)

func TestMetaStorePersistsIdentityAndShutdownState(t *testing.T) {
	dir := t.TempDir()
	m, err := openMeta(dir, 0, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	prev, unclean, err := m.markRunning()
	if err != nil || prev != PreviousRunNone || unclean != 0 {
		t.Fatalf("first start: previous run %v, %d unclean starts, err %v; want %v, 0", prev, unclean, err, PreviousRunNone)
	}
	ns := namespaceRecord{SubNQN: "nqn.2026-11.io.nprdma:a", NSID: 1, Backing: "/x", Size: 1 << 30,
		NGUID: [16]byte{1, 2, 3}, UUID: [16]byte{9, 8, 7}}
	sub := subsystemRecord{NQN: ns.SubNQN, Serial: "abc", Hosts: []string{"nqn.host"}}
	if err := m.putNamespace(ns); err != nil {
		t.Fatal(err)
	}
	if err := m.putSubsystem(sub); err != nil {
		t.Fatal(err)
	}
	if err := m.markClean(); err != nil {
		t.Fatal(err)
	}
	if err := m.close(); err != nil {
		t.Fatal(err)
	}

	m, err = openMeta(dir, 0, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer m.close()
	prev, unclean, err = m.markRunning()
	if err != nil || prev != PreviousRunClean || unclean != 0 {
		t.Fatalf("after clean shutdown: previous run %v, %d unclean starts, err %v; want %v, 0", prev, unclean, err, PreviousRunClean)
	}
	// The marker is consumed: without a clean shutdown in between, a store
	// that holds records reads as a crash, and each such start is counted.
	for want := uint64(1); want <= 2; want++ {
		if prev, unclean, _ = m.markRunning(); prev != PreviousRunUnclean || unclean != want {
			t.Fatalf("marker not consumed: previous run %v, %d unclean starts; want %v, %d", prev, unclean, PreviousRunUnclean, want)
		}
	}
	if err := m.markClean(); err != nil {
		t.Fatal(err)
	}
	if prev, unclean, _ = m.markRunning(); prev != PreviousRunClean || unclean != 2 {
		t.Fatalf("after a clean shutdown: previous run %v, %d unclean starts; want %v, 2 (kept)", prev, unclean, PreviousRunClean)
	}
	got, ok, err := m.namespace(ns.SubNQN, 1, false)
	if err != nil || !ok || got.NGUID != ns.NGUID || got.UUID != ns.UUID || got.Backing != "/x" {
		t.Fatalf("namespace = %+v ok=%v err=%v", got, ok, err)
	}
	if _, ok, _ := m.namespace(ns.SubNQN, 2, false); ok {
		t.Fatal("nsid 2 must not exist")
	}
	s, ok, err := m.subsystem(sub.NQN, false)
	if err != nil || !ok || s.Serial != "abc" || len(s.Hosts) != 1 {
		t.Fatalf("subsystem = %+v ok=%v err=%v", s, ok, err)
	}
}

// TestFailedStartKeepsPreviousRun: a target closed without ever accepting a
// connection (a start that failed) leaves the record of how the previous run
// ended as it was: a first or clean run reads as clean next time, a crash
// still as a crash. A target that accepted one is not recorded as clean by
// Close.
func TestFailedStartKeepsPreviousRun(t *testing.T) {
	dir := t.TempDir()
	boots := map[uint64]bool{}
	// Each start is another process to hosts (a new boot ID); each start
	// after a crash is counted (nvme.NPInstance).
	start := func(want PreviousRun, unclean uint64) *Target {
		t.Helper()
		tg, err := New(WithDataDir(dir), WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		if got := tg.PreviousRun(); got != want {
			t.Fatalf("previous run %v, want %v", got, want)
		}
		in := tg.Instance()
		if in.BootID == 0 || boots[in.BootID] || in.Flags&nvme.NPInstanceTracked == 0 || in.UncleanStarts != unclean {
			t.Fatalf("instance %+v: want a new boot ID, tracked, %d unclean starts", in, unclean)
		}
		boots[in.BootID] = true
		return tg
	}
	tg := start(PreviousRunNone, 0)
	if _, err := tg.AddSubsystem(SubsystemConfig{NQN: "nqn.2026-11.io.nprdma:failed", AllowAnyHost: true}); err != nil {
		t.Fatal(err)
	}
	tg.Close() // as the CLI does when a later step of its start fails
	tg = start(PreviousRunClean, 0)
	// A crash: the process dies without closing anything.
	tg.closeMeta()
	tg.dev.Close()
	tg = start(PreviousRunUnclean, 1)
	tg.Close()
	tg = start(PreviousRunUnclean, 2) // the failed start did not hide the crash
	tg.Shutdown(t.Context())
	tg = start(PreviousRunClean, 2)
	tg.accepted.Store(true) // served: Close without a drain is not clean
	tg.Close()
	start(PreviousRunUnclean, 3).Close()
}

// TestInstanceWithoutDataDir: a target without a data directory still
// reports a boot ID, but not as tracked: hosts cannot tell its clean
// restarts from crashes.
func TestInstanceWithoutDataDir(t *testing.T) {
	tg, err := New(WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	if in := tg.Instance(); in.BootID == 0 || in.Flags&nvme.NPInstanceTracked != 0 || in.UncleanStarts != 0 {
		t.Fatalf("instance %+v: want a boot ID, untracked", in)
	}
}

// TestMetaStoreFailsAtTheFirstWriteAfterItsDirectoryIsRemoved: badger
// itself would take the write into a file that no longer has a name and
// report success (and then never close); the store refuses it, says the
// directory is gone, counts it, refuses every later write and closes
// without waiting for badger.
func TestMetaStoreFailsAtTheFirstWriteAfterItsDirectoryIsRemoved(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "meta")
	m, err := openMeta(dir, 0, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	rec := namespaceRecord{SubNQN: "nqn.2026-11.io.nprdma:a", NSID: 1, Backing: "/x", Size: 1 << 30}
	if err := m.putNamespace(rec); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	rec.NSID = 2
	err = m.putNamespace(rec)
	var me *MetadataError
	if !errors.Is(err, ErrMetadataStore) || !errors.As(err, &me) || !me.Removed || me.Dir != dir {
		t.Fatalf("write into a removed directory: %v; want a MetadataError saying %s was removed", err, dir)
	}
	if f := m.failed(); f == nil || !f.Removed {
		t.Fatalf("store not latched as failed: %v", f)
	}
	if err := m.markClean(); !errors.Is(err, ErrMetadataStore) {
		t.Fatalf("marker written into a failed store: %v", err)
	}
	if n := m.writeErrors.Load(); n != 2 {
		t.Fatalf("%d write errors counted, want 2 (the failed write, the refused marker)", n)
	}
	if n, r := m.recorded.Load(), m.recordsRefused.Load(); n != 1 || r != 1 {
		t.Fatalf("records: %d written, %d refused; want 1, 1", n, r)
	}
	closed := make(chan error, 1)
	go func() { closed <- m.close() }()
	select {
	case err := <-closed:
		if err == nil || !strings.Contains(err.Error(), "left to process exit") {
			t.Fatalf("close of a failed store: %v", err)
		}
	case <-time.After(30 * time.Second): // badger's own Close never returns here
		t.Fatal("close of a failed store blocks")
	}
}

// TestMetaStoreProbeFindsAReplacedDirectory: with nothing written, the
// probe timer finds the directory replaced by another one at its path.
func TestMetaStoreProbeFindsAReplacedDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "meta")
	m, err := openMeta(dir, 5*time.Millisecond, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer m.close()
	if err := os.Rename(dir, dir+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for m.failed() == nil {
		if time.Now().After(deadline) {
			t.Fatal("the probe timer did not find the directory replaced")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if f := m.failed(); !f.Removed || m.writeErrors.Load() != 1 {
		t.Fatalf("failure %v (removed %v), %d write errors; want removed, 1", f, f.Removed, m.writeErrors.Load())
	}
}
