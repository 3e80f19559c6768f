package npbench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/bench/nprdmabench"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/tcp"
)

// latencies times n calls of once after a warm-up.
func latencies(n int, once func() (time.Duration, error)) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	for i := -bench.WarmUpOps(n); i < n; i++ {
		d, err := once()
		if err != nil {
			return nil, err
		}
		if i >= 0 {
			out = append(out, d)
		}
	}
	return out, nil
}

// pairedLatencies times n pairs of a and b, one of each in turn, the first
// of a pair alternating, after a warm-up: both see the same machine at the
// same moments, so a drift over the run (where the scheduler put the
// threads, what else ran) cannot favour either.
func pairedLatencies(n int, a, b func() (time.Duration, error)) (la, lb []time.Duration, err error) {
	la, lb = make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	for i := -bench.WarmUpOps(n); i < n; i++ {
		first, second, fa := a, b, true
		if i%2 != 0 {
			first, second, fa = b, a, false
		}
		d1, err := first()
		if err != nil {
			return nil, nil, err
		}
		d2, err := second()
		if err != nil {
			return nil, nil, err
		}
		if i < 0 {
			continue
		}
		if !fa {
			d1, d2 = d2, d1
		}
		la, lb = append(la, d1), append(lb, d2)
	}
	return la, lb, nil
}

// timedOnce is once for a queue pair: w posted, its completion awaited.
func timedOnce(ctx context.Context, p *nprdmabench.Pair, w nprdma.SendWR) func() (time.Duration, error) {
	return func() (time.Duration, error) {
		t0 := time.Now()
		err := p.Once(ctx, w)
		return time.Since(t0), err
	}
}

// FabricConfig sizes the fabric-ops experiment.
type FabricConfig struct {
	Samples int           // latency samples per case per round
	Rounds  int           // latency rounds
	Depths  []int         // throughput queue depths
	Sizes   []int         // throughput sizes
	Run     time.Duration // each throughput point
	// ThroughputRounds: each stream runs this many times per point, the
	// streams taking turns (alternating order).
	ThroughputRounds int
	// Congestion is the TCP congestion control of every connection, ours
	// and the raw socket's alike ("": the system's). The transport is what
	// is compared: under BBR, a common system default, every connection is
	// paced at the bandwidth BBR estimates for it, and on loopback that
	// estimate settles per connection, holding about half of them (ours and,
	// less often, the raw socket's) to two thirds of the rate the rest run at
	// (docs/nprdma.md §10.2).
	Congestion string
}

// DefaultFabricConfig returns the sizes for a mode.
func DefaultFabricConfig(m bench.Mode) FabricConfig {
	return FabricConfig{
		Samples: bench.ByMode(m, 3000, 20000),
		Rounds:  bench.ByMode(m, 2, 8),
		Depths:  []int{1, 2, 4, 8, 16, 32},
		// The goal is on 128 KiB; 4 KiB streams are reported in full mode.
		Sizes:            bench.ByMode(m, []int{128 << 10}, []int{4 << 10, 128 << 10}),
		Run:              bench.ByMode(m, 100*time.Millisecond, 250*time.Millisecond),
		ThroughputRounds: bench.ByMode(m, 4, 14),
		Congestion:       "reno", // built into every Linux, allowed to every process
	}
}

// congestionName names a congestion control setting in the report.
func congestionName(cc string) string {
	if cc == "" {
		sys, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
		if err != nil {
			return "the system's"
		}
		return "the system's (" + strings.TrimSpace(string(sys)) + ")"
	}
	return cc
}

// Goals of fabric-ops, as the issue states them.
var (
	ReadLatencyGoal = bench.Goal{Text: "4 KiB READ p50 ≤ 1.2× a raw loopback TCP request/response of the same size", Op: bench.AtMost, Threshold: 1.2}
	ThroughputGoal  = bench.Goal{Text: "128 KiB throughput ≥ 0.8× raw loopback TCP streaming", Op: bench.AtLeast, Threshold: 0.8}
)

