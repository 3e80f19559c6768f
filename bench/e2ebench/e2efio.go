package e2ebench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/bench/blockdevbench"
	"github.com/nprdma/nprdma/blockdev"
)

// E2EName is the experiment's fixed name (--only e2e-fio).
const E2EName = "e2e-fio"

// The goals for the resident case, against the two-hop peer (fio's
// nbd engine → nbdkit's nbd plugin as a proxy → nbdkit over TCP), and the
// stretch goals against the one-hop peer (fio → nbdkit over TCP).
var (
	E2EGoalQD1  = bench.Goal{Text: "resident: QD1 p50 through attach (NBD) ≤ 0.67× the two-hop nbdkit peer", Op: bench.AtMost, Threshold: 0.67}
	E2EGoalQD   = bench.Goal{Text: "resident: QD32 IOPS through attach (NBD) ≥ 1.5× the two-hop nbdkit peer", Op: bench.AtLeast, Threshold: 1.5}
	E2EStretch1 = bench.Goal{Text: "stretch: resident QD1 p50 through attach (NBD, two hops) ≤ the one-hop peer (fio → nbdkit over TCP)", Op: bench.AtMost, Threshold: 1}
	E2EStretchQ = bench.Goal{Text: "stretch: resident QD32 IOPS through attach (NBD, two hops) ≥ the one-hop peer", Op: bench.AtLeast, Threshold: 1}
)

// E2EConfig sizes the e2e-fio experiment.
type E2EConfig struct {
	// ResidentSize is the namespace of the resident case; the target gets
	// --memory ResidentSize + 32 MiB, so that all of it stays in DRAM.
	ResidentSize int64
	// SSDSize and SSDMemory: the SSD case's namespace and --memory.
	SSDSize, SSDMemory int64
	// SSDWarmup reads the SSD namespace at random before the runs, so that
	// the target's cache holds its steady share (SSDMemory/SSDSize) of it.
	SSDWarmup time.Duration
	Runtime   time.Duration // fio --runtime of each measurement
	Ramp      time.Duration // fio --ramp_time
	Rounds    int
	QD        int  // the high queue depth (32)
	Mix       bool // also a randrw 70/30 row (resident, QD)
	Loop      bool // also fio on loop devices (needs root, /dev/fuse, loop)
	Dir       string
}

// DefaultE2EConfig returns the sizes for a mode.
func DefaultE2EConfig(m bench.Mode) E2EConfig {
	return E2EConfig{
		ResidentSize: bench.ByMode[int64](m, 256<<20, 1<<30),
		SSDSize:      bench.ByMode[int64](m, 1<<30, 4<<30),
		SSDMemory:    bench.ByMode[int64](m, 256<<20, 1<<30),
		SSDWarmup:    bench.ByMode(m, 1500*time.Millisecond, 15*time.Second),
		Runtime:      bench.ByMode(m, time.Second, 10*time.Second),
		Ramp:         bench.WarmUp(m),
		Rounds:       m.Rounds(),
		QD:           32,
		// The mix and the loop devices are reported, not judged: full mode
		// only, to keep the quick suite short.
		Mix:  m == bench.ModeFull,
		Loop: m == bench.ModeFull,
	}
}

// E2ESpec declares the experiment for the suite.
func E2ESpec(bins *Binaries) bench.Spec {
	return bench.Spec{
		Name:  E2EName,
		Title: "fio through attach (NBD socket, loop device) against nbdkit chains with the same number of hops",
		Goals: []string{E2EGoalQD1.Text, E2EGoalQD.Text, E2EStretch1.Text, E2EStretchQ.Text,
			"SSD case (namespace 4× --memory, nbdkit file plugin on the same file) and fio on our loop device against a loop device over nbdfuse → nbdkit: reported"},
		// One set-up (files, target, attachments, peers) serves every round.
		RoundsInside: true,
		Run: func(ctx context.Context, env *bench.Env) (*bench.Experiment, error) {
			return MeasureE2E(ctx, env, bins, DefaultE2EConfig(env.Mode))
		},
	}
}

// e2eCase is one fio target measured every round.
type e2eCase struct {
	key, label string
	uri        string // nbd engine
	device     string // libaio on a block device
	rw         string // randread or randrw
	qd         int
	procs      map[string]int // processes to sample, by role
}

func (c e2eCase) args(runtime, ramp time.Duration) []string {
	a := []string{"--name=" + c.key, "--rw=" + c.rw, "--bs=4k", "--iodepth=" + strconv.Itoa(c.qd), "--numjobs=1",
		"--time_based", "--runtime=" + bench.FioTime(runtime), "--ramp_time=" + bench.FioTime(ramp), "--norandommap", "--randrepeat=0"}
	if c.rw == "randrw" {
		a = append(a, "--rwmixread=70")
	}
	if c.uri != "" {
		return append(a, "--ioengine=nbd", "--uri="+c.uri)
	}
	return append(a, "--ioengine=libaio", "--direct=1", "--filename="+c.device)
}

