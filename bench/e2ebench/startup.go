package e2ebench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/internal/banner"
)

// StartupName is the experiment's fixed name (--only startup).
const StartupName = "startup"

// Goals of the startup experiment. The issue asks for the pin/unpinned
// ratio; the goal states what the unpinned design promises: its start does
// not pay for pinning, and does not grow with the namespace (O(1)
// registration; "independent" is read as within 25%, the noise of a
// sub-second start on this machine).
var (
	StartupGoalPin = bench.Goal{Text: "time from exec to the first completed remote read on a 64 GiB namespace: unpinned ≤ the --pin baseline (whole DRAM budget registered pinned up front); pin/unpinned reported",
		Op: bench.AtMost, Threshold: 1}
	StartupGoalSize = bench.Goal{Text: "unpinned start-up independent of namespace size: 64 GiB ≤ 1.25× a 1 GiB namespace",
		Op: bench.AtMost, Threshold: 1.25}
)

// StartupConfig sizes the startup experiment.
type StartupConfig struct {
	// NamespaceSize is the sparse backing file (64 GiB); SmallSize the
	// small namespace of the size comparison.
	NamespaceSize, SmallSize int64
	// Memory is --memory of every start, and so what --pin pins.
	Memory int64
	Rounds int
	// Poll is the pause between readiness attempts.
	Poll time.Duration
	Dir  string
}

// DefaultStartupConfig returns the sizes for a mode.
func DefaultStartupConfig(m bench.Mode) StartupConfig {
	return StartupConfig{
		NamespaceSize: 64 << 30,
		SmallSize:     1 << 30,
		Memory:        bench.ByMode[int64](m, 1<<30, 4<<30),
		Rounds:        1,
		Poll:          time.Millisecond,
	}
}

// StartupSpec declares the experiment for the suite.
func StartupSpec(bins *Binaries) bench.Spec {
	return bench.Spec{
		Name:  StartupName,
		Title: "Start-up: exec of nprdma-target to the first completed remote read, unpinned vs --pin",
		Goals: []string{StartupGoalPin.Text, StartupGoalSize.Text, "nbdkit's start on the same file as a reference"},
		Run: func(ctx context.Context, env *bench.Env) (*bench.Experiment, error) {
			return MeasureStartup(ctx, env, bins, DefaultStartupConfig(env.Mode))
		},
	}
}

// startCase is one kind of start measured every round.
type startCase struct {
	key, label string
	backing    string
	pin        bool
	nbdkit     bool
}

// startSample is one measured start.
type startSample struct {
	ready   time.Duration // exec → first completed read
	listen  time.Duration // exec → the target's "serving" line (0 for nbdkit)
	attempt int           // readiness attempts before the read
	pl      bench.Placement
}

