package e2ebench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/bench"
)

// The smoke tests run each experiment end to end at toy sizes with the
// real binaries (bin/ when fresh, else built into the test's directory).
// They check what the experiments produce, never how fast anything was.

func smokeEnv(t *testing.T) (*bench.Env, *Binaries) {
	t.Helper()
	root := moduleRoot(t)
	log := quietLog
	if testing.Verbose() {
		log = nil // the default logger
	}
	env := &bench.Env{Mode: bench.ModeQuick, OutDir: t.TempDir(), ScratchDir: t.TempDir(), Log: log,
		Tools: &bench.Tools{}}
	return env, &Binaries{RepoRoot: root}
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/nprdma/nprdma\n") {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Skip("not inside the nprdma module")
		}
		dir = parent
	}
}

func figure(t *testing.T, e *bench.Experiment, name string) bench.Figure {
	t.Helper()
	f, ok := e.Figure(name)
	if !ok {
		var names []string
		for _, f := range e.Figures {
			names = append(names, f.Name)
		}
		t.Fatalf("figure %q missing; have %q", name, names)
	}
	return f
}

func seriesY(t *testing.T, e *bench.Experiment, name string, x float64) float64 {
	t.Helper()
	s, ok := e.SeriesByName(name)
	if !ok {
		t.Fatalf("series %q missing", name)
	}
	for _, p := range s.Points {
		if p.X == x {
			return p.Y
		}
	}
	t.Fatalf("series %q has no point at x=%g: %v", name, x, s.Points)
	return 0
}

// TestCapacitySmoke: at 1× nearly every read is one-sided, at 2× uniform
// reads hit about half the time (the cache holds half the namespace), the
// 5×-style goal figure carries its prediction, and RSS is reported.
func TestCapacitySmoke(t *testing.T) {
	env, bins := smokeEnv(t)
	cfg := CapacityConfig{Budget: 16 << 20, Ratios: []int{1, 2}, Warmup: 300 * time.Millisecond, MaxWarmup: 2 * time.Second,
		WarmupQD: 4, Runtime: 400 * time.Millisecond, ColdReads: 50, Workloads: capacityWorkloads}
	exp, err := MeasureCapacity(context.Background(), env, bins, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if h := seriesY(t, exp, "hit-zipf", 1); h < 0.9 {
		t.Errorf("1× Zipf hit ratio %.3f: the all-resident run is not resident", h)
	}
	if h := seriesY(t, exp, "hit-uniform", 2); h < 0.3 || h > 0.75 {
		t.Errorf("2× uniform hit ratio %.3f, want about 0.5", h)
	}
	f := figure(t, exp, "2× Zipf(0.99) reads: average read latency vs prediction")
	if f.Value <= 0 || f.BaselineValue <= 0 || !strings.Contains(f.Baseline, "prediction (hit ") {
		t.Errorf("prediction figure %+v", f)
	}
	figure(t, exp, "2× 70/30 read/write, Zipf(0.99): average latency of all operations")
	if rss := figure(t, exp, "2×: target peak RSS"); rss.Value <= 0 || rss.BaselineValue != mib(memoryFor(cfg.Budget)) {
		t.Errorf("RSS figure %+v", rss)
	}
	if len(exp.Placements) == 0 || len(exp.Plots) == 0 {
		t.Errorf("placements %d, plots %d", len(exp.Placements), len(exp.Plots))
	}
}

// TestStartupSmoke: every kind of start completes a first read, the --pin
// start says the namespace is two-sided only, and the figures pair the
// cases the issue asks for.
func TestStartupSmoke(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("--pin needs CAP_IPC_LOCK (run as root)")
	}
	if _, err := bench.FindTool("nbdkit"); err != nil {
		t.Skipf("nbdkit not installed: %v", err)
	}
	env, bins := smokeEnv(t)
	cfg := StartupConfig{NamespaceSize: 1 << 30, SmallSize: 64 << 20, Memory: 32 << 20, Rounds: 1, Poll: time.Millisecond}
	exp, err := MeasureStartup(context.Background(), env, bins, cfg)
	if err != nil {
		t.Fatal(err)
	}
	pin := figure(t, exp, "--pin start-up to first read (pin/unpinned)")
	unp := figure(t, exp, "unpinned start-up to first read")
	if pin.Value <= 0 || unp.Value <= 0 || unp.Goal == nil || pin.Value != unp.BaselineValue {
		t.Errorf("start-up figures: unpinned %+v, pin %+v", unp, pin)
	}
	figure(t, exp, "unpinned start-up vs nbdkit")
	if len(exp.Placements) != 4 {
		t.Errorf("%d placements, want one per kind of start", len(exp.Placements))
	}
}

