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
