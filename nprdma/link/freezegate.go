package link

import (
	"sync"
	"sync/atomic"
)

// FreezeGate is the switch behind a provider's Freeze and Thaw (fault
// injection: a process stopped with SIGSTOP, whose peers see silence rather
// than an error). Receive loops check Frozen before each delivery and wait
// on Thawed; the check is one atomic load, so that the switch costs nothing
// while it is never thrown. The zero value is thawed.
type FreezeGate struct {
	frozen atomic.Bool
	mu     sync.Mutex
	thawed chan struct{} // open while frozen
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Freeze stops the gate; it is a no-op on a frozen gate.
func (g *FreezeGate) Freeze() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.frozen.Load() {
		g.thawed = make(chan struct{})
		g.frozen.Store(true)
	}
}

// Thaw reopens the gate and releases every waiter; it is a no-op on a
// thawed gate.
func (g *FreezeGate) Thaw() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.frozen.Load() {
		g.frozen.Store(false)
		close(g.thawed)
	}
}

// Frozen reports whether the gate is frozen.
func (g *FreezeGate) Frozen() bool { return g.frozen.Load() }

// Thawed returns a channel that is closed once the gate is thawed: already
// closed when it is thawed now.
func (g *FreezeGate) Thawed() <-chan struct{} {
	if !g.frozen.Load() {
		return closedChan
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.frozen.Load() {
		return closedChan
	}
	return g.thawed
}
