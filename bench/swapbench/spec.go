package swapbench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/swap"
)

// The suite entries of the swap experiments, with the names, titles and
// goals bench/cmd/nprdma-bench lists for them.

// FaultsGoal: a major fault's median within 1.2x a raw read plus 10 µs,
// expressed as a ratio to that bound.
var FaultsGoal = bench.Goal{Text: "major fault p50 ≤ 1.2× a raw 4 KiB O_DIRECT read of the backing + 10 µs, same run",
	Op: bench.AtMost, Threshold: 1}

// PolicyGoal: the default policy's hit ratio at least CLOCK's.
var PolicyGoal = bench.Goal{Text: "the default policy's hit ratio ≥ CLOCK's under Zipf(0.99) and a scan-polluted mix",
	Op: bench.AtLeast, Threshold: 1}

// RSSGoal: peak RSS within budget + 10% + 64 MiB, as a ratio to that bound.
var RSSGoal = bench.Goal{Text: "RSS of a process holding a region 5× its budget under random access ≤ budget + 10% + 64 MiB",
	Op: bench.AtMost, Threshold: 1}

// FaultsSpec is the "swap-faults" experiment.
func FaultsSpec() bench.Spec {
	return bench.Spec{
		Name:  "swap-faults",
		Title: "Minor and major fault latency of the SSD-backed region",
		Goals: []string{FaultsGoal.Text, "minor fault p50/p99 reported next to the raw read"},
		Run: func(ctx context.Context, env *bench.Env) (*bench.Experiment, error) {
			samples := bench.ByMode(env.Mode, 3000, 20000)
			exp := &bench.Experiment{Method: fmt.Sprintf("A file in the scratch directory holds %d pages of random data followed by a "+
				"hole of %d pages; a swap.Region over it (budget = the whole file, so nothing is evicted) is read once per page. "+
				"Each round takes, in this order, a raw 4 KiB O_DIRECT pread of an untouched data page through blockdev (the "+
				"physical limit), a 4 KiB ReadAt of another untouched data page through the region (major fault: backing read "+
				"+ UFFDIO_COPY + the copy out), a one-byte load of a third one through the raw view (userfaultfd fill by the C "+
				"fault threads), then a ReadAt and a raw-view load of two hole pages (minor faults: zero page). Pages are drawn "+
				"without replacement in random order, so every sample is a first touch; the kinds are interleaved so that they "+
				"share the machine's conditions.", 3*samples, 2*samples)}
			exp.AddParam("samples per kind", samples)
			exp.AddParam("scratch directory", env.ScratchDir)
			sampler := bench.StartCPUSampler(os.Getpid(), 0)
			f, err := MeasureFaults(ctx, filepath.Join(env.ScratchDir, "swap-faults.img"), samples)
			pl := sampler.Stop()
			pl.Role, pl.Pinned = "swap faults (bench process)", len(env.CPUs) > 0
			exp.Placements = append(exp.Placements, pl)
			if err != nil {
				return exp, err
			}
			us := bench.Micros
			exp.Add(
				bench.NewFigure("major fault p50", us(f.MajorP50), "µs", "1.2 × raw read p50 + 10 µs", us(f.MajorBound())).WithGoal(FaultsGoal),
				bench.NewFigure("major fault p50 vs raw read", us(f.MajorP50), "µs", "raw O_DIRECT read p50", us(f.RawReadP50)),
				bench.NewFigure("major fault p99", us(f.MajorP99), "µs", "raw O_DIRECT read p99", us(f.RawReadP99)),
				bench.NewFigure("minor fault p50", us(f.MinorP50), "µs", "raw O_DIRECT read p50", us(f.RawReadP50)),
				bench.NewFigure("minor fault p99", us(f.MinorP99), "µs", "raw O_DIRECT read p99", us(f.RawReadP99)),
				bench.NewFigure("raw-view major fault p50", us(f.UffdMajorP50), "µs", "raw O_DIRECT read p50", us(f.RawReadP50)),
				bench.NewFigure("raw-view major fault p99", us(f.UffdMajorP99), "µs", "raw O_DIRECT read p99", us(f.RawReadP99)),
				bench.NewFigure("raw-view minor fault p50", us(f.UffdMinorP50), "µs", "raw O_DIRECT read p50", us(f.RawReadP50)),
				bench.NewFigure("raw-view minor fault p99", us(f.UffdMinorP99), "µs", "raw O_DIRECT read p99", us(f.RawReadP99)),
			)
			for _, k := range []struct{ key, label string }{
				{"raw", "raw O_DIRECT read"}, {"major", "major fault (ReadAt)"}, {"minor", "minor fault (ReadAt)"},
				{"uffd-major", "major fault (raw view)"}, {"uffd-minor", "minor fault (raw view)"},
			} {
				exp.AddSeries(bench.Series{Name: "cdf-" + k.key, Label: k.label, XUnit: "µs", YUnit: "fraction",
					Points: bench.CDF(f.dist[k.key], 200)})
			}
			exp.AddPlot(bench.Plot{File: "swap-faults-cdf.svg", Kind: bench.PlotCDF, LogX: true,
				Title: "4 KiB fault latency against a raw read of the backing", XLabel: "latency (µs)", YLabel: "fraction of reads",
				Series: []string{"cdf-raw", "cdf-major", "cdf-minor", "cdf-uffd-major", "cdf-uffd-minor"}})
			if !f.Direct {
				exp.Note("the scratch file system refused O_DIRECT: raw reads and major faults went through the page cache")
			}
			exp.Note("raw-view faults include waking a fault thread, usually on the other vCPU (~40–60 µs on this machine); " +
				"the target's command paths use the explicit API (ReadAt)")
			return exp, nil
		},
	}
}

