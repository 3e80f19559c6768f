package e2ebench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/bench/blockdevbench"
)

// CapacityName is the experiment's fixed name (--only capacity).
const CapacityName = "capacity"

// CapacityGoal is the goal: at 5x the budget, the average Zipf read
// costs no more than 5% above what its hit ratio predicts.
var CapacityGoal = bench.Goal{
	Text: "at 5× the DRAM budget, average Zipf(0.99) 4 KiB read latency ≤ 1.05× the prediction from the measured hit ratio " +
		"(hit × all-resident latency + miss × fault-path latency, same run)",
	Op: bench.AtMost, Threshold: 1.05}

// CapacityConfig sizes the capacity experiment.
type CapacityConfig struct {
	// Budget is the target's resident capacity B; the namespace of ratio r
	// is r×B. The target gets --memory memoryFor(B): swap keeps a free
	// margin of a sixteenth of its budget (at most 16 MiB) out of use.
	Budget int64
	// Ratios are the namespace-to-budget ratios, 1 first (the all-resident
	// baseline).
	Ratios []int
	// Before each measured workload WarmupQD concurrent readers (and
	// writers, for the mix) run it for at least Warmup and until the hit
	// ratio settles, at most MaxWarmup; Runtime is the measured time at QD1.
	Warmup, MaxWarmup time.Duration
	WarmupQD          int
	Runtime           time.Duration
	// ColdReads first-touch reads measure the fault path after each start.
	ColdReads int
	// RepeatBaseline runs the 1× case again at the end; the baseline is the
	// mean of both runs and their difference is reported as drift.
	RepeatBaseline bool
	// Workloads are measured at every ratio; Zipf reads, the judged one,
	// first.
	Workloads []workload
	// Dir holds the backing files (a real disk); default env.ScratchDir.
	Dir string
}

// DefaultCapacityConfig returns the sizes for a mode: quick fits in about
// a minute and a half on this machine.
func DefaultCapacityConfig(m bench.Mode) CapacityConfig {
	return CapacityConfig{
		Budget: bench.ByMode[int64](m, 128<<20, 1<<30),
		// Quick measures the judged 5× next to its 1× baseline only.
		Ratios:         bench.ByMode(m, []int{1, 5}, []int{1, 2, 5, 8}),
		Warmup:         bench.ByMode(m, time.Second, 5*time.Second),
		MaxWarmup:      bench.ByMode(m, 4*time.Second, 60*time.Second),
		WarmupQD:       8,
		Runtime:        bench.ByMode(m, 1500*time.Millisecond, 15*time.Second),
		ColdReads:      bench.ByMode(m, 500, 5000),
		RepeatBaseline: m == bench.ModeFull,
		// Uniform reads and the read/write mix are reported in full mode.
		Workloads: bench.ByMode(m, capacityWorkloads[:1], capacityWorkloads),
	}
}

// memoryFor returns the --memory that leaves b bytes resident after swap's
// free margin (budget/16, at most 16 MiB, kept by a region larger than its
// budget), rounded up to whole pages.
func memoryFor(b int64) int64 {
	m := (b*16/15 + pageSize - 1) / pageSize * pageSize
	if m-b > 16<<20 {
		m = b + 16<<20
	}
	return m
}

// CapacitySpec declares the experiment for the suite.
func CapacitySpec(bins *Binaries) bench.Spec {
	return bench.Spec{
		Name:  CapacityName,
		Title: "Latency against the namespace-to-DRAM ratio (1×..8×)",
		Goals: []string{CapacityGoal.Text,
			"average and p99 latency of Zipf(0.99), uniform and 70/30 read/write 4 KiB I/O at 2×, 5×, 8× against the all-resident run; target RSS against --memory"},
		Run: func(ctx context.Context, env *bench.Env) (*bench.Experiment, error) {
			return MeasureCapacity(ctx, env, bins, DefaultCapacityConfig(env.Mode))
		},
	}
}

