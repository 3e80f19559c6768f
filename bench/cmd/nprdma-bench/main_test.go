package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nprdma/nprdma/bench"
)

func TestExperimentListIsFixed(t *testing.T) {
	want := []string{"blockdev", "swap-faults", "swap-policy", "swap-rss", "fabric-ops", "registration",
		"np-read", "capacity", "e2e-fio", "nvme-tcp", "pool", "startup", "shm", "guest-nvmetcp", "guest-verbs", "attach-modes"}
	var names []string
	for _, s := range experiments() {
		names = append(names, s.Name)
		if s.Title == "" || len(s.Goals) == 0 {
			t.Errorf("experiment %s lacks a title or goals: the report could not say what is pending", s.Name)
		}
	}
	if !slices.Equal(names, want) {
		t.Fatalf("experiments %v, want %v", names, want)
	}
}

func runApp(t *testing.T, args ...string) (string, error) {
	t.Helper()
	app := newApp()
	var out bytes.Buffer
	app.Writer, app.ErrWriter = &out, &out
	err := app.Run(append([]string{"nprdma-bench"}, args...))
	return out.String(), err
}

func TestList(t *testing.T) {
	out, err := runApp(t, "--list")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"blockdev      ready", "capacity      ready", "swap-faults   ready", "goal: major fault p50 ≤ 1.2×"} {
		if !strings.Contains(out, want) {
			t.Errorf("--list output lacks %q:\n%s", want, out)
		}
	}
}

func TestBadArguments(t *testing.T) {
	if _, err := runApp(t, "--only", "blockdev,nope", "--out", t.TempDir()); err == nil || !strings.Contains(err.Error(), "unknown experiment nope") {
		t.Fatalf("--only nope: %v", err)
	}
	if _, err := runApp(t, "--mode", "forever", "--out", t.TempDir()); err == nil || !strings.Contains(err.Error(), `mode "forever"`) {
		t.Fatalf("--mode forever: %v", err)
	}
}

func TestPathsFromRepoRoot(t *testing.T) {
	root := repoRoot()
	if root == "" {
		t.Skip("not inside the nprdma module")
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repoRoot %q has no go.mod", root)
	}
	if got := fromRoot(root, "bench/out"); got != filepath.Join(root, "bench/out") {
		t.Fatalf("fromRoot = %q", got)
	}
	if got := fromRoot(root, "/abs/x"); got != "/abs/x" {
		t.Fatalf("absolute path changed: %q", got)
	}
	if got := fromRoot("", "rel"); got != "rel" {
		t.Fatalf("outside the module: %q", got)
	}
}

func TestCommandLine(t *testing.T) {
	saved := os.Args
	defer func() { os.Args = saved }()
	os.Args = []string{"/tmp/go-build123/b001/exe/nprdma-bench", "--only", "blockdev", "--note", "it's shared"}
	if got, want := commandLine(), `go run ./bench/cmd/nprdma-bench --only blockdev --note 'it'\''s shared'`; got != want {
		t.Fatalf("commandLine = %s, want %s", got, want)
	}
	os.Args = []string{"/usr/local/bin/nprdma-bench", "--mode", "full"}
	if got := commandLine(); got != "nprdma-bench --mode full" {
		t.Fatalf("commandLine = %s", got)
	}
}

func TestRenderOnly(t *testing.T) {
	dir := t.TempDir()
	r := &bench.Run{Schema: bench.SchemaVersion, Mode: bench.ModeQuick, Command: "x",
		Experiments: []*bench.Experiment{{Name: "blockdev", Status: bench.StatusDone,
			Figures: []bench.Figure{bench.NewFigure("QD1 p50 latency", 60, "µs", "fio", 58)},
			Series:  []bench.Series{{Name: "s", Points: []bench.Point{{X: 1, Y: 2}, {X: 2, Y: 3}}}},
			Plots:   []bench.Plot{{File: "blockdev-x.svg", Kind: bench.PlotLine, Series: []string{"s"}}}}}}
	if err := r.WriteJSON(filepath.Join(dir, "out", "results.json")); err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(dir, "docs", "bench.md")
	if _, err := runApp(t, "--render-only", "--out", filepath.Join(dir, "out"), "--report", report); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(report)
	if err != nil || !strings.Contains(string(md), "| QD1 p50 latency | 60 µs | fio | 58 µs | 1.03 |") {
		t.Fatalf("rendered report (%v):\n%s", err, md)
	}
	if _, err := os.Stat(filepath.Join(dir, "docs", "bench", "blockdev-x.svg")); err != nil {
		t.Fatal(err)
	}
	// A note given when rendering joins the stored ones, in the report and
	// in the record.
	if _, err := runApp(t, "--render-only", "--out", filepath.Join(dir, "out"), "--report", report, "--note", "ran again later"); err != nil {
		t.Fatal(err)
	}
	if md, err := os.ReadFile(report); err != nil || !strings.Contains(string(md), "ran again later") {
		t.Fatalf("the note is not in the report (%v)", err)
	}
	if stored, err := bench.ReadRun(filepath.Join(dir, "out", "results.json")); err != nil || !slices.Contains(stored.Notes, "ran again later") {
		t.Fatalf("the note is not in results.json (%v)", err)
	}
	if _, err := runApp(t, "--render-only", "--out", filepath.Join(dir, "missing"), "--report", report); err == nil {
		t.Fatal("rendering from a missing results file succeeded")
	}
}

// TestCPUProfile: --cpuprofile writes a pprof profile (gzip-compressed
// protobuf) once stopped, and a path it cannot create is an error before
// anything is measured.
func TestCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.pprof")
	stop, err := startCPUProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	b, err := os.ReadFile(path)
	if err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Fatalf("profile %q: %d bytes, err %v; want gzip data", path, len(b), err)
	}
	if _, err := startCPUProfile(filepath.Join(t.TempDir(), "missing", "cpu.pprof")); err == nil || !strings.Contains(err.Error(), "cpu profile") {
		t.Fatalf("profile in a missing directory: %v", err)
	}
}

// TestREADMETableMatchesResults: the README's results table is what the
// bench generates from the committed results (docs/bench/results.json, the
// record behind docs/bench.md), so the README cannot drift from the report.
func TestREADMETableMatchesResults(t *testing.T) {
	root := repoRoot()
	if root == "" {
		t.Skip("not inside the nprdma repository")
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := bench.StandingTableIn(readme)
	if err != nil {
		t.Skipf("README.md has no results table yet: %v", err)
	}
	run, err := bench.ReadRun(filepath.Join(root, "docs", "bench", "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if want := bench.StandingTable(run, "docs/bench.md"); got != want {
		t.Fatalf("README.md's table differs from docs/bench/results.json; regenerate it with\n"+
			"  go run ./bench/cmd/nprdma-bench --render-only --out docs/bench\ngot:\n%s\nwant:\n%s", got, want)
	}
}
