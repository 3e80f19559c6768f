package blockdevbench

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/blockdev"
)

const testSeed = 99

func TestFillAndVerifyPage(t *testing.T) {
	a := make([]byte, PageSize)
	b := make([]byte, PageSize)
	FillPage(a, testSeed, 7)
	FillPage(b, testSeed, 8)
	if slices.Equal(a, b) {
		t.Fatal("pages 7 and 8 have the same content")
	}
	if err := VerifyPage(a, testSeed, 7); err != nil {
		t.Fatal(err)
	}
	if err := VerifyPage(a, testSeed, 8); err == nil {
		t.Fatal("page 7's content verified as page 8")
	}
	a[4000] ^= 1
	if err := VerifyPage(a, testSeed, 7); err == nil || !strings.Contains(err.Error(), "byte 4000") {
		t.Fatalf("flipped bit: %v", err)
	}
	FillPage(b, testSeed+1, 7)
	if pageTag(testSeed, 7) == pageTag(testSeed+1, 7) {
		t.Fatal("the seed does not change the content")
	}
}

func prepared(t *testing.T, size int64) (string, blockdev.Device) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "backing")
	if err := PrepareFile(context.Background(), path, size, testSeed); err != nil {
		t.Fatal(err)
	}
	dev, err := blockdev.Open(path, blockdev.WithReadOnly())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return path, dev
}

func TestPrepareFileWritesEveryPage(t *testing.T) {
	// 5 MiB: one full 4 MiB chunk and a partial one.
	path, _ := prepared(t, 5<<20)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) != 5<<20 {
		t.Fatalf("file is %d bytes", len(data))
	}
	for page := int64(0); page < int64(len(data))/PageSize; page++ {
		if err := VerifyPage(data[page*PageSize:(page+1)*PageSize], testSeed, page); err != nil {
			t.Fatal(err)
		}
	}
	// A larger leftover is replaced, not kept.
	if err := os.Truncate(path, 9<<20); err != nil {
		t.Fatal(err)
	}
	if err := PrepareFile(context.Background(), path, 1<<20, testSeed); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Size() != 1<<20 {
		t.Fatalf("after preparing 1 MiB over a 9 MiB leftover: %v, %v", st.Size(), err)
	}
	if err := PrepareFile(context.Background(), path, 1000, testSeed); err == nil {
		t.Fatal("unaligned size accepted")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := PrepareFile(ctx, filepath.Join(t.TempDir(), "x"), 1<<20, testSeed); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled prepare: %v", err)
	}
}

func TestRandomReads(t *testing.T) {
	_, dev := prepared(t, 4<<20)
	for _, qd := range []int{1, 4} {
		res, err := RandomReads(context.Background(), dev, qd, 20*time.Millisecond, 150*time.Millisecond, 1, testSeed)
		if err != nil {
			t.Fatal(err)
		}
		if res.Ops == 0 || len(res.Samples) != int(res.Ops) || res.IOPS != float64(res.Ops)/0.15 {
			t.Fatalf("qd %d: %d ops, %d samples, %v IOPS", qd, res.Ops, len(res.Samples), res.IOPS)
		}
		if res.Longest < res.Summary.Max {
			t.Fatalf("qd %d: longest read %v shorter than the slowest sample %v", qd, res.Longest, res.Summary.Max)
		}
		if !slices.IsSorted(res.Samples) || res.Summary.P50 != bench.Percentile(res.Samples, 50) || res.Summary.N != len(res.Samples) {
			t.Fatalf("qd %d: samples unsorted or summary inconsistent: %+v", qd, res.Summary)
		}
	}
	if err := VerifySample(dev, 64, 3, testSeed); err != nil {
		t.Fatal(err)
	}
	if err := VerifySample(dev, 64, 3, testSeed+1); err == nil {
		t.Fatal("VerifySample accepted content written with another seed")
	}
	if _, err := RandomReads(context.Background(), dev, 0, 0, time.Millisecond, 1, testSeed); err == nil {
		t.Fatal("queue depth 0 accepted")
	}
}

func TestRandomReadsCatchWrongContent(t *testing.T) {
	_, dev := prepared(t, 1<<20)
	_, err := RandomReads(context.Background(), dev, 2, 0, time.Second, 1, testSeed+1)
	if err == nil || !strings.Contains(err.Error(), "wrong content") {
		t.Fatalf("reads of content written with another seed: %v", err)
	}
}

// failingDevice fails every read after the first n.
type failingDevice struct {
	blockdev.Device
	n int
}

func (d *failingDevice) ReadAt(p []byte, off int64) (int, error) {
	if d.n <= 0 {
		return 0, &blockdev.Error{Op: "read", Path: d.Path(), Off: off, Len: int64(len(p)), Err: blockdev.ErrInjected}
	}
	d.n--
	return d.Device.ReadAt(p, off)
}

// slowDevice delays its first read.
type slowDevice struct {
	blockdev.Device
	delay time.Duration
	done  bool
}

func (d *slowDevice) ReadAt(p []byte, off int64) (int, error) {
	if !d.done {
		d.done = true
		time.Sleep(d.delay)
	}
	return d.Device.ReadAt(p, off)
}

