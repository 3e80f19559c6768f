package main

import (
	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/bench/blockdevbench"
	"github.com/nprdma/nprdma/bench/npbench"
	"github.com/nprdma/nprdma/bench/swapbench"
)

// experiments is the suite, in report order. Names are fixed; an experiment
// without Run is pending and appears in the report with its goals. To add
// one, give its Spec a Run (usually a function in its bench/<x>bench
// package) — there is deliberately no init() registry: this list is the
// whole suite.
func experiments() []bench.Spec {
	return []bench.Spec{
		blockdevbench.Spec(),
		swapbench.FaultsSpec(),
		swapbench.PolicySpec(),
		swapbench.RSSSpec(),
		npbench.FabricSpec(),
		npbench.RegistrationSpec(),
		npbench.NPReadSpec(),
		{
			Name:  "capacity",
			Title: "Latency against the namespace-to-DRAM ratio (1×..8×)",
			Goals: []string{
				"at 5× the DRAM budget, average latency of skewed (Zipf) 4 KiB reads ≤ 1.1× the all-in-DRAM run (NP-RDMA: 5× capacity at +10%)",
				"p99 and the latency the hit ratio predicts, for Zipf, uniform and read/write mixes",
			},
		},
		{
			Name:  "e2e-fio",
			Title: "fio through attach (NBD socket, loop device) against nbdkit serving the same data",
			Goals: []string{"the same fio job against nprdma attach and against nbdkit (memory plugin: resident case; file plugin: SSD case): QD1 p50 and QD32 IOPS as ratios to nbdkit"},
		},
		npbench.PoolSpec(),
		{
			Name:  "startup",
			Title: "Target start-up time against namespace size",
			Goals: []string{"time from start to the first served read independent of namespace size (O(1) unpinned registration), next to nbdkit's start on the same backing"},
		},
	}
}
