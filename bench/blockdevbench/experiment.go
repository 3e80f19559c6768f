package blockdevbench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/blockdev"
)

// Name is the experiment's fixed name (--only blockdev).
const Name = "blockdev"

// Goal is the acceptance criterion of the experiment: our QD1 median read
// latency within 10% of fio's on the same file.
var Goal = bench.Goal{Text: "QD1 p50 ≤ 1.1× fio psync", Op: bench.AtMost, Threshold: 1.1}

// dataSeed keys the backing file's content.
const dataSeed = 0x6e707264_6d61_0001

// Config sizes the experiment.
type Config struct {
	FileSize int64         // backing file size
	Dir      string        // where the backing file is created (a real disk)
	Runtime  time.Duration // measured time of each main measurement
	Warmup   time.Duration // discarded start of each measurement (fio ramp_time)
	Rounds   int           // main rounds; ours and fio alternate, order reversed each round
	QD       int           // the high queue depth (32)
	// SweepDepths are the queue depths of the IOPS-vs-depth sweep (none: no sweep).
	SweepDepths  []int
	SweepRuntime time.Duration
	SweepWarmup  time.Duration
	// KeepFile leaves the backing file in place after the run.
	KeepFile bool
}

// DefaultConfig returns the sizes of one round for a mode (the suite runs
// the rounds): quick measures about 15 s, full uses a 4 GiB file and longer
// runs.
func DefaultConfig(m bench.Mode) Config {
	return Config{
		FileSize: bench.ByMode[int64](m, 512<<20, 4<<30),
		Runtime:  bench.ByMode(m, time.Second, 10*time.Second),
		Warmup:   bench.WarmUp(m),
		Rounds:   1,
		QD:       32,
		// The sweep is reported, not judged: full mode only.
		SweepDepths:  bench.ByMode(m, nil, []int{1, 2, 4, 8, 16, 32}),
		SweepRuntime: bench.ByMode(m, 500*time.Millisecond, 5*time.Second),
		SweepWarmup:  bench.WarmUp(m),
	}
}

// Spec declares the experiment for the suite.
func Spec() bench.Spec {
	return bench.Spec{
		Name:  Name,
		Title: "4 KiB random reads of the backing file: blockdev vs fio",
		Goals: []string{Goal.Text + " on the same file in the same run (p99 and IOPS at QD1 and QD32 reported next to fio)"},
		Run: func(ctx context.Context, env *bench.Env) (*bench.Experiment, error) {
			cfg := DefaultConfig(env.Mode)
			cfg.Dir = env.ScratchDir
			return Measure(ctx, env, cfg)
		},
	}
}

// caseDef is one kind of measurement that is repeated every round.
type caseDef struct {
	key    string // series and file names
	role   string // CPU placement row
	label  string // legend
	ours   bool
	qd     int // ours: goroutines; fio: iodepth
	engine string
	jobs   int
	procs  int  // ours: GOMAXPROCS during the measurement (0: unchanged)
	uring  bool // ours: the file opened WithIOUring
}

func (c caseDef) fioArgs(path string, dur, warmup time.Duration) []string {
	return []string{
		"--name=" + c.key, "--filename=" + path,
		"--rw=randread", "--bs=4k", "--direct=1",
		"--ioengine=" + c.engine, "--iodepth=" + strconv.Itoa(c.qd),
		"--numjobs=" + strconv.Itoa(c.jobs), "--group_reporting",
		"--time_based", "--runtime=" + bench.FioTime(dur), "--ramp_time=" + bench.FioTime(warmup),
		// Uniform offsets with replacement, as our reader draws them.
		"--norandommap", "--randrepeat=0",
	}
}

// measurement is one case measured once.
type measurement struct {
	p50, p99  time.Duration
	iops      float64
	longest   time.Duration   // the longest single read seen
	samples   []time.Duration // ours, sorted
	fio       bench.FioIO     // fio's figures
	placement bench.Placement
}