type e2eResult struct {
	def      e2eCase
	p50, p99 []float64 // µs per round (reads)
	iops     []float64 // reads + writes per round
	fio      []bench.FioIO
	longest  time.Duration
}

// e2eRig is everything the experiment started; close tears it down in
// reverse order.
type e2eRig struct {
	// tgtBin and iniBin are the commands the experiment runs.
	tgtBin, iniBin string
	closers        []func() error
	notes          []string
}

// onClose registers a teardown step.
func (r *e2eRig) onClose(f func() error) { r.closers = append(r.closers, f) }

// newE2ERig starts the rig of experiment name, which compares ours with
// nbdkit through fio: the peers (installed if allowed), the nprdma
// commands, a scratch directory under dir (default env's), removed when the
// rig closes, and the directory of its raw outputs.
func newE2ERig(ctx context.Context, env *bench.Env, bins *Binaries, name, dir string) (rig *e2eRig, work, rawDir string, err error) {
	if _, err := env.Tools.Require(ctx, "fio", "nbdkit", "nbdcopy"); err != nil {
		return nil, "", "", err
	}
	rig = &e2eRig{}
	if rig.tgtBin, rig.iniBin, err = bins.Resolve(ctx, env); err != nil {
		return nil, "", "", err
	}
	if dir == "" {
		dir = env.ScratchDir
	}
	if work, err = os.MkdirTemp(dir, name+"-"); err != nil {
		return nil, "", "", fmt.Errorf("%s: %w", name, err)
	}
	if rawDir, err = env.Dir(name); err != nil {
		os.RemoveAll(work)
		return nil, "", "", err
	}
	rig.onClose(func() error { return os.RemoveAll(work) })
	return rig, work, rawDir, nil
}

// closeInto closes the rig at the end of experiment name; a teardown that
// fails is the experiment's error unless it has one already.
func (r *e2eRig) closeInto(name string, err *error) {
	if cerr := r.close(); cerr != nil && *err == nil {
		*err = fmt.Errorf("%s: teardown: %w", name, cerr)
	}
}

func (r *e2eRig) close() error {
	var errs []error
	for i := len(r.closers) - 1; i >= 0; i-- {
		if err := r.closers[i](); err != nil {
			errs = append(errs, err)
		}
	}
	r.closers = nil
	return errors.Join(errs...)
}

