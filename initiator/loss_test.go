package initiator

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nprdma/nprdma/internal/promtest"
	"github.com/nprdma/nprdma/nprdma/tcp"
	"github.com/nprdma/nprdma/nvme"
)

// TestCommandGivesUpAfterMaxSessions: a command under which the connection
// is lost on every session is tried on MaxCommandSessions sessions, never
// twice on one, then fails with an error wrapping the last transport
// failure; the controller reconnects and serves later commands. Before, it
// was retried on every new session for ever.
func TestCommandGivesUpAfterMaxSessions(t *testing.T) {
	for _, k := range []fabricKind{kinds[0], nvmeTCPKind} {
		t.Run(k.name, func(t *testing.T) { commandGivesUpAfterMaxSessions(t, k) })
	}
}

func commandGivesUpAfterMaxSessions(t *testing.T, k fabricKind) {
	r := newRig(t, k, targetSpec{allowAny: true})
	c := r.connect(t, WithReconnectDelay(10*time.Millisecond))
	n := namespace(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	seen := map[*session]int{}
	err := c.do(ctx, func(s *session) error {
		seen[s]++
		q := s.ioQueue(c)
		q.Close() // the connection is lost under the command
		_, err := q.Submit(ctx, nvme.FlushCommand(n.NSID()), nil)
		return err
	})
	if !errors.Is(err, nvme.ErrQueueFailed) || !strings.Contains(err.Error(), "giving up") || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("command failing on every session: %v", err)
	}
	if len(seen) != MaxCommandSessions {
		t.Fatalf("tried on %d sessions, want %d", len(seen), MaxCommandSessions)
	}
	for _, k := range seen {
		if k != 1 {
			t.Fatalf("tried %d times on one session", k)
		}
	}
	if _, err := n.ReadAtContext(ctx, make([]byte, BlockSize), 0); err != nil {
		t.Fatalf("read after the command gave up: %v", err)
	}
}

// TestSQDeletionIsRetriedOnTheNextSession: a command the target aborted
// because it deleted the queue (a controller replaced or fenced while its
// link still worked) did not run; it runs again on a new session. With Do
// Not Retry it is returned as is.
func TestSQDeletionIsRetriedOnTheNextSession(t *testing.T) {
	r := newRig(t, kinds[0], targetSpec{allowAny: true})
	c := r.connect(t, WithReconnectDelay(10*time.Millisecond))
	n := namespace(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var seen []*session
	err := c.do(ctx, func(s *session) error {
		seen = append(seen, s)
		if len(seen) == 1 {
			return nvme.Errorf(nvme.StatusAbortedSQDeleted, "queue 1 of controller 1 failed: command not executed")
		}
		_, err := s.ioQueue(c).Submit(ctx, nvme.FlushCommand(n.NSID()), nil)
		return err
	})
	if err != nil {
		t.Fatalf("command aborted by SQ deletion once: %v", err)
	}
	if len(seen) != 2 || seen[0] == seen[1] {
		t.Fatalf("tried on %d sessions (distinct: %v), want 2", len(seen), len(seen) == 2 && seen[0] != seen[1])
	}

	tries := 0
	err = c.do(ctx, func(s *session) error {
		tries++
		return nvme.Errorf(nvme.StatusAbortedSQDeleted.WithDNR(), "do not retry")
	})
	if !errors.Is(err, nvme.StatusAbortedSQDeleted) || tries != 1 {
		t.Fatalf("SQ deletion with DNR: %v after %d tries, want it returned after 1", err, tries)
	}
}

// TestUnflushedCountsWhatNoFlushCovered: writes without FUA, trims and
// write-zeroes count until a Flush succeeds; FUA writes never do; a Flush
// that fails (the controller lost) covers nothing.
func TestUnflushedCountsWhatNoFlushCovered(t *testing.T) {
	_, tg, _, _, c := restartable(t, kinds[1], WithIOQueues(1), WithControllerLossTimeout(time.Second), WithQPTimeout(500*time.Millisecond))
	n := namespace(t, c)
	if u := n.Unflushed(); u != (Unflushed{}) {
		t.Fatalf("fresh namespace: %+v unflushed", u)
	}
	if _, err := n.WriteAtFUA(make([]byte, 2*BlockSize), 0); err != nil {
		t.Fatal(err)
	}
	if u := n.Unflushed(); u != (Unflushed{}) {
		t.Fatalf("after a FUA write: %+v unflushed", u)
	}
	if _, err := n.WriteAt(make([]byte, 3*BlockSize), 0); err != nil {
		t.Fatal(err)
	}
	if err := n.Trim(8*BlockSize, BlockSize); err != nil {
		t.Fatal(err)
	}
	if err := n.WriteZeroes(16*BlockSize, 2*BlockSize); err != nil {
		t.Fatal(err)
	}
	if u, want := n.Unflushed(), (Unflushed{Commands: 3, Bytes: 6 * BlockSize}); u != want {
		t.Fatalf("after a write, a trim and a write-zeroes: %+v unflushed, want %+v", u, want)
	}
	if err := n.Flush(); err != nil {
		t.Fatal(err)
	}
	if u := n.Unflushed(); u != (Unflushed{}) {
		t.Fatalf("after a flush: %+v unflushed", u)
	}
	if _, err := n.WriteAt(make([]byte, BlockSize), 0); err != nil {
		t.Fatal(err)
	}
	tg.Close()
	if err := n.Flush(); !errors.Is(err, ErrControllerLost) {
		t.Fatalf("flush with the target gone: %v", err)
	}
	if u, want := n.Unflushed(), (Unflushed{Commands: 1, Bytes: BlockSize}); u != want {
		t.Fatalf("after a failed flush: %+v unflushed, want %+v", u, want)
	}
}

// TestLostSaysSinceWhenAndWhy: once the target stays away past the loss
// timeout, Lost is closed and Loss says since when and why (the loss
// timeout, the connection's failure, the last reconnect attempt).
func TestLostSaysSinceWhenAndWhy(t *testing.T) {
	for _, k := range restartKinds {
		t.Run(k.name, func(t *testing.T) { lostSaysSinceWhenAndWhy(t, k) })
	}
}

func lostSaysSinceWhenAndWhy(t *testing.T, k fabricKind) {
	_, tg, _, _, c := restartable(t, k, WithIOQueues(1), WithControllerLossTimeout(time.Second), WithQPTimeout(500*time.Millisecond),
		WithKeepAlive(time.Second))
	if since, err := c.Loss(); !since.IsZero() || err != nil {
		t.Fatalf("a live controller reports a loss: %v %v", since, err)
	}
	start := time.Now()
	tg.Close()
	select {
	case <-c.Lost():
	case <-time.After(20 * time.Second):
		t.Fatal("Lost not closed long after the loss timeout")
	}
	since, err := c.Loss()
	if since.Before(start) || time.Since(since) > 20*time.Second || !errors.Is(err, ErrControllerLost) {
		t.Fatalf("Loss: %v %v", since, err)
	}
	for _, want := range []string{"not reconnected within 1s", "the connection was lost", "last reconnect attempt"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("loss error lacks %q: %v", want, err)
		}
	}
	if errors.Is(err, nvme.ErrQueueFailed) {
		t.Errorf("the loss error matches ErrQueueFailed, which callers retry: %v", err)
	}
}

