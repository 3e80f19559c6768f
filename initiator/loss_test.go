package initiator

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/fabric"
)

// TestCommandGivesUpAfterMaxSessions: a command under which the connection
// is lost on every session is tried on MaxCommandSessions sessions, never
// twice on one, then fails with an error wrapping the last transport
// failure; the controller reconnects and serves later commands. Before, it
// was retried on every new session for ever.
func TestCommandGivesUpAfterMaxSessions(t *testing.T) {
	r := newRig(t, kinds[0], targetSpec{allowAny: true})
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
	if !errors.Is(err, fabric.ErrQueueFailed) || !strings.Contains(err.Error(), "giving up") || errors.Is(err, context.DeadlineExceeded) {
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

// TestUnflushedCountsWhatNoFlushCovered: writes without FUA, trims and
// write-zeroes count until a Flush succeeds; FUA writes never do; a Flush
// that fails (the controller lost) covers nothing.
func TestUnflushedCountsWhatNoFlushCovered(t *testing.T) {
	_, tg, _, c := restartable(t, WithIOQueues(1), WithControllerLossTimeout(time.Second), WithQPTimeout(500*time.Millisecond))
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
	_, tg, _, c := restartable(t, WithIOQueues(1), WithControllerLossTimeout(time.Second), WithQPTimeout(500*time.Millisecond),
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
	if errors.Is(err, fabric.ErrQueueFailed) {
		t.Errorf("the loss error matches ErrQueueFailed, which callers retry: %v", err)
	}
}
