package bench

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestChildWaitsForItsLineAndStops: a child's output line is found (also
// when it came before the wait), an early exit is reported with its
// output, and stop ends a process that ignores nothing.
func TestChildWaitsForItsLineAndStops(t *testing.T) {
	c, err := StartChild("sh", []string{"sh", "-c", "echo first; echo ready at 42; exec sleep 60"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.WaitLine(context.Background(), 10*time.Second, func(l string) bool { return strings.HasPrefix(l, "ready") })
	if err != nil || l != "ready at 42" {
		t.Fatalf("waitLine: %q %v", l, err)
	}
	// Again: the line is already in the output.
	if l, err := c.WaitLine(context.Background(), time.Second, func(l string) bool { return l == "first" }); err != nil || l != "first" {
		t.Fatalf("waitLine for an earlier line: %q %v", l, err)
	}
	if err := c.Stop(syscall.SIGTERM, 10*time.Second); err == nil || !strings.Contains(err.Error(), "signal") {
		// sleep dies of SIGTERM: an exit by signal is reported.
		t.Fatalf("stop: %v, want the signal reported", err)
	}
	if !c.Exited() {
		t.Fatal("child still running after stop")
	}

	e, err := StartChild("sh", []string{"sh", "-c", "echo broken config >&2; exit 3"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.WaitLine(context.Background(), 10*time.Second, func(l string) bool { return strings.Contains(l, "serving") })
	if err == nil || !strings.Contains(err.Error(), "exited") || !strings.Contains(err.Error(), "broken config") {
		t.Fatalf("early exit: %v", err)
	}
}