// TestE2ESmoke runs the e2e-fio experiment at toy sizes (NPRDMA_LONG=1:
// it starts a dozen processes and, as root, two loop devices).
func TestE2ESmoke(t *testing.T) {
	if os.Getenv("NPRDMA_LONG") == "" {
		t.Skip("NPRDMA_LONG=1 runs the e2e-fio smoke test")
	}
	for _, tool := range []string{"fio", "nbdkit", "nbdcopy"} {
		if _, err := bench.FindTool(tool); err != nil {
			t.Skipf("%s not installed: %v", tool, err)
		}
	}
	env, bins := smokeEnv(t)
	cfg := E2EConfig{ResidentSize: 32 << 20, SSDSize: 64 << 20, SSDMemory: 16 << 20, SSDWarmup: 300 * time.Millisecond,
		Runtime: 500 * time.Millisecond, Ramp: 100 * time.Millisecond, Rounds: 1, QD: 8, Mix: true, Loop: true}
	exp, err := MeasureE2E(context.Background(), env, bins, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"resident QD1 p50 vs two-hop", "resident QD8 IOPS vs two-hop", "resident QD1 p50 vs one-hop",
		"SSD QD8 IOPS vs two-hop (file)", "randrw 70/30 QD8 IOPS vs two-hop"} {
		if f := figure(t, exp, name); f.Value <= 0 || f.BaselineValue <= 0 {
			t.Errorf("%s: %+v", name, f)
		}
	}
	if os.Geteuid() == 0 {
		figure(t, exp, "loop device QD1 p50 vs nbdfuse loop")
	}
}

// TestSHMSmoke runs the shm experiment at toy sizes (NPRDMA_LONG=1: it
// starts a target, two attach processes and nbdkit): every goal figure is
// there with both sides measured, and the attachment over shm left the
// target's CPU out of the reads.
func TestSHMSmoke(t *testing.T) {
	if os.Getenv("NPRDMA_LONG") == "" {
		t.Skip("NPRDMA_LONG=1 runs the shm smoke test")
	}
	for _, tool := range []string{"fio", "nbdkit", "nbdcopy"} {
		if _, err := bench.FindTool(tool); err != nil {
			t.Skipf("%s not installed: %v", tool, err)
		}
	}
	env, bins := smokeEnv(t)
	cfg := SHMConfig{ResidentSize: 32 << 20, Runtime: 500 * time.Millisecond, Ramp: 100 * time.Millisecond, Rounds: 1, QD: 8, Samples: 50}
	exp, err := MeasureSHM(context.Background(), env, bins, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"resident QD1 p50, shm vs one-hop", "resident QD8 IOPS, shm vs one-hop",
		"4 KiB READ in place p50 vs 2× memcpy + 1 µs", "major fault p50 over shm vs its bound"} {
		if f := figure(t, exp, name); f.Value <= 0 || f.BaselineValue <= 0 || f.Goal == nil {
			t.Errorf("%s: %+v", name, f)
		}
	}
	cpu := figure(t, exp, "target CPU per resident read at QD8, shm vs tcp")
	if cpu.BaselineValue <= 0 || cpu.Value >= cpu.BaselineValue {
		t.Errorf("target CPU per read: shm %v µs, tcp %v µs", cpu.Value, cpu.BaselineValue)
	}
}

// TestNVMeTCPSmoke runs the nvme-tcp experiment at toy sizes (NPRDMA_LONG=1,
// like the e2e-fio smoke test: it starts five processes and checks the
// data through both attachments).
func TestNVMeTCPSmoke(t *testing.T) {
	if os.Getenv("NPRDMA_LONG") == "" {
		t.Skip("NPRDMA_LONG=1 runs the nvme-tcp smoke test")
	}
	for _, tool := range []string{"fio", "nbdkit", "nbdcopy"} {
		if _, err := bench.FindTool(tool); err != nil {
			t.Skipf("%s not installed: %v", tool, err)
		}
	}
	env, bins := smokeEnv(t)
	cfg := NVMeTCPConfig{Size: 32 << 20, Runtime: 300 * time.Millisecond, Ramp: 100 * time.Millisecond, Rounds: 2, QD: 8}
	exp, err := MeasureNVMeTCP(context.Background(), env, bins, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"NVMe/TCP QD1 p50 vs two-hop", "NVMe/TCP QD8 IOPS vs two-hop", "NVMe/TCP QD1 p50 vs the nprdma fabric",
		"NVMe/TCP QD8 IOPS vs one-hop", "nprdma fabric QD8 IOPS vs two-hop"} {
		if f := figure(t, exp, name); f.Value <= 0 || f.BaselineValue <= 0 {
			t.Errorf("%s: %+v", name, f)
		}
	}
	if f := figure(t, exp, "NVMe/TCP QD1 p50 vs two-hop"); f.Goal == nil {
		t.Errorf("the QD1 figure carries no goal: %+v", f)
	}
}
