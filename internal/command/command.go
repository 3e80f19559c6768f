// Package command holds what the project's commands (nprdma-target,
// nprdma-initiator, nprdma-csi, nprdma-lab, nprdma-bench) do alike on their
// command lines: running the app, the logger of --log-level, the Prometheus
// endpoint of --metrics-addr, and size flags (internal/providers has the
// nprdma provider of --provider). What a command decides about its domain
// lives in its package (target, initiator, initiator/attach), not here.
package command

import (
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"
)

// Main runs app on args and exits 1 with "NAME: error" on stderr if it
// fails.
func Main(app *cli.App, args []string) {
	if err := app.Run(args); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", app.Name, err)
		os.Exit(1)
	}
}

// UnknownCommand is an app's CommandNotFound: it names the commands there
// are and exits 2 (the library's default says "No help topic" and exits 3).
func UnknownCommand(cc *cli.Context, name string) {
	var names []string
	for _, c := range cc.App.Commands {
		if !c.Hidden {
			names = append(names, c.Name)
		}
	}
	fmt.Fprintf(cc.App.ErrWriter, "%s: unknown command %q (commands: %s; --help for more)\n", cc.App.Name, name, strings.Join(names, ", "))
	cli.OsExiter(2)
}