// FabricSpec is the "fabric-ops" experiment.
func FabricSpec() bench.Spec {
	return bench.Spec{
		Name:  "fabric-ops",
		Title: "nprdma/tcp READ, WRITE and SEND against a raw loopback socket",
		Goals: []string{ReadLatencyGoal.Text, ThroughputGoal.Text + " (READ, WRITE and SEND, at the worst queue depth of 1–32)",
			"busy-poll variant and CPU placement reported"},
		Run: func(ctx context.Context, env *bench.Env) (*bench.Experiment, error) {
			return MeasureFabric(ctx, env, DefaultFabricConfig(env.Mode))
		},
	}
}

// latencyVariant is one case of the latency part.
type latencyVariant struct {
	latencyCase
	op       nprdma.Opcode // 0: the raw socket
	busyPoll bool
	procs    int // GOMAXPROCS during the measurement (0: unchanged)
	c        *nprdmabench.Pair
	raw      *nprdmabench.RawRoundTrip
}

func (v *latencyVariant) measure(ctx context.Context, n int) ([]time.Duration, error) {
	if v.procs > 0 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(v.procs))
	}
	if v.raw != nil {
		return latencies(n, v.raw.Once)
	}
	return latencies(n, timedOnce(ctx, v.c, v.c.WR(v.op, 4096, 0)))
}

// tputLine is one stream of the throughput part.
type tputLine struct {
	key, label string
	op         nprdma.Opcode             // 0: the raw socket
	points     map[int]map[int][]float64 // size → depth → MiB/s per round
}

// throughputPoint measures every line at one size and depth: each line's
// connection is set up once, then the lines take turns, cfg.Run each,
// cfg.ThroughputRounds times (the order reversed every other round), so that
// a drift of the machine over the point (where the scheduler put the
// threads) reaches every line alike.
func throughputPoint(ctx context.Context, lines []*tputLine, size, qd int, cfg FabricConfig) error {
	type runner interface {
		Run(context.Context, time.Duration) (nprdmabench.ThroughputResult, error)
		Close()
	}
	streams := make([]runner, len(lines))
	defer func() {
		for _, r := range streams {
			if r != nil {
				r.Close()
			}
		}
	}()
	for i, l := range lines {
		var err error
		if l.op == 0 {
			streams[i], err = nprdmabench.DialRawStream(ctx, size, qd, cfg.Congestion)
		} else {
			streams[i], err = nprdmabench.NewOpStream(ctx, tcp.New(tcp.WithCongestionControl(cfg.Congestion)), l.op, size, qd, false)
		}
		if err != nil {
			return fmt.Errorf("fabric-ops: %s %d bytes QD%d: %w", l.key, size, qd, err)
		}
	}
	for round := range cfg.ThroughputRounds {
		for _, i := range bench.RoundOrder(len(lines), round) {
			r, err := streams[i].Run(ctx, cfg.Run)
			if err != nil {
				return fmt.Errorf("fabric-ops: %s %d bytes QD%d: %w", lines[i].key, size, qd, err)
			}
			lines[i].points[size][qd] = append(lines[i].points[size][qd], r.MiBPerSec)
		}
	}
	return nil
}

// newTputLines is the raw stream and the three ops, with room for sizes.
func newTputLines(sizes []int) []*tputLine {
	lines := []*tputLine{{key: "raw", label: "raw TCP stream"}, {key: "read", label: "READ", op: nprdma.OpRead},
		{key: "write", label: "WRITE", op: nprdma.OpWrite}, {key: "send", label: "SEND", op: nprdma.OpSend}}
	for _, l := range lines {
		l.points = map[int]map[int][]float64{}
		for _, s := range sizes {
			l.points[s] = map[int][]float64{}
		}
	}
	return lines
}

// turnRatios is each turn's ours/base and the index of the median one.
func turnRatios(ours, base []float64) ([]float64, int) {
	ratios := make([]float64, len(ours))
	for i := range ours {
		ratios[i] = ours[i] / base[i]
	}
	return ratios, bench.MedianIndex(ratios)
}

