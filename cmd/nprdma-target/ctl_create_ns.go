package main

import (
	"context"

	"github.com/nprdma/nprdma/internal/command"
	"github.com/nprdma/nprdma/target/manage"
	"github.com/urfave/cli/v2"
)

func ctlCreateNS() *cli.Command {
	return &cli.Command{
		Name:      "create-ns",
		Usage:     "create a namespace in a subsystem, on a new sparse file or an existing device",
		ArgsUsage: "NQN",
		Description: "Creates a namespace (method nvmf_subsystem_add_ns). Without --backing the target creates a sparse file of\n" +
			"--size in its volume directory (named NAME.img), refused when the directory cannot hold it whole; with\n" +
			"--backing it serves that device or file, all of it or --size of it (more is refused). Its DRAM budget is\n" +
			"--budget, or a quarter of the size, taken from what the other namespaces leave of the target's --memory\n" +
			"(as much as is left if less; refused below 64KiB). --max-size bounds how large resize-ns may make it while\n" +
			"the target runs (default: 4 times the size, at least 64GiB; address space only). Refused: a name or NSID\n" +
			"taken (exists), an unknown subsystem (not found), a backing in use (in use). Hosts connected to the\n" +
			"subsystem get a Namespace Attribute Changed event. Sizes take KiB, MiB, GiB, TiB.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "name", Usage: "the namespace's name, unique on the target: letters, digits, '.', '_', '-' (up to 128)"},
			&cli.UintFlag{Name: "nsid", Usage: "the namespace ID (default: the first free)"},
			&cli.StringFlag{Name: "size", Usage: "its size (e.g. 10GiB); required without --backing"},
			&cli.StringFlag{Name: "backing", Usage: "an existing block device or file to serve instead of a new file"},
			&cli.StringFlag{Name: "budget", Usage: "its DRAM budget (default: a quarter of the size, within what --memory has left)"},
			&cli.StringFlag{Name: "max-size", Usage: "how large it may grow while the target runs (default: 4x the size, at least 64GiB)"},
		},
		Action: func(cc *cli.Context) error {
			if err := ctlArgs(cc, "NQN"); err != nil {
				return err
			}
			p := manage.AddNamespaceParams{NQN: cc.Args().First(), Name: cc.String("name"), NSID: uint32(cc.Uint("nsid")), Backing: cc.String("backing")}
			var err error
			if p.SizeBytes, err = command.SizeFlag(cc, "size"); err != nil {
				return err
			}
			if p.BudgetBytes, err = command.SizeFlag(cc, "budget"); err != nil {
				return err
			}
			if p.MaxSizeBytes, err = command.SizeFlag(cc, "max-size"); err != nil {
				return err
			}
			return ctlRun(cc, func(ctx context.Context, c *manage.Client) (any, error) { return c.AddNamespace(ctx, p) })
		},
	}
}
