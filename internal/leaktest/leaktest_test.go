package leaktest

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

type recorder struct{ failed string }

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
}

// A goroutine that ends in time passes; one that does not fails the test,
// and the message shows its stack.
func TestWaitGoroutines(t *testing.T) {
	n := runtime.NumGoroutine()
	go func() { time.Sleep(50 * time.Millisecond) }()
	var r recorder
	WaitGoroutines(&r, n, 5*time.Second)
	if r.failed != "" {
		t.Fatalf("a goroutine that ended was reported: %s", r.failed)
	}

	// Three, so that another goroutine of the test binary ending meanwhile
	// cannot bring the count down to the one asked for.
	stop, started := make(chan struct{}), make(chan struct{})
	defer close(stop)
	for range 3 {
		go leftBehind(started, stop)
		<-started
	}
	WaitGoroutines(&r, runtime.NumGoroutine()-3, 50*time.Millisecond)
	if !strings.Contains(r.failed, "leftBehind") {
		t.Fatalf("a goroutine left running was not reported with its stack: %q", r.failed)
	}
}

func leftBehind(started, stop chan struct{}) {
	started <- struct{}{}
	<-stop
}
