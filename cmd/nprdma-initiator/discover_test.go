package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/nprdma/nprdma/nvme"
)

// TestDiscoverShowsTransportAndProvider: over nprdma/tcp the target
// advertises the NVMe-oF RDMA transport (TRTYPE 1, the binding nprdma
// speaks) and discover prints it together with the provider that carried
// it, so "rdma" is not mistaken for hardware RDMA.
func TestDiscoverShowsTransportAndProvider(t *testing.T) {
	host := "nqn.2024-01.io.nprdma:test-host"
	addr := startTarget(t, host)
	t.Setenv("NPRDMA_STATE_DIR", t.TempDir())
	text := runApp(t, "--hostnqn", host, "--provider", "tcp", "discover", "--target", addr)
	want := "subsystem " + subA + " at " + addr + " (NVMe-oF transport rdma, nprdma provider tcp)"
	if !strings.Contains(text, want) {
		t.Errorf("discover output lacks %q:\n%s", want, text)
	}
	var d Discovery
	if err := json.Unmarshal([]byte(runApp(t, "--hostnqn", host, "--provider", "tcp", "discover", "--target", addr, "--json")), &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Subsystems) != 1 || d.Subsystems[0].Transport != "rdma" || d.Subsystems[0].Provider != "tcp" {
		t.Fatalf("discover --json: %+v", d.Subsystems)
	}
}

func TestTransportName(t *testing.T) {
	for trtype, want := range map[uint8]string{
		nvme.TransportRDMA: "rdma", nvme.TransportTCP: "tcp", nvme.TransportLoop: "loop", nvme.TransportFC: "trtype-2",
	} {
		if got := transportName(trtype); got != want {
			t.Errorf("transportName(%d) = %q, want %q", trtype, got, want)
		}
	}
}

func TestPrintDiscoveryWithoutService(t *testing.T) {
	var out bytes.Buffer
	printDiscovery(&out, Discovery{Target: "x", HostNQN: "h", Subsystems: []DiscoveredSubsystem{
		{NQN: "nqn.a", Transport: "loop", Provider: "loop", Address: "target-1", Error: "refused"}}})
	for _, want := range []string{"subsystem nqn.a at target-1 (NVMe-oF transport loop, nprdma provider loop)", "error: refused"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
