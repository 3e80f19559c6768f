package bench

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
)

func quietEnv(t *testing.T) *Env {
	return &Env{Mode: ModeQuick, OutDir: t.TempDir(), Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

func TestRunSuite(t *testing.T) {
	var ran []string
	ok := func(ctx context.Context, env *Env) (*Experiment, error) {
		ran = append(ran, "ok")
		e := &Experiment{Method: "measured"}
		e.Add(NewFigure("f", 1, "µs", "b", 1))
		return e, nil
	}
	specs := []Spec{
		{Name: "ok", Title: "works", Goals: []string{"g1"}, Run: ok},
		{Name: "fails", Run: func(ctx context.Context, env *Env) (*Experiment, error) {
			ran = append(ran, "fails")
			e := &Experiment{}
			e.Add(NewFigure("partial", 2, "", "b", 1))
			return e, errors.New("peer died")
		}},
		{Name: "panics", Run: func(ctx context.Context, env *Env) (*Experiment, error) {
			ran = append(ran, "panics")
			panic("index out of range")
		}},
		{Name: "later", Title: "not built", Goals: []string{"someday ≤ 2×"}},
	}
	r, err := RunSuite(context.Background(), specs, quietEnv(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(ran, ",") != "ok,ok,ok,ok,ok,fails,panics" {
		t.Fatalf("ran %v: want five rounds of ok, and fails and panics stopped at their first", ran)
	}
	got := map[string]*Experiment{}
	for _, e := range r.Experiments {
		got[e.Name] = e
	}
	if e := got["ok"]; e.Status != StatusDone || e.Title != "works" || e.Goals[0] != "g1" || e.Method != "measured" || e.Started.IsZero() {
		t.Fatalf("ok: %+v", e)
	}
	if e := got["fails"]; e.Status != StatusFailed || e.Error != "peer died" || len(e.Figures) != 1 {
		t.Fatalf("fails: %+v", e)
	}
	if e := got["panics"]; e.Status != StatusFailed || !strings.Contains(e.Error, "panic: index out of range") {
		t.Fatalf("panics: %+v", e)
	}
	if e := got["later"]; e.Status != StatusPending || e.Goals[0] != "someday ≤ 2×" {
		t.Fatalf("pending: %+v", e)
	}
	if len(r.Failed()) != 2 {
		t.Fatalf("Failed() = %d experiments, want 2", len(r.Failed()))
	}
	if r.Machine.CPUs == 0 || r.Schema != SchemaVersion || r.Finished.Before(r.Started) {
		t.Fatalf("run header: %+v", r)
	}

	ran = nil
	r, err = RunSuite(context.Background(), specs, quietEnv(t), []string{"fails", " ok"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(ran, ",") != "ok,ok,ok,ok,ok,fails" || r.Experiment("panics").Status != StatusNotRun || r.Experiment("later").Status != StatusPending {
		t.Fatalf("--only: ran %v, statuses %v %v", ran, r.Experiment("panics").Status, r.Experiment("later").Status)
	}

	if _, err := RunSuite(context.Background(), specs, quietEnv(t), []string{"nope"}); err == nil ||
		!strings.Contains(err.Error(), "unknown experiment nope (known: ok, fails, panics, later)") {
		t.Fatalf("unknown name: %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran = nil
	r, _ = RunSuite(ctx, specs, quietEnv(t), nil)
	if len(ran) != 0 || r.Experiment("ok").Status != StatusNotRun || !strings.Contains(r.Experiment("ok").Notes[0], "interrupted") {
		t.Fatalf("cancelled suite: ran %v, ok = %+v", ran, r.Experiment("ok"))
	}
}

func TestParseModeAndByMode(t *testing.T) {
	for in, want := range map[string]Mode{"quick": ModeQuick, "FULL": ModeFull, "": ModeQuick, " full ": ModeFull, "smoke": ModeSmoke} {
		if got, err := ParseMode(in); err != nil || got != want {
			t.Errorf("ParseMode(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseMode("long"); err == nil || !strings.Contains(err.Error(), `"long"`) {
		t.Errorf("ParseMode(long): %v", err)
	}
	if ByMode(ModeQuick, 1, 2) != 1 || ByMode(ModeFull, 1, 2) != 2 {
		t.Error("ByMode picks the wrong value")
	}
}

func TestEnvDir(t *testing.T) {
	env := quietEnv(t)
	d, err := env.Dir("blockdev")
	if err != nil || !strings.HasSuffix(d, "/blockdev") {
		t.Fatalf("Dir = %q, %v", d, err)
	}
	if (&Env{}).Logger() == nil {
		t.Fatal("no default logger")
	}
}

// TestRoundsJudgedOnMedian runs an experiment whose ratio moves from round to
// round: the suite runs MinRounds rounds, the figure's ratio is the median
// of the per-round ratios, min and max are kept, and the verdict follows the
// median, not the last or the best round.
func TestRoundsJudgedOnMedian(t *testing.T) {
	goal := Goal{Text: "≤ 1.1× base", Op: AtMost, Threshold: 1.1}
	values := []float64{150, 100, 120, 90, 130} // against a baseline of 100
	round := 0
	spec := Spec{Name: "noisy", Run: func(ctx context.Context, env *Env) (*Experiment, error) {
		if env.Round != round {
			t.Errorf("env.Round %d in round %d", env.Round, round)
		}
		e := &Experiment{}
		e.Note("round %d", round+1)
		e.Add(NewFigure("p50", values[round], "µs", "base", 100).WithGoal(goal))
		e.Add(NewFigure("info", 1, "", "base", 2))
		if round == 0 {
			e.Add(NewFigure("once", 1, "", "base", 2))
		}
		round++
		return e, nil
	}}
	r, err := RunSuite(context.Background(), []Spec{spec}, quietEnv(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	e := r.Experiment("noisy")
	f, ok := e.Figure("p50")
	if !ok || round != MinRounds || e.Status != StatusDone {
		t.Fatalf("ran %d rounds, status %s, figure %v", round, e.Status, ok)
	}
	lo, hi := f.RatioRange()
	if f.Ratio != 1.2 || lo != 0.9 || hi != 1.5 || f.Rounds() != MinRounds || f.Value != 120 || f.BaselineValue != 100 {
		t.Fatalf("merged figure: ratio %v range %v–%v rounds %d value %v baseline %v", f.Ratio, lo, hi, f.Rounds(), f.Value, f.BaselineValue)
	}
	if !f.Judged() || f.Met == nil || *f.Met {
		t.Fatalf("verdict on the median 1.2 against ≤ 1.1 must be not met: %v", f.Met)
	}
	// The plots and notes come from the median round (the third, ratio 1.2).
	if e.Notes[0] != "round 3" || !strings.Contains(e.Notes[1], "from round 3") || !strings.Contains(e.Notes[2], `"once" (1)`) {
		t.Fatalf("notes %q", e.Notes)
	}

	// Smoke mode runs one round and judges nothing.
	round = 0
	env := quietEnv(t)
	env.Mode = ModeSmoke
	r, _ = RunSuite(context.Background(), []Spec{spec}, env, nil)
	f, _ = r.Experiment("noisy").Figure("p50")
	if round != 1 || f.Judged() || f.Met != nil {
		t.Fatalf("smoke: %d rounds, judged %v, met %v", round, f.Judged(), f.Met)
	}
}

// TestRoundsInside: an experiment that interleaves its own rounds is run
// once and judged on the figures it built with RoundsFigure.
func TestRoundsInside(t *testing.T) {
	calls := 0
	goal := Goal{Text: "≥ 0.7×", Op: AtLeast, Threshold: 0.7}
	spec := Spec{Name: "guest", RoundsInside: true, Run: func(ctx context.Context, env *Env) (*Experiment, error) {
		calls++
		e := &Experiment{}
		n := env.Mode.Rounds()
		e.Add(RoundsFigure("iops", "IOPS", "kernel", []float64{80, 60, 75, 90, 72}[:n], []float64{100, 100, 100, 100, 100}[:n]).WithGoal(goal))
		return e, nil
	}}
	r, _ := RunSuite(context.Background(), []Spec{spec}, quietEnv(t), nil)
	f, _ := r.Experiment("guest").Figure("iops")
	if calls != 1 || f.Ratio != 0.75 || !f.Judged() || f.Met == nil || !*f.Met {
		t.Fatalf("calls %d ratio %v judged %v met %v", calls, f.Ratio, f.Judged(), f.Met)
	}
	if lo, hi := f.RatioRange(); lo != 0.6 || hi != 0.9 {
		t.Fatalf("range %v–%v", lo, hi)
	}
}

// TestRoundsFigureZeroBaseline: a round with no baseline gives no ratio and
// is not counted.
func TestRoundsFigureZeroBaseline(t *testing.T) {
	f := RoundsFigure("x", "", "b", []float64{1, 2, 3}, []float64{1, 0, 2})
	if f.Rounds() != 2 || f.Ratio != 1 {
		t.Fatalf("rounds %d ratio %v (ratios %v)", f.Rounds(), f.Ratio, f.RoundRatios)
	}
	if f := RoundsFigure("x", "", "b", []float64{1}, []float64{0}); f.Rounds() != 0 || f.Notes == "" {
		t.Fatalf("all-zero baseline: %+v", f)
	}
}
