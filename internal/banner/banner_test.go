package banner

import (
	"strings"
	"testing"
)

func TestLinesRoundTrip(t *testing.T) {
	out := Lines("nqn.x/1 (4 GiB)", "tcp", "127.0.0.1:4420", "unpinned (NP-RDMA)", true)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines, got %q", out)
	}
	if !IsServing(lines[0]) || IsServing(lines[1]) {
		t.Fatalf("IsServing: %q", lines)
	}
	if _, ok := Addr(lines[0]); ok {
		t.Fatalf("Addr found an address in the serving line %q", lines[0])
	}
	// A log prefix in front does not hide the address.
	if addr, ok := Addr("2026/11/21 " + lines[1]); !ok || addr != "127.0.0.1:4420" {
		t.Fatalf("Addr = %q, %v", addr, ok)
	}
	if _, ok := Addr(Connect + "  "); ok {
		t.Fatal("Addr accepted an empty address")
	}
}
