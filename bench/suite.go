package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"time"
)

// Mode selects how long and how big the experiments are.
type Mode string

const (
	// ModeQuick keeps the whole suite, MinRounds rounds of every judged
	// point, within fifteen minutes: small files, about a second per
	// measurement. It is the default.
	ModeQuick Mode = "quick"
	// ModeFull uses larger sizes and longer runs (BENCH=full).
	ModeFull Mode = "full"
	// ModeSmoke runs every experiment once with the quick sizes and judges
	// nothing: a check that the suite works end to end.
	ModeSmoke Mode = "smoke"
)

// ParseMode accepts "quick", "full" and "smoke".
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(strings.TrimSpace(s))); m {
	case ModeQuick, ModeFull, ModeSmoke:
		return m, nil
	case "":
		return ModeQuick, nil
	}
	return "", fmt.Errorf("unknown benchmark mode %q (want quick, full or smoke)", s)
}

// Rounds is how many rounds of every judged point the mode runs: MinRounds,
// or one in smoke mode.
func (m Mode) Rounds() int {
	if m == ModeSmoke {
		return 1
	}
	return MinRounds
}

// WarmUp is the bench's one warm-up rule: every timed measurement first
// runs its workload for WarmUp and discards what it measured then (fio's
// ramp_time, the bench's own warm-up before timing), so that connections,
// caches and CPU frequency have settled. A cache being filled to a steady
// hit ratio is not a warm-up of this kind: the experiments that need one
// say how long it runs.
func WarmUp(m Mode) time.Duration { return ByMode(m, 250*time.Millisecond, 2*time.Second) }

// WarmUpOps is the same rule for a measurement counted in operations: a
// tenth of n (at least one, at most 500) run untimed before the n timed
// ones.
func WarmUpOps(n int) int { return min(n/10+1, 500) }

// ByMode picks the quick (and smoke) or the full value of a parameter.
func ByMode[T any](m Mode, quick, full T) T {
	if m == ModeFull {
		return full
	}
	return quick
}

// Env is what an experiment gets from the suite.
type Env struct {
	Mode Mode
	// OutDir holds raw outputs (fio's JSON, logs); each experiment writes
	// under OutDir/<name>/ (see Dir).
	OutDir string
	// ScratchDir holds large temporary files such as backing files. It must
	// be on a real disk, not tmpfs, for O_DIRECT figures to mean anything.
	ScratchDir string
	// CPUs, if set, is the CPU set the suite pinned itself to; children
	// inherit it. Experiments report it in their placements.
	CPUs []int
	Log  *slog.Logger
	// Tools finds (and may install) external tools.
	Tools *Tools
	// Round is the index of the round the suite is running (from 0): an
	// experiment that alternates its cases starts every other round in
	// reverse (bench.RoundOrder(n, env.Round)), so that over the rounds
	// neither the subject nor the baseline always goes first.
	Round int
}

// Dir returns (creating it) the raw-output directory of an experiment.
func (e *Env) Dir(experiment string) (string, error) {
	d := filepath.Join(e.OutDir, experiment)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return "", fmt.Errorf("output directory of %s: %w", experiment, err)
	}
	return d, nil
}

// Logger returns Log or the default logger.
func (e *Env) Logger() *slog.Logger {
	if e.Log != nil {
		return e.Log
	}
	return slog.Default()
}

// Spec declares an experiment: its fixed name, what it is for, and the code
// that runs it. A Spec without Run is pending: the report lists it with its
// goals so that nothing missing goes unnoticed.
type Spec struct {
	Name  string
	Title string
	Goals []string
	// Run measures and returns the experiment's record (Name, Title, Goals,
	// Status and timing are filled in by the suite). On error a partial
	// record may be returned; the suite marks it failed. The suite calls Run
	// env.Mode.Rounds() times and merges the rounds (see mergeRounds),
	// unless RoundsInside is set.
	Run func(ctx context.Context, env *Env) (*Experiment, error)
	// RoundsInside says that Run interleaves env.Mode.Rounds() rounds itself
	// and reports figures built with RoundsFigure: the suite calls it once.
	// It suits an experiment whose set-up (a guest boot) costs more than a
	// round.
	RoundsInside bool
}

// Pending reports whether the experiment is not built yet.
func (s Spec) Pending() bool { return s.Run == nil }