// MeasureE2E runs the experiment with cfg.
func MeasureE2E(ctx context.Context, env *bench.Env, bins *Binaries, cfg E2EConfig) (exp *bench.Experiment, err error) {
	if cfg.Rounds < 1 || cfg.QD < 2 || cfg.Runtime <= 0 || cfg.SSDMemory >= cfg.SSDSize {
		return nil, fmt.Errorf("e2e-fio: bad config: rounds %d, qd %d, runtime %v, SSD memory %d of %d", cfg.Rounds, cfg.QD, cfg.Runtime, cfg.SSDMemory, cfg.SSDSize)
	}
	if cfg.Loop {
		// nbdfuse ships with nbdcopy; without it only the loop cases go.
		env.Tools.Require(ctx, "nbdfuse", "losetup")
	}
	rig, work, rawDir, err := newE2ERig(ctx, env, bins, E2EName, cfg.Dir)
	if err != nil {
		return nil, err
	}
	tgtBin, iniBin := rig.tgtBin, rig.iniBin
	defer rig.closeInto(E2EName, &err)
	log := env.Logger()
	qd := strconv.Itoa(cfg.QD)

	// The data: two files with per-page distinct content.
	resFile, ssdFile := filepath.Join(work, "resident.img"), filepath.Join(work, "ssd.img")
	log.Info("e2e-fio: writing the backing files", "resident", bench.FormatBytes(cfg.ResidentSize), "ssd", bench.FormatBytes(cfg.SSDSize))
	for _, f := range []struct {
		path string
		size int64
	}{{resFile, cfg.ResidentSize}, {ssdFile, cfg.SSDSize}} {
		if err := blockdevbench.PrepareFile(ctx, f.path, f.size, dataSeed); err != nil {
			return nil, err
		}
	}

	// Ours: a target per case, each with nprdma-initiator attach --mode nbd.
	startOurs := func(name, backing string, memory int64) (*targetProc, *bench.Child, string, error) {
		dir := filepath.Join(work, name)
		tp, err := startTarget(ctx, targetConfig{bin: tgtBin, backing: backing, memory: memory, dataDir: filepath.Join(dir, "meta")}, time.Minute)
		if err != nil {
			return nil, nil, "", err
		}
		rig.onClose(tp.shutdown)
		ap, sock, err := attachNBD(ctx, rig, iniBin, name, dir, tp.addr)
		if err != nil {
			return nil, nil, "", err
		}
		return tp, ap, nbdUnixURI(sock), nil
	}
	resTarget, resAttach, resURI, err := startOurs("resident", resFile, cfg.ResidentSize+32<<20)
	if err != nil {
		return nil, err
	}
	ssdTarget, ssdAttach, ssdURI, err := startOurs("ssd", ssdFile, cfg.SSDMemory)
	if err != nil {
		return nil, err
	}
	// In-process hosts warm the targets: the resident one is read whole,
	// the SSD one at random until its cache is full.
	resHost, err := connectHost(ctx, resTarget.addr, filepath.Join(work, "resident"))
	if err != nil {
		return nil, fmt.Errorf("e2e-fio: connect to the resident target: %w", err)
	}
	rig.onClose(func() error { resHost.close(); return nil })
	if err := fillCache(ctx, resHost, cfg.ResidentSize); err != nil {
		return nil, fmt.Errorf("e2e-fio: warm the resident target: %w", err)
	}
	resShare, err := oneSidedShare(ctx, resHost, 2000)
	if err != nil {
		return nil, fmt.Errorf("e2e-fio: resident target: %w", err)
	}
	ssdHost, err := connectHost(ctx, ssdTarget.addr, filepath.Join(work, "ssd"))
	if err != nil {
		return nil, fmt.Errorf("e2e-fio: connect to the SSD target: %w", err)
	}
	// For uniform reads any full cache is a steady one: fill it, then read
	// at random for SSDWarmup.
	ssdPages := cfg.SSDSize / pageSize
	if err := fillCache(ctx, ssdHost, cfg.SSDMemory); err != nil {
		ssdHost.close()
		return nil, fmt.Errorf("e2e-fio: fill the SSD target's cache: %w", err)
	}
	if _, err := warmUp(ctx, ssdHost, workload{key: "uniform"}, func(r *rand.Rand) int64 { return r.Int64N(ssdPages) }, 8, cfg.SSDWarmup, cfg.SSDWarmup, 0xe2e); err != nil {
		ssdHost.close()
		return nil, fmt.Errorf("e2e-fio: warm the SSD target: %w", err)
	}
	ssdWarmShare := ssdHost.c.Stats().OneSidedShare()
	ssdHost.close()

	// The peers: nbdkit's memory plugin filled with the same data, and its
	// file plugin on the SSD case's file; each behind an nbd-plugin proxy on
	// a unix socket for the two-hop chain.
	mem, memProxy, err := startMemoryPeers(ctx, rig, E2EName, resFile, cfg.ResidentSize)
	if err != nil {
		return nil, err
	}
	// cache=none: nbdkit drops what it read from the page cache, so that
	// its SSD case reads the SSD (ours reads the backing with O_DIRECT).
	file, err := bench.StartNBDKit(ctx, "file", []string{"file=" + ssdFile, "cache=none"}, bench.WithLoopbackTCP(), bench.WithNBDKitFlags("--readonly"))
	if err != nil {
		return nil, err
	}
	rig.onClose(file.Stop)
	fileProxy, err := bench.StartNBDKitProxy(ctx, file)
	if err != nil {
		return nil, err
	}
	rig.onClose(fileProxy.Stop)
	dropPageCache(ssdFile)

	const (
		rTarget   = "nprdma-target"
		rAttach   = "nprdma-initiator attach (NBD)"
		rNBDKit   = "nbdkit (memory, TCP)"
		rProxy    = "nbdkit (nbd proxy, unix socket)"
		rFile     = "nbdkit (file, TCP)"
		rFileProx = "nbdkit (nbd proxy → file)"
		rFUSE     = "nprdma-initiator attach (FUSE + loop)"
		rNBDFuse  = "nbdfuse"
	)
	resProcs := map[string]int{rTarget + " (resident)": resTarget.PID(), rAttach + " (resident)": resAttach.PID()}
	ssdProcs := map[string]int{rTarget + " (SSD)": ssdTarget.PID(), rAttach + " (SSD)": ssdAttach.PID()}
	var cases []e2eCase
	for _, q := range []int{1, cfg.QD} {
		qs := strconv.Itoa(q)
		cases = append(cases,
			e2eCase{key: "res-ours-qd" + qs, label: "nprdma attach (NBD) → target", uri: resURI, rw: "randread", qd: q, procs: resProcs},
			e2eCase{key: "res-2hop-qd" + qs, label: "nbdkit proxy → nbdkit memory", uri: memProxy.URI, rw: "randread", qd: q,
				procs: map[string]int{rProxy: memProxy.PID, rNBDKit: mem.PID}},
			e2eCase{key: "res-1hop-qd" + qs, label: "nbdkit memory (one hop)", uri: mem.URI, rw: "randread", qd: q, procs: map[string]int{rNBDKit: mem.PID}},
			e2eCase{key: "ssd-ours-qd" + qs, label: "nprdma attach (NBD) → target, 4× budget", uri: ssdURI, rw: "randread", qd: q, procs: ssdProcs},
			e2eCase{key: "ssd-2hop-qd" + qs, label: "nbdkit proxy → nbdkit file", uri: fileProxy.URI, rw: "randread", qd: q,
				procs: map[string]int{rFileProx: fileProxy.PID, rFile: file.PID}},
			e2eCase{key: "ssd-1hop-qd" + qs, label: "nbdkit file (one hop)", uri: file.URI, rw: "randread", qd: q, procs: map[string]int{rFile: file.PID}},
		)
	}
	if cfg.Mix {
		cases = append(cases,
			e2eCase{key: "mix-ours-qd" + qd, label: "nprdma attach (NBD) → target, randrw 70/30", uri: resURI, rw: "randrw", qd: cfg.QD, procs: resProcs},
			e2eCase{key: "mix-2hop-qd" + qd, label: "nbdkit proxy → nbdkit memory, randrw 70/30", uri: memProxy.URI, rw: "randrw", qd: cfg.QD,
				procs: map[string]int{rProxy: memProxy.PID, rNBDKit: mem.PID}})
	}
	loopNote := ""
	if cfg.Loop {
		ours, oursPID, peer, fusePID, err := setupLoops(ctx, rig, iniBin, resTarget.addr, mem, cfg.ResidentSize, work)
		if err != nil {
			loopNote = "Loop-device cases skipped: " + err.Error()
			log.Warn("e2e-fio: loop-device cases skipped", "err", err)
		} else {
			for _, q := range []int{1, cfg.QD} {
				qs := strconv.Itoa(q)
				cases = append(cases,
					e2eCase{key: "loop-ours-qd" + qs, label: "loop → nprdma-initiator attach (FUSE) → target", device: ours, rw: "randread", qd: q,
						procs: map[string]int{rTarget + " (resident)": resTarget.PID(), rFUSE: oursPID}},
					e2eCase{key: "loop-nbdfuse-qd" + qs, label: "loop → nbdfuse → nbdkit memory", device: peer, rw: "randread", qd: q,
						procs: map[string]int{rNBDFuse: fusePID, rNBDKit: mem.PID}})
			}
		}
	}

	var pl placements
	pinned := len(env.CPUs) > 0
	results, fioVersion, err := measureCases(ctx, log, E2EName, cases, cfg.Rounds, cfg.Runtime, cfg.Ramp, rawDir, pinned, &pl)
	if err != nil {
		return nil, err
	}

	exp = &bench.Experiment{Name: E2EName}
	exp.Method = fmt.Sprintf("The same fio %s job (4 KiB, uniform offsets with replacement: norandommap) runs against each path, "+
		"%v after a %v ramp, at QD1 and QD%d (one job; iodepth), over %d rounds in alternating order (reversed every other round); "+
		"a figure's ratio is the median of the per-round ratios, latency is fio's completion latency. "+
		"Resident case (%s of per-page distinct data): ours is fio's nbd engine → nprdma-initiator attach --mode nbd (unix socket) → "+
		"nprdma-target over nprdma/tcp on loopback, with --memory above the namespace and every page read once beforehand; the "+
		"two-hop peer is fio's nbd engine → nbdkit's nbd plugin as a proxy (unix socket) → nbdkit's memory plugin over loopback TCP, "+
		"filled with the same file by nbdcopy; the one-hop peer is fio's nbd engine straight to that nbdkit over TCP. "+
		"SSD case: a %s namespace with --memory %s, read at random for %v beforehand so that the cache holds its steady share; the peers "+
		"are the same chains ending in nbdkit's file plugin on the same file with cache=none (no page cache; ours reads its "+
		"backing with O_DIRECT). Loop-device case (resident data): fio libaio with direct=1 on the loop device of nprdma-initiator "+
		"attach --mode fuse (a FUSE file served by the attach process, connected to the resident target; loop with direct I/O) "+
		"against a loop device (direct I/O, 4 KiB sectors) over nbdfuse → the nbdkit memory server over TCP. Every process's CPU placement is sampled.",
		"randread", cfg.Runtime, cfg.Ramp, cfg.QD, cfg.Rounds, bench.FormatBytes(cfg.ResidentSize),
		bench.FormatBytes(cfg.SSDSize), bench.FormatBytes(cfg.SSDMemory), cfg.SSDWarmup)
	exp.AddParam("fio", fioVersion)
	exp.AddParam("runtime", cfg.Runtime)
	exp.AddParam("ramp", cfg.Ramp)
	exp.AddParam("rounds", cfg.Rounds)
	exp.AddParam("resident namespace", bench.FormatBytes(cfg.ResidentSize))
	exp.AddParam("SSD namespace / --memory", bench.FormatBytes(cfg.SSDSize)+" / "+bench.FormatBytes(cfg.SSDMemory))
	exp.AddParam("resident one-sided share (2000 random reads after the fill)", fmt.Sprintf("%.3f", resShare))
	exp.AddParam("SSD one-sided share after warm-up", fmt.Sprintf("%.2f", ssdWarmShare))

	byKey := map[string]*e2eResult{}
	for _, r := range results {
		byKey[r.def.key] = r
	}
	fig := func(name string, ours, base *e2eResult, pick func(*e2eResult) []float64, unit string) (bench.Figure, bool) {
		if ours == nil || base == nil {
			return bench.Figure{}, false
		}
		o, b := pick(ours), pick(base)
		return bench.RoundsFigure(name, unit, base.def.label, o, b).
			WithNotes(fmt.Sprintf("per round: ours %s; baseline %s", bench.RoundList(o), bench.RoundList(b))), true
	}
	p50 := func(r *e2eResult) []float64 { return r.p50 }
	p99 := func(r *e2eResult) []float64 { return r.p99 }
	iops := func(r *e2eResult) []float64 { return r.iops }
	add := func(f bench.Figure, ok bool, g *bench.Goal) {
		if !ok {
			return
		}
		if g != nil {
			f = f.WithGoal(*g)
		}
		exp.Add(f)
	}
	k := func(s string) *e2eResult { return byKey[s] }
	add2 := func(name, ours, base string, pick func(*e2eResult) []float64, unit string, g *bench.Goal) {
		f, ok := fig(name, k(ours), k(base), pick, unit)
		add(f, ok, g)
	}
	add2("resident QD1 p50 vs two-hop", "res-ours-qd1", "res-2hop-qd1", p50, "µs", &E2EGoalQD1)
	add2("resident QD"+qd+" IOPS vs two-hop", "res-ours-qd"+qd, "res-2hop-qd"+qd, iops, "IOPS", &E2EGoalQD)
	add2("resident QD1 p50 vs one-hop", "res-ours-qd1", "res-1hop-qd1", p50, "µs", &E2EStretch1)
	add2("resident QD"+qd+" IOPS vs one-hop", "res-ours-qd"+qd, "res-1hop-qd"+qd, iops, "IOPS", &E2EStretchQ)
	add2("resident QD1 p99 vs two-hop", "res-ours-qd1", "res-2hop-qd1", p99, "µs", nil)
	add2("resident QD1 IOPS vs two-hop", "res-ours-qd1", "res-2hop-qd1", iops, "IOPS", nil)
	add2("resident QD"+qd+" p50 vs two-hop", "res-ours-qd"+qd, "res-2hop-qd"+qd, p50, "µs", nil)
	add2("resident QD"+qd+" p99 vs two-hop", "res-ours-qd"+qd, "res-2hop-qd"+qd, p99, "µs", nil)
	add2("resident two-hop peer QD1 p50 vs one-hop peer", "res-2hop-qd1", "res-1hop-qd1", p50, "µs", nil)
	add2("SSD QD1 p50 vs two-hop (file)", "ssd-ours-qd1", "ssd-2hop-qd1", p50, "µs", nil)
	add2("SSD QD1 p99 vs two-hop (file)", "ssd-ours-qd1", "ssd-2hop-qd1", p99, "µs", nil)
	add2("SSD QD"+qd+" IOPS vs two-hop (file)", "ssd-ours-qd"+qd, "ssd-2hop-qd"+qd, iops, "IOPS", nil)
	add2("SSD QD1 p50 vs one-hop (file)", "ssd-ours-qd1", "ssd-1hop-qd1", p50, "µs", nil)
	add2("SSD QD"+qd+" IOPS vs one-hop (file)", "ssd-ours-qd"+qd, "ssd-1hop-qd"+qd, iops, "IOPS", nil)
	add2("randrw 70/30 QD"+qd+" IOPS vs two-hop", "mix-ours-qd"+qd, "mix-2hop-qd"+qd, iops, "IOPS", nil)
	add2("randrw 70/30 QD"+qd+" read p50 vs two-hop", "mix-ours-qd"+qd, "mix-2hop-qd"+qd, p50, "µs", nil)
	add2("loop device QD1 p50 vs nbdfuse loop", "loop-ours-qd1", "loop-nbdfuse-qd1", p50, "µs", nil)
	add2("loop device QD1 p99 vs nbdfuse loop", "loop-ours-qd1", "loop-nbdfuse-qd1", p99, "µs", nil)
	add2("loop device QD"+qd+" IOPS vs nbdfuse loop", "loop-ours-qd"+qd, "loop-nbdfuse-qd"+qd, iops, "IOPS", nil)

	// Plots: QD1 latency CDFs per case family, grouped bars.
	cdf := func(file, title string, keys ...string) {
		var names []string
		for _, key := range keys {
			r := byKey[key]
			if r == nil {
				continue
			}
			exp.AddSeries(bench.Series{Name: "cdf-" + key, Label: r.def.label, XUnit: "µs", YUnit: "fraction",
				Points: bench.MergeFioIO(r.fio...).Clat.CDF(200)})
			names = append(names, "cdf-"+key)
		}
		if len(names) > 0 {
			exp.AddPlot(bench.Plot{File: file, Kind: bench.PlotCDF, LogX: true, Title: title, XLabel: "completion latency (µs)", Series: names})
		}
	}
	cdf("e2e-fio-cdf-resident-qd1.svg", "Resident case, 4 KiB random reads at QD1", "res-ours-qd1", "res-2hop-qd1", "res-1hop-qd1")
	cdf("e2e-fio-cdf-ssd-qd1.svg", "SSD case, 4 KiB random reads at QD1", "ssd-ours-qd1", "ssd-2hop-qd1", "ssd-1hop-qd1")
	cdf("e2e-fio-cdf-loop-qd1.svg", "Loop devices, 4 KiB random reads at QD1 (libaio, direct)", "loop-ours-qd1", "loop-nbdfuse-qd1")
	var cats []string
	for _, g := range []string{"res", "ssd", "loop"} {
		if byKey[g+"-ours-qd1"] != nil {
			cats = append(cats, map[string]string{"res": "resident", "ssd": "SSD", "loop": "loop device"}[g])
		}
	}
	bars := func(file, title, ylabel string, pick func(*e2eResult) []float64, qdKey string, logY bool) {
		var names []string
		for _, s := range []struct{ name, label, suffix string }{
			{"ours", "ours (nprdma)", "ours"}, {"2hop", "two-hop nbdkit peer (loop: nbdfuse)", "2hop"}, {"1hop", "one-hop nbdkit", "1hop"},
		} {
			var pts []bench.Point
			for i, g := range []string{"res", "ssd", "loop"} {
				key := g + "-" + s.suffix + "-" + qdKey
				if g == "loop" && s.suffix == "2hop" {
					key = "loop-nbdfuse-" + qdKey
				}
				if r := byKey[key]; r != nil && i < len(cats) {
					pts = append(pts, bench.Point{X: float64(i), Y: bench.MeanFloat(pick(r))})
				}
			}
			if len(pts) == 0 {
				continue
			}
			name := "bars-" + qdKey + "-" + s.name + "-" + strings.TrimSuffix(strings.TrimPrefix(file, "e2e-fio-"), ".svg")
			exp.AddSeries(bench.Series{Name: name, Label: s.label, YUnit: ylabel, Points: pts})
			names = append(names, name)
		}
		exp.AddPlot(bench.Plot{File: file, Kind: bench.PlotBars, LogY: logY, Title: title, YLabel: ylabel, Categories: cats, Series: names})
	}
	bars("e2e-fio-p50-qd1.svg", "QD1 median read latency (mean of rounds)", "p50 (µs)", p50, "qd1", false)
	bars("e2e-fio-iops-qd"+qd+".svg", "QD"+qd+" IOPS (mean of rounds)", "IOPS", iops, "qd"+qd, false)

	exp.Placements = pl.list()
	for _, r := range results {
		noteNoise(exp, r.def.key+" p50", r.p50)
		noteNoise(exp, r.def.key+" IOPS", r.iops)
		if r.longest >= 200*time.Millisecond {
			exp.Note("Stall: in %s one I/O took %v; the machine or the disk stopped for that long.", r.def.key, r.longest.Round(time.Millisecond))
		}
	}
	if resShare < 0.99 {
		exp.Note("Resident case: only %.1f%% of random reads completed one-sided although --memory exceeds the namespace: "+
			"the others found their page absent and took the fault path.", resShare*100)
	}
	exp.Note("Hops: ours goes fio → (unix socket) attach process → (nprdma/tcp) target; the two-hop peer fio → (unix socket) proxy nbdkit → (TCP) nbdkit; the one-hop peer fio → (TCP) nbdkit.")
	exp.Note("SSD case: after the warm-up %.0f%% of our reads completed one-sided; nbdkit's file plugin with cache=none keeps no cache, ours keeps --memory %s of the %s namespace: the figures compare a DRAM cache plus the SSD against the SSD alone.",
		ssdWarmShare*100, bench.FormatBytes(cfg.SSDMemory), bench.FormatBytes(cfg.SSDSize))
	if loopNote != "" {
		exp.Note("%s", loopNote)
	}
	for _, n := range rig.notes {
		exp.Note("%s", n)
	}
	if !pinned {
		exp.Note("Not pinned: every process could run on either CPU; the placement table shows where each ran.")
	}
	return exp, nil
}