// PolicySpec is the "swap-policy" experiment.
func PolicySpec() bench.Spec {
	return bench.Spec{
		Name:  "swap-policy",
		Title: "Eviction policy hit ratio; eviction and writeback throughput",
		Goals: []string{PolicyGoal.Text + " (CLOCK vs a scan-resistant policy)", "eviction and writeback throughput reported"},
		Run: func(ctx context.Context, env *bench.Env) (*bench.Experiment, error) {
			cfg := PolicyConfig{Pages: bench.ByMode(env.Mode, 8192, 16384), Accesses: bench.ByMode(env.Mode, 100000, 400000)}
			budget := bench.ByMode[int64](env.Mode, 32<<20, 128<<20)
			dur := bench.ByMode(env.Mode, time.Second, 10*time.Second)
			exp := &bench.Experiment{Method: "Hit ratio: a swap.Region over an in-memory device (the ratio does not depend on " +
				"the device) is read one byte per access, first for a warm-up of the same length as the measurement, then " +
				"faults are counted. Workloads: Zipf(0.99) over the region's pages (ranks scattered by a fixed permutation), " +
				"and the same with 30% of the accesses replaced by a sequential scan of the whole region; region:budget " +
				"2, 4 and 8; CLOCK (FIFO-reinsertion) against S3-FIFO (the default). Throughput: over a file 4× the " +
				"budget, two goroutines read or rewrite (50/50) random pages for the run time; evictions and writebacks " +
				"per second are set against two goroutines doing raw 4 KiB random O_DIRECT writes to the same file."}
			exp.AddParam("pages", cfg.Pages)
			exp.AddParam("accesses per run", cfg.Accesses)
			exp.AddParam("throughput budget", fmt.Sprintf("%d MiB", budget>>20))
			exp.AddParam("throughput run time", dur)
			sampler := bench.StartCPUSampler(os.Getpid(), 0)
			res, err := ComparePolicies(ctx, cfg)
			if err != nil {
				sampler.Stop()
				return exp, err
			}
			var categories []string
			var clock, s3 []bench.Point
			for i := 0; i+1 < len(res); i += 2 {
				c, s := res[i], res[i+1] // CLOCK then S3-FIFO per case
				name := fmt.Sprintf("%s 1:%g", c.Workload, c.RegionToBudget)
				fig := bench.NewFigure("hit ratio "+name, s.HitRatio, "", "CLOCK", c.HitRatio)
				if s.Policy == swap.DefaultPolicy.String() {
					fig = fig.WithGoal(PolicyGoal)
				}
				exp.Add(fig)
				clock = append(clock, bench.Point{X: float64(len(categories)), Y: c.HitRatio})
				s3 = append(s3, bench.Point{X: float64(len(categories)), Y: s.HitRatio})
				categories = append(categories, name)
			}
			exp.AddSeries(bench.Series{Name: "hit-clock", Label: "CLOCK", YUnit: "hit ratio", Points: clock})
			exp.AddSeries(bench.Series{Name: "hit-s3fifo", Label: "S3-FIFO", YUnit: "hit ratio", Points: s3})
			exp.AddPlot(bench.Plot{File: "swap-policy-hit-ratio.svg", Kind: bench.PlotBars, Title: "Hit ratio by policy",
				YLabel: "hit ratio", Series: []string{"hit-clock", "hit-s3fifo"}, Categories: categories})

			e, err := MeasureEviction(ctx, filepath.Join(env.ScratchDir, "swap-evict.img"), budget, dur)
			pl := sampler.Stop()
			pl.Role, pl.Pinned = "swap policy and eviction (bench process)", len(env.CPUs) > 0
			exp.Placements = append(exp.Placements, pl)
			if err != nil {
				return exp, err
			}
			exp.Add(
				bench.NewFigure("writebacks", e.WritebacksPerSec, "pages/s", "raw 4 KiB random writes", e.RawWritesPerSec),
				bench.NewFigure("evictions", e.EvictionsPerSec, "pages/s", "raw 4 KiB random writes", e.RawWritesPerSec),
				bench.NewFigure("writeback bandwidth", e.MiBPerSec, "MiB/s", "raw 4 KiB random writes",
					e.RawWritesPerSec*pageSize/(1<<20)),
			)
			return exp, nil
		},
	}
}

