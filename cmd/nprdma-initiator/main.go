// Command nprdma-initiator talks to nprdma targets: it discovers what a
// target offers this host and attaches remote namespaces as local block
// devices. See docs/initiator.md.
package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nprdma/tcp"
	"github.com/nprdma/nprdma/nprdma/verbs"
	"github.com/urfave/cli/v2"
)

func main() {
	if err := newApp().Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "nprdma-initiator:", err)
		os.Exit(1)
	}
}

func newApp() *cli.App {
	return &cli.App{
		Name:  "nprdma-initiator",
		Usage: "discover nprdma targets and attach their namespaces as local block devices",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "hostnqn", Usage: "host NQN to connect as (default: nqn.2014-08.org.nvmexpress:uuid:<host ID from --hostid-file>)"},
			&cli.StringFlag{Name: "hostid-file", Usage: "file holding this host's ID, created on first use (default: $NPRDMA_STATE_DIR/hostid or ~/.config/nprdma/hostid)"},
			&cli.StringFlag{Name: "provider", Value: "tcp", Usage: "nprdma provider: tcp (software RDMA over TCP), verbs (an RDMA NIC through rdma-core; targets are then addressed by an IP address of the fabric) or loop (in-process; for tests only)"},
			&cli.StringFlag{Name: "rdma-device", Usage: "with --provider verbs: the RDMA device to use (ibv_devices lists them; default: the first)"},
			&cli.StringFlag{Name: "log-level", Value: "warn", Usage: "log level: debug, info, warn, error"},
		},
		Commands:        []*cli.Command{discoverCommand(), attachCommand(), listCommand(), detachCommand(), hostnqnCommand()},
		HideHelpCommand: true,
		// The library's default says "No help topic" and exits 3.
		CommandNotFound: func(cc *cli.Context, name string) {
			var names []string
			for _, c := range cc.App.Commands {
				names = append(names, c.Name)
			}
			fmt.Fprintf(cc.App.ErrWriter, "nprdma-initiator: unknown command %q (commands: %s; --help for more)\n", name, strings.Join(names, ", "))
			cli.OsExiter(2)
		},
	}
}

// newLogger is the log of the initiator, the NBD server and FUSE: stderr, at
// --log-level.
func newLogger(cc *cli.Context) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(cc.String("log-level"))); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", cc.String("log-level"))
	}
	return slog.New(slog.NewTextHandler(cc.App.ErrWriter, &slog.HandlerOptions{Level: l})), nil
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

func newDevice(cc *cli.Context) (*nprdma.Device, error) {
	var p nprdma.Provider
	switch name := cc.String("provider"); name {
	case "tcp":
		p = tcp.New()
	case "loop":
		p = loop.New()
	case "verbs":
		dev, err := verbs.OpenDevice(cc.String("rdma-device"), nprdma.WithName("initiator"))
		if err != nil {
			return nil, fmt.Errorf("--provider verbs: %w", err)
		}
		return dev, nil
	default:
		return nil, fmt.Errorf("--provider %q: want tcp, verbs or loop", name)
	}
	// Pinning the host's data buffers needs CAP_IPC_LOCK or a memlock
	// limit; the software providers do not need it.
	return nprdma.NewDevice(p, nprdma.WithName("initiator"), nprdma.WithPinning(false)), nil
}