// startMemoryPeers starts nbdkit's memory plugin on loopback TCP, filled
// with file's size bytes by nbdcopy (the one-hop peer), and nbdkit's nbd
// plugin in front of it on a unix socket (the two-hop chain); the rig stops
// both.
func startMemoryPeers(ctx context.Context, rig *e2eRig, name, file string, size int64) (mem, proxy *bench.NBDKit, err error) {
	if mem, err = startMemoryPeer(ctx, rig, name, file, size); err != nil {
		return nil, nil, err
	}
	if proxy, err = bench.StartNBDKitProxy(ctx, mem); err != nil {
		return nil, nil, err
	}
	rig.onClose(proxy.Stop)
	return mem, proxy, nil
}

// startMemoryPeer starts nbdkit's memory plugin on loopback TCP, filled
// with file's size bytes by nbdcopy (the one-hop peer); the rig stops it.
func startMemoryPeer(ctx context.Context, rig *e2eRig, name, file string, size int64) (*bench.NBDKit, error) {
	mem, err := bench.StartNBDKit(ctx, "memory", []string{"size=" + strconv.FormatInt(size, 10)}, bench.WithLoopbackTCP())
	if err != nil {
		return nil, err
	}
	rig.onClose(mem.Stop)
	nbdcopy, err := bench.FindTool("nbdcopy")
	if err != nil {
		return nil, err
	}
	if out, err := exec.CommandContext(ctx, nbdcopy, "--flush", file, mem.URI).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%s: nbdcopy the data into nbdkit memory: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return mem, nil
}

