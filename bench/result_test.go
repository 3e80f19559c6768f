package bench

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestGoalMet(t *testing.T) {
	atMost := Goal{Text: "p50 ≤ 1.1× fio", Op: AtMost, Threshold: 1.1}
	atLeast := Goal{Text: "throughput ≥ 0.8× raw", Op: AtLeast, Threshold: 0.8}
	for _, tc := range []struct {
		g     Goal
		ratio float64
		want  bool
	}{
		{atMost, 1.0, true}, {atMost, 1.1, true}, {atMost, 1.1001, false},
		{atLeast, 0.8, true}, {atLeast, 0.79, false}, {atLeast, 3, true},
		{atMost, math.NaN(), false}, {atLeast, math.Inf(1), false},
		{Goal{Op: "?", Threshold: 1}, 1, false},
	} {
		if got := tc.g.Met(tc.ratio); got != tc.want {
			t.Errorf("%s %v: Met(%v) = %v, want %v", tc.g.Op, tc.g.Threshold, tc.ratio, got, tc.want)
		}
	}
	if got := atMost.Expression(); got != "ratio ≤ 1.1" {
		t.Errorf("Expression = %q", got)
	}
	if got := atLeast.Expression(); got != "ratio ≥ 0.8" {
		t.Errorf("Expression = %q", got)
	}
}

func TestNewFigure(t *testing.T) {
	f := NewFigure("QD1 p50", 66, "µs", "fio p50", 60).WithGoal(Goal{Text: "≤ 1.1", Op: AtMost, Threshold: 1.1})
	if f.Ratio != 1.1 || f.Met == nil || !*f.Met {
		t.Fatalf("66/60: ratio %v met %v, want 1.1 and met", f.Ratio, f.Met)
	}
	f = NewFigure("QD1 p50", 67, "µs", "fio p50", 60).WithGoal(Goal{Text: "≤ 1.1", Op: AtMost, Threshold: 1.1})
	if *f.Met {
		t.Fatalf("67/60 = %v met a ≤ 1.1 goal", f.Ratio)
	}
	zero := NewFigure("x", 5, "µs", "nothing", 0).WithGoal(Goal{Op: AtLeast, Threshold: 0})
	if zero.Ratio != 0 || *zero.Met || !strings.Contains(zero.Notes, "baseline is zero") {
		t.Fatalf("zero baseline: %+v", zero)
	}
	nan := NewFigure("x", math.NaN(), "", "b", math.Inf(1))
	if _, err := json.Marshal(nan); err != nil {
		t.Fatalf("a figure made from NaN/Inf does not encode: %v", err)
	}
	if NewFigure("y", 1, "", "b", 2).Met != nil {
		t.Fatal("a figure without a goal has Met set")
	}
	if got := NewFigure("z", 1, "", "b", 0).WithNotes("noisy").Notes; got != "baseline is zero: no ratio; noisy" {
		t.Fatalf("notes %q", got)
	}
}

func sampleRun() *Run {
	started := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	done := &Experiment{Name: "blockdev", Title: "reads", Status: StatusDone, Method: "m", Goals: []string{"g"},
		Started: started, Seconds: 12.5}
	done.AddParam("file size", "1 GiB")
	done.Add(RoundsFigure("QD1 p50", "µs", "fio", []float64{60, 66, 57, 60, 61}, []float64{58, 60, 60, 58, 58}).
		WithGoal(Goal{Text: "QD1 p50 ≤ 1.1× fio", Op: AtMost, Threshold: 1.1}))
	done.AddSeries(Series{Name: "cdf", Label: "ours", Points: []Point{{50, 0.5}, {math.NaN(), 0.7}, {90, 1}}})
	done.AddPlot(Plot{File: "blockdev-cdf.svg", Kind: PlotCDF, Title: "cdf", Series: []string{"cdf"}})
	done.Placements = []Placement{{Role: "ours", Allowed: "0-1", RanOn: []CPUShare{{CPU: 0, Samples: 3, Share: 0.75}, {CPU: 1, Samples: 1, Share: 0.25}}, Samples: 4}}
	done.Note("noisy")
	return &Run{Schema: SchemaVersion, Started: started, Finished: started.Add(time.Minute), Revision: "abc",
		Mode: ModeQuick, Command: "nprdma-bench", Machine: Machine{CPUs: 2, CPUModel: "cpu"},
		Experiments: []*Experiment{done, {Name: "swap-faults", Status: StatusPending, Goals: []string{"major ≤ 1.2× raw + 10 µs"}}}}
}

