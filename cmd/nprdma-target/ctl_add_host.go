package main

import (
	"context"
	"path/filepath"

	"github.com/nprdma/nprdma/target/manage"
	"github.com/urfave/cli/v2"
)

func ctlAddHost() *cli.Command {
	return &cli.Command{
		Name:      "add-host",
		Usage:     "allow a host to connect to a subsystem",
		ArgsUsage: "NQN HOSTNQN",
		Description: "Adds HOSTNQN to the subsystem's allow-list (method nvmf_subsystem_add_host); a host allowed already is\n" +
			"left as it is, except that --dhchap-secret-file replaces its key file. With --dhchap-secret-file the host must\n" +
			"authenticate (DH-HMAC-CHAP) on every queue with the secret in that file, which the target reads (a file\n" +
			"only its owner may read, as gen-dhchap-key writes; a relative path is taken from this command's directory)\n" +
			"and reads again on SIGHUP; the path is recorded with the host, the secret never.",
		Flags: []cli.Flag{&cli.StringFlag{Name: "dhchap-secret-file", Usage: "a file with the host's DH-HMAC-CHAP secret (on the target's machine)"}},
		Action: func(cc *cli.Context) error {
			if err := ctlArgs(cc, "NQN", "HOSTNQN"); err != nil {
				return err
			}
			p := manage.HostParams{NQN: cc.Args().Get(0), Host: cc.Args().Get(1), DHCHAPKeyFile: cc.String("dhchap-secret-file")}
			if p.DHCHAPKeyFile != "" {
				// The target reads it, and its working directory is not ours.
				abs, err := filepath.Abs(p.DHCHAPKeyFile)
				if err != nil {
					return err
				}
				p.DHCHAPKeyFile = abs
			}
			return ctlRun(cc, func(ctx context.Context, c *manage.Client) (any, error) { return true, c.AddHost(ctx, p) })
		},
	}
}