// caseResults accumulates the rounds of one case.
type caseResults struct {
	def       caseDef
	p50, p99  []float64 // µs per round
	iops      []float64
	samples   [][]time.Duration
	fio       []bench.FioIO
	placement bench.Placement
}

func (r *caseResults) add(m measurement) {
	r.p50 = append(r.p50, bench.Micros(m.p50))
	r.p99 = append(r.p99, bench.Micros(m.p99))
	r.iops = append(r.iops, m.iops)
	if m.samples != nil {
		r.samples = append(r.samples, m.samples)
	}
	if !r.def.ours {
		r.fio = append(r.fio, m.fio)
	}
	r.placement.Merge(m.placement)
}

// cdf returns the pooled latency distribution of every round.
func (r *caseResults) cdf() []bench.Point {
	if r.def.ours {
		return bench.CDF(mergeSamples(r.samples...), 200)
	}
	merged := bench.MergeFioIO(r.fio...)
	return merged.Clat.CDF(200)
}

type runner struct {
	env      *bench.Env
	cfg      Config
	path     string
	dev      blockdev.Device
	uringDev blockdev.Device // the same file WithIOUring
	fio      bench.Fio
	rawDir   string
	fioVer   string
	readSeed uint64
	stalls   []string // measurements during which the disk stalled
}

func (rn *runner) measure(ctx context.Context, c caseDef, dur, warmup time.Duration, tag string) (measurement, error) {
	pinned := len(rn.env.CPUs) > 0
	if c.ours {
		if c.procs > 0 {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(c.procs))
		}
		rn.readSeed++
		dev := rn.dev
		if c.uring {
			dev = rn.uringDev
		}
		sampler := bench.StartCPUSampler(os.Getpid(), 0)
		res, err := RandomReads(ctx, dev, c.qd, warmup, dur, rn.readSeed, dataSeed)
		pl := sampler.Stop()
		if err != nil {
			return measurement{}, fmt.Errorf("%s (%s): %w", c.key, tag, err)
		}
		pl.Role, pl.Pinned = c.role, pinned
		m := measurement{p50: res.Summary.P50, p99: res.Summary.P99, iops: res.IOPS, longest: res.Longest, samples: res.Samples, placement: pl}
		rn.noteStall(c, tag, m)
		return m, nil
	}
	res, err := rn.fio.Run(ctx, c.fioArgs(rn.path, dur, warmup)...)
	if rn.rawDir != "" && len(res.Raw) > 0 {
		if serr := res.SaveRaw(filepath.Join(rn.rawDir, fmt.Sprintf("fio-%s-%s.json", c.key, tag))); serr != nil {
			rn.env.Logger().Warn("cannot keep fio output", "err", serr)
		}
	}
	if err != nil {
		return measurement{}, fmt.Errorf("%s (%s): %w", c.key, tag, err)
	}
	rn.fioVer = res.Version
	io := res.GroupRead(0)
	if io.TotalIOs == 0 {
		return measurement{}, fmt.Errorf("%s (%s): fio completed no reads", c.key, tag)
	}
	pl := res.Placement
	pl.Role, pl.Pinned = c.role, pinned
	m := measurement{p50: io.P50, p99: io.P99, iops: io.IOPS, longest: io.Clat.Max, fio: io, placement: pl}
	rn.noteStall(c, tag, m)
	return m, nil
}

// stallThreshold is a read time no healthy 4 KiB read comes near (the
// reference disk's p99 is ~100 µs): seeing one means the disk or the
// machine stopped, and the measurement it fell in is unreliable.
const stallThreshold = 200 * time.Millisecond

func (rn *runner) noteStall(c caseDef, tag string, m measurement) {
	if m.longest >= stallThreshold {
		rn.stalls = append(rn.stalls, fmt.Sprintf("%s (%s): one read took %v, %.0f IOPS", c.key, tag, m.longest.Round(time.Millisecond), m.iops))
	}
}

