package main

import (
	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/bench/attachbench"
	"github.com/nprdma/nprdma/bench/blockdevbench"
	"github.com/nprdma/nprdma/bench/e2ebench"
	"github.com/nprdma/nprdma/bench/npbench"
	"github.com/nprdma/nprdma/bench/swapbench"
)

// experiments is the suite, in report order. Names are fixed; an experiment
// without Run is pending and appears in the report with its goals. To add
// one, give its Spec a Run (usually a function in its bench/<x>bench
// package) — there is deliberately no init() registry: this list is the
// whole suite.
func experiments() []bench.Spec {
	// The end-to-end experiments run the nprdma commands: bin/ of the
	// repository (make bench builds it), rebuilt when stale.
	bins := &e2ebench.Binaries{RepoRoot: repoRoot()}
	return []bench.Spec{
		blockdevbench.Spec(),
		swapbench.FaultsSpec(),
		swapbench.PolicySpec(),
		swapbench.RSSSpec(),
		npbench.FabricSpec(),
		npbench.RegistrationSpec(),
		npbench.NPReadSpec(),
		e2ebench.CapacitySpec(bins),
		e2ebench.E2ESpec(bins),
		e2ebench.NVMeTCPSpec(bins),
		npbench.PoolSpec(),
		e2ebench.StartupSpec(bins),
		e2ebench.SHMSpec(bins),
		e2ebench.GuestNVMeTCPSpec(bins),
		e2ebench.GuestVerbsSpec(bins),
		attachbench.Spec(repoRoot()),
	}
}
