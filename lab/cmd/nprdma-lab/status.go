package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/nprdma/nprdma/lab"
)

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "say whether the guest lab can run here (fetches the default kernel if it is missing)",
		Action: func(cc *cli.Context) error {
			if err := lab.Available(); err != nil {
				fmt.Fprintf(cc.App.Writer, "guest lab unavailable: %v\n", err)
				cli.OsExiter(1)
				return nil
			}
			fmt.Fprintf(cc.App.Writer, "guest lab available; kernels %v; cache %s\n", lab.KernelNames(), lab.CacheDir())
			return nil
		},
	}
}
