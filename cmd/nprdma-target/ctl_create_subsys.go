package main

import (
	"context"

	"github.com/nprdma/nprdma/target/manage"
	"github.com/urfave/cli/v2"
)

func ctlCreateSubsys() *cli.Command {
	return &cli.Command{
		Name:      "create-subsys",
		Usage:     "create a subsystem",
		ArgsUsage: "NQN",
		Description: "Creates a subsystem (method nvmf_create_subsystem) that hosts connect to by NQN. Hosts not allowed are\n" +
			"refused at Connect (deny by default): give --host, add them later with add-host, or --allow-any-host.\n" +
			"A subsystem that exists already is refused (exists), as are an NQN that is not one and the discovery NQN.",
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "host", Usage: "a host NQN allowed to connect (repeatable)"},
			&cli.BoolFlag{Name: "allow-any-host", Usage: "let every host connect (no access control; excludes --host)"},
		},
		Action: func(cc *cli.Context) error {
			if err := ctlArgs(cc, "NQN"); err != nil {
				return err
			}
			p := manage.CreateSubsystemParams{NQN: cc.Args().First(), Hosts: cc.StringSlice("host"), AllowAnyHost: cc.Bool("allow-any-host")}
			return ctlRun(cc, func(ctx context.Context, c *manage.Client) (any, error) { return c.CreateSubsystem(ctx, p) })
		},
	}
}
