package main

import (
	"context"

	"github.com/nprdma/nprdma/target/manage"
	"github.com/urfave/cli/v2"
)

func ctlDeleteSubsys() *cli.Command {
	return &cli.Command{
		Name:      "delete-subsys",
		Usage:     "delete a subsystem created with create-subsys",
		ArgsUsage: "NQN",
		Description: "Deletes a subsystem (method nvmf_delete_subsystem). Its namespaces must be deleted first (in use); one\n" +
			"the target's configuration (--nqn, --config) serves is refused (configured: change the configuration).\n" +
			"While hosts are connected it is refused naming them, unless --force, which disconnects them.",
		Flags: []cli.Flag{&cli.BoolFlag{Name: "force", Usage: "disconnect the hosts connected to it instead of refusing"}},
		Action: func(cc *cli.Context) error {
			if err := ctlArgs(cc, "NQN"); err != nil {
				return err
			}
			p := manage.DeleteSubsystemParams{NQN: cc.Args().First(), Force: cc.Bool("force")}
			return ctlRun(cc, func(ctx context.Context, c *manage.Client) (any, error) {
				return true, c.DeleteSubsystem(ctx, p)
			})
		},
	}
}
