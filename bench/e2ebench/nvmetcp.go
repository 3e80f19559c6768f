package e2ebench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/bench/blockdevbench"
)

// NVMeTCPName is the experiment's fixed name (--only nvme-tcp).
const NVMeTCPName = "nvme-tcp"

// The goals of the NVMe/TCP host, against the two-hop nbdkit chain (fio's
// nbd engine → nbdkit's nbd plugin → nbdkit over TCP): the same number of
// hops as fio → attach → target.
var (
	NVMeTCPGoalQD1 = bench.Goal{Text: "over NVMe/TCP: QD1 p50 through attach (NBD) ≤ 0.9× the two-hop nbdkit chain", Op: bench.AtMost, Threshold: 0.9}
	NVMeTCPGoalQD  = bench.Goal{Text: "over NVMe/TCP: QD32 IOPS through attach (NBD) ≥ 1.5× the two-hop nbdkit chain", Op: bench.AtLeast, Threshold: 1.5}
)

// NVMeTCPConfig sizes the nvme-tcp experiment.
type NVMeTCPConfig struct {
	// Size is the namespace; the target gets --memory Size + 32 MiB, so
	// that all of it stays in DRAM (as in e2e-fio's resident case).
	Size    int64
	Runtime time.Duration // fio --runtime of each measurement
	Ramp    time.Duration // fio --ramp_time
	Rounds  int           // figures are medians of the rounds
	QD      int           // the high queue depth (32)
	Dir     string
}

// DefaultNVMeTCPConfig returns the sizes for a mode: five rounds in both,
// so that a median means something.
func DefaultNVMeTCPConfig(m bench.Mode) NVMeTCPConfig {
	return NVMeTCPConfig{
		Size:    bench.ByMode[int64](m, 256<<20, 1<<30),
		Runtime: bench.ByMode(m, time.Second, 10*time.Second),
		Ramp:    bench.WarmUp(m),
		Rounds:  m.Rounds(),
		QD:      32,
	}
}

// NVMeTCPSpec declares the experiment for the suite.
func NVMeTCPSpec(bins *Binaries) bench.Spec {
	return bench.Spec{
		Name:  NVMeTCPName,
		Title: "fio through attach over NVMe/TCP against the nprdma fabric and nbdkit chains",
		Goals: []string{NVMeTCPGoalQD1.Text, NVMeTCPGoalQD.Text,
			"the same through attach over the nprdma fabric, and nbdkit's one-hop server: reported"},
		// One set-up (files, target, attachments, peers) serves every round.
		RoundsInside: true,
		Run: func(ctx context.Context, env *bench.Env) (*bench.Experiment, error) {
			return MeasureNVMeTCP(ctx, env, bins, DefaultNVMeTCPConfig(env.Mode))
		},
	}
}