// RSSSpec is the "swap-rss" experiment.
func RSSSpec() bench.Spec {
	return bench.Spec{
		Name:  "swap-rss",
		Title: "Resident memory against the DRAM budget",
		Goals: []string{RSSGoal.Text},
		Run: func(ctx context.Context, env *bench.Env) (*bench.Experiment, error) {
			budget := bench.ByMode[int64](env.Mode, 128<<20, 512<<20)
			dur := bench.ByMode(env.Mode, 4*time.Second, 30*time.Second)
			exp := &bench.Experiment{Method: "A fresh child process (the bench binary re-executed, so that nothing " +
				"earlier experiments left in the bench's heap is counted) reads its VmRSS (baseline), creates a region " +
				"5× the budget over a sparse file and runs two goroutines that read or rewrite (50/50) random 4 KiB " +
				"pages for the run time, sampling VmRSS every 5 ms. The peak is set against budget + 10% + 64 MiB; " +
				"it is the whole child process (Go runtime, heap, region), and the baseline is reported too."}
			exp.AddParam("budget", fmt.Sprintf("%d MiB", budget>>20))
			exp.AddParam("region", fmt.Sprintf("%d MiB", 5*budget>>20))
			exp.AddParam("run time", dur)
			var sampler *bench.CPUSampler
			res, err := MeasureRSSInChild(ctx, filepath.Join(env.ScratchDir, "swap-rss.img"), budget, 5, dur,
				func(pid int) { sampler = bench.StartCPUSampler(pid, 0) })
			if sampler != nil {
				pl := sampler.Stop()
				pl.Role, pl.Pinned = "swap RSS (child process)", len(env.CPUs) > 0
				exp.Placements = append(exp.Placements, pl)
			}
			if err != nil {
				return exp, err
			}
			mib := func(b int64) float64 { return float64(b) / (1 << 20) }
			exp.Add(
				bench.NewFigure("peak RSS", mib(res.PeakRSSBytes), "MiB", "budget + 10% + 64 MiB", mib(res.LimitBytes)).WithGoal(RSSGoal),
				bench.NewFigure("peak RSS vs budget", mib(res.PeakRSSBytes), "MiB", "budget", mib(res.BudgetBytes)),
				bench.NewFigure("RSS growth while holding the region", mib(res.Growth()), "MiB", "budget", mib(res.BudgetBytes)),
				bench.NewFigure("RSS before the region", mib(res.BaselineBytes), "MiB", "budget", mib(res.BudgetBytes)),
			)
			return exp, nil
		},
	}
}
