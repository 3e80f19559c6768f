package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/nprdma/nprdma/lab"
)

func fetchCommand() *cli.Command {
	return &cli.Command{
		Name:  "fetch",
		Usage: "fetch the pinned kernels into the lab's cache (make deps runs it)",
		Description: "Downloads each kernel's Debian packages (pinned by version and SHA-256 in lab/kernels.go)\n" +
			"with a private apt configuration, unpacks them and indexes the modules, under\n" +
			"$NPRDMA_LAB_CACHE (default /tmp/nprdma-lab). Quick when they are cached. Guest tests fetch\n" +
			"what they need themselves; this does it ahead of time.",
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "kernel", Aliases: []string{"k"}, Value: cli.NewStringSlice(lab.KernelNames()...), Usage: "kernels to fetch"},
		},
		Action: func(cc *cli.Context) error {
			for _, k := range cc.StringSlice("kernel") {
				tree, err := lab.Fetch(cc.Context, k, cc.App.ErrWriter)
				if err != nil {
					return err
				}
				fmt.Fprintf(cc.App.Writer, "kernel %s: %s\n", k, tree)
			}
			return nil
		},
	}
}
