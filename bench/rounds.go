package bench

import (
	"fmt"
	"slices"
	"strings"
)

// MinRounds is the fewest rounds a goal is judged on. One run of a
// subject next to its baseline is a sample of this machine's noise as much
// as of the code (a ratio moved 0.59-1.50 between rounds of one run), so a
// verdict is given only on the median of at least MinRounds per-round
// ratios, each round measuring the baseline and the subject side by side.
const MinRounds = 5

// Median returns the median of xs by the nearest-rank rule of Percentile
// (the lower middle of an even count); 0 for none. xs is not modified.
func Median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return Percentile(s, 50)
}

// RoundsFigure builds a figure from per-round measurements: round i
// measured values[i] next to baselines[i]. Its ratio is the median of the
// per-round ratios (RoundRatios keeps them all, in round order); Value and
// BaselineValue are the medians of each. Rounds whose baseline is zero give
// no ratio and are left out of RoundRatios.
func RoundsFigure(name, unit, baseline string, values, baselines []float64) Figure {
	n := min(len(values), len(baselines))
	f := Figure{Name: name, Unit: unit, Baseline: baseline,
		Value: finite(Median(values[:n])), BaselineValue: finite(Median(baselines[:n]))}
	for i := range n {
		if baselines[i] != 0 {
			f.RoundRatios = append(f.RoundRatios, finite(values[i]/baselines[i]))
		}
	}
	if len(f.RoundRatios) == 0 {
		f.Notes = "baseline is zero: no ratio"
		return f
	}
	f.Ratio = Median(f.RoundRatios)
	f.RatioMin, f.RatioMax = slices.Min(f.RoundRatios), slices.Max(f.RoundRatios)
	return f
}

// Rounds is the number of rounds behind the figure's ratio: the length of
// RoundRatios, or 1 for a figure measured once.
func (f Figure) Rounds() int {
	if len(f.RoundRatios) > 0 {
		return len(f.RoundRatios)
	}
	if f.BaselineValue != 0 {
		return 1
	}
	return 0
}

// RatioRange returns the smallest and largest per-round ratio (the ratio
// itself for a figure measured once).
func (f Figure) RatioRange() (lo, hi float64) {
	if len(f.RoundRatios) == 0 {
		return f.Ratio, f.Ratio
	}
	return slices.Min(f.RoundRatios), slices.Max(f.RoundRatios)
}

// Judged reports whether the figure has a goal and enough rounds for a
// verdict; Met is set only then (see judge).
func (f Figure) Judged() bool { return f.Goal != nil && f.Rounds() >= MinRounds }

// judge evaluates the goals of e's figures on their median ratios and clears
// the verdict of figures measured in fewer than MinRounds rounds.
func judge(e *Experiment) {
	for i := range e.Figures {
		f := &e.Figures[i]
		if f.Goal == nil {
			continue
		}
		if !f.Judged() {
			f.Met = nil
			continue
		}
		*f = f.WithGoal(*f.Goal)
	}
}

// mergeRounds combines the records of rounds of one experiment, each
// measured with its baselines side by side, into one: every figure becomes a
// RoundsFigure over the rounds that produced it. Plots, series, parameters
// and notes come from one round, the round of the median ratio of the first
// goal figure (or the first round when there is none), and a note says
// which.
func mergeRounds(rounds []*Experiment) *Experiment {
	switch len(rounds) {
	case 0:
		return &Experiment{}
	case 1:
		return rounds[0]
	}
	base := rounds[0]
	baseIdx := 0
	for _, f := range base.Figures {
		if f.Goal == nil {
			continue
		}
		var ratios []float64
		var idx []int
		for i, r := range rounds {
			if g, ok := r.Figure(f.Name); ok {
				ratios = append(ratios, g.Ratio)
				idx = append(idx, i)
			}
		}
		if m := MedianIndex(ratios); m >= 0 {
			baseIdx = idx[m]
			base = rounds[baseIdx]
		}
		break
	}
	out := *base
	out.Figures = nil
	var names []string
	for _, r := range rounds {
		for _, f := range r.Figures {
			if !slices.Contains(names, f.Name) {
				names = append(names, f.Name)
			}
		}
	}
	var partial []string
	for _, name := range names {
		var values, baselines []float64
		var proto *Figure
		for _, r := range rounds {
			f, ok := r.Figure(name)
			if !ok {
				continue
			}
			if proto == nil || r == base {
				proto = &f
			}
			values = append(values, f.Value)
			baselines = append(baselines, f.BaselineValue)
		}
		f := RoundsFigure(name, proto.Unit, proto.Baseline, values, baselines)
		f.Goal = proto.Goal
		if proto.Notes != "" && proto.Notes != f.Notes {
			f = f.WithNotes(proto.Notes)
		}
		out.Figures = append(out.Figures, f)
		if len(values) < len(rounds) {
			partial = append(partial, fmt.Sprintf("%q (%d)", name, len(values)))
		}
	}
	out.Notes = append(slices.Clone(base.Notes), fmt.Sprintf("Every figure is the median of %d rounds, each measuring the subject next to its baseline; plots, parameters and the notes above are from round %d, the round of the median ratio of the first goal.", len(rounds), baseIdx+1))
	if len(partial) > 0 {
		out.Note("Figures missing from some rounds (rounds that have them in brackets): %s.", strings.Join(partial, ", "))
	}
	return &out
}
