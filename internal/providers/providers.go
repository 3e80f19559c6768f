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
	"github.com/nprdma/nprdma/nprdma/verbs"
	"github.com/urfave/cli/v2"
)

// The names --provider takes. Auto is not a provider: a command resolves
// it (For) before opening one.
const (
	Auto  = "auto"
	TCP   = "tcp"   // software RDMA over TCP (nprdma/tcp)
	SHM   = "shm"   // shared memory on this host (nprdma/shm)
	Verbs = "verbs" // an RDMA NIC through rdma-core (nprdma/verbs)
	Loop  = "loop"  // in-process, for tests (nprdma/loop)
)

// RDMADeviceFlag is --rdma-device: which RDMA NIC --provider verbs opens.
func RDMADeviceFlag() cli.Flag {
	return &cli.StringFlag{Name: "rdma-device", Usage: "with --provider verbs: the RDMA device to use (ibv_devices lists them; default: the first)"}
}

// Names are the --provider names a command takes, in the order its errors
// list them.
type Names []string

// Fabric is what --provider chose: a software provider, on which the
// command makes its own device, or an RDMA NIC's device, open.
type Fabric struct {
	Provider nprdma.Provider // tcp, shm, loop; nil for verbs
	Device   *nprdma.Device  // verbs; nil for the others
}

// Open opens the provider called name, which must be one of ns: for verbs
// the RDMA NIC rdmaDevice names ("": the first) as a device with opts, for
// the others a new software provider (opts are for the device the command
// makes on it).
func (ns Names) Open(name, rdmaDevice string, opts ...nprdma.DeviceOption) (Fabric, error) {
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
	case Verbs:
		dev, err := verbs.OpenDevice(rdmaDevice, opts...)
		if err != nil {
			return Fabric{}, fmt.Errorf("--provider verbs: %w", err)
		}
		return Fabric{Device: dev}, nil
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