// measureCases runs fio on every case once per round, in the order of
// bench.RoundOrder (reversed every other round), sampling where the cases'
// processes run into pl and keeping fio's JSON in rawDir; it returns the
// per-round figures of each case and fio's version.
func measureCases(ctx context.Context, log *slog.Logger, name string, cases []e2eCase, rounds int, runtime, ramp time.Duration,
	rawDir string, pinned bool, pl *placements) ([]*e2eResult, string, error) {
	results := make([]*e2eResult, len(cases))
	for i, c := range cases {
		results[i] = &e2eResult{def: c}
	}
	fio := bench.Fio{}
	var fioVersion string
	for round := range rounds {
		for _, i := range bench.RoundOrder(len(cases), round) {
			c := cases[i]
			log.Info(name+": measuring", "case", c.key, "round", round+1, "of", rounds)
			var res bench.FioResult
			err := pl.sampleDuring(c.procs, pinned, func() error {
				var err error
				res, err = fio.Run(ctx, c.args(runtime, ramp)...)
				return err
			})
			if len(res.Raw) > 0 {
				res.SaveRaw(filepath.Join(rawDir, fmt.Sprintf("fio-%s-r%d.json", c.key, round+1)))
			}
			if err != nil {
				return nil, "", fmt.Errorf("%s %s: %w", name, c.key, err)
			}
			fioVersion = res.Version
			fl := res.Placement
			fl.Role, fl.Pinned = "fio ("+c.label+")", pinned
			pl.add(fl)
			r := results[i]
			rd := res.GroupRead(0)
			var wr bench.FioIO
			for _, j := range res.Jobs {
				wr = bench.MergeFioIO(wr, j.Write)
			}
			if rd.TotalIOs == 0 {
				return nil, "", fmt.Errorf("%s %s: fio completed no reads", name, c.key)
			}
			r.p50 = append(r.p50, bench.Micros(rd.P50))
			r.p99 = append(r.p99, bench.Micros(rd.P99))
			r.iops = append(r.iops, rd.IOPS+wr.IOPS)
			r.fio = append(r.fio, rd)
			r.longest = max(r.longest, rd.Clat.Max)
		}
	}
	return results, fioVersion, nil
}