func TestRunJSONRoundTrip(t *testing.T) {
	r := sampleRun()
	if n := len(r.Experiments[0].Series[0].Points); n != 2 {
		t.Fatalf("AddSeries kept %d points; the NaN point must be dropped", n)
	}
	path := filepath.Join(t.TempDir(), "out", "results.json")
	if err := r.WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	back, err := ReadRun(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r, back) {
		a, _ := json.Marshal(r)
		b, _ := json.Marshal(back)
		t.Fatalf("round trip changed the run:\n%s\n%s", a, b)
	}
	raw, _ := os.ReadFile(path)
	if !strings.Contains(string(raw), `[50, 0.5]`) && !strings.Contains(string(raw), "[\n") {
		t.Fatalf("points are not written as arrays:\n%s", raw)
	}
	var generic map[string]any
	if err := json.Unmarshal(raw, &generic); err != nil {
		t.Fatal(err)
	}
	fig := generic["experiments"].([]any)[0].(map[string]any)["figures"].([]any)[0].(map[string]any)
	for _, k := range []string{"name", "value", "unit", "baseline", "baseline_value", "ratio", "goal", "met"} {
		if _, ok := fig[k]; !ok {
			t.Errorf("figure JSON lacks %q: %v", k, fig)
		}
	}
	goal := fig["goal"].(map[string]any)
	if goal["op"] != "<=" || goal["threshold"] != 1.1 || goal["text"] == "" {
		t.Errorf("goal JSON = %v", goal)
	}
}

func TestReadRunErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadRun(filepath.Join(dir, "missing.json")); !os.IsNotExist(err) {
		t.Fatalf("missing file: %v", err)
	}
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"schema": 99}`), 0o644)
	if _, err := ReadRun(bad); err == nil || !strings.Contains(err.Error(), "schema 99") {
		t.Fatalf("wrong schema: %v", err)
	}
	os.WriteFile(bad, []byte(`{"schema": 1, "experiments": [{"series": [{"points": [[1]]}]}]}`), 0o644)
	if _, err := ReadRun(bad); err == nil {
		t.Fatal("a one-element point was accepted")
	}
}

func TestCarryOver(t *testing.T) {
	prev := sampleRun()
	prev.Experiments = append(prev.Experiments, &Experiment{Name: "fabric-ops", Status: StatusFailed, Error: "boom"})
	cur := &Run{Experiments: []*Experiment{
		{Name: "blockdev", Title: "new title", Status: StatusNotRun, Goals: []string{"new goal"}},
		{Name: "swap-faults", Status: StatusNotRun},
		{Name: "fabric-ops", Status: StatusNotRun},
		{Name: "capacity", Status: StatusNotRun},
		{Name: "np-read", Status: StatusDone},
	}}
	cur.CarryOver(prev)
	b := cur.Experiment("blockdev")
	if b.Status != StatusDone || len(b.Figures) != 1 || b.Title != "new title" || b.Goals[0] != "new goal" {
		t.Fatalf("blockdev not carried over with the current title/goals: %+v", b)
	}
	if !strings.Contains(b.CarriedFrom, "2026-11-21 12:00 UTC") || !strings.Contains(b.CarriedFrom, "abc") {
		t.Fatalf("CarriedFrom = %q", b.CarriedFrom)
	}
	if prev.Experiment("blockdev").Title != "reads" {
		t.Fatal("CarryOver modified the earlier run")
	}
	if cur.Experiment("swap-faults").Status != StatusNotRun {
		t.Fatal("a pending record was carried over")
	}
	if f := cur.Experiment("fabric-ops"); f.Status != StatusFailed || f.Error != "boom" {
		t.Fatalf("failed record not carried: %+v", f)
	}
	if cur.Experiment("capacity").Status != StatusNotRun || cur.Experiment("np-read").Status != StatusDone {
		t.Fatal("records without an earlier result, or that ran, changed")
	}
	cur.CarryOver(nil) // no earlier run: nothing happens
}

func TestWithoutRootNamesNoPathOfTheMachine(t *testing.T) {
	r := &Run{Experiments: []*Experiment{{Name: "x", Method: "A file in /srv/repo/bench/out is read; the repository is /srv/repo."}}}
	got, err := r.WithoutRoot("/srv/repo/")
	if err != nil {
		t.Fatal(err)
	}
	if want := "A file in bench/out is read; the repository is .."; got.Experiments[0].Method != want {
		t.Fatalf("method %q, want %q", got.Experiments[0].Method, want)
	}
	if r.Experiments[0].Method == got.Experiments[0].Method {
		t.Fatal("the run given was changed")
	}
}
