package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/nprdma/nprdma/initiator/attach"
	"github.com/urfave/cli/v2"
)

func detachCommand() *cli.Command {
	return &cli.Command{
		Name:      "detach",
		Usage:     "tear down attachments: stop their attach process, which flushes, unbinds and disconnects",
		UsageText: "nprdma-initiator detach [--force] NAME|/dev/loopN|SOCKET|URI ... | --all",
		Description: "Sends the attach process SIGTERM and waits until it has torn everything down (the loop device,\n" +
			"the FUSE mount, the socket, the connection to the target) and exited. While the loop device of an\n" +
			"attachment is mounted, detach refuses and names the mount point; --force has the attach process\n" +
			"unmount it first (lazily if busy: the filesystem disappears from view at once and its open files\n" +
			"fail) and abort FUSE users, by sending SIGUSR1 instead. An attachment whose process is gone is\n" +
			"cleaned up (dead FUSE mount, stale socket) and its record removed. An attachment whose controller\n" +
			"is lost, or whose namespace changed on the target (see list), also when its teardown is what finds\n" +
			"it, is detached like the others and says so; detach fails only if the namespace had acknowledged\n" +
			"writes or trims that no flush covered, which may be lost, and says how many. It fails likewise, naming\n" +
			"them, if such writes were outstanding when the target restarted without a clean shutdown (a crash or\n" +
			"kill of nprdma-target): the attachment reconnected and went on, but they may be lost.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "all", Aliases: []string{"a"}, Usage: "detach every attachment"},
			&cli.BoolFlag{Name: "force", Aliases: []string{"f"}, Usage: "unmount a mounted loop device (lazily if busy) and abort users of the FUSE file instead of refusing"},
			&cli.DurationFlag{Name: "timeout", Value: 90 * time.Second, Usage: "how long to wait for an attach process to finish its teardown"},
			runDirFlag(),
		},
		Action: detachAction,
	}
}

func detachAction(cc *cli.Context) error {
	dir, err := attach.DirAt(cc.String("run-dir"))
	if err != nil {
		return err
	}
	var recs []attach.Record
	switch {
	case cc.Bool("all") && cc.NArg() > 0:
		return errors.New("detach: give names or --all, not both")
	case cc.Bool("all"):
		if recs, err = dir.List(); err != nil {
			fmt.Fprintf(cc.App.ErrWriter, "nprdma-initiator: %v\n", err)
		}
		if len(recs) == 0 {
			fmt.Fprintln(cc.App.ErrWriter, "nprdma-initiator: nothing is attached")
			return nil
		}
	case cc.NArg() == 0:
		return errors.New("detach: name an attachment (NAME, /dev/loopN, socket or URI; see list), or --all")
	}
	var errs []error
	// A name that matches nothing is an error, but the others are still
	// detached (docs/attach.md).
	for _, arg := range cc.Args().Slice() {
		rec, err := dir.Find(arg)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		recs = append(recs, rec)
	}
	for _, rec := range recs {
		if err := dir.Detach(rec, cc.Bool("force"), cc.Duration("timeout"), sayer(cc)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