// Measure runs the experiment with cfg.
func Measure(ctx context.Context, env *bench.Env, cfg Config) (*bench.Experiment, error) {
	if _, err := env.Tools.Require(ctx, "fio"); err != nil {
		return nil, err
	}
	if cfg.Rounds < 1 || cfg.QD < 1 || cfg.Runtime <= 0 {
		return nil, fmt.Errorf("blockdev bench: bad config (rounds %d, qd %d, runtime %v)", cfg.Rounds, cfg.QD, cfg.Runtime)
	}
	dir := cfg.Dir
	if dir == "" {
		dir = env.ScratchDir
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("scratch directory: %w", err)
	}
	rawDir, err := env.Dir(Name)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "blockdev-bench.img")
	log := env.Logger()

	log.Info("blockdev: writing the backing file", "path", path, "size", bench.FormatBytes(cfg.FileSize))
	prepStart := time.Now()
	if err := PrepareFile(ctx, path, cfg.FileSize, dataSeed); err != nil {
		os.Remove(path)
		return nil, err
	}
	prepTime := time.Since(prepStart)
	if !cfg.KeepFile {
		defer os.Remove(path)
	}
	dev, err := blockdev.Open(path, blockdev.WithReadOnly())
	if err != nil {
		return nil, err
	}
	defer dev.Close()
	if _, direct, _ := blockdev.FdOf(dev); !direct {
		return nil, fmt.Errorf("blockdev bench: the file system under %s refuses O_DIRECT (tmpfs?): use a scratch directory on a disk", dir)
	}
	if err := VerifySample(dev, 256, 1, dataSeed); err != nil {
		return nil, fmt.Errorf("blockdev bench: backing file content before the run: %w", err)
	}

	uringDev, err := blockdev.Open(path, blockdev.WithReadOnly(), blockdev.WithIOUring(), blockdev.WithLogger(log))
	if err != nil {
		return nil, err
	}
	defer uringDev.Close()
	rn := &runner{env: env, cfg: cfg, path: path, dev: dev, uringDev: uringDev, rawDir: rawDir}
	cases := []caseDef{
		{key: "ours-qd1", role: "nprdma-bench: blockdev, 1 goroutine", label: "blockdev (ours)", ours: true, qd: 1},
		{key: "fio-psync-qd1", role: "fio psync, 1 job", label: "fio psync", engine: "psync", qd: 1, jobs: 1},
		{key: fmt.Sprintf("ours-qd%d", cfg.QD), role: fmt.Sprintf("nprdma-bench: blockdev, %d goroutines", cfg.QD), label: fmt.Sprintf("blockdev (ours), %d goroutines", cfg.QD), ours: true, qd: cfg.QD},
		{key: fmt.Sprintf("fio-libaio-qd%d", cfg.QD), role: fmt.Sprintf("fio libaio, iodepth=%d", cfg.QD), label: fmt.Sprintf("fio libaio iodepth=%d", cfg.QD), engine: "libaio", qd: cfg.QD, jobs: 1},
		{key: fmt.Sprintf("fio-psync-qd%d", cfg.QD), role: fmt.Sprintf("fio psync, %d jobs", cfg.QD), label: fmt.Sprintf("fio psync, %d jobs", cfg.QD), engine: "psync", qd: 1, jobs: cfg.QD},
		// The same reader with one P per goroutine: tells how much of the
		// gap to fio is the Go scheduler's handling of blocking system
		// calls rather than blockdev itself.
		{key: fmt.Sprintf("ours-qd%d-procs%d", cfg.QD, cfg.QD), role: fmt.Sprintf("nprdma-bench: blockdev, %d goroutines, GOMAXPROCS=%d", cfg.QD, cfg.QD),
			label: fmt.Sprintf("blockdev (ours), %d goroutines, GOMAXPROCS=%d", cfg.QD, cfg.QD), ours: true, qd: cfg.QD, procs: cfg.QD},
		// The same reader through an io_uring (blockdev.WithIOUring), which
		// switches to the ring only at depth: QD1 must not pay for it.
		{key: "ours-qd1-uring", role: "nprdma-bench: blockdev with io_uring, 1 goroutine", label: "blockdev (ours), io_uring", ours: true, qd: 1, uring: true},
		{key: fmt.Sprintf("ours-qd%d-uring", cfg.QD), role: fmt.Sprintf("nprdma-bench: blockdev with io_uring, %d goroutines", cfg.QD),
			label: fmt.Sprintf("blockdev (ours), io_uring, %d goroutines", cfg.QD), ours: true, qd: cfg.QD, uring: true},
	}
	results := make([]*caseResults, len(cases))
	for i, c := range cases {
		results[i] = &caseResults{def: c}
	}
	for round := range cfg.Rounds {
		// ABBA: reversing the order every other round cancels a linear
		// drift of the machine between ours and fio.
		order := make([]int, len(cases))
		for i := range order {
			order[i] = i
			if (env.Round+round)%2 == 1 {
				order[i] = len(cases) - 1 - i
			}
		}
		for _, i := range order {
			log.Info("blockdev: measuring", "case", cases[i].key, "round", round+1, "of", cfg.Rounds)
			m, err := rn.measure(ctx, cases[i], cfg.Runtime, cfg.Warmup, fmt.Sprintf("r%d", round+1))
			if err != nil {
				return nil, err
			}
			results[i].add(m)
		}
	}

	sweep, err := rn.sweep(ctx)
	if err != nil {
		return nil, err
	}
	if err := VerifySample(dev, 256, 2, dataSeed); err != nil {
		return nil, fmt.Errorf("blockdev bench: backing file content after the run: %w", err)
	}

	exp := &bench.Experiment{Name: Name}
	exp.Method = fmt.Sprintf("A %s file in %s (%s) is written once with 4 MiB sequential O_DIRECT writes of incompressible, per-page distinct data, "+
		"then read with 4 KiB O_DIRECT reads at uniformly random page offsets (drawn with replacement, like fio's norandommap). "+
		"Ours is blockdev.File.ReadAt called from 1 goroutine (QD1) and from %d goroutines (QD%d), the latter also with GOMAXPROCS raised to %d, and both again on the file opened WithIOUring; every read's first word is checked and 256 pages are verified in full before and after. "+
		"The baseline is fio %s on the same file in the same run: psync with 1 job (QD1), libaio with iodepth=%d, and psync with %d jobs (the like-for-like comparison for %d blocking readers). "+
		"Each measurement runs %v after a %v warm-up; ours and fio alternate (in reverse order every other round when a run has %d rounds). "+
		"Latency is the time of one read: ours the wall time around ReadAt, fio its completion latency (clat). "+
		"A sweep over queue depths (%v s each) gives IOPS against queue depth.",
		bench.FormatBytes(cfg.FileSize), dir, fsName(dir), cfg.QD, cfg.QD, cfg.QD, orUnknown(rn.fioVer), cfg.QD, cfg.QD, cfg.QD,
		cfg.Runtime, cfg.Warmup, cfg.Rounds, cfg.SweepRuntime.Seconds())
	exp.AddParam("file size", bench.FormatBytes(cfg.FileSize))
	exp.AddParam("file system", fsName(dir))
	exp.AddParam("write time", prepTime.Round(10*time.Millisecond))
	exp.AddParam("runtime", cfg.Runtime)
	exp.AddParam("warm-up", cfg.Warmup)
	exp.AddParam("rounds", cfg.Rounds)
	exp.AddParam("high queue depth", cfg.QD)
	exp.AddParam("sweep depths", fmt.Sprint(cfg.SweepDepths))
	exp.AddParam("fio", orUnknown(rn.fioVer))

	qd1, fio1 := results[0], results[1]
	oursHi, aioHi, psyncHi, oursProcs := results[2], results[3], results[4], results[5]
	uring1, uringHi := results[6], results[7]
	qd := strconv.Itoa(cfg.QD)
	fig := func(name string, ours, base []float64, unit string, baseName string) bench.Figure {
		return bench.NewFigure(name, bench.MeanFloat(ours), unit, baseName, bench.MeanFloat(base)).
			WithNotes(fmt.Sprintf("per round: ours %s; fio %s", bench.RoundList(ours), bench.RoundList(base)))
	}
	exp.Add(
		fig("QD1 p50 latency", qd1.p50, fio1.p50, "µs", "fio psync QD1 p50").WithGoal(Goal),
		fig("QD1 p99 latency", qd1.p99, fio1.p99, "µs", "fio psync QD1 p99"),
		fig("QD1 IOPS", qd1.iops, fio1.iops, "IOPS", "fio psync QD1 IOPS"),
		fig("QD"+qd+" p50 latency vs libaio", oursHi.p50, aioHi.p50, "µs", "fio libaio iodepth="+qd+" p50"),
		fig("QD"+qd+" p99 latency vs libaio", oursHi.p99, aioHi.p99, "µs", "fio libaio iodepth="+qd+" p99"),
		fig("QD"+qd+" IOPS vs libaio", oursHi.iops, aioHi.iops, "IOPS", "fio libaio iodepth="+qd+" IOPS"),
		fig("QD"+qd+" p50 latency vs psync×"+qd, oursHi.p50, psyncHi.p50, "µs", "fio psync "+qd+" jobs p50"),
		fig("QD"+qd+" p99 latency vs psync×"+qd, oursHi.p99, psyncHi.p99, "µs", "fio psync "+qd+" jobs p99"),
		fig("QD"+qd+" IOPS vs psync×"+qd, oursHi.iops, psyncHi.iops, "IOPS", "fio psync "+qd+" jobs IOPS"),
		fig("QD"+qd+" p99 latency, GOMAXPROCS="+qd+", vs psync×"+qd, oursProcs.p99, psyncHi.p99, "µs", "fio psync "+qd+" jobs p99"),
		fig("QD"+qd+" IOPS, GOMAXPROCS="+qd+", vs psync×"+qd, oursProcs.iops, psyncHi.iops, "IOPS", "fio psync "+qd+" jobs IOPS"),
		fig("QD1 p50 latency, io_uring", uring1.p50, fio1.p50, "µs", "fio psync QD1 p50"),
		fig("QD"+qd+" IOPS, io_uring, vs libaio", uringHi.iops, aioHi.iops, "IOPS", "fio libaio iodepth="+qd+" IOPS"),
		fig("QD"+qd+" p99 latency, io_uring, vs libaio", uringHi.p99, aioHi.p99, "µs", "fio libaio iodepth="+qd+" p99"),
	)
	for _, r := range results {
		exp.AddSeries(bench.Series{Name: "cdf-" + r.def.key, Label: r.def.label, XUnit: "µs", YUnit: "fraction", Points: r.cdf()})
		exp.Placements = append(exp.Placements, r.placement)
	}
	exp.AddPlot(bench.Plot{File: "blockdev-cdf-qd1.svg", Kind: bench.PlotCDF, LogX: true,
		Title:   "4 KiB random read latency at QD1 (backing file, O_DIRECT)",
		Caption: "Latency CDF of every measured read, all rounds pooled; x is logarithmic so that the tail shows.",
		XLabel:  "read latency (µs)", Series: []string{"cdf-" + qd1.def.key, "cdf-" + fio1.def.key}})
	exp.AddPlot(bench.Plot{File: "blockdev-cdf-qd" + qd + ".svg", Kind: bench.PlotCDF, LogX: true,
		Title:   "4 KiB random read latency at QD" + qd,
		Caption: "Ours with " + qd + " goroutines against fio with one libaio thread keeping " + qd + " reads in flight and against " + qd + " psync jobs.",
		XLabel:  "read latency (µs)", Series: []string{"cdf-" + oursHi.def.key, "cdf-" + oursProcs.def.key, "cdf-" + uringHi.def.key, "cdf-" + aioHi.def.key, "cdf-" + psyncHi.def.key}})

	// Side-by-side percentiles: one bar group per (queue depth, percentile).
	cats := []string{"QD1 p50", "QD1 p99", "QD" + qd + " p50", "QD" + qd + " p99"}
	mean := bench.MeanFloat
	exp.AddSeries(bench.Series{Name: "bars-ours", Label: "blockdev (ours)", YUnit: "µs", Points: []bench.Point{
		{X: 0, Y: mean(qd1.p50)}, {X: 1, Y: mean(qd1.p99)}, {X: 2, Y: mean(oursHi.p50)}, {X: 3, Y: mean(oursHi.p99)}}})
	exp.AddSeries(bench.Series{Name: "bars-fio-psync", Label: "fio psync (QD" + qd + ": " + qd + " jobs)", YUnit: "µs", Points: []bench.Point{
		{X: 0, Y: mean(fio1.p50)}, {X: 1, Y: mean(fio1.p99)}, {X: 2, Y: mean(psyncHi.p50)}, {X: 3, Y: mean(psyncHi.p99)}}})
	exp.AddSeries(bench.Series{Name: "bars-fio-libaio", Label: "fio libaio (QD" + qd + " only)", YUnit: "µs", Points: []bench.Point{
		{X: 2, Y: mean(aioHi.p50)}, {X: 3, Y: mean(aioHi.p99)}}})
	exp.AddPlot(bench.Plot{File: "blockdev-latency-bars.svg", Kind: bench.PlotBars, LogY: true,
		Caption: "Logarithmic latency axis, so that medians and tails fit one chart.",
		Title:   "Read latency percentiles, ours next to fio (mean of rounds)", YLabel: "latency (µs)",
		Categories: cats, Series: []string{"bars-ours", "bars-fio-psync", "bars-fio-libaio"}})

	if len(sweep) > 0 {
		depths := make([]float64, len(cfg.SweepDepths))
		for i, d := range cfg.SweepDepths {
			depths[i] = float64(d)
		}
		var iopsNames, latNames []string
		for _, s := range sweep {
			iopsNames = append(iopsNames, "iops-"+s.key)
			latNames = append(latNames, "p50-"+s.key)
			exp.AddSeries(bench.Series{Name: "iops-" + s.key, Label: s.label, XUnit: "queue depth", YUnit: "IOPS", Points: s.iops})
			exp.AddSeries(bench.Series{Name: "p50-" + s.key, Label: s.label, XUnit: "queue depth", YUnit: "µs", Points: s.p50})
		}
		exp.AddPlot(bench.Plot{File: "blockdev-iops-vs-qd.svg", Kind: bench.PlotLine, LogX: true, XTicks: depths,
			Title: "4 KiB random read IOPS against queue depth", XLabel: "queue depth (goroutines / jobs / iodepth)", YLabel: "IOPS",
			Caption: "One measurement per point (shorter than the main rounds); ours uses one goroutine per outstanding read, with the default GOMAXPROCS, with GOMAXPROCS raised to the queue depth, and through an io_uring.",
			Series:  iopsNames})
		exp.AddPlot(bench.Plot{File: "blockdev-p50-vs-qd.svg", Kind: bench.PlotLine, LogX: true, XTicks: depths,
			Title: "Median read latency against queue depth", XLabel: "queue depth", YLabel: "p50 latency (µs)",
			Series: latNames})
	}

	exp.Note("fio's percentiles come from its log-linear histogram (each within ~1.6%% of the exact value); ours are exact, from all samples sorted.")
	exp.Note("At QD%s ours runs %s goroutines, each blocked in pread on its own thread: fio psync with %s jobs is the like-for-like baseline; libaio keeps %s reads in flight from one thread and is shown for reference.", qd, qd, qd, qd)
	for _, r := range results {
		if s := bench.Spread(r.p50); s > 0.10 {
			exp.Note("Noisy: %s p50 varied by %.0f%% between rounds (%s µs).", r.def.key, s*100, bench.RoundList(r.p50))
		}
		if s := bench.Spread(r.iops); s > 0.10 {
			exp.Note("Noisy: %s IOPS varied by %.0f%% between rounds (%s).", r.def.key, s*100, bench.RoundList(r.iops))
		}
	}
	if def, procs := bench.MeanFloat(oursHi.iops), bench.MeanFloat(oursProcs.iops); def > 0 && procs > 1.2*def {
		exp.Note("At QD%s ours reached %.0f IOPS with GOMAXPROCS=%d but %.0f with GOMAXPROCS=%d: a goroutine blocked in pread keeps its P until the runtime's monitor thread hands it off, "+
			"so with few Ps the number of reads in flight, not the device, is the limit. Callers that need queue depth from blocking reads need more Ps (or threads) than CPUs, or an asynchronous interface.",
			qd, procs, cfg.QD, def, runtime.GOMAXPROCS(0))
	}
	if len(rn.stalls) > 0 {
		exp.Note("Stalls: a single read took over %v in these measurements: the disk, the machine (shared) or, for ours, the Go scheduler held it that long; treat these points with care: %s.",
			stallThreshold, strings.Join(rn.stalls, "; "))
	}
	if len(env.CPUs) == 0 {
		exp.Note("Not pinned: ours and fio could run on any CPU (the table shows where they were seen); rerun with --cpus to pin both to the same set.")
	}
	return exp, nil
}