// waitUnixSocket waits until something accepts connections on path.
func waitUnixSocket(ctx context.Context, c *bench.Child, path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if conn, err := net.Dial("unix", path); err == nil {
			conn.Close()
			return nil
		}
		if c.Exited() {
			return fmt.Errorf("%s exited before serving %s: %s", c.Name, path, c.Output(1200))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: nothing accepts connections on %s after %v: %s", c.Name, path, timeout, c.Output(1200))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// dropPageCache asks the kernel to forget the file's cached pages (only
// this file's), so that a peer reading it through the page cache starts
// cold.
func dropPageCache(path string) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

// setupLoops attaches the resident namespace as a loop device with
// nprdma-initiator attach --mode fuse, and the nbdkit memory server as a
// loop device over nbdfuse, both with direct I/O and 4 KiB sectors, and
// checks that both read the same data. It returns the devices and the PIDs
// of the two FUSE servers.
func setupLoops(ctx context.Context, rig *e2eRig, iniBin, targetAddr string, mem *bench.NBDKit, size int64, work string) (ours string, oursPID int, peer string, fusePID int, err error) {
	fail := func(err error) (string, int, string, int, error) { return "", 0, "", 0, err }
	if os.Geteuid() != 0 {
		return fail(errors.New("loop devices need root"))
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fail(fmt.Errorf("no /dev/fuse: %w", err))
	}
	nbdfuse, err := bench.FindTool("nbdfuse")
	if err != nil {
		return fail(err)
	}
	losetup, err := exec.LookPath("losetup")
	if err != nil {
		return fail(fmt.Errorf("losetup: %w", err))
	}

	dir := filepath.Join(work, "loop")
	ap, err := bench.StartChild("nprdma-initiator attach --mode fuse", []string{iniBin, "--hostid-file", filepath.Join(dir, "hostid"),
		"attach", "--mode", "fuse", "--name", "e2e-loop", "--json", "--target", targetAddr, "--nqn", benchNQN}, nil,
		"NPRDMA_RUN_DIR="+filepath.Join(dir, "run"))
	if err != nil {
		return fail(err)
	}
	rig.onClose(func() error { return ap.Stop(syscall.SIGTERM, time.Minute) })
	line, err := ap.WaitLine(ctx, time.Minute, func(l string) bool { return strings.Contains(l, `"device"`) })
	if err != nil {
		return fail(err)
	}
	var rec struct {
		LoopDevice string `json:"device"`
	}
	if err := json.Unmarshal([]byte(line), &rec); err != nil || !strings.HasPrefix(rec.LoopDevice, "/dev/loop") {
		return fail(fmt.Errorf("attach --mode fuse printed %q: %v", line, err))
	}
	ours = rec.LoopDevice

	mnt := mkdir(filepath.Join(work, "fuse-nbdfuse"))
	pidFile := filepath.Join(work, "nbdfuse.pid")
	nf, err := bench.StartChild("nbdfuse", []string{nbdfuse, "-P", pidFile, filepath.Join(mnt, "disk"), mem.URI}, nil)
	if err != nil {
		return fail(err)
	}
	rig.onClose(func() error {
		// nbdfuse exits by itself once its mount is gone; a signal is
		// the fallback (its death by that signal is then no error).
		out, uerr := exec.Command("umount", mnt).CombinedOutput()
		if !nf.Wait(10 * time.Second) {
			nf.Stop(syscall.SIGTERM, 10*time.Second)
		}
		if uerr != nil {
			return fmt.Errorf("umount %s: %w: %s", mnt, uerr, strings.TrimSpace(string(out)))
		}
		return nil
	})
	for deadline := time.Now().Add(15 * time.Second); ; {
		if b, err := os.ReadFile(pidFile); err == nil && len(strings.TrimSpace(string(b))) > 0 {
			break
		}
		if nf.Exited() || time.Now().After(deadline) {
			return fail(fmt.Errorf("nbdfuse did not come up: %s", nf.Output(600)))
		}
		time.Sleep(10 * time.Millisecond)
	}
	out, err := exec.CommandContext(ctx, losetup, "--find", "--show", "--direct-io=on", "--sector-size", "4096", filepath.Join(mnt, "disk")).CombinedOutput()
	if err != nil {
		return fail(fmt.Errorf("losetup on the nbdfuse file: %w: %s", err, strings.TrimSpace(string(out))))
	}
	peer = strings.TrimSpace(string(out))
	rig.onClose(func() error {
		if out, err := exec.Command(losetup, "-d", peer).CombinedOutput(); err != nil {
			return fmt.Errorf("losetup -d %s: %w: %s", peer, err, strings.TrimSpace(string(out)))
		}
		return nil
	})
	for _, dev := range []string{ours, peer} {
		b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "dio"))
		if err != nil || strings.TrimSpace(string(b)) != "1" {
			rig.notes = append(rig.notes, fmt.Sprintf("The loop device %s did not get direct I/O (sysfs dio %q): its reads may hit the page cache.", dev, strings.TrimSpace(string(b))))
		}
		if err := verifyDevice(dev, size); err != nil {
			return fail(err)
		}
	}
	return ours, ap.PID(), peer, nf.PID(), nil
}

