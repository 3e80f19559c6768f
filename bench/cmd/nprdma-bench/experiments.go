package main

import (
	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/bench/blockdevbench"
)

// experiments is the suite, in report order. Names are fixed; an experiment
// without Run is pending and appears in the report with its goals. To add
// one, give its Spec a Run (usually a function in its bench/<x>bench
// package) — there is deliberately no init() registry: this list is the
// whole suite.
func experiments() []bench.Spec {
	return []bench.Spec{
		blockdevbench.Spec(),
		{
			Name:  "swap-faults",
			Title: "Minor and major fault latency of the SSD-backed region",
			Goals: []string{
				"major fault p50 ≤ 1.2× a raw 4 KiB O_DIRECT read of the backing + 10 µs, same run",
				"minor fault p50/p99 reported next to the raw read",
			},
		},
		{
			Name:  "swap-policy",
			Title: "Eviction policy hit ratio; eviction and writeback throughput",
			Goals: []string{
				"the default policy's hit ratio ≥ CLOCK's under Zipf(0.99) and a scan-polluted mix (CLOCK vs a scan-resistant policy)",
				"eviction and writeback throughput reported",
			},
		},
		{
			Name:  "swap-rss",
			Title: "Resident memory against the DRAM budget",
			Goals: []string{"RSS of a process holding a region 5× its budget under random access ≤ budget + 10% + 64 MiB"},
		},
		{
			Name:  "fabric-ops",
			Title: "nprdma/tcp READ, WRITE and SEND against a raw loopback socket",
			Goals: []string{
				"4 KiB READ p50 ≤ 1.2× a raw loopback TCP request/response of the same size",
				"128 KiB throughput ≥ 0.8× raw loopback TCP streaming",
				"busy-poll variant and CPU placement reported",
			},
		},
		{
			Name:  "registration",
			Title: "Registration time against region size: unpinned vs pinned",
			Goals: []string{"unpinned registration time independent of region size and far below pinned (mlock) registration at every size (log-log plot)"},
		},
		{
			Name:  "np-read",
			Title: "One-sided 4 KiB READ of an unpinned region: no fault, minor fault, major fault",
			Goals: []string{
				"no-fault READ of an unpinned MR ≤ a pinned-MR READ + 2 µs (NP-RDMA: +0.1–2 µs)",
				"minor and major fault reads next to their physical limits (raw socket round trip; raw O_DIRECT read of the backing)",
			},
		},
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
		{
			Name:  "pool",
			Title: "Registered-buffer pool against per-I/O registration",
			Goals: []string{"pooled I/O throughput ≥ per-I/O registration throughput; registrations avoided reported"},
		},
		{
			Name:  "startup",
			Title: "Target start-up time against namespace size",
			Goals: []string{"time from start to the first served read independent of namespace size (O(1) unpinned registration), next to nbdkit's start on the same backing"},
		},
	}
}
