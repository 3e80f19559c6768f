package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"text/tabwriter"
	"time"

	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/initiator/attach"
	"github.com/nprdma/nprdma/internal/command"
	"github.com/nprdma/nprdma/internal/providers"
	"github.com/nprdma/nprdma/nvme"
	nvmetcp "github.com/nprdma/nprdma/nvme/tcp"
	"github.com/urfave/cli/v2"
)

func discoverCommand() *cli.Command {
	return &cli.Command{
		Name:  "discover",
		Usage: "list the subsystems and namespaces a target offers this host",
		Description: "Connects to the target's discovery controller, reads the Discovery log page (the subsystems\n" +
			"this host may access), then connects to each subsystem to list its namespaces.\n" +
			"Each subsystem shows the NVMe-oF transport type the target advertises (rdma: nprdma speaks the\n" +
			"NVMe-oF RDMA binding, also when the RDMA is software over TCP; loop for the in-process provider and\n" +
			"for a shared-memory listener, whose address is unix:PATH: attach uses it from this host; tcp: NVMe/TCP)\n" +
			"and, over the nprdma fabric, the nprdma provider this host reached it with (--provider), for which\n" +
			"the log has no field.\n" +
			"With --transport tcp, the discovery controller is at --target (port 8009 when none is given) and\n" +
			"each subsystem is listed at the address and port its log entry gives.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "target", Aliases: []string{"t"}, Required: true, Usage: "target address, host:port (e.g. 127.0.0.1:4420; with --transport tcp the port defaults to 8009), or unix:PATH, a target's shared-memory socket on this host (--transport nprdma)"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON instead of a table"},
			&cli.DurationFlag{Name: "timeout", Value: 10 * time.Second, Usage: "give up after this long"},
		},
		Action: discover,
	}
}

// Discovery is what discover prints (--json).
type Discovery struct {
	Target     string                `json:"target"`
	HostNQN    string                `json:"host_nqn"`
	Subsystems []DiscoveredSubsystem `json:"subsystems"`
}

// DiscoveredSubsystem is one subsystem of the discovery log.
type DiscoveredSubsystem struct {
	NQN string `json:"nqn"`
	// Transport is the NVMe-oF transport type (TRTYPE) the target
	// advertises: "rdma" for the RDMA binding even when the RDMA is nprdma's
	// software RDMA over TCP, because a host must speak the RDMA binding,
	// not NVMe/TCP, to it.
	Transport string `json:"transport"`
	// Provider is the nprdma provider this host reached the target with
	// (--provider): what carries the RDMA. The discovery log has no field
	// for it; a provider other than the target's would not have got this
	// far. Empty over NVMe/TCP.
	Provider   string                `json:"provider,omitempty"`
	Address    string                `json:"address"`
	Service    string                `json:"service,omitempty"`
	Namespaces []DiscoveredNamespace `json:"namespaces"`
	Error      string                `json:"error,omitempty"`
}

// DiscoveredNamespace is one namespace of a subsystem.
type DiscoveredNamespace struct {
	NSID      uint32 `json:"nsid"`
	Size      int64  `json:"size_bytes"`
	BlockSize int    `json:"block_size"`
	NGUID     string `json:"nguid"`
	UUID      string `json:"uuid,omitempty"`
	OneSided  bool   `json:"one_sided_reads"`
}

func transportName(t uint8) string {
	switch t {
	case nvme.TransportRDMA:
		return "rdma"
	case nvme.TransportTCP:
		return "tcp"
	case nvme.TransportLoop:
		return "loop"
	}
	return fmt.Sprintf("trtype-%d", t)
}

