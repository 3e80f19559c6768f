package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/nprdma/nprdma/lab"
)

func runCommand() *cli.Command {
	return &cli.Command{
		Name:      "run",
		Usage:     "boot a guest, run a bash script in it, and exit with the script's status",
		ArgsUsage: "SCRIPT (a file, or - for standard input)",
		Description: "Example: nprdma-lab run --modules nvmet-tcp,nvme-tcp script.sh\n" +
			"Prints the guest's console as it runs (--quiet: only the script's output, at the end), then\n" +
			"each step's time (guest clock, under TCG) on stderr. Exits with the script's status; if the\n" +
			"guest did not finish (no boot, timeout), with 125. Files the script wrote to $LAB_OUT are\n" +
			"left in the directory named on stderr (--keep-out) or removed.\n\n" + about,
		Flags: append(specFlags(),
			&cli.DurationFlag{Name: "timeout", Value: lab.DefaultTimeout, Usage: "the whole run, boot included"},
			&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "print only the script's output, when it ends"},
			&cli.BoolFlag{Name: "keep-out", Usage: "keep $LAB_OUT's directory and print its path"},
		),
		Action: runScript,
	}
}

func runScript(cc *cli.Context) error {
	if cc.NArg() != 1 {
		return fmt.Errorf("run: want one SCRIPT argument (a file, or - for standard input)")
	}
	s, err := specFromFlags(cc)
	if err != nil {
		return err
	}
	var script []byte
	if name := cc.Args().First(); name == "-" {
		script, err = io.ReadAll(os.Stdin)
	} else {
		script, err = os.ReadFile(name)
	}
	if err != nil {
		return err
	}
	s.Script = string(script)
	s.Timeout = cc.Duration("timeout")
	if !cc.Bool("quiet") {
		s.Log = cc.App.Writer
	}
	begin := time.Now()
	res, err := lab.Run(cc.Context, s)
	if res == nil {
		if err != nil {
			fmt.Fprintln(cc.App.ErrWriter, "nprdma-lab:", err)
		}
		cli.OsExiter(125)
		return nil
	}
	if cc.Bool("quiet") {
		fmt.Fprint(cc.App.Writer, res.Output)
	}
	w := cc.App.ErrWriter
	fmt.Fprintf(w, "lab: boot %.1fs, whole run %.1fs (this machine's clock)\n", res.Boot.Seconds(), time.Since(begin).Seconds())
	for _, st := range res.Steps {
		mark := "ok"
		if !st.OK {
			mark = "FAILED"
		}
		fmt.Fprintf(w, "lab: step %-24s %8.3fs %s\n", st.Name, st.Duration.Seconds(), mark)
	}
	if cc.Bool("keep-out") {
		fmt.Fprintln(w, "lab: $LAB_OUT is kept in", res.Dir)
	} else {
		os.RemoveAll(res.Dir)
	}
	if err != nil {
		fmt.Fprintln(w, "nprdma-lab:", err)
		cli.OsExiter(125)
		return nil
	}
	if res.ExitCode != 0 {
		fmt.Fprintf(w, "lab: script failed in step %q with status %d\n", res.FailedStep, res.ExitCode)
		cli.OsExiter(res.ExitCode)
	}
	return nil
}
