// Command nprdma-initiator talks to nprdma targets: it discovers what a
// target offers this host and attaches remote namespaces as local block
// devices. See docs/initiator.md.
package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/internal/command"
	"github.com/nprdma/nprdma/internal/providers"
	nvmetcp "github.com/nprdma/nprdma/nvme/tcp"
	"github.com/urfave/cli/v2"
)

func main() {
	command.Main(newApp(), os.Args)
}

func newApp() *cli.App {
	return &cli.App{
		Name:  "nprdma-initiator",
		Usage: "discover nprdma targets and attach their namespaces as local block devices",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "hostnqn", Usage: "host NQN to connect as (default: nqn.2014-08.org.nvmexpress:uuid:<host ID from --hostid-file>)"},
			&cli.StringFlag{Name: "hostid-file", Usage: "file holding this host's ID, created on first use (default: $NPRDMA_STATE_DIR/hostid or ~/.config/nprdma/hostid)"},
			&cli.StringFlag{Name: "transport", Value: "nprdma", Usage: "NVMe-oF transport: nprdma (the nprdma fabric, one-sided reads; an nprdma-target; its provider is --provider) or tcp (NVMe/TCP to any NVMe/TCP target, two-sided; a --target without a port means 4420, or 8009 for discover)"},
			providerFlag(),
			&cli.BoolFlag{Name: "hdr-digest", Usage: "with --transport tcp: ask the target for header digests (CRC32C of every PDU header)"},
			&cli.BoolFlag{Name: "data-digest", Usage: "with --transport tcp: ask the target for data digests (CRC32C of every PDU's data)"},
			command.LogLevelFlag("warn"),
		}, slices.Concat(providers.Flags(), secretFlags())...),
		Commands:        []*cli.Command{discoverCommand(), attachCommand(), listCommand(), detachCommand(), hostnqnCommand()},
		HideHelpCommand: true,
		CommandNotFound: command.UnknownCommand,
	}
}

// sayer tells the user msg on stderr, as "nprdma-initiator: msg".
func sayer(cc *cli.Context) func(msg string) {
	return func(msg string) { fmt.Fprintln(cc.App.ErrWriter, "nprdma-initiator: "+msg) }
}

// hostOptions are the initiator options the global flags select, logging
// to log.
func hostOptions(cc *cli.Context, log *slog.Logger) []initiator.Option {
	opts := []initiator.Option{initiator.WithLogger(log)}
	if f := cc.String("hostid-file"); f != "" {
		opts = append(opts, initiator.WithStateFile(f))
	}
	if n := cc.String("hostnqn"); n != "" {
		opts = append(opts, initiator.WithHostNQN(n))
	}
	return opts
}

// newTransport is the transport --transport selects for addr (over the
// nprdma fabric, on the provider --provider names for addr), and what
// releases it once the controllers that use it are closed.
func newTransport(cc *cli.Context, addr string) (initiator.Transport, func(), error) {
	if err := checkTransportFlags(cc); err != nil {
		return initiator.Transport{}, nil, err
	}
	if cc.String("transport") == "nprdma" {
		dev, err := newDevice(cc, addr)
		if err != nil {
			return initiator.Transport{}, nil, err
		}
		return initiator.NPRDMA(dev), func() { dev.Close() }, nil
	}
	var d nvmetcp.Digests
	if cc.Bool("hdr-digest") {
		d |= nvmetcp.HeaderDigest
	}
	if cc.Bool("data-digest") {
		d |= nvmetcp.DataDigest
	}
	return initiator.TCP(nvmetcp.WithDigests(d)), func() {}, nil
}

// checkTransportFlags refuses an unknown --transport, and the flags of one
// transport given with the other: --provider is the nprdma fabric's, the
// digests are NVMe/TCP's.
func checkTransportFlags(cc *cli.Context) error {
	switch name := cc.String("transport"); name {
	case "nprdma":
		if cc.Bool("hdr-digest") || cc.Bool("data-digest") {
			return fmt.Errorf("--hdr-digest and --data-digest are for --transport tcp")
		}
	case "tcp":
		if cc.IsSet("provider") {
			return fmt.Errorf("--provider is for --transport nprdma")
		}
	default:
		return fmt.Errorf("--transport %q: want nprdma or tcp", name)
	}
	return nil
}

// targetAddr is --target, with NVMe/TCP's conventional port when it has
// none: port for an I/O controller (4420), or the discovery port (8009).
func targetAddr(cc *cli.Context, port int) string {
	addr := cc.String("target")
	if cc.String("transport") != "tcp" {
		return addr
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return net.JoinHostPort(strings.Trim(addr, "[]"), strconv.Itoa(port))
	}
	return addr
}
