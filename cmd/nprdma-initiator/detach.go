package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
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
		if err := detachOne(cc, dir, rec); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func detachOne(cc *cli.Context, dir *attach.Dir, rec attach.Record) error {
	say := func(format string, args ...any) {
		fmt.Fprintf(cc.App.ErrWriter, "nprdma-initiator: "+format+"\n", args...)
	}
	proc := rec.Process()
	if !proc.Alive() {
		notes, err := dir.Reap(rec, cc.Bool("force"))
		if err != nil {
			return fmt.Errorf("detach %s: its process (pid %d) is gone, and cleaning up after it failed: %w", rec.Name, rec.PID, err)
		}
		say("%s was not running (pid %d is gone); removed its record%s", rec.Name, rec.PID, joinNotes(notes))
		return nil
	}
	force := cc.Bool("force")
	if rec.Device != "" && !force {
		mounts, err := attach.MountPointsOf(rec.Device)
		if err != nil {
			return fmt.Errorf("detach %s: checking whether %s is mounted: %w", rec.Name, rec.Device, err)
		}
		if len(mounts) > 0 {
			return fmt.Errorf("detach %s: %s is mounted at %s; unmount it first (umount %s), or detach --force to unmount it (lazily if busy)",
				rec.Name, rec.Device, strings.Join(mounts, ", "), mounts[len(mounts)-1])
		}
	}
	sig := syscall.SIGTERM
	if force {
		sig = syscall.SIGUSR1
	}
	// The process writes its final record here before it exits: the only
	// word of a loss (or change) its teardown finds a moment before it
	// removes its record. Without one, the last record seen says most.
	outcome, err := dir.ExpectOutcome(rec.Name)
	if err != nil {
		say("%v; the outcome is judged from its record alone", err)
	}
	defer outcome.Close()
	attempts := rec.DetachAttempts
	if err := proc.Signal(sig); err != nil {
		if errors.Is(err, attach.ErrProcessGone) {
			return detachOne(cc, dir, rec) // exited meanwhile: clean up
		}
		return fmt.Errorf("detach %s: %w", rec.Name, err)
	}
	final := rec // the last record seen
	deadline := time.Now().Add(cc.Duration("timeout"))
	for proc.Alive() {
		cur, err := dir.Load(rec.Name)
		if err == nil && cur.PID == rec.PID && cur.Dead() {
			final = cur
		}
		if err == nil && cur.PID == rec.PID && cur.DetachAttempts > attempts {
			return fmt.Errorf("detach %s: the attach process (pid %d) refused: %s", rec.Name, rec.PID, cur.DetachError)
		}
		if time.Now().After(deadline) {
			where := "its output"
			if rec.LogFile != "" {
				where = rec.LogFile
			}
			return fmt.Errorf("detach %s: pid %d is still tearing down after %v; see %s", rec.Name, rec.PID, cc.Duration("timeout"), where)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if out, ok := outcome.Read(); ok && out.Process() == rec.Process() {
		final = out
	}
	// The attach process removes its record after a clean teardown; one
	// that is left says the teardown failed.
	cur, err := dir.Load(rec.Name)
	if errors.Is(err, os.ErrNotExist) || (err == nil && cur.PID != rec.PID) {
		if final.Dead() {
			// Its teardown fails when it leaves acknowledged writes
			// unflushed: it succeeded, so nothing was lost.
			say("detached %s (%s); %s", rec.Name, rec.Use(), final.DetachedDead())
			return nil
		}
		say("detached %s (%s)", rec.Name, rec.Use())
		return nil
	}
	if err != nil {
		return fmt.Errorf("detach %s: %w", rec.Name, err)
	}
	notes, rerr := dir.Reap(cur, cc.Bool("force"))
	msg := fmt.Sprintf("detach %s: the attach process exited with an error: %s", rec.Name, cur.DetachError)
	if len(notes) > 0 {
		msg += "; cleaned up after it" + joinNotes(notes)
	}
	if rerr != nil {
		msg += "; cleaning up: " + rerr.Error()
	}
	return errors.New(msg)
}

func joinNotes(notes []string) string {
	if len(notes) == 0 {
		return ""
	}
	return ", " + strings.Join(notes, ", ")
}