func mkdir(p string) string {
	os.MkdirAll(p, 0o755)
	return p
}

// verifyDevice reads 64 random pages of a block device with O_DIRECT and
// checks their whole content.
func verifyDevice(path string, size int64) error {
	dev, err := blockdev.Open(path, blockdev.WithReadOnly(), blockdev.WithoutExclusive())
	if err != nil {
		return err
	}
	defer dev.Close()
	buf := blockdev.AlignedBuffer(pageSize)
	r := rand.New(rand.NewPCG(uint64(size), 64))
	for range 64 {
		page := r.Int64N(size / pageSize)
		if _, err := dev.ReadAt(buf, page*pageSize); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if err := blockdevbench.VerifyPage(buf, dataSeed, page); err != nil {
			return fmt.Errorf("%s does not hold the data: %w", path, err)
		}
	}
	return nil
}

// oneSidedShare reads n random pages and returns the share that completed
// one-sided.
func oneSidedShare(ctx context.Context, h *host, n int) (float64, error) {
	pages := h.ns.Size() / pageSize
	r := rand.New(rand.NewPCG(uint64(pages), 5))
	buf := make([]byte, pageSize)
	before := h.c.Stats()
	for range n {
		page := r.Int64N(pages)
		if _, err := h.ns.ReadAtContext(ctx, buf, page*pageSize); err != nil {
			return 0, err
		}
		if err := checkTag(buf, page); err != nil {
			return 0, err
		}
	}
	after := h.c.Stats()
	return float64(after.ReadsOneSided-before.ReadsOneSided) / float64(after.Reads-before.Reads), nil
}
