package attach

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"
)

// Detach has the attach process of rec tear its attachment down and waits
// for it to exit, at most timeout: SIGTERM, or with force SIGUSR1 (the
// process unmounts a mounted device, lazily if busy, and aborts FUSE users
// first). Without force a mounted device is refused before the process is
// told anything. A record whose process is gone is reaped (Reap). What was
// done goes to say; the error says why the attachment is not detached
// cleanly: the process refused, had not finished by timeout, or its teardown
// failed (acknowledged writes or trims that no flush covered), with what was
// cleaned up after it.
func (d *Dir) Detach(rec Record, force bool, timeout time.Duration, say func(string)) error {
	sayf := func(format string, args ...any) { say(fmt.Sprintf(format, args...)) }
	proc := rec.Process()
	if !proc.Alive() {
		notes, err := d.Reap(rec, force)
		if err != nil {
			return fmt.Errorf("detach %s: its process (pid %d) is gone, and cleaning up after it failed: %w", rec.Name, rec.PID, err)
		}
		sayf("%s was not running (pid %d is gone); removed its record%s", rec.Name, rec.PID, joinNotes(notes))
		return nil
	}
	if rec.Device != "" && !force {
		mounts, err := MountPointsOf(rec.Device)
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
	outcome, err := d.ExpectOutcome(rec.Name)
	if err != nil {
		sayf("%v; the outcome is judged from its record alone", err)
	}
	defer outcome.Close()
	attempts := rec.DetachAttempts
	if err := proc.Signal(sig); err != nil {
		if errors.Is(err, ErrProcessGone) {
			return d.Detach(rec, force, timeout, say) // exited meanwhile: clean up
		}
		return fmt.Errorf("detach %s: %w", rec.Name, err)
	}
	final := rec // the last record seen
	deadline := time.Now().Add(timeout)
	for proc.Alive() {
		cur, err := d.Load(rec.Name)
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
			return fmt.Errorf("detach %s: pid %d is still tearing down after %v; see %s", rec.Name, rec.PID, timeout, where)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if out, ok := outcome.Read(); ok && out.Process() == rec.Process() {
		final = out
	}
	// The attach process removes its record after a clean teardown; one
	// that is left says the teardown failed.
	cur, err := d.Load(rec.Name)
	if errors.Is(err, os.ErrNotExist) || (err == nil && cur.PID != rec.PID) {
		if final.Dead() {
			// Its teardown fails when it leaves acknowledged writes
			// unflushed: it succeeded, so nothing was lost.
			sayf("detached %s (%s); %s", rec.Name, rec.Use(), final.DetachedDead())
			return nil
		}
		sayf("detached %s (%s)", rec.Name, rec.Use())
		return nil
	}
	if err != nil {
		return fmt.Errorf("detach %s: %w", rec.Name, err)
	}
	notes, rerr := d.Reap(cur, force)
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