// onOneCPU runs fn with every thread of this process restricted to the
// first CPU it may use, then gives the threads back their mask.
func onOneCPU(fn func() error) error {
	pid := os.Getpid()
	cpus, err := bench.Affinity(pid)
	if err != nil {
		return err
	}
	if err := bench.PinProcess(pid, cpus[:1]); err != nil {
		return err
	}
	err = fn()
	if rerr := bench.PinProcess(pid, cpus); rerr != nil && err == nil {
		err = fmt.Errorf("fabric-ops: restore the CPU mask %s: %w", bench.FormatCPUList(cpus), rerr)
	}
	return err
}

// MeasureFabric runs fabric-ops with cfg.
func MeasureFabric(ctx context.Context, env *bench.Env, cfg FabricConfig) (*bench.Experiment, error) {
	if cfg.Samples < 1 || cfg.Rounds < 1 || cfg.ThroughputRounds < 1 || cfg.Run <= 0 {
		return nil, fmt.Errorf("fabric-ops: bad config %+v", cfg)
	}
	exp := &bench.Experiment{}
	pinned := len(env.CPUs) > 0
	const size = 4096
	var vs []*latencyVariant
	add := func(key, label string, op nprdma.Opcode, busyPoll bool, procs int) *latencyVariant {
		v := &latencyVariant{latencyCase: latencyCase{key: key, label: label}, op: op, busyPoll: busyPoll, procs: procs}
		vs = append(vs, v)
		return v
	}
	raw := add("raw", "raw TCP request/response", 0, false, 0)
	read := add("read", "READ", nprdma.OpRead, false, 0)
	write := add("write", "WRITE", nprdma.OpWrite, false, 0)
	send := add("send", "SEND", nprdma.OpSend, false, 0)
	readBP := add("read-busypoll", "READ, busy-poll CQ", nprdma.OpRead, true, 0)
	writeBP := add("write-busypoll", "WRITE, busy-poll CQ", nprdma.OpWrite, true, 0)
	sendBP := add("send-busypoll", "SEND, busy-poll CQ", nprdma.OpSend, true, 0)
	raw1 := add("raw-procs1", "raw TCP request/response, GOMAXPROCS=1", 0, false, 1)
	read1 := add("read-procs1", "READ, GOMAXPROCS=1", nprdma.OpRead, false, 1)
	defer func() {
		for _, v := range vs {
			if v.c != nil {
				v.c.Close()
			}
			if v.raw != nil {
				v.raw.Close()
			}
		}
	}()
	for _, v := range vs {
		var err error
		if v.op == 0 {
			v.raw, err = nprdmabench.DialRawRoundTrip(ctx, size, cfg.Congestion)
		} else {
			o := nprdmabench.PairOptions{LocalSize: size, RemoteSize: size, BusyPoll: v.busyPoll, Pin: true}
			if v.op == nprdma.OpSend {
				o.RecvSize = size
			}
			v.c, err = nprdmabench.NewPair(ctx, tcp.New(tcp.WithCongestionControl(cfg.Congestion)), o)
		}
		if err != nil {
			return exp, fmt.Errorf("fabric-ops: set up %s: %w", v.key, err)
		}
	}
	// The READ goal is judged on READs and raw round trips taken in turn,
	// op by op, on the same two connections as the blocks above.
	readPaired := &latencyCase{key: "read-paired", label: "READ, interleaved with the raw round trip"}
	rawPaired := &latencyCase{key: "raw-paired", label: "raw TCP request/response, interleaved with READ"}
	log := env.Logger()
	for round := range cfg.Rounds {
		log.Info("fabric-ops: latency", "round", round+1, "of", cfg.Rounds)
		var pr, pw []time.Duration
		err := sampled(&readPaired.placement, "nprdma-bench (initiator and target in one process): READ and raw round trip in turn", pinned, func() error {
			var err error
			pr, pw, err = pairedLatencies(cfg.Samples, timedOnce(ctx, read.c, read.c.WR(nprdma.OpRead, size, 0)), raw.raw.Once)
			return err
		})
		if err != nil {
			return exp, fmt.Errorf("fabric-ops: READ and raw in turn: %w", err)
		}
		readPaired.add(pr)
		rawPaired.add(pw)
		for _, i := range bench.RoundOrder(len(vs), env.Round+round) {
			v := vs[i]
			var samples []time.Duration
			err := sampled(&v.placement, "nprdma-bench (initiator and target in one process): "+v.label, pinned, func() error {
				var err error
				samples, err = v.measure(ctx, cfg.Samples)
				return err
			})
			if err != nil {
				return exp, fmt.Errorf("fabric-ops: %s: %w", v.key, err)
			}
			v.add(samples)
		}
	}

	// Throughput: every size and depth, raw stream and each op taking turns.
	lines := newTputLines(cfg.Sizes)
	var tputPlacement bench.Placement
	for _, size := range cfg.Sizes {
		log.Info("fabric-ops: throughput", "size", size)
		for _, qd := range cfg.Depths {
			if err := sampled(&tputPlacement, "nprdma-bench: throughput runs", pinned, func() error {
				return throughputPoint(ctx, lines, size, qd, cfg)
			}); err != nil {
				return exp, err
			}
		}
	}
	// The 128 KiB QD1 point again with the whole process on one CPU, where
	// the scheduler cannot move the two ends between vCPUs from one run to
	// the next: what an operation costs against the raw stream, without
	// that drift.
	const oneCPUSize = 128 << 10
	oneCPU := newTputLines([]int{oneCPUSize})
	var oneCPUPlacement bench.Placement
	log.Info("fabric-ops: throughput on one CPU", "size", oneCPUSize, "qd", 1)
	if err := onOneCPU(func() error {
		return sampled(&oneCPUPlacement, "nprdma-bench: 128 KiB QD1 throughput runs on one CPU", true, func() error {
			return throughputPoint(ctx, oneCPU, oneCPUSize, 1, cfg)
		})
	}); err != nil {
		return exp, err
	}

	exp.Method = fmt.Sprintf("Initiator and target are two nprdma devices on nprdma/tcp in the bench process, connected over loopback "+
		"(one TCP connection per queue pair), with pinned registered memory from AllocBuffer filled with data (every page written: "+
		"memory never written reads as the kernel's one zero page, always in cache). Latency: per round, first %[1]d 4 KiB READs "+
		"and %[1]d raw round trips taken in turn, op by op (the first of each pair alternating), on which the READ goal is judged; "+
		"then each case in a block of its own of %[1]d operations at queue depth 1 (post to completion, after a warm-up), the cases "+
		"in reverse order every other round; %[2]d rounds; a figure is the mean of the per-round percentiles. The baseline is an "+
		"8-byte request answered by 4 KiB over a plain loopback TCP socket (TCP_NODELAY). Variants: a busy-polling completion queue "+
		"(spins 200 µs before parking) and GOMAXPROCS=1 (READ and the raw round trip). Throughput: READ, WRITE and SEND of 4 KiB and "+
		"128 KiB with 1–32 operations outstanding (bench/nprdmabench) against a raw request/response stream with as many requests "+
		"in flight on one socket, whose server answers from as many slots of data in turn as the op's remote region has; at each "+
		"point the four streams are connected once and take turns, %[3]v each (filling and draining the pipe included), %[4]d "+
		"times, the order reversed every other time; a depth's ratio is the median over those turns of the op against the raw "+
		"stream of the same turn, and the goal is judged at the depth with the lowest. Then the 128 KiB QD1 point once more, "+
		"the same way, with every thread of the process restricted to one CPU (sched_setaffinity), where the scheduler cannot "+
		"move the two ends of a connection between vCPUs: reported, not judged. Every connection, ours and the raw socket's, "+
		"uses the TCP congestion control %[5]s: the system's default here may pace each connection at a bandwidth estimate "+
		"that settles per connection (BBR), which would judge that estimate rather than the transport (docs/nprdma.md §10.2).",
		cfg.Samples, cfg.Rounds, cfg.Run, cfg.ThroughputRounds, congestionName(cfg.Congestion))
	exp.AddParam("latency samples per case per round", cfg.Samples)
	exp.AddParam("latency rounds", cfg.Rounds)
	exp.AddParam("throughput turn", cfg.Run)
	exp.AddParam("throughput turns per stream and point", cfg.ThroughputRounds)
	exp.AddParam("queue depths", fmt.Sprint(cfg.Depths))
	exp.AddParam("placement", placementParam())
	exp.AddParam("TCP congestion control", congestionName(cfg.Congestion))

	exp.Add(figure("4 KiB READ p50", readPaired.p50, rawPaired.p50, "µs", "raw TCP round trip p50, taken in turn with the READs").WithGoal(ReadLatencyGoal),
		figure("4 KiB READ p99", readPaired.p99, rawPaired.p99, "µs", "raw TCP round trip p99, taken in turn with the READs"),
		figure("4 KiB READ p50, in blocks", read.p50, raw.p50, "µs", "raw TCP round trip p50, its own block"),
		figure("4 KiB READ p99, in blocks", read.p99, raw.p99, "µs", "raw TCP round trip p99, its own block"))
	for _, x := range []struct {
		name string
		v, b *latencyVariant
		p99  bool
	}{
		{"4 KiB WRITE", write, raw, true},
		{"4 KiB SEND", send, raw, true},
		{"4 KiB READ, busy-poll CQ", readBP, raw, true},
		{"4 KiB WRITE, busy-poll CQ", writeBP, raw, false},
		{"4 KiB SEND, busy-poll CQ", sendBP, raw, false},
		{"4 KiB READ, GOMAXPROCS=1", read1, raw1, true},
	} {
		base := "raw TCP round trip"
		if x.b == raw1 {
			base += ", GOMAXPROCS=1"
		}
		exp.Add(figure(x.name+" p50", x.v.p50, x.b.p50, "µs", base+" p50"))
		if x.p99 {
			exp.Add(figure(x.name+" p99", x.v.p99, x.b.p99, "µs", base+" p99"))
		}
	}
	for _, op := range lines[1:] {
		for _, s := range cfg.Sizes {
			// A depth's ratio is the median over turns of the op against
			// the raw stream of the same turn: loopback streaming on two
			// vCPUs swings up to 2× from one turn to the next (where the
			// scheduler puts the two ends), and a ratio of means or a
			// single turn would let one swing decide. The goal must hold
			// at every depth: the figure is the depth with the lowest
			// median, quoted from the turn it came from.
			worst, worstQD, worstRound := 0.0, 0, 0
			var all []string
			for _, qd := range cfg.Depths {
				ratios, k := turnRatios(op.points[s][qd], lines[0].points[s][qd])
				all = append(all, fmt.Sprintf("QD%d %.2f (%s)", qd, ratios[k], bench.RoundList(ratios)))
				if worstQD == 0 || ratios[k] < worst {
					worst, worstQD, worstRound = ratios[k], qd, k
				}
			}
			ours, base := op.points[s][worstQD], lines[0].points[s][worstQD]
			// The name does not say which depth was worst, so that the
			// suite merges the figure over rounds whichever it was.
			f := bench.NewFigure(fmt.Sprintf("%s %s throughput, worst QD", bench.FormatBytes(int64(s)), op.label),
				ours[worstRound], "MiB/s", "raw TCP stream at that depth, same turn", base[worstRound]).
				WithNotes(fmt.Sprintf("worst depth QD%d; median turn of %d; per turn: %s; baseline %s; median ratio by depth (every turn): %s",
					worstQD, len(ours), bench.RoundList(ours), bench.RoundList(base), strings.Join(all, ", ")))
			if s == 128<<10 {
				f = f.WithGoal(ThroughputGoal)
			}
			exp.Add(f)
		}
	}

	for _, op := range oneCPU[1:] {
		ours, base := op.points[oneCPUSize][1], oneCPU[0].points[oneCPUSize][1]
		ratios, k := turnRatios(ours, base)
		exp.Add(bench.NewFigure(fmt.Sprintf("%s %s throughput QD1, one CPU", bench.FormatBytes(oneCPUSize), op.label),
			ours[k], "MiB/s", "raw TCP stream QD1 on one CPU, same turn", base[k]).
			WithNotes(fmt.Sprintf("median turn of %d; per turn: %s; baseline %s; ratios %s",
				len(ours), bench.RoundList(ours), bench.RoundList(base), bench.RoundList(ratios))))
	}

	for _, v := range []*latencyVariant{raw, read, write, send, readBP, read1, raw1} {
		exp.AddSeries(v.series())
	}
	exp.AddPlot(bench.Plot{File: "fabric-ops-latency-cdf.svg", Kind: bench.PlotCDF, LogX: true,
		Title: "4 KiB operation latency at QD1, nprdma/tcp against a raw loopback socket", XLabel: "latency (µs)", YLabel: "fraction of operations",
		Caption: "Every sample of every round pooled; logarithmic x so that the tail shows.",
		Series:  []string{"cdf-raw", "cdf-read", "cdf-write", "cdf-send", "cdf-read-busypoll"}})
	exp.AddPlot(bench.Plot{File: "fabric-ops-latency-procs1-cdf.svg", Kind: bench.PlotCDF, LogX: true,
		Title: "4 KiB READ latency: GOMAXPROCS=1 against the default", XLabel: "latency (µs)", YLabel: "fraction of operations",
		Series: []string{"cdf-raw", "cdf-read", "cdf-raw-procs1", "cdf-read-procs1"}})
	depths := make([]float64, len(cfg.Depths))
	for i, d := range cfg.Depths {
		depths[i] = float64(d)
	}
	for _, s := range cfg.Sizes {
		var names []string
		for _, l := range lines {
			name := fmt.Sprintf("tput-%d-%s", s>>10, l.key)
			var pts []bench.Point
			for _, qd := range cfg.Depths {
				y := bench.MeanFloat(l.points[s][qd])
				if s < 64<<10 {
					y = y * (1 << 20) / float64(s) // IOPS
				}
				pts = append(pts, bench.Point{X: float64(qd), Y: y})
			}
			unit := "MiB/s"
			if s < 64<<10 {
				unit = "IOPS"
			}
			exp.AddSeries(bench.Series{Name: name, Label: l.label, XUnit: "queue depth", YUnit: unit, Points: pts})
			names = append(names, name)
		}
		ylabel, what := "MiB/s", "throughput"
		if s < 64<<10 {
			ylabel, what = "operations per second", "IOPS"
		}
		exp.AddPlot(bench.Plot{File: fmt.Sprintf("fabric-ops-%dk-vs-qd.svg", s>>10), Kind: bench.PlotLine, LogX: true, XTicks: depths,
			Title:  fmt.Sprintf("%s %s against queue depth, nprdma/tcp and a raw loopback stream", bench.FormatBytes(int64(s)), what),
			XLabel: "queue depth", YLabel: ylabel, Series: names})
	}

	for _, v := range vs {
		exp.Placements = append(exp.Placements, v.placement)
		noteNoise(exp, "p50", v.key, v.p50)
	}
	tputPlacement.Role = "nprdma-bench: throughput runs (initiator and target in one process)"
	exp.Placements = append(exp.Placements, tputPlacement, oneCPUPlacement)
	if bench.MeanFloat(read.p50) > ReadLatencyGoal.Threshold*bench.MeanFloat(raw.p50) &&
		bench.MeanFloat(read1.p50) < bench.MeanFloat(read.p50) {
		exp.Note("READ at QD1 costs %.2f× the raw round trip with GOMAXPROCS=%d but %.2f× with GOMAXPROCS=1: the completion is "+
			"delivered by the connection's reader goroutine to a waiter on another goroutine, and with a second P idle the Go "+
			"scheduler wakes a thread that steals the waiter onto the other vCPU, where a wake-up costs tens of µs on this machine "+
			"(docs/nprdma.md §10).", bench.MeanFloat(read.p50)/bench.MeanFloat(raw.p50), runtime.GOMAXPROCS(0),
			bench.MeanFloat(read1.p50)/bench.MeanFloat(raw1.p50))
	}
	if !pinned {
		exp.Note("Not pinned: initiator, target and the raw peer share the bench process and run wherever the scheduler puts them (see the placement table).")
	}
	return exp, nil
}
