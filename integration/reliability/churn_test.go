package reliability_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/internal/promtest"
	"github.com/nprdma/nprdma/nprdma"
)

// crasher is a provider that can break all its links at once, like the
// death of the process behind it (loop and tcp both can).
type crasher interface{ Crash() }

// churnState is what must come back after connect/disconnect churn: the
// process's resources and the fabric's and target's own accounting.
type churnState struct {
	proc                       resources
	heap                       uint64 // Go heap in use after a GC
	controllers                int
	targetQPs, hostQPs         int64
	targetRegistered, targetNP int64 // pinned-style and unpinned registered bytes
	hostRegistered             int64
	connections, poolInUse     float64
}

func (s churnState) String() string {
	return fmt.Sprintf("%v, heap %.1f MiB, %d controllers, QPs target %d host %d, registered target %d + %d unpinned, host %d, "+
		"target connections %v, target pool in use %v", s.proc, float64(s.heap)/(1<<20), s.controllers, s.targetQPs, s.hostQPs,
		s.targetRegistered, s.targetNP, s.hostRegistered, s.connections, s.poolInUse)
}

func churnMeasure(t *testing.T, r *targetRig, host *nprdma.Device) churnState {
	t.Helper()
	p := measure(t)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	ts, hs := r.tg.Device().Stats(), host.Stats()
	return churnState{proc: p, heap: ms.HeapInuse, controllers: r.tg.Controllers(),
		targetQPs: ts.QPs, hostQPs: hs.QPs, targetRegistered: ts.RegisteredBytes, targetNP: ts.UnpinnedBytes,
		hostRegistered: hs.RegisteredBytes, connections: promtest.Sum(t, r.reg, "nprdma_target_connections"),
		poolInUse: promtest.Sum(t, r.reg, "nprdma_fabric_pool_in_use_bytes")}
}

// Tolerances of the churn check, and why:
//   - goroutines, file descriptors, queue pairs, registered bytes,
//     controllers, connections and the target's pool in use: none. Each
//     cycle's are released when it ends; any difference is a leak.
//   - Go heap: 8 MiB. Caches that fill up to a bound (sync.Pools of staging
//     buffers, the race detector's shadow under -race, map buckets that Go
//     never shrinks) grow without leaking; a leak of one object per cycle
//     of even 8 KiB passes 8 MiB at 1000 cycles.
//   - RSS: 32 MiB: the heap's slack plus what the runtime keeps of its
//     arenas and stacks after FreeOSMemory; a per-cycle leak of a queue's
//     receive buffers (up to 1 MiB) or a pool slab (4 MiB) exceeds it
//     within a few dozen cycles. Under the race detector 128 MiB: it keeps
//     history for every goroutine and sync object ever created (about
//     37 KiB per cycle measured here, 30 goroutines each) and never returns
//     it; the heap and registered-bytes checks stay exact there.
const churnHeapSlack = 8 << 20

func churnRSSSlack() int64 {
	if raceEnabled {
		return 128 << 20
	}
	return 32 << 20
}

// TestConnectDisconnectChurn: cycles of connect, a little verified I/O and
// disconnect — every tenth an abrupt one (the host's provider crashes, as
// when its process dies) — leave the process, the fabric and the target
// exactly where they started: goroutines, file descriptors, queue pairs,
// registered memory, controllers and connections return to their level,
// the heap and RSS within the slack above. loop runs 1000 cycles, tcp 100
// (1000 with NPRDMA_LONG=1); so does NVMe/TCP, whose abrupt cycles go
// through a proxy that resets the connections.
func TestConnectDisconnectChurn(t *testing.T) {
	for _, tc := range []struct {
		kind         fabricKind
		cycles, long int
	}{{loopFabric, 1000, 1000}, {tcpFabric, 100, 1000}, {nvmeTCPFabric, 100, 1000}} {
		t.Run(tc.kind.name, func(t *testing.T) {
			cycles := tc.cycles
			if longRun() {
				cycles = tc.long
			}
			churn(t, tc.kind, cycles)
		})
	}
}