// MeasureStartup runs the experiment with cfg.
func MeasureStartup(ctx context.Context, env *bench.Env, bins *Binaries, cfg StartupConfig) (*bench.Experiment, error) {
	if cfg.Rounds < 1 || cfg.Memory < 16<<20 || cfg.NamespaceSize <= cfg.Memory {
		return nil, fmt.Errorf("startup: bad config: rounds %d, memory %d, namespace %d (must exceed memory)", cfg.Rounds, cfg.Memory, cfg.NamespaceSize)
	}
	if _, err := env.Tools.Require(ctx, "nbdkit"); err != nil {
		return nil, err
	}
	tgtBin, _, err := bins.Resolve(ctx, env)
	if err != nil {
		return nil, err
	}
	if cfg.Dir == "" {
		cfg.Dir = env.ScratchDir
	}
	work, err := os.MkdirTemp(cfg.Dir, "startup-")
	if err != nil {
		return nil, fmt.Errorf("startup: %w", err)
	}
	defer os.RemoveAll(work)
	big, small := filepath.Join(work, "big.img"), filepath.Join(work, "small.img")
	for _, f := range []struct {
		path string
		size int64
	}{{big, cfg.NamespaceSize}, {small, cfg.SmallSize}} {
		// Sparse: a 64 GiB namespace costs nothing on disk.
		if err := blockdev.Create(f.path, f.size); err != nil {
			return nil, err
		}
	}
	// One metadata directory for every start: each opens an existing badger
	// store, as a restart does. A first, unmeasured start creates it and
	// brings the binary into the page cache.
	meta := filepath.Join(work, "meta")
	cases := []startCase{
		{key: "unpinned", label: "unpinned, " + bench.FormatBytes(cfg.NamespaceSize), backing: big},
		{key: "pin", label: "--pin, " + bench.FormatBytes(cfg.NamespaceSize), backing: big, pin: true},
		{key: "unpinned-small", label: "unpinned, " + bench.FormatBytes(cfg.SmallSize), backing: small},
		{key: "nbdkit", label: "nbdkit file, " + bench.FormatBytes(cfg.NamespaceSize), backing: big, nbdkit: true},
	}
	log := env.Logger()
	if _, err := startOnce(ctx, tgtBin, cases[0], cfg, meta, work); err != nil {
		return nil, fmt.Errorf("startup: priming start: %w", err)
	}
	samples := make([][]startSample, len(cases))
	var pl placements
	for round := range cfg.Rounds {
		for _, i := range bench.RoundOrder(len(cases), env.Round+round) {
			log.Info("startup: measuring", "case", cases[i].key, "round", round+1, "of", cfg.Rounds)
			s, err := startOnce(ctx, tgtBin, cases[i], cfg, meta, work)
			if err != nil {
				return nil, fmt.Errorf("startup %s: %w", cases[i].key, err)
			}
			s.pl.Role, s.pl.Pinned = cases[i].label, len(env.CPUs) > 0
			pl.add(s.pl)
			samples[i] = append(samples[i], s)
		}
	}

	exp := &bench.Experiment{Name: StartupName}
	exp.Method = fmt.Sprintf("A sparse %s backing file (and a %s one for the size comparison) in %s. Each measurement execs "+
		"nprdma-target (%s) with --memory %s on a free loopback port and, from the same instant, polls it every %v with an in-process "+
		"initiator: Connect (admin queue, enable, Identify, I/O queues), the namespace (Identify and the region descriptor), then one "+
		"4 KiB read at offset 0; the figure is the time from exec to that read's completion. Unpinned is the default target: the "+
		"region is registered in O(1) whatever its size. --pin is the baseline of a conventional RDMA target: before serving, it "+
		"allocates the whole --memory and registers it pinned (mlock); the 64 GiB namespace does not fit in it, so it is served "+
		"two-sided (the first read is an NVMe Read). The reference is nbdkit's file plugin on the same file, polled the same way by a "+
		"minimal NBD client (connect, handshake, one 4 KiB read). Every target start opens the same existing metadata store (an "+
		"unmeasured first start creates it); the target is stopped with SIGTERM after each measurement. %d rounds, in alternating "+
		"order; the figures are means of the rounds.",
		bench.FormatBytes(cfg.NamespaceSize), bench.FormatBytes(cfg.SmallSize), cfg.Dir, filepath.Base(tgtBin),
		bench.FormatBytes(cfg.Memory), cfg.Poll, cfg.Rounds)
	exp.AddParam("namespace", bench.FormatBytes(cfg.NamespaceSize)+" (sparse)")
	exp.AddParam("--memory (pinned by --pin)", bench.FormatBytes(cfg.Memory))
	exp.AddParam("rounds", cfg.Rounds)
	exp.AddParam("poll interval", cfg.Poll)

	ms := func(i int, pick func(startSample) time.Duration) []float64 {
		out := make([]float64, len(samples[i]))
		for j, s := range samples[i] {
			out[j] = float64(pick(s).Microseconds()) / 1000
		}
		return out
	}
	ready := func(s startSample) time.Duration { return s.ready }
	listen := func(s startSample) time.Duration { return s.listen }
	fig := func(name string, a, b int, g *bench.Goal) {
		va, vb := ms(a, ready), ms(b, ready)
		f := bench.NewFigure(name, bench.MeanFloat(va), "ms", cases[b].label, bench.MeanFloat(vb)).
			WithNotes(fmt.Sprintf("per round: %s; baseline %s", bench.RoundList(va), bench.RoundList(vb)))
		if g != nil {
			f = f.WithGoal(*g)
		}
		exp.Add(f)
	}
	fig("unpinned start-up to first read", 0, 1, &StartupGoalPin)
	fig("--pin start-up to first read (pin/unpinned)", 1, 0, nil)
	fig("unpinned start-up, 64 GiB vs 1 GiB namespace", 0, 2, &StartupGoalSize)
	fig("unpinned start-up vs nbdkit", 0, 3, nil)
	for i, c := range cases[:3] {
		l, r := bench.MeanFloat(ms(i, listen)), bench.MeanFloat(ms(i, ready))
		exp.Note("%s: %.1f ms from exec to the \"serving\" line (listening), %.1f ms to the first completed read.", c.label, l, r)
	}
	var pts []bench.Point
	cats := make([]string, len(cases))
	for i, c := range cases {
		cats[i] = c.label
		pts = append(pts, bench.Point{X: float64(i), Y: bench.MeanFloat(ms(i, ready))})
		noteNoise(exp, c.label+" start-up", ms(i, ready))
	}
	exp.AddSeries(bench.Series{Name: "startup", Label: "exec → first completed 4 KiB read", YUnit: "ms", Points: pts})
	exp.AddPlot(bench.Plot{File: "startup.svg", Kind: bench.PlotBars, LogY: true, Title: "Time from exec to the first completed remote read",
		YLabel: "ms (log)", Categories: cats, Series: []string{"startup"}})
	exp.Placements = pl.list()
	return exp, nil
}

