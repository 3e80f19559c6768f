package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/nprdma/nprdma/initiator/attach"
	"github.com/urfave/cli/v2"
)

func listCommand() *cli.Command {
	return &cli.Command{
		Name:  "list",
		Usage: "show what is attached: name, mode, state (attached, lost, namespace-changed), device or NBD URI, target, namespace, process",
		Description: "Reads the attachment records of the run directory (creating nothing). STATE is starting,\n" +
			"attached, lost (the target stayed unreachable past the controller-loss timeout, or refused this host)\n" +
			"or namespace-changed (the target, restarted, serves another namespace under the NSID: another size or\n" +
			"NGUID, or none). In the last two the attachment's I/O fails with EIO; a line under the table says since\n" +
			"when and why. An attachment that had writes or trims acknowledged and not flushed when the target\n" +
			"restarted without a clean shutdown (crash, kill) serves on, but a line under the table says how many\n" +
			"may be lost (JSON: possibly_lost, possibly_lost_bytes, possibly_lost_since); detach then fails naming them.\n" +
			"A record whose attach process is gone (killed, crashed) is dropped, saying so, after\n" +
			"cleaning up what it left (dead FUSE mount, stale socket, kernel device); one whose device waits for the next\n" +
			"attach of its name (ublk: the device outlives its process, its I/O held) is listed as orphaned instead.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print a JSON array of the attachment records instead of a table"},
			runDirFlag(),
		},
		Action: listAction,
	}
}

func listAction(cc *cli.Context) error {
	dir, err := attach.DirAt(cc.String("run-dir"))
	if err != nil {
		return err
	}
	live := dir.Attached(sayer(cc))
	if cc.Bool("json") {
		enc := json.NewEncoder(cc.App.Writer)
		enc.SetIndent("", "  ")
		return enc.Encode(live)
	}
	printAttachments(cc.App.Writer, live, time.Now())
	return nil
}

func printAttachments(w io.Writer, recs []attach.Record, now time.Time) {
	if len(recs) == 0 {
		fmt.Fprintln(w, "nothing is attached")
		return
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tMODE\tSTATE\tUSE\tTARGET\tSUBSYSTEM\tNSID\tSIZE\tPID\tUP")
	var dead []attach.Record
	for _, r := range recs {
		use := r.Use()
		if use == "" {
			use = "-"
		}
		switch {
		case r.DetachError != "" && r.DetachAttempts > 0:
			use += " (detach refused: " + r.DetachError + ")"
		case r.DetachError != "":
			use += " (detach failed: " + r.DetachError + ")"
		}
		if r.Dead() {
			dead = append(dead, r)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", r.Name, r.Mode, r.State, use, r.Target, r.NQN, r.NSID,
			attach.HumanSize(r.Size), strconv.Itoa(r.PID), now.Sub(r.Started).Truncate(time.Second))
	}
	tw.Flush()
	for _, r := range dead {
		fmt.Fprintf(w, "%s: %s since %s (%s ago); its I/O fails with EIO: %s\n", r.Name, r.DeadCause(),
			r.LostSince.Local().Format(time.DateTime), now.Sub(r.LostSince).Truncate(time.Second), r.LostReason)
	}
	for _, r := range recs {
		if r.State == attach.StateOrphaned {
			fmt.Fprintf(w, "%s: its attach process (pid %d) is gone; %s waits for it, its I/O held: attach again with --name %s to resume it, or detach %s to remove it\n",
				r.Name, r.PID, r.Device, r.Name, r.Name)
		}
	}
	for _, r := range recs {
		if r.PossiblyLost > 0 {
			fmt.Fprintf(w, "%s: %s it had acknowledged may be lost: they were not flushed when the target restarted without a clean shutdown (last at %s)\n",
				r.Name, attach.Changes(r.PossiblyLost, r.PossiblyLostBytes), r.PossiblyLostSince.Local().Format(time.DateTime))
		}
	}
}
