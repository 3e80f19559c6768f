package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/nprdma/nprdma/target/manage"
	"github.com/urfave/cli/v2"
)

// ctlCommand is `nprdma-target ctl`: the management API's client, one file
// per command (ctl_*.go). Every command prints its result as JSON on stdout
// (nvme-cli's -o json, SPDK's rpc.py); a refusal goes to stderr and the
// exit status is 1.
func ctlCommand() *cli.Command {
	return &cli.Command{
		Name:  "ctl",
		Usage: "change a running target: subsystems, hosts and namespaces (the management API)",
		Description: "Talks to a running nprdma-target over its management API: its unix socket (--socket, by default\n" +
			"DATA-DIR/manage.sock of --data-dir) or its TCP endpoint (--addr with --token-file). Changes take effect\n" +
			"at once, without disturbing the other namespaces; each is recorded in the target's metadata store first,\n" +
			"so a restart serves the same, and a target whose store failed refuses every change. Results are JSON.\n" +
			"Hosts connected to a namespace that is created, resized or deleted get an NVMe Namespace Attribute\n" +
			"Changed event. See docs/target.md §11.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "socket", Usage: "the target's management socket (default: DATA-DIR/" + manageSocketName + ")"},
			&cli.StringFlag{Name: "data-dir", Value: "nprdma-data", Usage: "the target's --data-dir, where its socket is unless --socket says otherwise"},
			&cli.StringFlag{Name: "addr", Usage: "the target's --manage-listen address (HOST:PORT) instead of the socket"},
			&cli.StringFlag{Name: "token-file", Usage: "the token for --addr: a file of the target's --manage-token-file content, owner-only"},
			&cli.DurationFlag{Name: "timeout", Value: manage.DefaultTimeout, Usage: "how long to wait for the target's answer"},
		},
		HideHelpCommand: true,
		Subcommands: []*cli.Command{ctlList(), ctlCreateSubsys(), ctlDeleteSubsys(), ctlAddHost(), ctlRemoveHost(),
			ctlCreateNS(), ctlResizeNS(), ctlDeleteNS()},
	}
}

// ctlClient makes the client of the target the ctl flags name, and the
// context bounding the call (--timeout).
func ctlClient(cc *cli.Context) (*manage.Client, context.Context, context.CancelFunc, error) {
	endpoint := cc.String("addr")
	if endpoint == "" {
		endpoint = cc.String("socket")
		if endpoint == "" {
			endpoint = filepath.Join(cc.String("data-dir"), manageSocketName)
		}
		endpoint = "unix:" + endpoint
	} else if cc.String("token-file") == "" {
		return nil, nil, nil, fmt.Errorf("--addr needs --token-file (the TCP endpoint refuses requests without the token)")
	}
	c, err := manage.Dial(endpoint, cc.String("token-file"))
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cc.Duration("timeout"))
	return c, ctx, cancel, nil
}

// ctlRun runs call with the client of the ctl flags and prints what it
// returns as indented JSON.
func ctlRun(cc *cli.Context, call func(context.Context, *manage.Client) (any, error)) error {
	c, ctx, cancel, err := ctlClient(cc)
	if err != nil {
		return err
	}
	defer cancel()
	defer c.Close()
	v, err := call(ctx, c)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// ctlArgs checks a command's positional arguments.
func ctlArgs(cc *cli.Context, names ...string) error {
	if cc.NArg() != len(names) {
		return fmt.Errorf("%s: want %d arguments (%v), got %d: see --help", cc.Command.Name, len(names), names, cc.NArg())
	}
	return nil
}

// nsArgs reads the NQN NSID arguments of a namespace command.
func nsArgs(cc *cli.Context) (string, uint32, error) {
	if err := ctlArgs(cc, "NQN", "NSID"); err != nil {
		return "", 0, err
	}
	nsid, err := parseNSID(cc.Args().Get(1))
	return cc.Args().Get(0), nsid, err
}

func parseNSID(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == 0 || n == 0xffffffff {
		return 0, fmt.Errorf("NSID %q is not in 1..4294967294", s)
	}
	return uint32(n), nil
}

// ctlBoolFlags are the ctl flags that take no value.
var ctlBoolFlags = map[string]bool{"--force": true, "--allow-any-host": true, "--help": true, "-h": true}

// interspersed lets a ctl command take its flags after its arguments, as
// nvme-cli's do (`ctl create-ns NQN --size 1GiB`): the command line parser
// stops at the first argument, so the arguments after the command's name
// are moved behind its flags. Other command lines are left as they are.
func interspersed(args []string) []string {
	i := slices.Index(args, "ctl")
	if i < 0 || i+1 >= len(args) {
		return args
	}
	// Past ctl's own flags to its command.
	j := i + 1
	for j < len(args) && strings.HasPrefix(args[j], "-") {
		if !strings.Contains(args[j], "=") && !ctlBoolFlags[args[j]] {
			j++
		}
		j++
	}
	if j >= len(args) {
		return args
	}
	out := slices.Clone(args[:j+1])
	var positional []string
	for k := j + 1; k < len(args); k++ {
		a := args[k]
		switch {
		case a == "--":
			positional = append(positional, args[k+1:]...)
			k = len(args)
		case strings.HasPrefix(a, "-"):
			out = append(out, a)
			if !strings.Contains(a, "=") && !ctlBoolFlags[a] && k+1 < len(args) {
				k++
				out = append(out, args[k])
			}
		default:
			positional = append(positional, a)
		}
	}
	return append(out, positional...)
}