// workload is one access pattern.
type workload struct {
	key, label string
	zipf       bool
	writeShare float64
}

var capacityWorkloads = []workload{
	{key: "zipf", label: "Zipf(0.99) reads", zipf: true},
	{key: "uniform", label: "uniform reads"},
	{key: "mix", label: "70/30 read/write, Zipf(0.99)", zipf: true, writeShare: 0.3},
}

// wlResult is one measured workload.
type wlResult struct {
	reads, hits, fallbacks, writes []time.Duration // sorted once measured
	readsFirstHalf, hitsFirstHalf  int
	warm                           warmUpResult
}

func (w *wlResult) hitRatio() float64 {
	if len(w.reads) == 0 {
		return 0
	}
	return float64(len(w.hits)) / float64(len(w.reads))
}

// halves returns the hit ratios of the first and second half of the
// measurement: far apart means the cache was not at its steady state.
func (w *wlResult) halves() (first, second float64) {
	n2 := len(w.reads) - w.readsFirstHalf
	if w.readsFirstHalf == 0 || n2 == 0 {
		h := w.hitRatio()
		return h, h
	}
	return float64(w.hitsFirstHalf) / float64(w.readsFirstHalf), float64(len(w.hits)-w.hitsFirstHalf) / float64(n2)
}

// capRun is one start of the target at one ratio.
type capRun struct {
	ratio        int
	size, memory int64
	cold         []time.Duration // first-touch reads that took the fallback
	coldHits     int             // first-touch reads served one-sided (should be none)
	wl           map[string]*wlResult
	peakRSS      int64
	prep         time.Duration
	targetHWM    int64
}

// MeasureCapacity runs the experiment with cfg.
func MeasureCapacity(ctx context.Context, env *bench.Env, bins *Binaries, cfg CapacityConfig) (*bench.Experiment, error) {
	if len(cfg.Ratios) == 0 || cfg.Ratios[0] != 1 || cfg.Budget < 16<<20 || cfg.Runtime <= 0 || len(cfg.Workloads) == 0 {
		return nil, fmt.Errorf("capacity: bad config: ratios %v (1 first), budget %d, runtime %v", cfg.Ratios, cfg.Budget, cfg.Runtime)
	}
	tgtBin, _, err := bins.Resolve(ctx, env)
	if err != nil {
		return nil, err
	}
	if cfg.Dir == "" {
		cfg.Dir = env.ScratchDir
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("capacity: scratch directory: %w", err)
	}
	work, err := os.MkdirTemp(cfg.Dir, "capacity-")
	if err != nil {
		return nil, fmt.Errorf("capacity: %w", err)
	}
	defer os.RemoveAll(work)
	log := env.Logger()
	var pl placements
	ratios := slices.Clone(cfg.Ratios)
	if cfg.RepeatBaseline {
		ratios = append(ratios, 1)
	}
	var runs []*capRun
	for i, r := range ratios {
		log.Info("capacity: measuring", "ratio", r, "namespace", bench.FormatBytes(int64(r)*cfg.Budget), "run", i+1, "of", len(ratios))
		run, err := runCapacityRatio(ctx, env, tgtBin, cfg, r, filepath.Join(work, "r"+strconv.Itoa(i)), uint64(i+1), &pl)
		if err != nil {
			return nil, fmt.Errorf("capacity %d×: %w", r, err)
		}
		runs = append(runs, run)
	}
	exp := capacityReport(env, cfg, runs, tgtBin)
	exp.Placements = pl.list()
	return exp, nil
}

