package main

import (
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/nprdma/nprdma/lab"
)

func shellCommand() *cli.Command {
	return &cli.Command{
		Name:  "shell",
		Usage: "boot a guest and give this terminal to a root bash in it (make lab)",
		Description: "Boots a guest as the guest tests do (same kernel, modules, shares, network), runs --script\n" +
			"if given, then opens an interactive bash on the guest's serial console.\n" +
			"Quit with exit (the guest powers off) or Ctrl-A x (QEMU quits at once).\n\n" + about,
		Flags: append(specFlags(),
			&cli.StringFlag{Name: "script", Usage: "a bash script run before the shell (set-up: exports, targets)"},
		),
		Action: func(cc *cli.Context) error {
			s, err := specFromFlags(cc)
			if err != nil {
				return err
			}
			if f := cc.String("script"); f != "" {
				b, err := os.ReadFile(f)
				if err != nil {
					return err
				}
				s.Script = string(b)
			}
			// A person ends the shell; the timeout is a day.
			s.Timeout = 24 * time.Hour
			return lab.Shell(cc.Context, s)
		},
	}
}
