package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/nvme/dhchap"
)

// The secrets' environment variables: attach --daemon hands the secrets
// to its child in them, never on its command line (which every user can
// read in the process list).
const (
	envDHCHAPSecret     = "NPRDMA_DHCHAP_SECRET"
	envDHCHAPCtrlSecret = "NPRDMA_DHCHAP_CTRL_SECRET"
)

// secretFlags are the global DH-HMAC-CHAP flags.
func secretFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "dhchap-secret", EnvVars: []string{envDHCHAPSecret}, Usage: "this host's DH-HMAC-CHAP secret (DHHC-1:hh:...:), for targets that require authentication; on the command line other users can read it in the process list: prefer --dhchap-secret-file or $" + envDHCHAPSecret},
		&cli.StringFlag{Name: "dhchap-secret-file", Usage: "file holding this host's DH-HMAC-CHAP secret (mode 0600; nprdma-target gen-dhchap-key writes one)"},
		&cli.StringFlag{Name: "dhchap-ctrl-secret", EnvVars: []string{envDHCHAPCtrlSecret}, Usage: "the controller's DH-HMAC-CHAP secret: every queue then authenticates both ways and the connection fails unless the target proves it holds this secret (needs the host's secret; prefer --dhchap-ctrl-secret-file or $" + envDHCHAPCtrlSecret + ")"},
		&cli.StringFlag{Name: "dhchap-ctrl-secret-file", Usage: "file holding the controller's DH-HMAC-CHAP secret (mode 0600)"},
	}
}

// secretOptions are the initiator options the DH-HMAC-CHAP flags select.
func secretOptions(cc *cli.Context) ([]initiator.Option, error) {
	var opts []initiator.Option
	host, err := secretFromFlags(cc, "dhchap-secret")
	if err != nil {
		return nil, err
	}
	if host != nil {
		opts = append(opts, initiator.WithDHCHAPSecret(host))
	}
	ctrl, err := secretFromFlags(cc, "dhchap-ctrl-secret")
	if err != nil {
		return nil, err
	}
	if ctrl != nil {
		if host == nil {
			return nil, fmt.Errorf("--dhchap-ctrl-secret needs --dhchap-secret too: the host authenticates first")
		}
		opts = append(opts, initiator.WithDHCHAPControllerSecret(ctrl))
	}
	return opts, nil
}

// secretFromFlags reads --NAME or --NAME-file (nil: neither). Errors never
// quote the secret.
func secretFromFlags(cc *cli.Context, name string) (*dhchap.Secret, error) {
	v, file := cc.String(name), cc.String(name+"-file")
	switch {
	case v != "" && file != "":
		return nil, fmt.Errorf("--%s and --%s-file exclude each other", name, name)
	case file != "":
		s, err := dhchap.ReadSecretFile(file)
		if err != nil {
			return nil, fmt.Errorf("--%s-file: %w", name, err)
		}
		return s, nil
	case v != "":
		s, err := dhchap.ParseSecret(v)
		if err != nil {
			return nil, fmt.Errorf("--%s: %w", name, err)
		}
		return s, nil
	}
	return nil, nil
}

// daemonSecretEnv passes the secrets given by value to attach's child.
func daemonSecretEnv(cc *cli.Context) []string {
	var env []string
	if v := cc.String("dhchap-secret"); v != "" {
		env = append(env, envDHCHAPSecret+"="+v)
	}
	if v := cc.String("dhchap-ctrl-secret"); v != "" {
		env = append(env, envDHCHAPCtrlSecret+"="+v)
	}
	return env
}
