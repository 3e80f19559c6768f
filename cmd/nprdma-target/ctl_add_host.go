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
			"left as it is, except that --dhchap-secret-file (with or without --dhchap-ctrl-secret-file) replaces its key\n" +
			"files. With --dhchap-secret-file the host must authenticate (DH-HMAC-CHAP) on every queue with the secret in\n" +
			"that file, which the target reads (a file only its owner may read, as gen-dhchap-key writes; a relative path\n" +
			"is taken from this command's directory) and reads again on SIGHUP; the path is recorded with the host, the\n" +
			"secret never. --dhchap-ctrl-secret-file, which needs --dhchap-secret-file and follows the same rules, names\n" +
			"the controller's secret for the host: the target proves itself with it when the host asks (bidirectional\n" +
			"authentication, as nvme connect --dhchap-ctrl-secret); without it a host that asks is refused.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "dhchap-secret-file", Usage: "a file with the host's DH-HMAC-CHAP secret (on the target's machine)"},
			&cli.StringFlag{Name: "dhchap-ctrl-secret-file", Usage: "a file with the controller's DH-HMAC-CHAP secret for the host, for bidirectional authentication (on the target's machine); needs --dhchap-secret-file"},
		},
		Action: func(cc *cli.Context) error {
			if err := ctlArgs(cc, "NQN", "HOSTNQN"); err != nil {
				return err
			}
			key, err := targetPath(cc.String("dhchap-secret-file"))
			if err != nil {
				return err
			}
			ctrlKey, err := targetPath(cc.String("dhchap-ctrl-secret-file"))
			if err != nil {
				return err
			}
			p := manage.HostParams{NQN: cc.Args().Get(0), Host: cc.Args().Get(1), DHCHAPKeyFile: key, DHCHAPCtrlKeyFile: ctrlKey}
			return ctlRun(cc, func(ctx context.Context, c *manage.Client) (any, error) { return true, c.AddHost(ctx, p) })
		},
	}
}

// targetPath makes absolute a path the target reads ("" stays ""): its
// working directory is not ours.
func targetPath(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	return filepath.Abs(path)
}