// SelectSpecs validates the names given to --only against specs.
func SelectSpecs(specs []Spec, only []string) (map[string]bool, error) {
	selected := map[string]bool{}
	var unknown []string
	for _, name := range only {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if !slices.ContainsFunc(specs, func(s Spec) bool { return s.Name == name }) {
			unknown = append(unknown, name)
			continue
		}
		selected[name] = true
	}
	if len(unknown) > 0 {
		names := make([]string, len(specs))
		for i, s := range specs {
			names[i] = s.Name
		}
		return nil, fmt.Errorf("unknown experiment %s (known: %s)", strings.Join(unknown, ", "), strings.Join(names, ", "))
	}
	return selected, nil
}

// RunSuite runs the selected experiments (all when only is empty) in order
// and returns the run record. A failing experiment does not stop the others;
// a cancelled context does: experiments not started are left not-run.
func RunSuite(ctx context.Context, specs []Spec, env *Env, only []string) (*Run, error) {
	selected, err := SelectSpecs(specs, only)
	if err != nil {
		return nil, err
	}
	run := &Run{Schema: SchemaVersion, Started: time.Now().UTC(), Mode: env.Mode, Machine: DetectMachine()}
	log := env.Logger()
	for _, spec := range specs {
		exp := &Experiment{Name: spec.Name, Title: spec.Title, Goals: spec.Goals}
		switch {
		case spec.Pending():
			exp.Status = StatusPending
		case len(selected) > 0 && !selected[spec.Name]:
			exp.Status = StatusNotRun
		case ctx.Err() != nil:
			exp.Status = StatusNotRun
			exp.Note("not run: the suite was interrupted (%v)", context.Cause(ctx))
		default:
			log.Info("experiment start", "name", spec.Name, "mode", env.Mode)
			exp = runRounds(ctx, spec, env)
			log.Info("experiment end", "name", spec.Name, "status", exp.Status, "seconds", fmt.Sprintf("%.1f", exp.Seconds), "error", exp.Error)
		}
		run.Experiments = append(run.Experiments, exp)
	}
	run.Finished = time.Now().UTC()
	return run, nil
}

// runRounds runs an experiment's rounds and merges them: a failed round
// fails the experiment, keeping the rounds before it.
func runRounds(ctx context.Context, spec Spec, env *Env) *Experiment {
	n := env.Mode.Rounds()
	if spec.RoundsInside {
		n = 1
	}
	start := time.Now()
	var done []*Experiment
	var failed *Experiment
	for r := range n {
		if n > 1 {
			env.Logger().Info("round", "name", spec.Name, "round", r+1, "of", n)
		}
		env.Round = r
		exp := runOne(ctx, spec, env)
		if exp.Status == StatusFailed {
			failed = exp
			break
		}
		done = append(done, exp)
		if ctx.Err() != nil && r+1 < n {
			failed = exp
			failed.Status, failed.Error = StatusFailed, fmt.Sprintf("interrupted after %d of %d rounds: %v", r+1, n, context.Cause(ctx))
			break
		}
	}
	exp := mergeRounds(done)
	if failed != nil {
		if len(done) == 0 {
			exp = failed
		}
		exp.Status, exp.Error = StatusFailed, failed.Error
	}
	exp.Name, exp.Title, exp.Goals = spec.Name, spec.Title, spec.Goals
	exp.Started = start.UTC()
	exp.Seconds = time.Since(start).Seconds()
	if exp.Status == "" {
		exp.Status = StatusDone
	}
	judge(exp)
	return exp
}

func runOne(ctx context.Context, spec Spec, env *Env) (exp *Experiment) {
	start := time.Now()
	var err error
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
			env.Logger().Error("experiment panicked", "name", spec.Name, "panic", p, "stack", string(debug.Stack()))
		}
		if exp == nil {
			exp = &Experiment{}
		}
		exp.Name, exp.Title, exp.Goals = spec.Name, spec.Title, spec.Goals
		exp.Started = start.UTC()
		exp.Seconds = time.Since(start).Seconds()
		if err != nil {
			exp.Status = StatusFailed
			exp.Error = err.Error()
		} else {
			exp.Status = StatusDone
		}
	}()
	exp, err = spec.Run(ctx, env)
	return exp
}

// Failed returns the experiments that failed.
func (r *Run) Failed() []*Experiment {
	var out []*Experiment
	for _, e := range r.Experiments {
		if e.Status == StatusFailed {
			out = append(out, e)
		}
	}
	return out
}

// LoadPrevious reads the first results file that exists and parses; it is
// the source of CarryOver. Missing files are not an error.
func LoadPrevious(paths ...string) (*Run, error) {
	var errs []error
	for _, p := range paths {
		r, err := ReadRun(p)
		if err == nil {
			return r, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return nil, errors.Join(errs...)
}
