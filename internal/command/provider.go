package command

import (
	"fmt"
	"strings"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nprdma/shm"
	"github.com/nprdma/nprdma/nprdma/tcp"
)

// The names --provider takes. Auto is not a provider: a command resolves
// it (ProviderFor) before making one.
const (
	ProviderAuto = "auto"
	ProviderTCP  = "tcp"  // software RDMA over TCP (nprdma/tcp)
	ProviderSHM  = "shm"  // shared memory on this host (nprdma/shm)
	ProviderLoop = "loop" // in-process, for tests (nprdma/loop)
)

// Providers are the --provider names a command takes, in the order its
// errors list them.
type Providers []string

// New returns a new provider called name, which must be one of ps.
func (ps Providers) New(name string) (nprdma.Provider, error) {
	for _, p := range ps {
		if p != name {
			continue
		}
		switch name {
		case ProviderTCP:
			return tcp.New(), nil
		case ProviderSHM:
			return shm.New(), nil
		case ProviderLoop:
			return loop.New(), nil
		}
	}
	return nil, fmt.Errorf("--provider %q: want %s", name, ps)
}

// String lists ps as a sentence does: "tcp, shm or loop".
func (ps Providers) String() string {
	if len(ps) < 2 {
		return strings.Join(ps, "")
	}
	return strings.Join(ps[:len(ps)-1], ", ") + " or " + ps[len(ps)-1]
}

// ProviderFor is the provider name means for the address addr: auto is shm
// for an address "unix:PATH" (shm.Scheme), tcp for the rest; other names
// mean themselves.
func ProviderFor(name, addr string) string {
	if name != ProviderAuto {
		return name
	}
	if strings.HasPrefix(addr, shm.Scheme) {
		return ProviderSHM
	}
	return ProviderTCP
}