func TestStallsAreNoted(t *testing.T) {
	_, dev := prepared(t, 1<<20)
	// The slow read falls in the warm-up: no sample, but Longest sees it.
	res, err := RandomReads(context.Background(), &slowDevice{Device: dev, delay: stallThreshold}, 1, time.Millisecond, 50*time.Millisecond, 1, testSeed)
	if err != nil {
		t.Fatal(err)
	}
	if res.Longest < stallThreshold {
		t.Fatalf("longest read %v, the device slept %v", res.Longest, stallThreshold)
	}
	rn := &runner{}
	rn.noteStall(caseDef{key: "ours-qd1"}, "r1", measurement{longest: res.Longest, iops: res.IOPS})
	rn.noteStall(caseDef{key: "fio"}, "r1", measurement{longest: time.Millisecond})
	if len(rn.stalls) != 1 || !strings.HasPrefix(rn.stalls[0], "ours-qd1 (r1): one read took") {
		t.Fatalf("stalls noted: %q", rn.stalls)
	}
}

func TestRandomReadsReturnDeviceErrors(t *testing.T) {
	_, dev := prepared(t, 1<<20)
	_, err := RandomReads(context.Background(), &failingDevice{Device: dev, n: 10}, 1, 0, time.Second, 1, testSeed)
	if !errors.Is(err, blockdev.ErrInjected) {
		t.Fatalf("device error: %v", err)
	}
}

func TestMeasureTiny(t *testing.T) {
	if _, err := bench.FindTool("fio"); err != nil {
		t.Skipf("skipping: %v", err)
	}
	dir := t.TempDir()
	if fsName(dir) == "tmpfs" {
		t.Skip("skipping: the temporary directory is on tmpfs, which refuses O_DIRECT")
	}
	env := &bench.Env{Mode: bench.ModeQuick, OutDir: filepath.Join(dir, "out"), ScratchDir: dir,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	cfg := Config{FileSize: 8 << 20, Dir: dir, Runtime: 150 * time.Millisecond, Warmup: 20 * time.Millisecond,
		Rounds: 2, QD: 4, SweepDepths: []int{1, 2}, SweepRuntime: 100 * time.Millisecond, SweepWarmup: 10 * time.Millisecond}
	procsBefore := runtime.GOMAXPROCS(0)
	exp, err := Measure(context.Background(), env, cfg)
	if err != nil {
		t.Fatal(err)
	}
	goal, ok := exp.Figure("QD1 p50 latency")
	if !ok || goal.Goal == nil || goal.Met == nil || goal.Value <= 0 || goal.BaselineValue <= 0 || goal.Unit != "µs" {
		t.Fatalf("QD1 p50 figure: %+v", goal)
	}
	if goal.Ratio != goal.Value/goal.BaselineValue {
		t.Fatalf("ratio %v is not %v/%v", goal.Ratio, goal.Value, goal.BaselineValue)
	}
	for _, name := range []string{"QD1 p99 latency", "QD1 IOPS", "QD4 IOPS vs libaio", "QD4 p50 latency vs psync×4", "QD4 p99 latency vs psync×4"} {
		f, ok := exp.Figure(name)
		if !ok || f.Value <= 0 || f.BaselineValue <= 0 || !strings.Contains(f.Notes, "per round") {
			t.Fatalf("figure %q: %+v", name, f)
		}
	}
	for _, name := range []string{"QD4 IOPS, GOMAXPROCS=4, vs psync×4", "QD1 p50 latency, io_uring", "QD4 IOPS, io_uring, vs libaio"} {
		if f, ok := exp.Figure(name); !ok || f.Value <= 0 {
			t.Fatalf("variant figure %q: %+v", name, f)
		}
	}
	if runtime.GOMAXPROCS(0) != procsBefore {
		t.Fatalf("GOMAXPROCS left at %d, was %d", runtime.GOMAXPROCS(0), procsBefore)
	}
	if len(exp.Placements) != 8 {
		t.Fatalf("%d placements, want one per case", len(exp.Placements))
	}
	for _, p := range exp.Placements {
		if p.Role == "" || p.Allowed == "" {
			t.Fatalf("placement %+v", p)
		}
	}
	// Every plot renders from the recorded series.
	if len(exp.Plots) != 5 {
		t.Fatalf("%d plots", len(exp.Plots))
	}
	for _, p := range exp.Plots {
		if _, err := bench.RenderPlot(exp, p); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"iops-ours", "iops-ours-uring"} {
		iops, _ := exp.SeriesByName(name)
		if len(iops.Points) != 2 || iops.Points[0].X != 1 || iops.Points[1].X != 2 {
			t.Fatalf("sweep series %s: %+v", name, iops)
		}
	}
	raw, _ := filepath.Glob(filepath.Join(env.OutDir, Name, "fio-*.json"))
	if len(raw) != 3*2+2*2 {
		t.Fatalf("%d raw fio outputs kept, want 10: %v", len(raw), raw)
	}
	if _, err := os.Stat(filepath.Join(dir, "blockdev-bench.img")); !os.IsNotExist(err) {
		t.Fatalf("backing file left behind: %v", err)
	}
}
