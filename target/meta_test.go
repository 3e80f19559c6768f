package target

import (
	"log/slog"
	"testing"
)

func TestMetaStorePersistsIdentityAndShutdownState(t *testing.T) {
	dir := t.TempDir()
	m, err := openMeta(dir, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	prev, err := m.markRunning()
	if err != nil || prev != PreviousRunNone {
		t.Fatalf("first start: previous run %v, err %v; want %v", prev, err, PreviousRunNone)
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

	m, err = openMeta(dir, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer m.close()
	prev, err = m.markRunning()
	if err != nil || prev != PreviousRunClean {
		t.Fatalf("after clean shutdown: previous run %v, err %v; want %v", prev, err, PreviousRunClean)
	}
	// The marker is consumed: without a clean shutdown in between, a store
	// that holds records reads as a crash.
	if prev, _ = m.markRunning(); prev != PreviousRunUnclean {
		t.Fatalf("marker not consumed: previous run %v, want %v", prev, PreviousRunUnclean)
	}
	got, ok, err := m.namespace(ns.SubNQN, 1)
	if err != nil || !ok || got.NGUID != ns.NGUID || got.UUID != ns.UUID || got.Backing != "/x" {
		t.Fatalf("namespace = %+v ok=%v err=%v", got, ok, err)
	}
	if _, ok, _ := m.namespace(ns.SubNQN, 2); ok {
		t.Fatal("nsid 2 must not exist")
	}
	s, ok, err := m.subsystem(sub.NQN)
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
	start := func(want PreviousRun) *Target {
		t.Helper()
		tg, err := New(WithDataDir(dir), WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		if got := tg.PreviousRun(); got != want {
			t.Fatalf("previous run %v, want %v", got, want)
		}
		return tg
	}
	tg := start(PreviousRunNone)
	if _, err := tg.AddSubsystem(SubsystemConfig{NQN: "nqn.2026-11.io.nprdma:failed", AllowAnyHost: true}); err != nil {
		t.Fatal(err)
	}
	tg.Close() // as the CLI does when a later step of its start fails
	tg = start(PreviousRunClean)
	// A crash: the process dies without closing anything.
	tg.closeMeta()
	tg.dev.Close()
	tg = start(PreviousRunUnclean)
	tg.Close()
	tg = start(PreviousRunUnclean) // the failed start did not hide the crash
	tg.Shutdown(t.Context())
	tg = start(PreviousRunClean)
	tg.accepted.Store(true) // served: Close without a drain is not clean
	tg.Close()
	start(PreviousRunUnclean).Close()
}
