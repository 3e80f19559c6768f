// Package bench is nprdma's benchmark framework: the result record every
// experiment fills in, latency statistics, hand-written SVG plots, the report
// generator (docs/bench.md) and harness helpers for the peers the experiments
// measure against (fio, nbdkit), CPU placement and process memory.
//
// Every figure is a ratio to a baseline measured in the same run on the same
// machine: absolute numbers on a shared two-vCPU VM drift by tens of percent
// between runs, ratios measured side by side much less.
package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// SchemaVersion is bumped whenever results.json changes incompatibly.
const SchemaVersion = 1

// Run is one invocation of the benchmark suite: where and how it ran, and
// what every experiment measured.
type Run struct {
	Schema      int           `json:"schema"`
	Started     time.Time     `json:"started"`
	Finished    time.Time     `json:"finished"`
	Revision    string        `json:"revision,omitempty"`
	Mode        Mode          `json:"mode"`
	Command     string        `json:"command"`
	Machine     Machine       `json:"machine"`
	Notes       []string      `json:"notes,omitempty"`
	Experiments []*Experiment `json:"experiments"`
}

// Status says whether an experiment produced figures.
type Status string

const (
	StatusDone    Status = "done"    // ran to the end; figures are valid
	StatusFailed  Status = "failed"  // returned an error; figures may be partial
	StatusPending Status = "pending" // not built yet: only its goals are known
	StatusNotRun  Status = "not-run" // excluded by --only and no earlier result exists
)

// Experiment is the record of one experiment.
type Experiment struct {
	Name   string `json:"name"`
	Title  string `json:"title"`
	Status Status `json:"status"`
	// Method says in one paragraph what was measured and how.
	Method string `json:"method,omitempty"`
	// Goals are the goal statements of the experiment, known even while it
	// is pending; figures carry the evaluated goals.
	Goals      []string    `json:"goals,omitempty"`
	Params     []Param     `json:"params,omitempty"`
	Figures    []Figure    `json:"figures,omitempty"`
	Series     []Series    `json:"series,omitempty"`
	Plots      []Plot      `json:"plots,omitempty"`
	Placements []Placement `json:"placements,omitempty"`
	// Notes are the honest notes: noise, caveats, anything a reader of the
	// figures must know.
	Notes   []string  `json:"notes,omitempty"`
	Error   string    `json:"error,omitempty"`
	Started time.Time `json:"started,omitzero"`
	Seconds float64   `json:"seconds,omitempty"`
	// CarriedFrom is set when this record was not measured by the current
	// invocation (--only excluded it) but copied from an earlier results
	// file; it names that run.
	CarriedFrom string `json:"carried_from,omitempty"`
}

// Param is one parameter of an experiment (file size, run time, ...).
type Param struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Comparison is the direction of a goal on a ratio.
type Comparison string

const (
	AtMost  Comparison = "<=" // the ratio must not exceed the threshold (latency, memory)
	AtLeast Comparison = ">=" // the ratio must reach the threshold (throughput)
)

// Goal is a pass/fail criterion on a figure's ratio.
type Goal struct {
	// Text is the goal as a reader states it, e.g. "QD1 p50 ≤ 1.1× fio".
	Text      string     `json:"text"`
	Op        Comparison `json:"op"`
	Threshold float64    `json:"threshold"`
}

// Met reports whether ratio satisfies the goal. A non-finite ratio (a
// baseline of zero) never meets a goal.
func (g Goal) Met(ratio float64) bool {
	if math.IsNaN(ratio) || math.IsInf(ratio, 0) {
		return false
	}
	switch g.Op {
	case AtMost:
		return ratio <= g.Threshold
	case AtLeast:
		return ratio >= g.Threshold
	}
	return false
}

// Expression renders the goal's comparison, e.g. "ratio ≤ 1.1".
func (g Goal) Expression() string {
	sym := "≤"
	if g.Op == AtLeast {
		sym = "≥"
	}
	return fmt.Sprintf("ratio %s %s", sym, formatNumber(g.Threshold))
}

