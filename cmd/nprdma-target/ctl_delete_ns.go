package main

import (
	"context"

	"github.com/nprdma/nprdma/target/manage"
	"github.com/urfave/cli/v2"
)

func ctlDeleteNS() *cli.Command {
	return &cli.Command{
		Name:      "delete-ns",
		Usage:     "delete a namespace created with create-ns",
		ArgsUsage: "NQN NSID",
		Description: "Deletes the namespace (method nvmf_subsystem_remove_ns): its record, then the namespace (its region keys\n" +
			"revoked at once, commands naming it answered Invalid Namespace, those running finished, flushed and\n" +
			"closed), then its backing file if the target created it. While hosts are connected to the subsystem it\n" +
			"is refused naming them (in use), unless --force, which fences them off this namespace and leaves them\n" +
			"the others. A namespace of the target's configuration is refused (configured).",
		Flags: []cli.Flag{&cli.BoolFlag{Name: "force", Usage: "fence connected hosts off the namespace instead of refusing"}},
		Action: func(cc *cli.Context) error {
			nqn, nsid, err := nsArgs(cc)
			if err != nil {
				return err
			}
			p := manage.RemoveNamespaceParams{NQN: nqn, NSID: nsid, Force: cc.Bool("force")}
			return ctlRun(cc, func(ctx context.Context, c *manage.Client) (any, error) {
				return true, c.RemoveNamespace(ctx, p)
			})
		},
	}
}