func runCapacityRatio(ctx context.Context, env *bench.Env, tgtBin string, cfg CapacityConfig, ratio int, dir string, seed uint64, pl *placements) (*capRun, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	run := &capRun{ratio: ratio, size: int64(ratio) * cfg.Budget, memory: memoryFor(cfg.Budget), wl: map[string]*wlResult{}}
	backing := filepath.Join(dir, "backing.img")
	t0 := time.Now()
	if err := blockdevbench.PrepareFile(ctx, backing, run.size, dataSeed); err != nil {
		return nil, err
	}
	run.prep = time.Since(t0)
	tp, err := startTarget(ctx, targetConfig{bin: tgtBin, backing: backing, memory: run.memory, dataDir: filepath.Join(dir, "meta")}, time.Minute)
	if err != nil {
		return nil, err
	}
	defer tp.Stop(syscall.SIGKILL, time.Second)
	rss := bench.StartRSSSampler(tp.PID(), 20*time.Millisecond)
	h, err := connectHost(ctx, tp.addr, dir)
	if err != nil {
		rss.Stop()
		return nil, fmt.Errorf("connect: %w", err)
	}
	hostClosed := false
	defer func() {
		if !hostClosed {
			h.close()
		}
	}()
	pages := run.size / pageSize
	rng := rand.New(rand.NewPCG(seed, 0xc01d))

	// The fault path: first-touch reads of distinct pages right after the
	// start, when nothing is resident (the file was written with O_DIRECT,
	// so nothing is in the page cache either).
	buf := make([]byte, pageSize)
	seen := map[int64]bool{}
	for len(seen) < min(cfg.ColdReads, int(pages)/2) {
		page := rng.Int64N(pages)
		if seen[page] {
			continue
		}
		seen[page] = true
		before := h.c.Stats().ReadsOneSided
		start := time.Now()
		_, err := h.ns.ReadAt(buf, page*pageSize)
		d := time.Since(start)
		if err != nil {
			return nil, fmt.Errorf("cold read of page %d: %w", page, err)
		}
		if err := checkTag(buf, page); err != nil {
			return nil, err
		}
		if h.c.Stats().ReadsOneSided != before {
			run.coldHits++
			continue
		}
		run.cold = append(run.cold, d)
	}
	slices.Sort(run.cold)
	// Fill the cache: at 1× this reads everything, so that the measurement
	// starts with every page in DRAM; above, it reads the first
	// budget's worth, after which every workload's warm-up only has to
	// exchange pages, not wait for the cache to fill.
	if err := fillCache(ctx, h, min(run.size, run.memory)); err != nil {
		return nil, err
	}

	procs := map[string]int{"nprdma-target": tp.PID(), "nprdma-bench (in-process initiator)": os.Getpid()}
	pinned := len(env.CPUs) > 0
	for wi, w := range cfg.Workloads {
		gen := func(r *rand.Rand) int64 { return r.Int64N(pages) }
		if w.zipf {
			z, err := newZipf(pages, 0.99)
			if err != nil {
				return nil, err
			}
			gen = z.page
		}
		wu, err := warmUp(ctx, h, w, gen, cfg.WarmupQD, cfg.Warmup, cfg.MaxWarmup, seed*100+uint64(wi))
		if err != nil {
			return nil, fmt.Errorf("warm-up %s: %w", w.key, err)
		}
		var res *wlResult
		err = pl.sampleDuring(procs, pinned, func() error {
			var err error
			res, err = measureWorkload(ctx, h, w, gen, cfg.Runtime, seed*100+50+uint64(wi))
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", w.key, err)
		}
		res.warm = wu
		run.wl[w.key] = res
	}
	// Full check of a sample of pages after the mixed writes.
	for range 64 {
		page := rng.Int64N(pages)
		if _, err := h.ns.ReadAt(buf, page*pageSize); err != nil {
			return nil, err
		}
		if err := blockdevbench.VerifyPage(buf, dataSeed, page); err != nil {
			return nil, fmt.Errorf("after the run: %w", err)
		}
	}
	h.close()
	hostClosed = true
	rep, _ := rss.Stop()
	run.peakRSS = rep.PeakRSS
	run.targetHWM = rep.Last.HWM
	if err := tp.shutdown(); err != nil {
		return nil, err
	}
	return run, nil
}

// fillCache reads [0, n) in 1 MiB reads from 4 goroutines, so that the
// target's cache is full before a workload warms it: a cache that is still
// filling would make every hit ratio depend on how long the warm-up ran.
func fillCache(ctx context.Context, h *host, n int64) error {
	const chunk, workers = 1 << 20, 4
	var next int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, chunk)
			for ctx.Err() == nil {
				mu.Lock()
				off := next
				next += chunk
				mu.Unlock()
				if off >= n {
					return
				}
				k := min(chunk, n-off)
				if _, err := h.ns.ReadAt(buf[:k], off); err != nil {
					errs[g] = fmt.Errorf("fill: read [%d, +%d): %w", off, k, err)
					return
				}
				for p := int64(0); p < k; p += pageSize {
					if err := checkTag(buf[p:], (off+p)/pageSize); err != nil {
						errs[g] = err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return ctx.Err()
}

// warmWindow is how often the warm-up looks at the hit ratio.
const warmWindow = 500 * time.Millisecond

// warmUpResult says how a warm-up ended.
type warmUpResult struct {
	took    time.Duration
	hit     float64 // one-sided share of the last windows
	settled bool    // the hit ratio stopped moving before maxD
}

// warmUp runs qd goroutines of the workload until the share of reads served
// one-sided stops moving (the mean of the last two windows within 0.01 of
// the two before, after at least minD) or maxD has passed, so that the cache
// holds what the workload keeps hot when the measurement starts.
func warmUp(ctx context.Context, h *host, w workload, gen func(*rand.Rand) int64, qd int, minD, maxD time.Duration, seed uint64) (warmUpResult, error) {
	start := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	var res warmUpResult
	go func() {
		defer close(done)
		t := time.NewTicker(warmWindow)
		defer t.Stop()
		var shares []float64
		prev := h.c.Stats()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			cur := h.c.Stats()
			if n := cur.Reads - prev.Reads; n > 0 {
				shares = append(shares, float64(cur.ReadsOneSided-prev.ReadsOneSided)/float64(n))
			}
			prev = cur
			el := time.Since(start)
			if k := len(shares); k >= 4 {
				last, before := (shares[k-1]+shares[k-2])/2, (shares[k-3]+shares[k-4])/2
				res.hit = last
				if el >= minD && last-before < 0.01 && before-last < 0.01 {
					res.settled = true
					cancel()
					return
				}
			}
			if el >= maxD {
				cancel()
				return
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make([]error, qd)
	for g := range qd {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(g)))
			buf := make([]byte, pageSize)
			for ctx.Err() == nil {
				page := gen(r)
				var err error
				if w.writeShare > 0 && r.Float64() < w.writeShare {
					blockdevbench.FillPage(buf, dataSeed, page)
					_, err = h.ns.WriteAt(buf, page*pageSize)
				} else if _, err = h.ns.ReadAt(buf, page*pageSize); err == nil {
					err = checkTag(buf, page)
				}
				if err != nil {
					errs[g] = err
					cancel()
					return
				}
			}
		}()
	}
	wg.Wait()
	cancel()
	<-done
	res.took = time.Since(start)
	return res, errors.Join(errs...)
}

// measureWorkload issues one operation at a time for d and times each; a
// read counts as a hit when the initiator's counters say it completed
// one-sided (exact at QD1: nothing else reads meanwhile).
func measureWorkload(ctx context.Context, h *host, w workload, gen func(*rand.Rand) int64, d time.Duration, seed uint64) (*wlResult, error) {
	r := rand.New(rand.NewPCG(seed, 7))
	buf := make([]byte, pageSize)
	res := &wlResult{}
	start := time.Now()
	half, end := start.Add(d/2), start.Add(d)
	for {
		now := time.Now()
		if now.After(end) {
			break
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		page := gen(r)
		off := page * pageSize
		if w.writeShare > 0 && r.Float64() < w.writeShare {
			blockdevbench.FillPage(buf, dataSeed, page)
			t0 := time.Now()
			_, err := h.ns.WriteAt(buf, off)
			res.writes = append(res.writes, time.Since(t0))
			if err != nil {
				return nil, fmt.Errorf("write page %d: %w", page, err)
			}
			continue
		}
		before := h.c.Stats().ReadsOneSided
		t0 := time.Now()
		_, err := h.ns.ReadAt(buf, off)
		lat := time.Since(t0)
		if err != nil {
			return nil, fmt.Errorf("read page %d: %w", page, err)
		}
		hit := h.c.Stats().ReadsOneSided != before
		if err := checkTag(buf, page); err != nil {
			return nil, err
		}
		res.reads = append(res.reads, lat)
		if hit {
			res.hits = append(res.hits, lat)
		} else {
			res.fallbacks = append(res.fallbacks, lat)
		}
		if t0.Before(half) {
			res.readsFirstHalf++
			if hit {
				res.hitsFirstHalf++
			}
		}
	}
	for _, s := range [][]time.Duration{res.reads, res.hits, res.fallbacks, res.writes} {
		slices.Sort(s)
	}
	if len(res.reads) == 0 {
		return nil, fmt.Errorf("no read completed in %v", d)
	}
	return res, nil
}

// capacityReport turns the runs into the experiment record.
func capacityReport(env *bench.Env, cfg CapacityConfig, runs []*capRun, tgtBin string) *bench.Experiment {
	us := bench.Micros
	exp := &bench.Experiment{Name: CapacityName}
	exp.Method = fmt.Sprintf("The real nprdma-target (%s) serves one namespace from a backing file in %s with --memory %s, which "+
		"after swap's free margin keeps B = %s resident; the namespace is r×B for r in %v. "+
		"Each run writes the file afresh with per-page distinct data (4 MiB O_DIRECT writes, so nothing is in the page cache), starts "+
		"the target, and connects an in-process initiator over nprdma/tcp on loopback. The initiator is in the bench process rather "+
		"than behind fio and NBD so that every read is timed alone and classified exactly: at QD1 a read is a hit when the initiator's "+
		"one-sided counter moved, a miss when it took the fallback (the two-sided NVMe Read that faults the page in). "+
		"First, %d first-touch reads of distinct random pages measure the fault path (every one a major fault, with no eviction "+
		"needed yet); then the first --memory bytes of the namespace are read in 1 MiB reads, which at 1× makes everything resident "+
		"and above it fills the cache. For each workload — Zipf(0.99) reads (ranks scattered over the namespace by a fixed "+
		"permutation), uniform reads, and a 70/30 read/write mix with Zipf(0.99) offsets (writes rewrite a page's own content) — "+
		"%d concurrent workers warm the cache until the share of one-sided reads settles (at least %v, at most %v), then one worker "+
		"measures for %v, one 4 KiB operation at a time, checking the first word of every page read (64 pages are verified in full "+
		"at the end). The all-resident baseline is the 1× run of the same workload. The prediction for a run is hit × (average latency "+
		"of the 1× run's hits of that workload) + (1 − hit) × (average first-touch latency, all starts pooled). Target RSS is sampled every 20 ms.",
		filepath.Base(tgtBin), cfg.Dir, bench.FormatBytes(memoryFor(cfg.Budget)), bench.FormatBytes(cfg.Budget), cfg.Ratios, cfg.ColdReads,
		cfg.WarmupQD, cfg.Warmup, cfg.MaxWarmup, cfg.Runtime)
	exp.AddParam("resident capacity B", bench.FormatBytes(cfg.Budget))
	exp.AddParam("--memory", bench.FormatBytes(memoryFor(cfg.Budget)))
	exp.AddParam("ratios", fmt.Sprint(cfg.Ratios))
	exp.AddParam("warm-up", fmt.Sprintf("%d workers, %v to %v, until the hit ratio settles", cfg.WarmupQD, cfg.Warmup, cfg.MaxWarmup))
	exp.AddParam("measured", fmt.Sprintf("%v per workload, QD1", cfg.Runtime))
	exp.AddParam("first-touch reads", cfg.ColdReads)
	var prep []string
	for _, r := range runs {
		prep = append(prep, fmt.Sprintf("%d×: %v", r.ratio, r.prep.Round(10*time.Millisecond)))
	}
	exp.AddParam("file write time", fmt.Sprint(prep))

	// The baseline: the 1× run(s).
	var base []*capRun
	byRatio := map[int]*capRun{}
	for _, r := range runs {
		if r.ratio == 1 {
			base = append(base, r)
		} else {
			byRatio[r.ratio] = r
		}
	}
	baseAvg := func(key string, pick func(*wlResult) []time.Duration) float64 {
		var xs []float64
		for _, b := range base {
			xs = append(xs, us(bench.Mean(pick(b.wl[key]))))
		}
		return bench.MeanFloat(xs)
	}
	baseP99 := func(key string) float64 {
		var xs []float64
		for _, b := range base {
			xs = append(xs, us(bench.Percentile(b.wl[key].reads, 99)))
		}
		return bench.MeanFloat(xs)
	}
	// The fault path's latency is the mean of every start's first-touch
	// reads, pooled: each start measures the same path (a major fault with
	// a free slot, no eviction yet), and one start's thousand reads swung
	// between 0.67 and 0.85 ms from run to run on this machine's disk.
	var cold []time.Duration
	for _, r := range runs {
		cold = append(cold, r.cold...)
	}
	fault := us(bench.Mean(cold))
	reads := func(w *wlResult) []time.Duration { return w.reads }
	allOps := func(w *wlResult) []time.Duration {
		all := append(slices.Clone(w.reads), w.writes...)
		slices.Sort(all)
		return all
	}

	series := map[string][]bench.Point{}
	addPt := func(name string, x int, y float64) {
		series[name] = append(series[name], bench.Point{X: float64(x), Y: y})
	}
	ratiosSeen := []int{1}
	for _, w := range cfg.Workloads {
		b := baseAvg(w.key, reads)
		addPt("avg-"+w.key, 1, b)
		addPt("pred-"+w.key, 1, b)
		addPt("p99-"+w.key, 1, baseP99(w.key))
		var hs []float64
		for _, r := range base {
			hs = append(hs, r.wl[w.key].hitRatio())
		}
		addPt("hit-"+w.key, 1, bench.MeanFloat(hs))
	}
	for _, r := range cfg.Ratios[1:] {
		run := byRatio[r]
		if run == nil {
			continue
		}
		ratiosSeen = append(ratiosSeen, r)
		for _, w := range cfg.Workloads {
			res := run.wl[w.key]
			h := res.hitRatio()
			first, second := res.halves()
			resident := baseAvg(w.key, reads)
			hitLat := baseAvg(w.key, func(w *wlResult) []time.Duration { return w.hits })
			pred := h*hitLat + (1-h)*fault
			avg := us(bench.Mean(res.reads))
			p99 := us(bench.Percentile(res.reads, 99))
			name := fmt.Sprintf("%d× %s", r, w.label)
			predFig := bench.NewFigure(name+": average read latency vs prediction", avg, "µs",
				fmt.Sprintf("prediction (hit %.3f)", h), pred).WithNotes(fmt.Sprintf(
				"hit ratio %.3f (first half %.3f); hits %.1f µs avg (1× %.1f), misses %.1f µs avg (first touch %.1f); %d reads; warm-up %v%s",
				h, first, us(bench.Mean(res.hits)), hitLat, us(bench.Mean(res.fallbacks)), fault, len(res.reads),
				res.warm.took.Round(100*time.Millisecond), map[bool]string{true: "", false: " (hit ratio still moving)"}[res.warm.settled]))
			if r == 5 && w.key == "zipf" {
				predFig = predFig.WithGoal(CapacityGoal)
			}
			exp.Add(
				predFig,
				bench.NewFigure(name+": average read latency", avg, "µs", "1× (all resident)", resident),
				bench.NewFigure(name+": p99 read latency", p99, "µs", "1× (all resident) p99", baseP99(w.key)),
			)
			if w.writeShare > 0 {
				exp.Add(bench.NewFigure(name+": average latency of all operations", us(bench.Mean(allOps(res))), "µs",
					"1× (all resident)", baseAvg(w.key, allOps)).WithNotes(fmt.Sprintf("%d writes, %.1f µs avg (1× %.1f)",
					len(res.writes), us(bench.Mean(res.writes)), baseAvg(w.key, func(w *wlResult) []time.Duration { return w.writes }))))
			}
			addPt("avg-"+w.key, r, avg)
			addPt("pred-"+w.key, r, pred)
			addPt("p99-"+w.key, r, p99)
			addPt("hit-"+w.key, r, h)
			if d := second - first; d > 0.02 || d < -0.02 {
				exp.Note("%d× %s: the hit ratio moved from %.3f in the first half of the measurement to %.3f in the second: the cache "+
					"was still settling after the %v warm-up.", r, w.label, first, second, res.warm.took.Round(100*time.Millisecond))
			}
		}
	}
	for _, run := range runs {
		label := fmt.Sprintf("%d×", run.ratio)
		exp.Add(bench.NewFigure(label+": target peak RSS", mib(run.peakRSS), "MiB", "--memory", mib(run.memory)).
			WithNotes(fmt.Sprintf("kernel high-water mark %.0f MiB; namespace %s", mib(run.targetHWM), bench.FormatBytes(run.size))))
		addPt("rss-peak", run.ratio, mib(run.peakRSS))
		addPt("rss-memory", run.ratio, mib(run.memory))
		if run.coldHits > 0 {
			exp.Note("%d×: %d of the first-touch reads were served one-sided (the page was already resident), left out of the fault-path latency.", run.ratio, run.coldHits)
		}
	}
	if h := seriesYOf(series["hit-uniform"], 1); h > 0 && h < 0.99 {
		exp.Note("At 1× only %.1f%% of uniform reads were hits although --memory exceeds the namespace. The prediction "+
			"therefore takes the 1× hits' latency, not the 1× average, as the all-resident latency.", h*100)
	}
	var coldNotes []string
	for _, run := range runs {
		coldNotes = append(coldNotes, fmt.Sprintf("%d×: %.1f µs avg, p99 %.1f", run.ratio, us(bench.Mean(run.cold)), us(bench.Percentile(run.cold, 99))))
	}
	exp.Note("Fault-path latency (first-touch reads after each start): %s. The prediction uses all of them pooled: %.1f µs.", strings.Join(coldNotes, "; "), fault)
	if len(base) > 1 {
		var zs []float64
		for _, b := range base {
			zs = append(zs, us(bench.Mean(b.wl["zipf"].reads)))
		}
		exp.Note("The 1× run was repeated at the end; Zipf average read latency %s µs (first, last): the baseline is their mean.", bench.RoundList(zs))
	} else {
		exp.Note("Each ratio was measured once, in the order %v (the 1× baseline first): a machine that got busier during the run "+
			"shows up as latency growing with the ratio. BENCH=full repeats the 1× run at the end.", cfg.Ratios)
	}

	// Series and plots.
	ticks := make([]float64, len(ratiosSeen))
	for i, r := range ratiosSeen {
		ticks[i] = float64(r)
	}
	for _, s := range []struct{ name, label, unit string }{
		{"avg-zipf", "Zipf: measured", "µs"}, {"pred-zipf", "Zipf: predicted", "µs"},
		{"avg-uniform", "uniform: measured", "µs"}, {"pred-uniform", "uniform: predicted", "µs"},
		{"avg-mix", "70/30 mix (reads): measured", "µs"}, {"pred-mix", "70/30 mix (reads): predicted", "µs"},
		{"p99-zipf", "Zipf", "µs"}, {"p99-uniform", "uniform", "µs"}, {"p99-mix", "70/30 mix (reads)", "µs"},
		{"hit-zipf", "Zipf", "hit ratio"}, {"hit-uniform", "uniform", "hit ratio"}, {"hit-mix", "70/30 mix (reads)", "hit ratio"},
		{"rss-peak", "target peak RSS", "MiB"}, {"rss-memory", "--memory", "MiB"},
	} {
		exp.AddSeries(bench.Series{Name: s.name, Label: s.label, XUnit: "namespace / DRAM budget", YUnit: s.unit, Points: series[s.name]})
	}
	exp.AddPlot(bench.Plot{File: "capacity-avg.svg", Kind: bench.PlotLine, XTicks: ticks,
		Title: "Average 4 KiB read latency against the namespace-to-budget ratio", XLabel: "namespace / DRAM budget", YLabel: "average read latency (µs)",
		Caption: "Measured against predicted (hit × all-resident latency + miss × fault-path latency), QD1.",
		Series:  []string{"avg-zipf", "pred-zipf", "avg-uniform", "pred-uniform", "avg-mix", "pred-mix"}})
	exp.AddPlot(bench.Plot{File: "capacity-p99.svg", Kind: bench.PlotLine, XTicks: ticks, LogY: true,
		Title: "p99 4 KiB read latency against the namespace-to-budget ratio", XLabel: "namespace / DRAM budget", YLabel: "p99 read latency (µs)",
		Series: []string{"p99-zipf", "p99-uniform", "p99-mix"}})
	exp.AddPlot(bench.Plot{File: "capacity-hit-ratio.svg", Kind: bench.PlotLine, XTicks: ticks,
		Title: "Share of reads served one-sided (hit ratio)", XLabel: "namespace / DRAM budget", YLabel: "hit ratio",
		Series: []string{"hit-zipf", "hit-uniform", "hit-mix"}})
	exp.AddPlot(bench.Plot{File: "capacity-rss.svg", Kind: bench.PlotLine, XTicks: ticks,
		Title: "Target RSS against --memory", XLabel: "namespace / DRAM budget", YLabel: "MiB",
		Caption: "Peak VmRSS of the nprdma-target process over the whole run (sampled every 20 ms).",
		Series:  []string{"rss-peak", "rss-memory"}})
	var cdfs []string
	for _, run := range runs {
		if run.ratio == 1 && run != base[0] {
			continue
		}
		name := "cdf-zipf-" + strconv.Itoa(run.ratio)
		exp.AddSeries(bench.Series{Name: name, Label: fmt.Sprintf("%d×", run.ratio), XUnit: "µs", YUnit: "fraction",
			Points: bench.CDF(run.wl["zipf"].reads, 200)})
		cdfs = append(cdfs, name)
	}
	exp.AddPlot(bench.Plot{File: "capacity-cdf-zipf.svg", Kind: bench.PlotCDF, LogX: true,
		Title: "Zipf(0.99) 4 KiB read latency by namespace-to-budget ratio", XLabel: "read latency (µs)", Series: cdfs})
	if len(env.CPUs) == 0 {
		exp.Note("Not pinned: the target and the bench (initiator) could run on either CPU; the placement table shows where they ran.")
	}
	return exp
}

func seriesYOf(pts []bench.Point, x float64) float64 {
	for _, p := range pts {
		if p.X == x {
			return p.Y
		}
	}
	return 0
}