// sweepLine is one implementation measured across queue depths.
type sweepLine struct {
	key, label string
	iops, p50  []bench.Point
}

func (rn *runner) sweep(ctx context.Context) ([]sweepLine, error) {
	if len(rn.cfg.SweepDepths) == 0 {
		return nil, nil
	}
	lines := []sweepLine{
		{key: "ours", label: "blockdev (ours)"},
		{key: "ours-procs", label: "blockdev (ours), GOMAXPROCS = queue depth"},
		{key: "ours-uring", label: "blockdev (ours), io_uring"},
		{key: "fio-psync", label: "fio psync, one job per read"},
		{key: "fio-libaio", label: "fio libaio, one job"},
	}
	for i, d := range rn.cfg.SweepDepths {
		defs := []caseDef{
			{key: "sweep-ours-qd" + strconv.Itoa(d), ours: true, qd: d},
			{key: "sweep-ours-procs-qd" + strconv.Itoa(d), ours: true, qd: d, procs: max(d, runtime.GOMAXPROCS(0))},
			{key: "sweep-ours-uring-qd" + strconv.Itoa(d), ours: true, qd: d, uring: true},
			{key: "sweep-fio-psync-qd" + strconv.Itoa(d), engine: "psync", qd: 1, jobs: d},
			{key: "sweep-fio-libaio-qd" + strconv.Itoa(d), engine: "libaio", qd: d, jobs: 1},
		}
		for k := range defs {
			j := k
			if i%2 == 1 {
				j = len(defs) - 1 - k
			}
			rn.env.Logger().Info("blockdev: sweep", "case", defs[j].key)
			m, err := rn.measure(ctx, defs[j], rn.cfg.SweepRuntime, rn.cfg.SweepWarmup, "sweep")
			if err != nil {
				return nil, err
			}
			lines[j].iops = append(lines[j].iops, bench.Point{X: float64(d), Y: m.iops})
			lines[j].p50 = append(lines[j].p50, bench.Point{X: float64(d), Y: bench.Micros(m.p50)})
		}
	}
	// Points were appended in depth order per line; the alternating order
	// only changed when each was measured.
	return lines, nil
}

func orUnknown(s string) string {
	if s == "" {
		return "(unknown version)"
	}
	return s
}

// fsName names the file system under dir, for the report.
func fsName(dir string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "unknown file system"
	}
	switch uint32(st.Type) {
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlayfs"
	}
	return fmt.Sprintf("file system type %#x", uint32(st.Type))
}
