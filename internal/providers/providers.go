// Package providers is the choice of an nprdma provider by name, as the
// commands' --provider flag makes it (nprdma-target, nprdma-initiator).
package providers

import (
	"fmt"
	"strings"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nprdma/shm"
	"github.com/nprdma/nprdma/nprdma/tcp"
)

// The names --provider takes. Auto is not a provider: a command resolves
// it (For) before making one.
const (
	Auto = "auto"
	TCP  = "tcp"  // software RDMA over TCP (nprdma/tcp)
	SHM  = "shm"  // shared memory on this host (nprdma/shm)
	Loop = "loop" // in-process, for tests (nprdma/loop)
)

// Names are the --provider names a command takes, in the order its errors
// list them.
type Names []string

// New returns a new provider called name, which must be one of ns.
func (ns Names) New(name string) (nprdma.Provider, error) {
	for _, n := range ns {
		if n != name {
			continue
		}
		switch name {
		case TCP:
			return tcp.New(), nil
		case SHM:
			return shm.New(), nil
		case Loop:
			return loop.New(), nil
		}
	}
	return nil, fmt.Errorf("--provider %q: want %s", name, ns)
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
