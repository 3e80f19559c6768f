// Package npbench holds the experiments of the NP-RDMA fabric for the bench
// suite (bench/cmd/nprdma-bench): fabric-ops (nprdma/tcp READ, WRITE and
// SEND against a raw loopback socket), registration (unpinned against
// pinned, by region size), np-read (one-sided 4 KiB READs of a swap.Region
// with no fault, a minor fault and a major fault, next to a pinned region,
// a raw round trip and a raw O_DIRECT read) and pool (pooled registered
// buffers against per-I/O registration). Each is a bench.Spec; every
// figure is a ratio to a baseline measured in the same run, in interleaved
// rounds. docs/npbench.md describes them and their results.
package npbench

import (
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/bench/nprdmabench"
)

// series of latency samples of one case over rounds.
type latencyCase struct {
	key, label string
	p50, p99   []float64 // µs, one per round
	all        []time.Duration
	placement  bench.Placement
}

// add records one round's samples (sorted in place).
func (c *latencyCase) add(samples []time.Duration) {
	slices.Sort(samples)
	c.p50 = append(c.p50, bench.Micros(bench.Percentile(samples, 50)))
	c.p99 = append(c.p99, bench.Micros(bench.Percentile(samples, 99)))
	c.all = append(c.all, samples...)
}

// cdf is the pooled distribution of every round.
func (c *latencyCase) cdf() []bench.Point {
	s := slices.Clone(c.all)
	slices.Sort(s)
	return bench.CDF(s, 200)
}

func (c *latencyCase) series() bench.Series {
	return bench.Series{Name: "cdf-" + c.key, Label: c.label, XUnit: "µs", YUnit: "fraction", Points: c.cdf()}
}

// figure builds a figure from per-round values: the mean of ours against
// the mean of the baseline's, with every round's value in the notes.
func figure(name string, ours, base []float64, unit, baseName string) bench.Figure {
	return bench.NewFigure(name, bench.MeanFloat(ours), unit, baseName, bench.MeanFloat(base)).
		WithNotes(fmt.Sprintf("per round: %s; baseline %s", bench.RoundList(ours), bench.RoundList(base)))
}

// noteNoise adds an honest note for every case whose per-round values
// spread by more than 10%.
func noteNoise(exp *bench.Experiment, what string, key string, xs []float64) {
	if s := bench.Spread(xs); s > 0.10 {
		exp.Note("Noisy: %s %s varied by %.0f%% between rounds (%s).", key, what, s*100, bench.RoundList(xs))
	}
}

// sampled runs fn while sampling where this process's threads run, and
// merges what it saw into pl.
func sampled(pl *bench.Placement, role string, pinned bool, fn func() error) error {
	s := bench.StartCPUSampler(os.Getpid(), 0)
	err := fn()
	got := s.Stop()
	got.Role, got.Pinned = role, pinned
	if pl.Role == "" {
		*pl = got
		return err
	}
	pl.Merge(got)
	return err
}

// placementParam describes the CPUs and Go scheduler the figures depend on.
func placementParam() string { return nprdmabench.CPUPlacement() }
