package main

import (
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/nprdma/nprdma/nvme/dhchap"
)

// genDHCHAPKeyCommand prints a new DH-HMAC-CHAP secret in the DHHC-1
// textual form, as `nvme gen-dhchap-key` does, or writes it to an
// owner-only key file.
func genDHCHAPKeyCommand() *cli.Command {
	return &cli.Command{
		Name:  "gen-dhchap-key",
		Usage: "print a new DH-HMAC-CHAP secret (DHHC-1:hh:...:) for a host or a controller",
		Description: "The secret is random (or --secret). --hmac names the hash its users transform it with,\n" +
			"together with their NQN, when they use it (the host NQN for a host secret, the subsystem NQN for\n" +
			"a controller secret), so the same string serves any NQN and no --nqn is taken. Give the same string\n" +
			"to the host (nvme connect --dhchap-secret, nprdma-initiator --dhchap-secret-file) and to the target\n" +
			"(a key file of mode 0600 named by --dhchap-secret-file or the config's dhchap entries).",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "hmac", Aliases: []string{"m"}, Value: 0, Usage: "hash for the transformation: 0 none, 1 SHA-256, 2 SHA-384, 3 SHA-512"},
			&cli.IntFlag{Name: "key-length", Aliases: []string{"l"}, Usage: "key bytes: 32, 48 or 64 (default: the hash's digest length, 32 for none)"},
			&cli.StringFlag{Name: "secret", Aliases: []string{"s"}, Usage: "the key in hexadecimal instead of a random one"},
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "write the secret to this new file (mode 0600) instead of printing it"},
		},
		Action: genDHCHAPKey,
	}
}

func genDHCHAPKey(cc *cli.Context) error {
	if cc.NArg() > 0 {
		return fmt.Errorf("gen-dhchap-key takes no arguments (got %q)", cc.Args().First())
	}
	h := dhchap.HashID(cc.Int("hmac"))
	if cc.Int("hmac") < 0 || cc.Int("hmac") > 3 {
		return fmt.Errorf("--hmac %d: want 0 (none), 1 (SHA-256), 2 (SHA-384) or 3 (SHA-512)", cc.Int("hmac"))
	}
	var s *dhchap.Secret
	var err error
	if hx := cc.String("secret"); hx != "" {
		key, herr := hex.DecodeString(strings.TrimSpace(hx))
		if herr != nil {
			return errors.New("--secret: not hexadecimal")
		}
		if n := cc.Int("key-length"); n != 0 && n != len(key) {
			return fmt.Errorf("--secret is %d bytes, --key-length says %d", len(key), n)
		}
		s, err = dhchap.NewSecret(key, h)
	} else {
		s, err = dhchap.GenerateSecret(h, cc.Int("key-length"), nil)
	}
	if err != nil {
		return err
	}
	if path := cc.String("output"); path != "" {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fmt.Errorf("--output: %w", err)
		}
		if _, err := fmt.Fprintln(f, s.Encode()); err != nil {
			f.Close()
			return fmt.Errorf("--output: %w", err)
		}
		return f.Close()
	}
	_, err = fmt.Fprintln(cc.App.Writer, s.Encode())
	return err
}
