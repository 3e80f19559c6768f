package lab

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RunT runs s for a test: it skips the test when the lab (or s.Kernel)
// is unavailable here, ends the run before the test binary's deadline
// (-timeout) so that a hang is reported with its step, and fails the test
// when the run did not complete or the script exited non-zero, naming the
// step that was running and quoting the end of the output. With no
// s.Log, the console goes to t.Log. Result.Dir is removed when the test
// ends.
func RunT(t testing.TB, s Spec) *Result {
	t.Helper()
	RequireKernel(t, s.Kernel)
	if s.Log == nil {
		s.Log = testLog{t}
	}
	ctx := context.Background()
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if deadline, ok := d.Deadline(); ok {
			var cancel context.CancelFunc
			// Room to report before the test binary panics.
			ctx, cancel = context.WithDeadline(ctx, deadline.Add(-10*time.Second))
			defer cancel()
		}
	}
	res, err := Run(ctx, s)
	if res != nil {
		t.Cleanup(func() { os.RemoveAll(res.Dir) })
	}
	if err != nil {
		if res != nil {
			t.Fatalf("%v\nscript output ends:\n%s", err, tail(res.Output, 3000))
		}
		t.Fatal(err)
	}
	if res.ExitCode != 0 {
		step := "before the first step"
		if res.FailedStep != "" {
			step = "in step " + strconv.Quote(res.FailedStep)
		}
		t.Fatalf("guest script (kernel %s) failed %s with exit status %d; output ends:\n%s",
			kernelName(s.Kernel), step, res.ExitCode, tail(res.Output, 3000))
	}
	return res
}

func kernelName(name string) string {
	if name == "" {
		return defaultKernel
	}
	return name
}

// testLog passes each console line to t.Log. Run writes the console only
// before it returns, so never after the test.
type testLog struct{ t testing.TB }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