// Figure is one measured value next to its same-run baseline.
type Figure struct {
	Name          string  `json:"name"`
	Value         float64 `json:"value"`
	Unit          string  `json:"unit"`
	Baseline      string  `json:"baseline"`
	BaselineValue float64 `json:"baseline_value"`
	// Ratio is Value / BaselineValue for a figure measured once, the median
	// of RoundRatios for one measured in rounds; 0 when the baseline is 0
	// (see Notes).
	Ratio float64 `json:"ratio"`
	// RoundRatios are the per-round ratios, in round order, when the figure
	// was measured in rounds (see RoundsFigure); RatioMin and RatioMax are
	// their smallest and largest, for readers of the JSON.
	RoundRatios []float64 `json:"round_ratios,omitempty"`
	RatioMin    float64   `json:"ratio_min,omitempty"`
	RatioMax    float64   `json:"ratio_max,omitempty"`
	Goal        *Goal     `json:"goal,omitempty"`
	// Met is the verdict on Ratio; in a suite's results it is set only for
	// a figure with a goal measured in at least MinRounds rounds.
	Met   *bool  `json:"met,omitempty"`
	Notes string `json:"notes,omitempty"`
}

// NewFigure builds a figure and computes its ratio.
func NewFigure(name string, value float64, unit, baseline string, baselineValue float64) Figure {
	f := Figure{Name: name, Value: finite(value), Unit: unit, Baseline: baseline, BaselineValue: finite(baselineValue)}
	if f.BaselineValue == 0 {
		f.Notes = "baseline is zero: no ratio"
	} else {
		f.Ratio = finite(f.Value / f.BaselineValue)
	}
	return f
}

// WithGoal attaches a goal and evaluates it.
func (f Figure) WithGoal(g Goal) Figure {
	f.Goal = &g
	met := f.BaselineValue != 0 && g.Met(f.Ratio)
	f.Met = &met
	return f
}

// WithNotes sets the figure's notes.
func (f Figure) WithNotes(notes string) Figure {
	if f.Notes != "" {
		notes = f.Notes + "; " + notes
	}
	f.Notes = notes
	return f
}

// Point is one (x, y) pair; it is written to JSON as [x, y].
type Point struct {
	X, Y float64
}

// MarshalJSON writes the point as a two-element array, which keeps long
// series compact.
func (p Point) MarshalJSON() ([]byte, error) {
	return json.Marshal([2]float64{finite(p.X), finite(p.Y)})
}

// UnmarshalJSON reads a two-element array.
func (p *Point) UnmarshalJSON(b []byte) error {
	var xy []float64
	if err := json.Unmarshal(b, &xy); err != nil {
		return fmt.Errorf("point: %w", err)
	}
	if len(xy) != 2 {
		return fmt.Errorf("point %s: want [x, y]", b)
	}
	p.X, p.Y = xy[0], xy[1]
	return nil
}

// Series is a named list of points for a plot: x/y measurements, a CDF
// (x = latency, y = fraction of operations), or bar values (x = index of the
// category).
type Series struct {
	Name   string  `json:"name"`  // unique within the experiment
	Label  string  `json:"label"` // legend text
	XUnit  string  `json:"x_unit,omitempty"`
	YUnit  string  `json:"y_unit,omitempty"`
	Points []Point `json:"points"`
}

// PlotKind selects how a plot is drawn.
type PlotKind string

const (
	PlotLine PlotKind = "line" // x/y lines, optionally log-log
	PlotCDF  PlotKind = "cdf"  // cumulative distributions; y is a fraction in [0, 1]
	PlotBars PlotKind = "bars" // grouped bars: one group per category, one bar per series
)

// Plot describes a figure of the report; the SVG is rendered from the
// experiment's series, so a report can be regenerated from results.json.
type Plot struct {
	// File is the SVG's base name, unique in the report, e.g. "blockdev-cdf-qd1.svg".
	File    string   `json:"file"`
	Kind    PlotKind `json:"kind"`
	Title   string   `json:"title"`
	Caption string   `json:"caption,omitempty"`
	XLabel  string   `json:"x_label,omitempty"`
	YLabel  string   `json:"y_label,omitempty"`
	LogX    bool     `json:"log_x,omitempty"`
	LogY    bool     `json:"log_y,omitempty"`
	// XTicks overrides the automatic ticks (e.g. queue depths 1, 2, 4, ...).
	XTicks []float64 `json:"x_ticks,omitempty"`
	// Series names the experiment's series to draw, in legend order.
	Series []string `json:"series"`
	// Categories label the bar groups (PlotBars only).
	Categories []string `json:"categories,omitempty"`
}