func discover(cc *cli.Context) error {
	logger, err := command.Logger(cc)
	if err != nil {
		return err
	}
	secrets, err := secretOptions(cc)
	if err != nil {
		return err
	}
	opts := append(hostOptions(cc, logger), secrets...)
	addr := targetAddr(cc, nvmetcp.DiscoveryPort)
	tr, release, err := newTransport(cc, addr)
	if err != nil {
		return err
	}
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), cc.Duration("timeout"))
	defer cancel()
	log, err := initiator.DiscoverOver(ctx, tr, addr, opts...)
	if err != nil {
		return err
	}
	provider := ""
	if tr.String() == "nprdma" {
		provider = providers.For(cc.String("provider"), addr)
	}
	host, err := initiator.HostNQN(opts...)
	if err != nil {
		return err
	}
	out := Discovery{Target: addr, HostNQN: host, Subsystems: []DiscoveredSubsystem{}}
	for _, e := range log.Entries {
		if e.SUBTYPE != nvme.SubtypeNVM {
			continue // a referral, or the discovery subsystem itself (nvmet lists it)
		}
		s := DiscoveredSubsystem{NQN: e.SubNQN, Transport: transportName(e.TRTYPE), Provider: provider,
			Address: e.TRADDR, Service: e.TRSVCID, Namespaces: []DiscoveredNamespace{}}
		if err := listNamespaces(ctx, tr, subsystemAddr(tr, addr, e), &s, opts); err != nil {
			s.Error = err.Error()
		}
		out.Subsystems = append(out.Subsystems, s)
	}
	if cc.Bool("json") {
		enc := json.NewEncoder(cc.App.Writer)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	printDiscovery(cc.App.Writer, out)
	return nil
}

// subsystemAddr is where discover connects to the subsystem of log entry
// e, found through the discovery controller at addr. An nprdma-target
// serves its subsystems where it serves discovery, and its log carries its
// own idea of its address (it may listen on a wildcard): connect where
// discovery worked. An NVMe/TCP discovery controller (port 8009) names
// the I/O controllers' port; a wildcard or empty address in the entry
// means the discovery controller's host.
func subsystemAddr(tr initiator.Transport, addr string, e nvme.DiscoveryLogEntry) string {
	if tr.String() != "tcp" || e.TRTYPE != nvme.TransportTCP || e.TRSVCID == "" {
		return addr
	}
	host := e.TRADDR
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host, _, _ = net.SplitHostPort(addr)
	}
	return net.JoinHostPort(host, e.TRSVCID)
}

func listNamespaces(ctx context.Context, tr initiator.Transport, addr string, s *DiscoveredSubsystem, opts []initiator.Option) error {
	c, err := initiator.ConnectOver(ctx, tr, addr, s.NQN, append(opts, initiator.WithIOQueues(1), initiator.WithQueueDepth(4))...)
	if err != nil {
		return err
	}
	defer c.Close()
	ids, err := c.NamespaceIDs(ctx)
	if err != nil {
		return err
	}
	for _, id := range ids {
		n, err := c.Namespace(ctx, id)
		if err != nil {
			return err
		}
		desc, err := n.RegionDescriptor(ctx)
		if err != nil {
			return err
		}
		g := n.NGUID()
		ns := DiscoveredNamespace{NSID: id, Size: n.Size(), BlockSize: n.BlockSize(), NGUID: fmt.Sprintf("%x", g[:]), OneSided: desc != nil}
		if u := n.UUID(); u != (nvme.UUID{}) {
			ns.UUID = u.String()
		}
		s.Namespaces = append(s.Namespaces, ns)
	}
	return nil
}

func printDiscovery(w io.Writer, d Discovery) {
	fmt.Fprintf(w, "target %s, host %s: %d subsystem(s)\n", d.Target, d.HostNQN, len(d.Subsystems))
	for _, s := range d.Subsystems {
		addr := s.Address
		if s.Service != "" {
			addr += ":" + s.Service
		}
		if s.Provider != "" {
			fmt.Fprintf(w, "\nsubsystem %s at %s (NVMe-oF transport %s, nprdma provider %s)\n", s.NQN, addr, s.Transport, s.Provider)
		} else {
			fmt.Fprintf(w, "\nsubsystem %s at %s (NVMe-oF transport %s)\n", s.NQN, addr, s.Transport)
		}
		if s.Error != "" {
			fmt.Fprintf(w, "  error: %s\n", s.Error)
			continue
		}
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  NSID\tSIZE\tBLOCK\tNGUID\tONE-SIDED")
		for _, n := range s.Namespaces {
			fmt.Fprintf(tw, "  %d\t%s\t%d\t%s\t%v\n", n.NSID, attach.HumanSize(n.Size), n.BlockSize, n.NGUID, n.OneSided)
		}
		tw.Flush()
	}
}
