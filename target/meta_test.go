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
	clean, err := m.markRunning()
	if err != nil || clean {
		t.Fatalf("first start: clean=%v err=%v, want false, nil", clean, err)
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
	clean, err = m.markRunning()
	if err != nil || !clean {
		t.Fatalf("after clean shutdown: clean=%v err=%v, want true, nil", clean, err)
	}
	if clean, _ = m.markRunning(); clean {
		t.Fatal("marker must be consumed by markRunning")
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
