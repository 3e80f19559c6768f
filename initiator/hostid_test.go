package initiator

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nprdma/nprdma/nvme"
)

func TestHostIDPersists(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "hostid")
	a, err := LoadOrCreateHostID(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadOrCreateHostID(path)
	if err != nil || a != b || a == (nvme.UUID{}) {
		t.Fatalf("host ID not kept: %v %v %v", a, b, err)
	}
	nqn, err := HostNQN(WithStateFile(path))
	if err != nil || nqn != nvme.HostNQNFromUUID(a) {
		t.Fatalf("default host NQN %q %v", nqn, err)
	}
	if nqn, _ := HostNQN(WithStateFile(path), WithHostNQN("nqn.2024-01.io.nprdma:given")); nqn != "nqn.2024-01.io.nprdma:given" {
		t.Fatalf("WithHostNQN ignored: %q", nqn)
	}
	os.WriteFile(path, []byte("not a uuid\n"), 0o644)
	if _, err := LoadOrCreateHostID(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("corrupt host ID file: %v", err)
	}
	if _, err := HostNQN(WithStateFile(filepath.Join(t.TempDir(), "h")), WithHostNQN("bad nqn")); err == nil {
		t.Fatal("invalid host NQN accepted")
	}
}