// Add appends figures to the experiment.
func (e *Experiment) Add(figs ...Figure) { e.Figures = append(e.Figures, figs...) }

// AddSeries appends a series; points with a non-finite coordinate are
// dropped (JSON cannot carry them).
func (e *Experiment) AddSeries(s Series) {
	kept := s.Points[:0:0]
	for _, p := range s.Points {
		if isFinite(p.X) && isFinite(p.Y) {
			kept = append(kept, p)
		}
	}
	s.Points = kept
	e.Series = append(e.Series, s)
}

// AddPlot appends a plot description.
func (e *Experiment) AddPlot(p Plot) { e.Plots = append(e.Plots, p) }

// AddParam records a parameter.
func (e *Experiment) AddParam(name string, value any) {
	e.Params = append(e.Params, Param{Name: name, Value: fmt.Sprint(value)})
}

// Note appends an honest note.
func (e *Experiment) Note(format string, args ...any) {
	e.Notes = append(e.Notes, fmt.Sprintf(format, args...))
}

// SeriesByName finds a series.
func (e *Experiment) SeriesByName(name string) (Series, bool) {
	for _, s := range e.Series {
		if s.Name == name {
			return s, true
		}
	}
	return Series{}, false
}

// Figure finds a figure by name.
func (e *Experiment) Figure(name string) (Figure, bool) {
	for _, f := range e.Figures {
		if f.Name == name {
			return f, true
		}
	}
	return Figure{}, false
}

// Experiment finds an experiment of the run by name.
func (r *Run) Experiment(name string) *Experiment {
	for _, e := range r.Experiments {
		if e.Name == name {
			return e
		}
	}
	return nil
}

// WriteJSON writes the run to path (indented, stable field order), creating
// the directory. It writes a temporary file and renames it so that a reader
// never sees half a file.
func (r *Run) WriteJSON(path string) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results for %s: %w", path, err)
	}
	data = append(data, '\n')
	return writeFileAtomic(path, data)
}

// WithoutRoot returns the run with every mention of the directory root
// (the repository the bench ran in) made relative to it, so that results
// and reports committed from one machine name no path of it.
func (r *Run) WithoutRoot(root string) (*Run, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	root = strings.TrimSuffix(root, "/")
	data = bytes.ReplaceAll(data, []byte(root+"/"), nil)
	data = bytes.ReplaceAll(data, []byte(root), []byte("."))
	var out Run
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ReadRun reads a results file written by WriteJSON.
func ReadRun(path string) (*Run, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Run
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("results file %s: %w", path, err)
	}
	if r.Schema != SchemaVersion {
		return nil, fmt.Errorf("results file %s: schema %d, this build reads %d", path, r.Schema, SchemaVersion)
	}
	return &r, nil
}

// CarryOver fills the experiments of r that this invocation did not run
// (StatusNotRun) with their records from an earlier run, so that running one
// experiment does not erase the others from the report. Carried records keep
// their own figures and are marked with the earlier run's time and revision.
func (r *Run) CarryOver(prev *Run) {
	if prev == nil {
		return
	}
	for i, e := range r.Experiments {
		if e.Status != StatusNotRun {
			continue
		}
		old := prev.Experiment(e.Name)
		if old == nil || (old.Status != StatusDone && old.Status != StatusFailed) {
			continue
		}
		carried := *old
		if carried.CarriedFrom == "" {
			carried.CarriedFrom = describeRun(prev)
		}
		// The current code's description of the experiment wins.
		carried.Title, carried.Goals = e.Title, e.Goals
		r.Experiments[i] = &carried
	}
}

func describeRun(r *Run) string {
	s := r.Started.UTC().Format("2006-01-02 15:04 UTC")
	if r.Revision != "" {
		s += ", revision " + r.Revision
	}
	return s + ", mode " + string(r.Mode)
}

func writeFileAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func isFinite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// finite maps NaN and ±Inf to 0: JSON has no encoding for them.
func finite(x float64) float64 {
	if isFinite(x) {
		return x
	}
	return 0
}