func churn(t *testing.T, kind fabricKind, cycles int) {
	r := newTarget(t, kind, []subSpec{{NQN: subNQN, AllowAny: true, NS: []nsSpec{{NSID: 1, Size: 8 << 20, Budget: 1 << 20}}}})
	host, _ := r.hostDevice(t)
	var proxy *cutProxy // NVMe/TCP: the abrupt cycles' way in
	if kind.nvmeTCP {
		proxy = startCutProxy(t, r.tcpAddr)
	}
	buf := make([]byte, 8192)
	got := make([]byte, 8192)
	cycle := func(i int) {
		dev, abrupt := host, i%10 == 9
		var prov nprdma.Provider
		if abrupt && !kind.nvmeTCP {
			// A host process of its own that will die.
			dev, prov = r.hostDevice(t)
		}
		opts := hostOptions("churn", initiator.WithControllerLossTimeout(time.Second), initiator.WithReconnectDelay(10*time.Millisecond))
		var c *initiator.Controller
		var err error
		switch {
		case kind.nvmeTCP && abrupt:
			c, err = initiator.ConnectOver(context.Background(), initiator.TCP(), proxy.Addr(), subNQN, opts...)
		case kind.nvmeTCP:
			c, err = initiator.ConnectOver(context.Background(), initiator.TCP(), r.tcpAddr, subNQN, opts...)
		default:
			c, err = r.connectE(dev, subNQN, opts...)
		}
		if err != nil {
			t.Fatalf("cycle %d: connect: %v", i, err)
		}
		n := openNamespace(t, c, 1)
		off := int64(i%1000) * 8192
		fillPattern(buf, off, uint64(i))
		if _, err := n.WriteAt(buf, off); err != nil {
			t.Fatalf("cycle %d: write: %v", i, err)
		}
		if _, err := n.ReadAt(got, off); err != nil {
			t.Fatalf("cycle %d: read: %v", i, err)
		}
		if err := checkPattern(got, off, uint64(i)); err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		switch {
		case abrupt && kind.nvmeTCP:
			proxy.Cut()
		case abrupt:
			prov.(crasher).Crash()
		}
		if err := c.Close(); err != nil && !abrupt {
			t.Fatalf("cycle %d: close: %v", i, err)
		}
		if abrupt && !kind.nvmeTCP {
			dev.Close()
		}
	}
	// quiet: no controller, connection or queue pair is left of the cycles.
	quiet := func(s churnState) bool {
		return s.controllers == 0 && s.connections == 0 && s.targetQPs == 0 && s.hostQPs == 0
	}
	settle := func(done func(churnState) bool) (churnState, bool) {
		var s churnState
		ok := eventually(20*time.Second, func() bool {
			s = churnMeasure(t, r, host)
			return done(s)
		})
		return s, ok
	}

	// Warm up: the first cycles fill pools and caches that stay.
	for i := 0; i < 20; i++ {
		cycle(i)
	}
	// The last warm-up cycle is an abrupt one: the target may still be
	// closing its side of the reset connections after its accounting
	// shows none, so the base waits for the descriptors to hold still.
	prevFDs := -1
	base, ok := settle(func(s churnState) bool {
		still := s.proc.fds == prevFDs
		prevFDs = s.proc.fds
		return quiet(s) && still
	})
	if !ok {
		t.Fatalf("not quiet after the warm-up: %v", base)
	}
	start := time.Now()
	for i := 20; i < 20+cycles; i++ {
		cycle(i)
	}
	elapsed := time.Since(start)
	end, ok := settle(func(s churnState) bool {
		return quiet(s) && s.proc.goroutines <= base.proc.goroutines && s.proc.fds <= base.proc.fds
	})
	t.Logf("%d cycles (every tenth abrupt) in %v (%.1f ms each)", cycles, elapsed.Round(time.Millisecond),
		float64(elapsed.Microseconds())/1000/float64(cycles))
	t.Logf("before: %v", base)
	t.Logf("after:  %v", end)
	if !ok {
		t.Errorf("did not return to the starting level:\n%s", goroutineDump())
	}
	if end.proc.goroutines != base.proc.goroutines || end.proc.fds != base.proc.fds {
		t.Errorf("goroutines %d -> %d, fds %d -> %d", base.proc.goroutines, end.proc.goroutines, base.proc.fds, end.proc.fds)
	}
	if end.targetRegistered != base.targetRegistered || end.targetNP != base.targetNP || end.hostRegistered != base.hostRegistered {
		t.Errorf("registered bytes: target %d -> %d, unpinned %d -> %d, host %d -> %d", base.targetRegistered, end.targetRegistered,
			base.targetNP, end.targetNP, base.hostRegistered, end.hostRegistered)
	}
	if end.poolInUse != base.poolInUse {
		t.Errorf("target pool in use %v -> %v bytes", base.poolInUse, end.poolInUse)
	}
	if end.heap > base.heap+churnHeapSlack {
		t.Errorf("Go heap grew from %.1f to %.1f MiB", float64(base.heap)/(1<<20), float64(end.heap)/(1<<20))
	}
	if end.proc.rss > base.proc.rss+churnRSSSlack() {
		t.Errorf("RSS grew from %.1f to %.1f MiB", float64(base.proc.rss)/(1<<20), float64(end.proc.rss)/(1<<20))
	}
}