// MeasureNVMeTCP runs the experiment with cfg.
func MeasureNVMeTCP(ctx context.Context, env *bench.Env, bins *Binaries, cfg NVMeTCPConfig) (exp *bench.Experiment, err error) {
	if cfg.Rounds < 1 || cfg.QD < 2 || cfg.Runtime <= 0 || cfg.Size < 16<<20 {
		return nil, fmt.Errorf("nvme-tcp: bad config: rounds %d, qd %d, runtime %v, size %d", cfg.Rounds, cfg.QD, cfg.Runtime, cfg.Size)
	}
	rig, work, rawDir, err := newE2ERig(ctx, env, bins, NVMeTCPName, cfg.Dir)
	if err != nil {
		return nil, err
	}
	tgtBin, iniBin := rig.tgtBin, rig.iniBin
	defer rig.closeInto(NVMeTCPName, &err)
	log := env.Logger()

	// One target serves the namespace over both transports, from the same
	// DRAM cache, warmed by reading all of it once.
	file := filepath.Join(work, "resident.img")
	if err := blockdevbench.PrepareFile(ctx, file, cfg.Size, dataSeed); err != nil {
		return nil, err
	}
	tp, err := startTarget(ctx, targetConfig{bin: tgtBin, backing: file, memory: cfg.Size + 32<<20,
		dataDir: filepath.Join(work, "meta"), listenNVMeTCP: "127.0.0.1:0"}, time.Minute)
	if err != nil {
		return nil, err
	}
	rig.onClose(tp.shutdown)
	h, err := connectHost(ctx, tp.addr, work)
	if err != nil {
		return nil, fmt.Errorf("nvme-tcp: connect to the target: %w", err)
	}
	err = fillCache(ctx, h, cfg.Size)
	h.close()
	if err != nil {
		return nil, fmt.Errorf("nvme-tcp: warm the target: %w", err)
	}
	tcpAttach, tcpSock, err := attachNBD(ctx, rig, iniBin, "nvme-tcp", filepath.Join(work, "nvme-tcp"), tp.tcpAddr, "--transport", "tcp")
	if err != nil {
		return nil, err
	}
	npAttach, npSock, err := attachNBD(ctx, rig, iniBin, "nprdma", filepath.Join(work, "nprdma"), tp.addr)
	if err != nil {
		return nil, err
	}
	// Both read the data the file holds.
	if err := checkNBDPages(ctx, tcpSock, cfg.Size); err != nil {
		return nil, fmt.Errorf("nvme-tcp: through the NVMe/TCP attach: %w", err)
	}
	if err := checkNBDPages(ctx, npSock, cfg.Size); err != nil {
		return nil, fmt.Errorf("nvme-tcp: through the nprdma attach: %w", err)
	}

	// The peers: nbdkit's memory plugin filled with the same data, alone
	// (one hop) and behind an nbd-plugin proxy on a unix socket (two hops).
	mem, proxy, err := startMemoryPeers(ctx, rig, NVMeTCPName, file, cfg.Size)
	if err != nil {
		return nil, err
	}

	const (
		rTarget = "nprdma-target"
		rTCP    = "nprdma-initiator attach (NBD, NVMe/TCP)"
		rNP     = "nprdma-initiator attach (NBD, nprdma fabric)"
		rNBDKit = "nbdkit (memory, TCP)"
		rProxy  = "nbdkit (nbd proxy, unix socket)"
	)
	var cases []e2eCase
	for _, q := range []int{1, cfg.QD} {
		qs := strconv.Itoa(q)
		cases = append(cases,
			e2eCase{key: "tcp-qd" + qs, label: "attach (NBD) → target over NVMe/TCP", uri: nbdUnixURI(tcpSock), rw: "randread", qd: q,
				procs: map[string]int{rTarget: tp.PID(), rTCP: tcpAttach.PID()}},
			e2eCase{key: "nprdma-qd" + qs, label: "attach (NBD) → target over the nprdma fabric", uri: nbdUnixURI(npSock), rw: "randread", qd: q,
				procs: map[string]int{rTarget: tp.PID(), rNP: npAttach.PID()}},
			e2eCase{key: "2hop-qd" + qs, label: "nbdkit proxy → nbdkit memory", uri: proxy.URI, rw: "randread", qd: q,
				procs: map[string]int{rProxy: proxy.PID, rNBDKit: mem.PID}},
			e2eCase{key: "1hop-qd" + qs, label: "nbdkit memory (one hop)", uri: mem.URI, rw: "randread", qd: q, procs: map[string]int{rNBDKit: mem.PID}},
		)
	}
	var pl placements
	pinned := len(env.CPUs) > 0
	results, fioVersion, err := measureCases(ctx, log, NVMeTCPName, cases, cfg.Rounds, cfg.Runtime, cfg.Ramp, rawDir, pinned, &pl)
	if err != nil {
		return nil, err
	}

	qd := strconv.Itoa(cfg.QD)
	exp = &bench.Experiment{Name: NVMeTCPName}
	exp.Method = fmt.Sprintf("The same fio randread job (4 KiB, uniform offsets with replacement: norandommap) runs against four paths, "+
		"%v after a %v ramp, at QD1 and QD%d (one job; iodepth), over %d rounds in alternating order (reversed every other round); "+
		"a figure's ratio is the median of the per-round ratios, latency is fio's completion latency. "+
		"One nprdma-target serves a %s namespace of per-page distinct data with --memory above it, read once beforehand, on the "+
		"nprdma fabric (nprdma/tcp) and on an NVMe/TCP port (--listen-nvme-tcp), both on loopback. Ours: fio's nbd engine → "+
		"nprdma-initiator attach --mode nbd (unix socket) → the target, once with --transport tcp (NVMe/TCP: every read an NVMe "+
		"Read, its data in C2HData) and once over the nprdma fabric (one-sided reads). The two-hop peer is fio's nbd engine → "+
		"nbdkit's nbd plugin as a proxy (unix socket) → nbdkit's memory plugin over loopback TCP, filled with the same file by "+
		"nbdcopy; the one-hop peer is fio's nbd engine straight to that nbdkit. Before measuring, 64 pages read through each "+
		"attach are checked against the file. Every process's CPU placement is sampled.",
		cfg.Runtime, cfg.Ramp, cfg.QD, cfg.Rounds, bench.FormatBytes(cfg.Size))
	exp.AddParam("fio", fioVersion)
	exp.AddParam("runtime", cfg.Runtime)
	exp.AddParam("ramp", cfg.Ramp)
	exp.AddParam("rounds", cfg.Rounds)
	exp.AddParam("namespace", bench.FormatBytes(cfg.Size))

	byKey := map[string]*e2eResult{}
	for _, r := range results {
		byKey[r.def.key] = r
	}
	p50 := func(r *e2eResult) []float64 { return r.p50 }
	p99 := func(r *e2eResult) []float64 { return r.p99 }
	iops := func(r *e2eResult) []float64 { return r.iops }
	add := func(name, ours, base string, pick func(*e2eResult) []float64, unit string, g *bench.Goal) {
		o, b := pick(byKey[ours]), pick(byKey[base])
		f := bench.RoundsFigure(name, unit, byKey[base].def.label, o, b).
			WithNotes(fmt.Sprintf("per round: ours %s; baseline %s", bench.RoundList(o), bench.RoundList(b)))
		if g != nil {
			f = f.WithGoal(*g)
		}
		exp.Add(f)
	}
	add("NVMe/TCP QD1 p50 vs two-hop", "tcp-qd1", "2hop-qd1", p50, "µs", &NVMeTCPGoalQD1)
	add("NVMe/TCP QD"+qd+" IOPS vs two-hop", "tcp-qd"+qd, "2hop-qd"+qd, iops, "IOPS", &NVMeTCPGoalQD)
	add("NVMe/TCP QD1 p50 vs the nprdma fabric", "tcp-qd1", "nprdma-qd1", p50, "µs", nil)
	add("NVMe/TCP QD"+qd+" IOPS vs the nprdma fabric", "tcp-qd"+qd, "nprdma-qd"+qd, iops, "IOPS", nil)
	add("NVMe/TCP QD1 p50 vs one-hop", "tcp-qd1", "1hop-qd1", p50, "µs", nil)
	add("NVMe/TCP QD"+qd+" IOPS vs one-hop", "tcp-qd"+qd, "1hop-qd"+qd, iops, "IOPS", nil)
	add("NVMe/TCP QD1 p99 vs two-hop", "tcp-qd1", "2hop-qd1", p99, "µs", nil)
	add("NVMe/TCP QD"+qd+" p50 vs two-hop", "tcp-qd"+qd, "2hop-qd"+qd, p50, "µs", nil)
	add("nprdma fabric QD1 p50 vs two-hop", "nprdma-qd1", "2hop-qd1", p50, "µs", nil)
	add("nprdma fabric QD"+qd+" IOPS vs two-hop", "nprdma-qd"+qd, "2hop-qd"+qd, iops, "IOPS", nil)

	var cdfs []string
	for _, key := range []string{"tcp-qd1", "nprdma-qd1", "2hop-qd1", "1hop-qd1"} {
		r := byKey[key]
		exp.AddSeries(bench.Series{Name: "cdf-" + key, Label: r.def.label, XUnit: "µs", YUnit: "fraction",
			Points: bench.MergeFioIO(r.fio...).Clat.CDF(200)})
		cdfs = append(cdfs, "cdf-"+key)
	}
	exp.AddPlot(bench.Plot{File: "nvme-tcp-cdf-qd1.svg", Kind: bench.PlotCDF, LogX: true, Title: "4 KiB random reads at QD1",
		XLabel: "completion latency (µs)", Series: cdfs})
	cats := []string{"NVMe/TCP", "nprdma fabric", "nbdkit two-hop", "nbdkit one-hop"}
	bars := func(file, title, ylabel, qdKey string, pick func(*e2eResult) []float64) {
		var pts []bench.Point
		for i, k := range []string{"tcp", "nprdma", "2hop", "1hop"} {
			pts = append(pts, bench.Point{X: float64(i), Y: bench.Median(pick(byKey[k+"-"+qdKey]))})
		}
		name := "bars-" + strings.TrimSuffix(strings.TrimPrefix(file, "nvme-tcp-"), ".svg")
		exp.AddSeries(bench.Series{Name: name, Label: "median of rounds", YUnit: ylabel, Points: pts})
		exp.AddPlot(bench.Plot{File: file, Kind: bench.PlotBars, Title: title, YLabel: ylabel, Categories: cats, Series: []string{name}})
	}
	bars("nvme-tcp-p50-qd1.svg", "QD1 median read latency (median of rounds)", "p50 (µs)", "qd1", p50)
	bars("nvme-tcp-iops-qd"+qd+".svg", "QD"+qd+" IOPS (median of rounds)", "IOPS", "qd"+qd, iops)

	exp.Placements = pl.list()
	for _, r := range results {
		noteNoise(exp, r.def.key+" p50", r.p50)
		noteNoise(exp, r.def.key+" IOPS", r.iops)
		if r.longest >= 200*time.Millisecond {
			exp.Note("Stall: in %s one I/O took %v; the machine stopped for that long.", r.def.key, r.longest.Round(time.Millisecond))
		}
	}
	exp.Note("Hops: ours goes fio → (unix socket) attach process → (NVMe/TCP or nprdma/tcp, loopback) target; the two-hop peer fio → (unix socket) proxy nbdkit → (TCP) nbdkit; the one-hop peer fio → (TCP) nbdkit.")
	if !pinned {
		exp.Note("Not pinned: every process could run on either CPU; the placement table shows where each ran.")
	}
	return exp, nil
}

// checkNBDPages reads 64 random pages of the namespace (size bytes) through
// the NBD server on socket and checks each page's first word against the
// file's content.
func checkNBDPages(ctx context.Context, socket string, size int64) error {
	rng := rand.New(rand.NewPCG(uint64(size), 0x7c9))
	pages := size / pageSize
	picked := make([]int64, 64)
	for i := range picked {
		picked[i] = rng.Int64N(pages)
	}
	slices.Sort(picked)
	buf := make([]byte, pageSize)
	for _, pg := range picked {
		if err := nbdRead(ctx, "unix", socket, buf, uint64(pg*pageSize)); err != nil {
			return err
		}
		if err := checkTag(buf, pg); err != nil {
			return err
		}
	}
	return nil
}
