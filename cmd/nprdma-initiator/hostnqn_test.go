package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/nprdma/nprdma/nvme"
)

func TestHostNQNIsStableAndValid(t *testing.T) {
	idFile := filepath.Join(t.TempDir(), "hostid")
	first := strings.TrimSpace(runApp(t, "--hostid-file", idFile, "hostnqn"))
	if err := nvme.ValidateNQN(first); err != nil {
		t.Fatalf("hostnqn printed %q: %v", first, err)
	}
	if !strings.HasPrefix(first, "nqn.2014-08.org.nvmexpress:uuid:") {
		t.Fatalf("hostnqn = %q, want the UUID form", first)
	}
	if again := strings.TrimSpace(runApp(t, "--hostid-file", idFile, "hostnqn")); again != first {
		t.Fatalf("second run printed %q, first %q: the host NQN must be stable", again, first)
	}
	const given = "nqn.2026-11.io.nprdma:host-a"
	if got := strings.TrimSpace(runApp(t, "--hostnqn", given, "hostnqn")); got != given {
		t.Fatalf("with --hostnqn: %q, want %q", got, given)
	}
}
