package main

import (
	"context"
	"errors"

	"github.com/nprdma/nprdma/internal/command"
	"github.com/nprdma/nprdma/target/manage"
	"github.com/urfave/cli/v2"
)

func ctlResizeNS() *cli.Command {
	return &cli.Command{
		Name:      "resize-ns",
		Usage:     "grow a namespace while it is served",
		ArgsUsage: "NQN NSID",
		Description: "Grows the namespace to --size (method nvmf_subsystem_resize_ns): the record first, then its backing (a\n" +
			"file is extended, sparse; a block device must have grown already), then its region, while hosts keep\n" +
			"using it. Connected hosts get a Namespace Attribute Changed event and see the new size in Identify\n" +
			"Namespace. Namespaces only grow: a smaller size is refused, as is one beyond its max size (until a\n" +
			"restart) or beyond what the volume directory can hold. Its DRAM budget stays as it was.",
		Flags: []cli.Flag{&cli.StringFlag{Name: "size", Usage: "the new size (e.g. 20GiB)"}},
		Action: func(cc *cli.Context) error {
			nqn, nsid, err := nsArgs(cc)
			if err != nil {
				return err
			}
			size, err := command.SizeFlag(cc, "size")
			if err != nil {
				return err
			}
			if size == 0 {
				return errors.New("resize-ns: --size is required")
			}
			p := manage.ResizeNamespaceParams{NQN: nqn, NSID: nsid, SizeBytes: size}
			return ctlRun(cc, func(ctx context.Context, c *manage.Client) (any, error) { return c.ResizeNamespace(ctx, p) })
		},
	}
}
