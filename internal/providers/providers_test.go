package providers_test

import (
	"testing"

	"github.com/nprdma/nprdma/internal/providers"
)

func TestOpen(t *testing.T) {
	ns := providers.Names{providers.Auto, providers.TCP, providers.SHM, providers.Loop}
	for _, name := range []string{"tcp", "shm", "loop"} {
		f, err := ns.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		if f.Provider == nil || f.Provider.Name() != name {
			t.Errorf("Open(%q): %+v, want the software provider %s", name, f, name)
		}
	}
	for _, c := range []struct {
		ns   providers.Names
		name string
		want string
	}{
		{ns, "rdma", `--provider "rdma": want auto, tcp, shm or loop`},
		// a provider the command does not offer
		{providers.Names{"tcp", "loop"}, "shm", `--provider "shm": want tcp or loop`},
		// auto is resolved by the command first, never a provider itself
		{ns, "auto", `--provider "auto": resolve it first (For)`},
	} {
		if _, err := c.ns.Open(c.name); err == nil || err.Error() != c.want {
			t.Errorf("Open(%q) of %v: %v, want %q", c.name, c.ns, err, c.want)
		}
	}
}

func TestFor(t *testing.T) {
	for _, c := range []struct{ name, addr, want string }{
		{"auto", "unix:/run/nprdma/target.sock", "shm"},
		{"auto", "127.0.0.1:4420", "tcp"},
		{"auto", "[::1]:4420", "tcp"},
		{"tcp", "unix:/run/x.sock", "tcp"},
		{"loop", "name", "loop"},
	} {
		if got := providers.For(c.name, c.addr); got != c.want {
			t.Errorf("For(%q, %q) = %q, want %q", c.name, c.addr, got, c.want)
		}
	}
}
