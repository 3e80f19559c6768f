package link

import (
	"sync"
	"testing"
	"time"
)

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestFreezeGate(t *testing.T) {
	var g FreezeGate
	if g.Frozen() || !isClosed(g.Thawed()) {
		t.Fatal("zero gate: want thawed")
	}
	g.Freeze()
	g.Freeze() // no-op: one wait covers both
	ch := g.Thawed()
	if !g.Frozen() || isClosed(ch) {
		t.Fatal("after Freeze: want frozen and an open channel")
	}
	var wg sync.WaitGroup
	released := make(chan time.Time, 4)
	for range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); <-g.Thawed(); released <- time.Now() }()
	}
	time.Sleep(10 * time.Millisecond)
	if len(released) != 0 {
		t.Fatal("a waiter passed a frozen gate")
	}
	thawedAt := time.Now()
	g.Thaw()
	g.Thaw() // no-op: closing twice would panic
	wg.Wait()
	close(released)
	for at := range released {
		if at.Before(thawedAt) {
			t.Fatal("a waiter was released before Thaw")
		}
	}
	if g.Frozen() || !isClosed(ch) || !isClosed(g.Thawed()) {
		t.Fatal("after Thaw: want thawed, the old channel closed")
	}
	g.Freeze()
	if isClosed(g.Thawed()) {
		t.Fatal("a second Freeze must hand out a fresh open channel")
	}
	g.Thaw()
}
