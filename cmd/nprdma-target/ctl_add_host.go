package main

import (
	"context"

	"github.com/nprdma/nprdma/target/manage"
	"github.com/urfave/cli/v2"
)

func ctlAddHost() *cli.Command {
	return &cli.Command{
		Name:      "add-host",
		Usage:     "allow a host to connect to a subsystem",
		ArgsUsage: "NQN HOSTNQN",
		Description: "Adds HOSTNQN to the subsystem's allow-list (method nvmf_subsystem_add_host); a host allowed already is\n" +
			"left as it is. --dhchap-key-file is refused: this target does not authenticate hosts yet.",
		Flags: []cli.Flag{&cli.StringFlag{Name: "dhchap-key-file", Usage: "a file with the host's DH-HMAC-CHAP secret (refused until the target authenticates hosts)"}},
		Action: func(cc *cli.Context) error {
			if err := ctlArgs(cc, "NQN", "HOSTNQN"); err != nil {
				return err
			}
			p := manage.HostParams{NQN: cc.Args().Get(0), Host: cc.Args().Get(1), DHCHAPKeyFile: cc.String("dhchap-key-file")}
			return ctlRun(cc, func(ctx context.Context, c *manage.Client) (any, error) { return true, c.AddHost(ctx, p) })
		},
	}
}
