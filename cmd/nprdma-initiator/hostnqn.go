package main

import (
	"fmt"

	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/internal/command"
	"github.com/urfave/cli/v2"
)

// hostnqnCommand prints the NQN this host connects as, so that it can be put
// on a target's allow-list (nprdma-target --allow-host) before connecting.
func hostnqnCommand() *cli.Command {
	return &cli.Command{
		Name:  "hostnqn",
		Usage: "print the host NQN this machine connects as (for nprdma-target --allow-host)",
		Description: "The NQN comes from --hostnqn if given, else from the host ID in --hostid-file\n" +
			"(created on first use), so it stays the same across runs.",
		Action: func(cc *cli.Context) error {
			log, err := command.Logger(cc)
			if err != nil {
				return err
			}
			nqn, err := initiator.HostNQN(hostOptions(cc, log)...)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cc.App.Writer, nqn)
			return err
		},
	}
}
