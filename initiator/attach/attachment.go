package attach

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/initiator/blockio"
)

// Namespace is what an attachment needs of the namespace it serves
// (*initiator.Namespace): its blocks, and how its I/O may fail for good.
type Namespace interface {
	blockio.Backend
	// Unflushed counts the acknowledged writes, trims and write-zeroes no
	// successful flush covered.
	Unflushed() initiator.Unflushed
	// PossiblyLost counts those a target restart without a clean shutdown
	// may have lost; LossReported is signalled when it grows.
	PossiblyLost() initiator.Unflushed
	LossReported() <-chan struct{}
	// Changed is closed when the target serves another namespace under the
	// NSID; Change says since when and why.
	Changed() <-chan struct{}
	Change() (since time.Time, err error)
	// Resized receives when the target grew the namespace (Size says to
	// what).
	Resized() <-chan struct{}
}

// Controller is what an attachment needs of its controller
// (*initiator.Controller). Close also releases what the controller runs on.
type Controller interface {
	// Lost is closed when the controller is lost for good; Loss says since
	// when and why.
	Lost() <-chan struct{}
	Loss() (since time.Time, err error)
	HostNQN() string
	Stats() initiator.Stats
	Close() error
}

// Request asks an attachment to tear down: Force unmounts its device (lazily
// if busy) rather than refusing while it is mounted.
type Request struct {
	Force bool
	Cause string // for the log: the signal, say
}

// An Attachment is the life of one attach process: a namespace exposed
// through a frontend, and its record in the run directory. Claim it, give
// it its namespace (Connected), expose it (Expose), and Run it until a
// teardown request succeeds; Abort undoes a setup that failed.
type Attachment struct {
	dir    *Dir
	rec    Record
	resume *Record
	say    func(string)

	ctrl  Controller
	ns    Namespace
	exp   Exposure
	stats initiator.Stats // the controller's counters at teardown
}

// Claim claims rec.Name in dir (Dir.Claim) and records the attachment as
// starting. say gets the messages for the user (one line each, no prefix).
func Claim(dir *Dir, rec Record, say func(string)) (*Attachment, error) {
	rec.State = StateStarting
	resume, err := dir.Claim(rec)
	if err != nil {
		return nil, err
	}
	if say == nil {
		say = func(string) {}
	}
	return &Attachment{dir: dir, rec: rec, resume: resume, say: say}, nil
}

func (a *Attachment) sayf(format string, args ...any) { a.say(fmt.Sprintf(format, args...)) }

// Record returns the attachment's record as it is now.
func (a *Attachment) Record() Record { return a.rec }

// Resuming returns the record of the dead attach process whose device this
// one resumes (Dir.Claim), or nil.
func (a *Attachment) Resuming() *Record { return a.resume }

// Connected hands the attachment its controller and namespace: from then
// on its teardown flushes the namespace and closes the controller.
func (a *Attachment) Connected(ctrl Controller, ns Namespace) {
	a.ctrl, a.ns = ctrl, ns
	a.rec.Size, a.rec.HostNQN = ns.Size(), ctrl.HostNQN()
}

// Expose starts f over b (the namespace, possibly decorated) and records
// the attachment as attached. cfg.Name, cfg.Dir and cfg.Resume are set here.
func (a *Attachment) Expose(ctx context.Context, f Frontend, b blockio.Backend, cfg Config) error {
	cfg.Name, cfg.Dir, cfg.Resume = a.rec.Name, a.dir, a.resume
	exp, err := f.Start(ctx, b, cfg)
	if err != nil {
		return err
	}
	a.exp = exp
	exp.Fill(&a.rec)
	if a.resume != nil {
		a.rec.ResumedFrom = a.resume.PID
	}
	a.rec.State = StateAttached
	return a.dir.Save(a.rec)
}

// Abort tears down what was set up, forcibly, and removes the record: for a
// setup that failed or was interrupted.
func (a *Attachment) Abort() {
	a.tearDown(true)
	a.dir.Remove(a.rec.Name)
}

