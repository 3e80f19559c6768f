// Package leaktest checks in tests that goroutines a component started are
// gone once it is closed.
package leaktest

import (
	"runtime"
	"time"
)

// TB is the part of testing.TB that WaitGoroutines uses.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// WaitGoroutines waits up to within for the process to run at most n
// goroutines (a count taken before the component started), and fails the
// test with every goroutine's stack if it still runs more.
func WaitGoroutines(t TB, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines left, want at most %d:\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
