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
	if strings.Join(ran, ",") != "ok,fails,panics" {
		t.Fatalf("ran %v", ran)
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
	if strings.Join(ran, ",") != "ok,fails" || r.Experiment("panics").Status != StatusNotRun || r.Experiment("later").Status != StatusPending {
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
	for in, want := range map[string]Mode{"quick": ModeQuick, "FULL": ModeFull, "": ModeQuick, " full ": ModeFull} {
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