// Run serves until a teardown request succeeds (the attach process then
// exits), recording meanwhile what happens to the namespace: a controller
// lost for good or a namespace changed on the target (the attachment's I/O
// fails with EIO from then on, but it serves on until detached, so that
// clients get errors rather than a vanished device), and acknowledged
// changes a target restart may have lost. A refused request (the device is
// mounted) is recorded and Run goes on serving. ctx ending, or the exposure
// failing by itself, is a forced request. The error is the teardown's.
func (a *Attachment) Run(ctx context.Context, requests <-chan Request) error {
	lost, changed := a.ctrl.Lost(), a.ns.Changed()
	dead := func() {
		if a.noteDeath() {
			a.sayf("%s: %s; its I/O fails with EIO until it is detached: %s", a.rec.Name, a.rec.DeadCause(), a.rec.LostReason)
		}
	}
	for {
		var req Request
		select {
		case req = <-requests:
		case <-ctx.Done():
			// The embedding program is finishing: nobody is left to
			// retry a refused teardown.
			req = Request{Force: true, Cause: "context done"}
		case err := <-a.exp.Failed():
			req = Request{Force: true, Cause: err.Error()}
		case <-lost:
			lost = nil
			dead()
			continue
		case <-changed:
			changed = nil
			dead()
			continue
		case <-a.ns.LossReported():
			a.notePossiblyLost()
			continue
		case <-a.ns.Resized():
			a.noteResized()
			continue
		}
		how := "detaching"
		if req.Force {
			how = "detaching (forced)"
		}
		a.sayf("%s: %s", req.Cause, how)
		refused, err := a.tearDown(req.Force)
		if refused {
			a.rec.DetachAttempts++
			a.rec.DetachError = err.Error()
			if err := a.dir.Save(a.rec); err != nil {
				a.say(err.Error())
			}
			a.sayf("still attached: %v. Unmount it and detach again, or detach --force (SIGUSR1).", err)
			continue
		}
		a.reportStats()
		return a.finish(err)
	}
}

// finish records how the teardown ended: a failed one keeps the record
// (with the error) for list and detach to show and clean up after; a clean
// one removes it, and the log of a daemon.
func (a *Attachment) finish(terr error) error {
	if terr != nil {
		// Not a refusal (DetachAttempts): the process exits, and detach
		// must wait for that to reap the record.
		a.rec.DetachError = terr.Error()
		a.dir.Save(a.rec)
		a.tellOutcome()
		return fmt.Errorf("detach %s: %w", a.rec.Name, terr)
	}
	a.tellOutcome()
	if err := a.dir.Remove(a.rec.Name); err != nil {
		return err
	}
	if a.rec.LogFile != "" {
		os.Remove(a.rec.LogFile) // a clean run leaves nothing behind
	}
	if a.rec.Dead() {
		a.sayf("detached %s: %s", a.rec.Name, a.rec.DetachedDead())
		return nil
	}
	a.sayf("detached %s", a.rec.Name)
	return nil
}

// tearDown stops exposing, flushes and disconnects. Without force it
// refuses while the device is mounted or busy (Exposure.Detach): refused is
// then true and nothing has changed.
func (a *Attachment) tearDown(force bool) (refused bool, err error) {
	var errs []error
	if a.exp != nil {
		err := a.exp.Detach(force)
		var r *RefusedError
		if errors.As(err, &r) && !force {
			return true, err
		}
		if err != nil {
			if err := a.finalFlushError(err); err != nil {
				errs = append(errs, err)
			}
		} else if a.ns != nil {
			// Taking a device down sends no flush: writes it completed
			// may still be in the target's volatile cache.
			if err := a.ns.Flush(); err != nil {
				if err := a.finalFlushError(err); err != nil {
					errs = append(errs, fmt.Errorf("final flush: %w", err))
				}
			}
		}
		a.exp = nil
	}
	if err := a.restartLossError(); err != nil {
		errs = append(errs, err)
	}
	if a.ctrl != nil {
		a.noteDeath() // the teardown's flush may have found it
		if err := a.ctrl.Close(); err != nil && !errors.Is(err, initiator.ErrClosed) {
			errs = append(errs, err)
		}
		a.stats = a.ctrl.Stats()
		a.ctrl = nil
	}
	return false, errors.Join(errs...)
}

// finalFlushError judges a failed final flush. A controller lost for good,
// or a namespace the target no longer serves, cannot flush, but that loses
// nothing unless the namespace acknowledged writes (or trims) that no
// successful flush covered: only those may have stayed in the target's
// volatile cache. nil means nothing was lost.
func (a *Attachment) finalFlushError(err error) error {
	if a.ns == nil || (!errors.Is(err, initiator.ErrControllerLost) && !errors.Is(err, initiator.ErrNamespaceChanged)) {
		return err
	}
	u := a.ns.Unflushed()
	if u.Commands == 0 {
		a.sayf("%s: the final flush failed, but nothing acknowledged was left unflushed: %v", a.rec.Name, err)
		return nil
	}
	return fmt.Errorf("%s that the initiator acknowledged since its last successful flush could not be flushed and may be lost: %w",
		Changes(u.Commands, u.Bytes), err)
}

// restartLossError reports the changes that were unflushed when the target
// restarted without a clean shutdown (initiator.Namespace.PossiblyLost): a
// final flush on the new target process cannot vouch for them.
func (a *Attachment) restartLossError() error {
	if a.ns == nil {
		return nil
	}
	u := a.ns.PossiblyLost()
	if u.Commands == 0 {
		return nil
	}
	return fmt.Errorf("%s that the initiator acknowledged had not been flushed when the target restarted without a clean shutdown, and may be lost",
		Changes(u.Commands, u.Bytes))
}

