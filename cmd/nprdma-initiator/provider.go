package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/internal/providers"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/shm"
	"github.com/nprdma/nprdma/nprdma/tcp"
	"github.com/nprdma/nprdma/nvme"
	"github.com/urfave/cli/v2"
)

// providerNames are the names --provider takes: the provider a command
// reaches the target with over the nprdma fabric (--transport nprdma). auto
// is shm for an address "unix:PATH" and tcp for the rest (providers.For).
// attach goes further with auto: for a target on this host that advertises
// a shared-memory listener for the subsystem in its discovery log, it
// attaches over shm (see chooseTransport). NVMe/TCP (--transport tcp) has
// no provider.
var providerNames = providers.Names{providers.Auto, providers.TCP, providers.SHM, providers.Verbs, providers.Loop}

func providerFlag() cli.Flag {
	return &cli.StringFlag{Name: "provider", Value: providers.Auto, Usage: "nprdma provider, only with --transport nprdma: auto (attach: shm when the target is on this host and offers it, else tcp; " +
		"other commands: shm for unix:PATH addresses, else tcp), tcp (software RDMA over TCP), shm (shared memory, same host), verbs (an RDMA NIC through rdma-core: " +
		"ConnectX, Soft-RoCE; the target by an IP address of the fabric, e.g. 192.168.1.5:4420; also reaches stock NVMe/RDMA targets such as Linux's nvmet-rdma) or loop (in-process; for tests only)"}
}

// newDevice opens the initiator's device: the RDMA NIC --rdma-device names
// with --provider verbs, else a software NIC on the provider --provider
// names for addr.
func newDevice(cc *cli.Context, addr string) (*nprdma.Device, error) {
	f, err := providerNames.Open(providers.For(cc.String("provider"), addr), providers.SettingsFrom(cc), nprdma.WithName("initiator"))
	if err != nil {
		return nil, err
	}
	if f.Device != nil {
		return f.Device, nil
	}
	return openDevice(f.Provider), nil
}

// openDevice opens the initiator's device on p. Pinning the host's data
// buffers needs CAP_IPC_LOCK or a memlock limit; the software providers do
// not need it.
func openDevice(p nprdma.Provider) *nprdma.Device {
	return nprdma.NewDevice(p, nprdma.WithName("initiator"), nprdma.WithPinning(false))
}

// transportChoice is how attach reaches the target: the transport, what
// releases it, the address, and why (said to the user).
type transportChoice struct {
	tr      initiator.Transport
	release func()
	addr    string
	reason  string
}

// overFabric is the choice of the nprdma fabric on dev.
func overFabric(dev *nprdma.Device, addr, reason string) transportChoice {
	return transportChoice{tr: initiator.NPRDMA(dev), release: func() { dev.Close() }, addr: addr, reason: reason}
}

// chooseTransport picks the transport and, over the nprdma fabric, the
// provider for attach. NVMe/TCP, and an explicit --provider, are used as
// given, except --provider shm, which needs the target's shared-memory
// address: from addr if it is one, else from its discovery log. With auto,
// a target on this host (its address is one of this host's) that
// advertises a shared-memory listener for nqn, whose socket exists here, is
// attached over shm; anything else over tcp, with the reason.
func chooseTransport(ctx context.Context, cc *cli.Context, addr, nqn string, opts []initiator.Option) (transportChoice, error) {
	name := cc.String("provider")
	if cc.String("transport") != "nprdma" || strings.HasPrefix(addr, shm.Scheme) || (name != providers.Auto && name != providers.SHM) {
		tr, release, err := newTransport(cc, addr)
		return transportChoice{tr: tr, release: release, addr: addr}, err
	}
	if err := checkTransportFlags(cc); err != nil {
		return transportChoice{}, err
	}
	shmAddr, why := sharedMemoryAddr(ctx, addr, nqn, opts)
	if shmAddr == "" {
		if name == providers.SHM {
			return transportChoice{}, fmt.Errorf("--provider shm: %s", why)
		}
		return overFabric(openDevice(tcp.New()), addr, "provider tcp: "+why), nil
	}
	return overFabric(openDevice(shm.New()), shmAddr,
		fmt.Sprintf("provider shm: the target is on this host and serves %s over shared memory at %s (reads run in place, without the target's CPU); --provider tcp to avoid it", nqn, shmAddr)), nil
}

// sharedMemoryAddr finds the shared-memory address the target at addr
// advertises for nqn, if the target is on this host; else "" and why not.
func sharedMemoryAddr(ctx context.Context, addr, nqn string, opts []initiator.Option) (string, string) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Sprintf("%s is not a host:port address", addr)
	}
	if !isLocalHost(ctx, host) {
		return "", fmt.Sprintf("the target %s is not on this host", addr)
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	dev := openDevice(tcp.New())
	defer dev.Close()
	log, err := initiator.Discover(dctx, dev, addr, opts...)
	if err != nil {
		return "", fmt.Sprintf("discovery at %s failed: %v", addr, err)
	}
	for _, e := range log.Entries {
		if e.SubNQN != nqn || e.TRTYPE != nvme.TransportLoop || !strings.HasPrefix(e.TRADDR, shm.Scheme) {
			continue
		}
		if fi, err := os.Stat(shm.Path(e.TRADDR)); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return e.TRADDR, ""
		}
		return "", fmt.Sprintf("the target's shared-memory socket %s is not on this host's file system", e.TRADDR)
	}
	return "", fmt.Sprintf("the target on this host offers no shared memory for %s (nprdma-target --listen unix:PATH)", nqn)
}

// isLocalHost reports whether host names this host: a loopback address or
// one of its interfaces' addresses.
func isLocalHost(ctx context.Context, host string) bool {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIPAddr(rctx, host)
	if err != nil {
		return false
	}
	ifaddrs, _ := net.InterfaceAddrs()
	for _, ip := range ips {
		if ip.IP.IsLoopback() {
			return true
		}
		for _, a := range ifaddrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip.IP) {
				return true
			}
		}
	}
	return false
}
