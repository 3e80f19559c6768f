package swapbench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nprdma/nprdma/bench"
)

// These run the measurements at small sizes so that they keep compiling and
// working; figures are logged, never asserted (timing belongs to bench/).

func TestMeasureFaults(t *testing.T) {
	f, err := MeasureFaults(context.Background(), filepath.Join(t.TempDir(), "faults"), 200)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("raw read p50 %v p99 %v | major p50 %v p99 %v (bound %v) | minor p50 %v p99 %v | "+
		"uffd major p50 %v p99 %v | uffd minor p50 %v p99 %v | direct %v",
		f.RawReadP50, f.RawReadP99, f.MajorP50, f.MajorP99, f.MajorBound(), f.MinorP50, f.MinorP99,
		f.UffdMajorP50, f.UffdMajorP99, f.UffdMinorP50, f.UffdMinorP99, f.Direct)
	if f.Samples != 200 || f.RawReadP50 <= 0 || f.MajorP50 <= 0 || f.MinorP50 <= 0 || f.MajorP99 < f.MajorP50 {
		t.Fatalf("implausible result: %+v", f)
	}
}

func TestMeasureEviction(t *testing.T) {
	e, err := MeasureEviction(context.Background(), filepath.Join(t.TempDir(), "evict"), 4<<20, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", e)
	if e.EvictionsPerSec <= 0 || e.WritebacksPerSec <= 0 || e.MiBPerSec <= 0 {
		t.Fatalf("no eviction or writeback measured: %+v", e)
	}
}

func TestComparePolicies(t *testing.T) {
	res, err := ComparePolicies(context.Background(), PolicyConfig{Pages: 2048, Ratios: []float64{4}, Accesses: 20000})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 4 {
		t.Fatalf("%d results, want 2 policies x 2 workloads", len(res))
	}
	for _, r := range res {
		t.Logf("%-6s %-9s 1:%g hit ratio %.3f", r.Policy, r.Workload, r.RegionToBudget, r.HitRatio)
		if r.HitRatio <= 0 || r.HitRatio >= 1 {
			t.Fatalf("implausible hit ratio: %+v", r)
		}
	}
}

func TestMeasureRSS(t *testing.T) {
	res, err := MeasureRSS(context.Background(), filepath.Join(t.TempDir(), "rss"), 16<<20, 5, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("budget %d MiB, baseline %d MiB, peak %d MiB, limit %d MiB",
		res.BudgetBytes>>20, res.BaselineBytes>>20, res.PeakRSSBytes>>20, res.LimitBytes>>20)
	if res.PeakRSSBytes <= 0 {
		t.Fatal("no RSS sample")
	}
	if !raceEnabled && !res.Within() {
		t.Fatalf("peak RSS %d exceeds the limit %d", res.PeakRSSBytes, res.LimitBytes)
	}
}

func TestZipfIsSkewed(t *testing.T) {
	// The generator must put about the share the Zipf law predicts on the
	// first rank (n=1000, theta=0.99: 1/H(1000, 0.99) = 0.133).
	z := newZipf(1000, 0.99, newRand(1))
	hits := 0
	const draws = 200000
	for i := 0; i < draws; i++ {
		k := z.next()
		if k < 0 || k >= 1000 {
			t.Fatalf("rank %d out of range", k)
		}
		if k == 0 {
			hits++
		}
	}
	if share := float64(hits) / draws; share < 0.12 || share > 0.15 {
		t.Fatalf("rank 0 drawn %.3f of the time, want about 0.133", share)
	}
}

// TestFullSizeFigures prints the figures docs/swap.md quotes, at full size:
// NPRDMA_LONG=1 go test -run FullSize -v ./bench/swapbench
func TestFullSizeFigures(t *testing.T) {
	if os.Getenv("NPRDMA_LONG") != "1" {
		t.Skip("set NPRDMA_LONG=1 for the full-size measurements")
	}
	ctx := context.Background()
	dir := t.TempDir()
	f, err := MeasureFaults(ctx, filepath.Join(dir, "faults"), 3000)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("faults (%d samples, direct %v): raw read p50 %v p99 %v | major p50 %v p99 %v (bound %v) | "+
		"minor p50 %v p99 %v | uffd major p50 %v p99 %v | uffd minor p50 %v p99 %v",
		f.Samples, f.Direct, f.RawReadP50, f.RawReadP99, f.MajorP50, f.MajorP99, f.MajorBound(),
		f.MinorP50, f.MinorP99, f.UffdMajorP50, f.UffdMajorP99, f.UffdMinorP50, f.UffdMinorP99)
	e, err := MeasureEviction(ctx, filepath.Join(dir, "evict"), 64<<20, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("eviction (budget 64 MiB, region 256 MiB, 2 goroutines 50/50 read/write): %+v", e)
	res, err := ComparePolicies(ctx, PolicyConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range res {
		t.Logf("policy %-6s %-9s 1:%g zipf %.2f hit ratio %.3f", p.Policy, p.Workload, p.RegionToBudget, p.Zipf, p.HitRatio)
	}
	rss, err := MeasureRSS(ctx, filepath.Join(dir, "rss"), 256<<20, 5, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("RSS: budget %d MiB, baseline %d MiB, peak %d MiB (growth %d MiB), limit %d MiB, within %v",
		rss.BudgetBytes>>20, rss.BaselineBytes>>20, rss.PeakRSSBytes>>20, rss.Growth()>>20, rss.LimitBytes>>20, rss.Within())
}

func TestSpecsMatchTheSuite(t *testing.T) {
	for _, s := range []struct {
		name string
		spec func() bench.Spec
	}{{"swap-faults", FaultsSpec}, {"swap-policy", PolicySpec}, {"swap-rss", RSSSpec}} {
		sp := s.spec()
		if sp.Name != s.name || sp.Run == nil || len(sp.Goals) == 0 || sp.Title == "" {
			t.Errorf("%s: incomplete spec %+v", s.name, sp)
		}
	}
}

// TestSpecsRun runs the three experiments as the suite would (quick mode):
// NPRDMA_LONG=1 go test -run SpecsRun -v ./bench/swapbench
func TestSpecsRun(t *testing.T) {
	if os.Getenv("NPRDMA_LONG") != "1" {
		t.Skip("set NPRDMA_LONG=1 to run the swap experiments at their quick-mode sizes")
	}
	env := &bench.Env{Mode: bench.ModeQuick, OutDir: t.TempDir(), ScratchDir: t.TempDir()}
	for _, spec := range []bench.Spec{FaultsSpec(), PolicySpec(), RSSSpec()} {
		exp, err := spec.Run(context.Background(), env)
		if err != nil {
			t.Fatalf("%s: %v", spec.Name, err)
		}
		for _, f := range exp.Figures {
			met := ""
			if f.Met != nil {
				met = fmt.Sprintf(" met=%v", *f.Met)
			}
			t.Logf("%s: %s = %.3f %s vs %s %.3f (ratio %.3f)%s", spec.Name, f.Name, f.Value, f.Unit, f.Baseline,
				f.BaselineValue, f.Ratio, met)
		}
		for _, n := range exp.Notes {
			t.Logf("%s: note: %s", spec.Name, n)
		}
	}
}
