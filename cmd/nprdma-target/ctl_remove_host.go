package main

import (
	"context"

	"github.com/nprdma/nprdma/target/manage"
	"github.com/urfave/cli/v2"
)

func ctlRemoveHost() *cli.Command {
	return &cli.Command{
		Name:      "remove-host",
		Usage:     "take a host off a subsystem's allow-list and disconnect it",
		ArgsUsage: "NQN HOSTNQN",
		Description: "Removes HOSTNQN from the subsystem's allow-list (method nvmf_subsystem_remove_host) and disconnects its\n" +
			"controllers there: its queues are fenced and its region keys revoked, so nothing it held keeps working.\n" +
			"A host not on the list is refused (not found); one the configuration allows (--allow-host, the config\n" +
			"file) too (configured).",
		Action: func(cc *cli.Context) error {
			if err := ctlArgs(cc, "NQN", "HOSTNQN"); err != nil {
				return err
			}
			p := manage.HostParams{NQN: cc.Args().Get(0), Host: cc.Args().Get(1)}
			return ctlRun(cc, func(ctx context.Context, c *manage.Client) (any, error) { return true, c.RemoveHost(ctx, p) })
		},
	}
}