// TestTargetRestartSettlesUnflushedChanges: when the initiator reconnects to
// another target process, what was unflushed is settled: kept, after a clean
// shutdown (the target flushed it); possibly lost, after a stop without one
// (the target's volatile cache is gone), which PossiblyLost, the stats and
// the metrics report. A flushed change is never counted, and a later Flush
// on the new process does not undo the count.
func TestTargetRestartSettlesUnflushedChanges(t *testing.T) {
	for _, k := range restartKinds {
		t.Run(k.name, func(t *testing.T) { targetRestartSettlesUnflushedChanges(t, k) })
	}
}

func targetRestartSettlesUnflushedChanges(t *testing.T, k fabricKind) {
	reg := prometheus.NewRegistry()
	spec, tg, _, _, c := restartable(t, k, WithIOQueues(1), WithMetrics(reg))
	ctx := context.Background()
	n := namespace(t, c)
	buf := make([]byte, 2*BlockSize)
	restart := func(clean bool) {
		t.Helper()
		var err error
		if clean {
			err = tg.Shutdown(ctx)
		} else {
			err = tg.Close() // no clean shutdown recorded: to the next process, a crash
		}
		if err != nil {
			t.Fatal(err)
		}
		spec.prov = tcp.New() // the same address, backing and data directory
		tg = startTarget(t, spec)
		t.Cleanup(func() { tg.Close() })
		// The first operation on the new session settles the namespace.
		if _, err := n.ReadAt(make([]byte, BlockSize), 0); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string, lost Unflushed, restarts, unclean uint64, reported bool) {
		t.Helper()
		select {
		case <-n.LossReported():
			if !reported {
				t.Errorf("%s: LossReported fired", when)
			}
		default:
			if reported {
				t.Errorf("%s: LossReported did not fire", when)
			}
		}
		if u := n.Unflushed(); u != (Unflushed{}) {
			t.Errorf("%s: %+v unflushed, want none", when, u)
		}
		if got := n.PossiblyLost(); got != lost {
			t.Errorf("%s: possibly lost %+v, want %+v", when, got, lost)
		}
		s := c.Stats()
		if s.TargetRestarts != restarts || s.TargetRestartsUnclean != unclean {
			t.Errorf("%s: %d target restarts, %d unclean; want %d, %d", when, s.TargetRestarts, s.TargetRestartsUnclean, restarts, unclean)
		}
		if got := promtest.Sum(t, reg, "nprdma_initiator_target_unclean_restarts_total", "subsystem", testSubNQN); got != float64(unclean) {
			t.Errorf("%s: nprdma_initiator_target_unclean_restarts_total %v, want %d", when, got, unclean)
		}
	}

	pattern(buf, 0, 1)
	if _, err := n.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	restart(true)
	check("after a clean restart", Unflushed{}, 1, 0, false)

	if _, err := n.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if err := n.Trim(8*BlockSize, BlockSize); err != nil {
		t.Fatal(err)
	}
	restart(false)
	lost := Unflushed{Commands: 2, Bytes: 3 * BlockSize}
	check("after an unclean restart", lost, 2, 1, true)
	if err := n.Flush(); err != nil {
		t.Fatal(err)
	}
	check("after a flush on the new process", lost, 2, 1, false)

	if _, err := n.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if err := n.Flush(); err != nil {
		t.Fatal(err)
	}
	restart(false)
	check("after an unclean restart with everything flushed", lost, 3, 2, false)
	got := make([]byte, len(buf))
	if _, err := n.ReadAt(got, 0); err != nil || !bytes.Equal(got, buf) {
		t.Fatalf("flushed data after the restarts: %v, equal %v", err, bytes.Equal(got, buf))
	}
}

