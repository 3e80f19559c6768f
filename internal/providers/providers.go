// Package providers is the choice of an nprdma provider by name, as the
// commands' --provider flag makes it (nprdma-target, nprdma-initiator).
package providers

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nprdma/shm"
	"github.com/nprdma/nprdma/nprdma/tcp"
)

// The names --provider takes. Auto is not a provider: a command resolves
// it (For) before opening one.
const (
	Auto = "auto"
	TCP  = "tcp"  // software RDMA over TCP (nprdma/tcp)
	SHM  = "shm"  // shared memory on this host (nprdma/shm)
	Loop = "loop" // in-process, for tests (nprdma/loop)
)

// Names are the --provider names a command takes, in the order its errors
// list them.
type Names []string

// Fabric is what --provider chose: a software provider, on which the
// command makes its own device.
type Fabric struct {
	Provider nprdma.Provider // tcp, shm, loop
}

// Open opens the provider called name, which must be one of ns: a new
// software provider.
func (ns Names) Open(name string) (Fabric, error) {
	if !slices.Contains(ns, name) {
		return Fabric{}, fmt.Errorf("--provider %q: want %s", name, ns)
	}
	switch name {
	case TCP:
		return Fabric{Provider: tcp.New()}, nil
	case SHM:
		return Fabric{Provider: shm.New()}, nil
	case Loop:
		return Fabric{Provider: loop.New()}, nil
	}
	return Fabric{}, fmt.Errorf("--provider %q: resolve it first (For)", name)
}

// String lists ns as a sentence does: "tcp, shm or loop".
func (ns Names) String() string {
	if len(ns) < 2 {
		return strings.Join(ns, "")
	}
	return strings.Join(ns[:len(ns)-1], ", ") + " or " + ns[len(ns)-1]
}

// For is the provider name means for the address addr: auto is shm for an
// address "unix:PATH" (shm.Scheme), tcp for the rest; other names mean
// themselves.
func For(name, addr string) string {
	if name != Auto {
		return name
	}
	if strings.HasPrefix(addr, shm.Scheme) {
		return SHM
	}
	return TCP
}
