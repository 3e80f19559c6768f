package target_test

import "testing"

// TestCommandPathAllocations checks that a two-sided 4 KiB Read, Write
// (data in the capsule) and Write with a keyed SGL (data fetched with an
// RDMA READ), from submission to completion, allocate nothing in the steady
// state on either provider: counted over every goroutine, the target's
// receive loop and workers and the host queue's included. They took 5, 8
// and 9 while each command had a Request, a goroutine and a context of its
// own (docs/target.md §3).
func TestCommandPathAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, p := range rigProviders {
		t.Run(p.name, func(t *testing.T) {
			o := newIOOps(t, p.new(t))
			for _, c := range []struct {
				name string
				op   func()
			}{{"read", o.read}, {"write", o.write}, {"write-keyed", o.writeKeyed}} {
				for range 300 { // every slot and buffer used once
					c.op()
				}
				if a := testing.AllocsPerRun(200, c.op); a > 0.5 {
					t.Errorf("%s: %.2f allocations per command", c.name, a)
				}
			}
		})
	}
}