// A write, trim or write-zeroes whose completion from a target is processed
// after the namespace has already recorded the target's next instance (its
// session outlived the restart by a completion) is settled as the restart
// settled the rest: lost after an unclean restart, flushed after a clean
// one; never counted as unflushed on the new process, so a Flush there
// covers exactly what it covered. A check of an older session that comes
// late changes nothing, and a completion in a newer session counts as usual.
func TestLateCompletionAfterRestartIsSettled(t *testing.T) {
	tracked := func(boot, unclean uint64) nvme.NPInstance {
		return nvme.NPInstance{BootID: boot, UncleanStarts: unclean, Flags: nvme.NPInstanceTracked}
	}
	// Sessions 1 (a), 2 (b: after an unclean stop), 3 (c: after a clean one).
	a, b, c := tracked(1, 0), tracked(2, 1), tracked(3, 1)
	var d durability
	unflushed := func() Unflushed {
		return Unflushed{d.acked.Commands - d.flushed.Commands, d.acked.Bytes - d.flushed.Bytes}
	}
	d.sawInstance(1, a)
	if d.changed(4096, 1, a) {
		t.Fatal("a change acknowledged by the current instance counted as lost")
	}
	if _, mayHaveLost, u := d.sawInstance(2, b); !mayHaveLost || u != (Unflushed{1, 4096}) {
		t.Fatalf("unclean restart settled %+v (may have lost %v), want 1 change of 4096 bytes lost", u, mayHaveLost)
	}
	if !d.changed(8192, 1, a) {
		t.Fatal("a late completion from before an unclean restart not counted as lost")
	}
	if d.lost != (Unflushed{2, 12288}) || unflushed() != (Unflushed{}) {
		t.Fatalf("lost %+v unflushed %+v, want 2 changes of 12288 bytes lost and nothing unflushed", d.lost, unflushed())
	}
	// A check of session 1 that raced with the reconnect and comes last.
	if restarted, _, _ := d.sawInstance(1, a); restarted || d.instance != b {
		t.Fatalf("a stale session's check took the instance back to %+v", d.instance)
	}

	if _, mayHaveLost, _ := d.sawInstance(3, c); mayHaveLost {
		t.Fatal("a clean restart said to have lost changes")
	}
	// Two writes on c, a Flush sent (its snapshot), then late completions
	// from b (clean since) and a (unclean since), then the Flush succeeds:
	// nothing is left unflushed.
	d.changed(512, 3, c)
	d.changed(512, 3, c)
	upTo := d.snapshot()
	if d.changed(512, 2, b) {
		t.Fatal("a late completion from before a clean restart counted as lost")
	}
	if !d.changed(1024, 1, a) {
		t.Fatal("a late completion from before an unclean restart two instances back not counted as lost")
	}
	d.covered(upTo)
	if d.lost != (Unflushed{3, 13312}) || unflushed() != (Unflushed{}) {
		t.Fatalf("lost %+v unflushed %+v, want 3 changes of 13312 bytes lost, nothing unflushed", d.lost, unflushed())
	}
	// Session 4 on the same process (a reconnect, no restart): its
	// completion counts before its check, and session 3's late ones too.
	d.changed(512, 4, c)
	d.changed(512, 3, c)
	if unflushed() != (Unflushed{2, 1024}) {
		t.Fatalf("unflushed %+v, want 2 changes of 1024 bytes", unflushed())
	}
	// A target that reports no instance never makes a completion late.
	var u durability
	u.sawInstance(1, nvme.NPInstance{})
	u.sawInstance(2, nvme.NPInstance{})
	if u.changed(4096, 1, a) || u.changed(4096, 1, nvme.NPInstance{}) || u.acked != (Unflushed{2, 8192}) {
		t.Fatalf("no instance recorded: acked %+v lost %+v, want 2 changes acked and nothing lost", u.acked, u.lost)
	}
}

// A namespace check that raced with a reconnect and ends after a check of
// the newer session does not take the record back to the older session.
func TestVerifiedSessionNeverGoesBack(t *testing.T) {
	var n Namespace
	s1, s2 := &session{gen: 1}, &session{gen: 2}
	n.storeVerified(s1)
	n.storeVerified(s2)
	n.storeVerified(s1)
	if n.verified.Load() != s2 {
		t.Fatalf("verified session of generation %d, want 2", n.verified.Load().gen)
	}
}
