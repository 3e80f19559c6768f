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

// Settings are what the commands' flags say of the providers besides the
// name (Flags, SettingsFrom).
type Settings struct {
	RDMADevice    string // --rdma-device: the RDMA NIC of verbs ("": the first)
	TCPCongestion string // --tcp-congestion: tcp's congestion control ("": the system's)
}

// Flags are --rdma-device and --tcp-congestion.
func Flags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "rdma-device", Usage: "with --provider verbs: the RDMA device to use (ibv_devices lists them; default: the first)"},
		&cli.StringFlag{Name: "tcp-congestion", Usage: "with --provider tcp: the TCP congestion control of the fabric's connections, e.g. cubic or reno " +
			"(default: the system's, net.ipv4.tcp_congestion_control); where that is bbr, its pacing can hold a connection's large transfers to two thirds of what reno moves (docs/nprdma.md §10.2)"},
	}
}

// SettingsFrom reads the Settings from a command's Flags.
func SettingsFrom(c *cli.Context) Settings {
	return Settings{RDMADevice: c.String("rdma-device"), TCPCongestion: c.String("tcp-congestion")}
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
// the RDMA NIC s.RDMADevice names as a device with opts, for the others a
// new software provider (opts are for the device the command makes on it).
func (ns Names) Open(name string, s Settings, opts ...nprdma.DeviceOption) (Fabric, error) {
	if !slices.Contains(ns, name) {
		return Fabric{}, fmt.Errorf("--provider %q: want %s", name, ns)
	}
	switch name {
	case TCP:
		return Fabric{Provider: tcp.New(tcp.WithCongestionControl(s.TCPCongestion))}, nil
	case SHM:
		return Fabric{Provider: shm.New()}, nil
	case Loop:
		return Fabric{Provider: loop.New()}, nil
	case Verbs:
		dev, err := verbs.OpenDevice(s.RDMADevice, opts...)
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
