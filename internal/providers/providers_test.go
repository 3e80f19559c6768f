package providers_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/nprdma/nprdma/internal/providers"
	"github.com/nprdma/nprdma/nprdma/verbs"
)

func TestOpen(t *testing.T) {
	ns := providers.Names{providers.Auto, providers.TCP, providers.SHM, providers.Verbs, providers.Loop}
	for _, name := range []string{"tcp", "shm", "loop"} {
		f, err := ns.Open(name, providers.Settings{})
		if err != nil {
			t.Fatal(err)
		}
		if f.Device != nil || f.Provider == nil || f.Provider.Name() != name {
			t.Errorf("Open(%q): %+v, want the software provider %s", name, f, name)
		}
	}
	for _, c := range []struct {
		ns   providers.Names
		name string
		want string
	}{
		{ns, "rdma", `--provider "rdma": want auto, tcp, shm, verbs or loop`},
		// a provider the command does not offer
		{providers.Names{"tcp", "verbs", "loop"}, "shm", `--provider "shm": want tcp, verbs or loop`},
		// auto is resolved by the command first, never a provider itself
		{ns, "auto", `--provider "auto": resolve it first (For)`},
	} {
		if _, err := c.ns.Open(c.name, providers.Settings{}); err == nil || err.Error() != c.want {
			t.Errorf("Open(%q) of %v: %v, want %q", c.name, c.ns, err, c.want)
		}
	}
}

// TestOpenVerbsWithoutANIC: --provider verbs on a machine without an RDMA
// NIC (or a binary without verbs) fails, naming the flag and what is
// missing.
func TestOpenVerbsWithoutANIC(t *testing.T) {
	f, err := providers.Names{providers.Verbs}.Open(providers.Verbs, providers.Settings{RDMADevice: "nprdma-no-such-device"})
	if err == nil {
		f.Device.Close()
		t.Skip("this machine has an RDMA device of that name")
	}
	if !strings.HasPrefix(err.Error(), "--provider verbs: ") || !errors.Is(err, verbs.ErrUnavailable) && !strings.Contains(err.Error(), "nprdma-no-such-device") {
		t.Fatalf("verbs without the NIC: %v, want an error naming --provider verbs and what is missing", err)
	}
}

func TestFor(t *testing.T) {
	for _, c := range []struct{ name, addr, want string }{
		{"auto", "unix:/run/nprdma/target.sock", "shm"},
		{"auto", "127.0.0.1:4420", "tcp"},
		{"auto", "[::1]:4420", "tcp"},
		{"tcp", "unix:/run/x.sock", "tcp"},
		{"verbs", "192.168.1.5:4420", "verbs"},
		{"loop", "name", "loop"},
	} {
		if got := providers.For(c.name, c.addr); got != c.want {
			t.Errorf("For(%q, %q) = %q, want %q", c.name, c.addr, got, c.want)
		}
	}
}

// TestOpenTCPCongestion: --tcp-congestion reaches the tcp provider (a name
// the host lacks fails its Listen, naming it).
func TestOpenTCPCongestion(t *testing.T) {
	f, err := providers.Names{providers.TCP}.Open(providers.TCP, providers.Settings{TCPCongestion: "nprdma-no-such-cc"})
	if err != nil {
		t.Fatal(err)
	}
	if ln, err := f.Provider.Listen("127.0.0.1:0"); err == nil {
		ln.Close()
		t.Fatal("the provider listened with a congestion control that does not exist")
	} else if !strings.Contains(err.Error(), "nprdma-no-such-cc") {
		t.Fatalf("listen: %v, want an error naming the congestion control", err)
	}
}