// notePossiblyLost records what a target restart without a clean shutdown
// may have lost, for list, and says it in the log.
func (a *Attachment) notePossiblyLost() {
	u := a.ns.PossiblyLost()
	if u.Commands == a.rec.PossiblyLost {
		return
	}
	a.rec.PossiblyLost, a.rec.PossiblyLostBytes, a.rec.PossiblyLostSince = u.Commands, u.Bytes, time.Now().UTC().Truncate(time.Second)
	if err := a.dir.Save(a.rec); err != nil {
		a.say(err.Error())
	}
	a.sayf("%s: %s that it had acknowledged were not flushed when the target restarted without a clean shutdown, and may be lost; it serves on",
		a.rec.Name, Changes(u.Commands, u.Bytes))
}

// noteResized follows the namespace when the target grew it, where the
// frontend can (Resizer: the fuse mode grows its FUSE file and loop device,
// and a mounted file system can then be grown with resize2fs); elsewhere
// the device keeps its size until the next attach (an NBD export keeps the
// size its clients negotiated: NBD has no way to tell them). The record
// says the size served.
func (a *Attachment) noteResized() {
	size := a.ns.Size()
	r, ok := a.exp.(Resizer)
	if !ok {
		a.sayf("%s: the target grew the namespace to %s; %s stays %s until it is attached again", a.rec.Name, HumanSize(size), a.rec.Use(), HumanSize(a.rec.Size))
		return
	}
	if err := r.Resize(); err != nil {
		a.sayf("%s: the target grew the namespace to %s, but the device could not follow: %v", a.rec.Name, HumanSize(size), err)
		return
	}
	a.rec.Size = size
	if err := a.dir.Save(a.rec); err != nil {
		a.say(err.Error())
	}
	a.sayf("%s: the target grew the namespace: %s is %s now", a.rec.Name, a.rec.Use(), HumanSize(size))
}

// noteDeath records that the attachment's I/O fails for good, if it does
// and the record does not say so yet, so that list and detach can say since
// when and why: the namespace changed on the target, or the controller is
// lost, whichever came first. It reports whether it recorded it.
func (a *Attachment) noteDeath() bool {
	if a.rec.Dead() {
		return false
	}
	var state string
	var since time.Time
	var why error
	if a.ns != nil {
		if t, err := a.ns.Change(); err != nil {
			state, since, why = StateNamespaceChanged, t, err
		}
	}
	if a.ctrl != nil {
		if t, err := a.ctrl.Loss(); err != nil && (why == nil || t.Before(since)) {
			state, since, why = StateLost, t, err
		}
	}
	if why == nil {
		return false
	}
	a.rec.State, a.rec.LostSince, a.rec.LostReason = state, since.UTC().Truncate(time.Second), why.Error()
	if err := a.dir.Save(a.rec); err != nil {
		a.say(err.Error())
	}
	return true
}

// tellOutcome hands the final record to the detach commands waiting for
// this process to exit: the record itself is gone by then, or may have
// changed (a loss found by the teardown) after their last look.
func (a *Attachment) tellOutcome() {
	if err := a.dir.TellOutcome(a.rec); err != nil {
		a.sayf("telling detach how the teardown ended: %v", err)
	}
}

func (a *Attachment) reportStats() {
	s := a.stats
	a.sayf("%s: %d reads (%.1f%% one-sided), %d suspected faults (%d minor, %d major resolved by the target), %d writes, %d flushes, %d trims",
		a.rec.Name, s.Reads, 100*s.OneSidedShare(), s.SuspectedPages, s.MinorResolved, s.MajorResolved, s.Writes, s.Flushes, s.Trims)
}

// DeadCause says why the I/O of a dead record (Dead) fails for good.
func (r Record) DeadCause() string {
	if r.State == StateNamespaceChanged {
		return "namespace changed on the target"
	}
	return "controller lost"
}

// DetachedDead is what is said of a dead attachment (Dead) that was
// detached: its teardown succeeded, so its failed final flush lost nothing.
func (r Record) DetachedDead() string {
	had := "its controller had been lost"
	if r.State == StateNamespaceChanged {
		had = "its namespace had changed on the target"
	}
	return fmt.Sprintf("%s since %s; nothing it acknowledged was left unflushed", had, r.LostSince.Local().Format(time.DateTime))
}

// Changes names n acknowledged writes, trims and write-zeroes of bytes in
// all: "1 write or trim (12 KiB)".
func Changes(n, bytes int64) string {
	what := fmt.Sprintf("%d writes or trims", n)
	if n == 1 {
		what = "1 write or trim"
	}
	return what + " (" + HumanSize(bytes) + ")"
}

// HumanSize writes n bytes in binary units: "4 GiB", "1.5 MiB".
func HumanSize(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	f := float64(n)
	i := 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	return strings.TrimSuffix(strings.TrimSuffix(fmt.Sprintf("%.1f", f), "0"), ".") + " " + units[i]
}
