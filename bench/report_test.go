package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func reportRun() *Run {
	r := sampleRun()
	e := r.Experiments[0]
	e.Add(RoundsFigure("QD1 IOPS", "IOPS", "fio IOPS", []float64{15000, 15000, 15500, 14000, 15000}, []float64{16000, 16000, 16000, 16000, 16000}).
		WithGoal(Goal{Text: "IOPS ≥ 0.95× fio", Op: AtLeast, Threshold: 0.95}))
	e.Add(NewFigure("QD1 p99", 120, "µs", "fio p99", 100))
	e.AddSeries(Series{Name: "bars", Label: "ours", Points: []Point{{0, 60}, {1, 120}}})
	e.AddPlot(Plot{File: "blockdev-bars.svg", Kind: PlotBars, Title: "bars | pipes", Categories: []string{"p50", "p99"}, Series: []string{"bars"}, Caption: "a caption"})
	r.Notes = []string{"machine was shared"}
	r.Experiments = append(r.Experiments,
		&Experiment{Name: "fabric-ops", Title: "ops", Status: StatusFailed, Error: "dial tcp: refused\nsecond line", Goals: []string{"READ p50 ≤ 1.2× raw"}},
		&Experiment{Name: "capacity", Status: StatusNotRun, Goals: []string{"5× at +10%"}},
		&Experiment{Name: "pool", Status: StatusDone, CarriedFrom: "2026-01-01 00:00 UTC",
			Figures: []Figure{NewFigure("x", 1, "", "y", 1).WithGoal(Goal{Text: "x ≥ y", Op: AtLeast, Threshold: 1})}},
	)
	return r
}

func TestWriteReport(t *testing.T) {
	dir := t.TempDir()
	report := filepath.Join(dir, "docs", "bench.md")
	assets := filepath.Join(dir, "docs", "bench")
	os.MkdirAll(assets, 0o755)
	stale := filepath.Join(assets, "old-plot.svg")
	os.WriteFile(stale, []byte("<svg/>"), 0o644)
	keep := filepath.Join(assets, "notes.txt")
	os.WriteFile(keep, []byte("x"), 0o644)

	r := reportRun()
	if err := WriteReport(r, report); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"blockdev-cdf.svg", "blockdev-bars.svg", "results.json"} {
		if _, err := os.Stat(filepath.Join(assets, f)); err != nil {
			t.Fatalf("report asset %s: %v", f, err)
		}
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("stale plot kept: %v", err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Fatalf("a non-SVG file in the assets directory was removed: %v", err)
	}
	back, err := ReadRun(filepath.Join(assets, "results.json"))
	if err != nil || len(back.Experiments) != len(r.Experiments) {
		t.Fatalf("results copy: %v, %d experiments", err, len(back.Experiments))
	}
	b, _ := os.ReadFile(report)
	md := string(b)
	for _, want := range []string{
		"# nprdma benchmark report",
		"> **Note:** machine was shared",
		"mode **quick**", "revision `abc`",
		"[bench-method.md](bench-method.md)", "[bench/results.json](bench/results.json)",
		// headline: met, unmet, pending, failed, not run
		"| [blockdev](#blockdev--reads) | QD1 p50 ≤ 1.1× fio (QD1 p50) | 5 | 1.03 | 0.95–1.10 | 60 µs | 58 µs fio | ✔ |",
		"| [blockdev](#blockdev--reads) | IOPS ≥ 0.95× fio (QD1 IOPS) | 5 | 0.94 | 0.88–0.97 | 15k IOPS | 16k IOPS fio IOPS | ✘ |",
		"| [swap-faults](#swap-faults) | major ≤ 1.2× raw + 10 µs | — | — | — | — | — | pending |",
		"failed: dial tcp: refused second line |",
		"| [capacity](#capacity) | 5× at +10% | — | — | — | — | — | not run |",
		"| [pool](#pool) | x ≥ y (x) | 1 | 1.00 | 1.00–1.00 | 1 | 1 y | not judged (1 of 5 rounds) |",
		"x: not judged: 1 round(s), a verdict needs 5.",
		// experiment section
		"### blockdev — reads", "Parameters: file size: 1 GiB", "| QD1 p99 | 120 µs | fio p99 | 100 µs | 1.20 | 1.20–1.20 |",
		"![cdf](bench/blockdev-cdf.svg)", "![bars \\| pipes](bench/blockdev-bars.svg)", "*a caption*",
		"| ours | 0-1 | no | cpu0 75%, cpu1 25% (4 samples) |",
		"✘ QD1 IOPS: goal \"IOPS ≥ 0.95× fio\" not met: median ratio 0.94 (rounds 0.88–0.97), the goal is ratio ≥ 0.95.",
		"- noisy",
		"**Pending:** this experiment is not built yet.", "- major ≤ 1.2× raw + 10 µs",
		"**Failed:** `dial tcp: refused second line`",
		"*Carried over from an earlier run (2026-01-01 00:00 UTC)",
		"Reproduce: `go run ./bench/cmd/nprdma-bench --only pool`",
		"- CPU: cpu, 2 CPUs online",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("report:\n%s", md)
	}
	// Regenerating from the copied results gives the same report.
	if err := WriteReport(back, report); err != nil {
		t.Fatal(err)
	}
	again, _ := os.ReadFile(report)
	if string(again) != md {
		t.Fatal("the report regenerated from results.json differs")
	}
}

func TestWriteReportRejectsBadPlotFiles(t *testing.T) {
	for _, file := range []string{"../escape.svg", "sub/x.svg", "x.png"} {
		r := sampleRun()
		r.Experiments[0].Plots[0].File = file
		err := WriteReport(r, filepath.Join(t.TempDir(), "bench.md"))
		if err == nil || !strings.Contains(err.Error(), "plain *.svg name") {
			t.Errorf("plot file %q: err = %v", file, err)
		}
	}
	r := sampleRun()
	r.Experiments[0].Plots = append(r.Experiments[0].Plots, r.Experiments[0].Plots[0])
	if err := WriteReport(r, filepath.Join(t.TempDir(), "bench.md")); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("duplicate plot file: err = %v", err)
	}
}

func TestAnchor(t *testing.T) {
	for e, want := range map[*Experiment]string{
		{Name: "blockdev", Title: "4 KiB random reads: blockdev vs fio"}: "blockdev--4-kib-random-reads-blockdev-vs-fio",
		{Name: "swap-rss"}: "swap-rss",
		{Name: "capacity", Title: "Latency against the ratio (1×..8×)"}: "capacity--latency-against-the-ratio-18",
	} {
		if got := anchor(e); got != want {
			t.Errorf("anchor(%q) = %q, want %q", e.Name, got, want)
		}
	}
}