// startOnce execs the server of c, polls it until one 4 KiB read at offset 0
// completes, and stops it.
func startOnce(ctx context.Context, tgtBin string, c startCase, cfg StartupConfig, meta, work string) (startSample, error) {
	port, err := bench.FreeLoopbackPort()
	if err != nil {
		return startSample{}, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	var argv []string
	if c.nbdkit {
		nk, err := bench.FindTool("nbdkit")
		if err != nil {
			return startSample{}, err
		}
		argv = []string{nk, "--foreground", "--exit-with-parent", "--ipaddr", "127.0.0.1", "--port", strconv.Itoa(port),
			"--readonly", "file", "file=" + c.backing}
	} else {
		argv = targetConfig{bin: tgtBin, backing: c.backing, memory: cfg.Memory, dataDir: meta, listen: addr, pin: c.pin}.argv()
	}
	t0 := time.Now()
	ch, err := bench.StartChild(filepath.Base(argv[0]), argv, nil)
	if err != nil {
		return startSample{}, err
	}
	defer ch.Stop(syscall.SIGKILL, time.Second)
	sampler := bench.StartCPUSampler(ch.PID(), 10*time.Millisecond)
	listened := make(chan time.Duration, 1)
	if !c.nbdkit {
		go func() {
			if _, err := ch.WaitLine(ctx, 5*time.Minute, banner.IsServing); err == nil {
				listened <- time.Since(t0)
			}
		}()
	}
	s := startSample{}
	buf := make([]byte, pageSize)
	deadline := t0.Add(5 * time.Minute)
	for {
		s.attempt++
		err := tryRead(ctx, c, addr, work, buf)
		if err == nil {
			s.ready = time.Since(t0)
			break
		}
		if errors.Is(err, errWrongData) {
			return s, err
		}
		if ch.Exited() {
			return s, fmt.Errorf("%s exited before serving: %s", ch.Name, ch.Output(1200))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return s, fmt.Errorf("%s: no read completed after %v (last: %v): %s", ch.Name, time.Since(t0).Round(time.Millisecond), err, ch.Output(600))
		}
		time.Sleep(cfg.Poll)
	}
	s.pl = sampler.Stop()
	if !c.nbdkit {
		select {
		case s.listen = <-listened:
		case <-time.After(5 * time.Second):
		}
	}
	if err := ch.Stop(syscall.SIGTERM, 2*time.Minute); err != nil {
		return s, err
	}
	return s, nil
}

var errWrongData = errors.New("startup: the first read of a sparse namespace returned non-zero bytes")

// tryRead is one readiness attempt: a connection and one read.
func tryRead(ctx context.Context, c startCase, addr, work string, buf []byte) error {
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if c.nbdkit {
		return nbdRead(actx, "tcp", addr, buf, 0)
	}
	h, err := connectHost(actx, addr, work, initiator.WithIOQueues(1))
	if err != nil {
		return err
	}
	defer h.close()
	if _, err := h.ns.ReadAtContext(actx, buf, 0); err != nil {
		return err
	}
	// A sparse file reads zeros; anything else is the wrong data.
	for _, b := range buf {
		if b != 0 {
			return errWrongData
		}
	}
	return nil
}
