package bench

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Percentile returns the p-th percentile (0 ≤ p ≤ 100) of sorted samples by
// the nearest-rank method: the smallest sample such that at least p% of the
// samples are less than or equal to it. It is exact (no interpolation, no
// histogram buckets) and zero for no samples. sorted must be in ascending
// order. It is the one percentile rule of the bench: latencies, per-round
// values and the median of rounds all go through it.
func Percentile[T cmp.Ordered](sorted []T, p float64) T {
	n := len(sorted)
	if n == 0 {
		var zero T
		return zero
	}
	if p <= 0 {
		return sorted[0]
	}
	if p >= 100 {
		return sorted[n-1]
	}
	// The small epsilon keeps p=50 of 100 samples at rank 50 despite
	// binary floating point (50/100*100 may come out as 50.000000000000007).
	rank := int(math.Ceil(p/100*float64(n) - 1e-9))
	if rank < 1 {
		rank = 1
	}
	return sorted[rank-1]
}

// Mean returns the arithmetic mean of samples (0 for none).
func Mean(samples []time.Duration) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	// Summing in float64 avoids overflow of int64 nanoseconds for long runs.
	var sum float64
	for _, s := range samples {
		sum += float64(s)
	}
	return time.Duration(sum / float64(len(samples)))
}

// LatencySummary is the usual description of a latency distribution.
type LatencySummary struct {
	N                          int
	Min, Mean, Max             time.Duration
	P50, P90, P99, P999, P9999 time.Duration
}

// Summarize sorts samples in place and summarises them.
func Summarize(samples []time.Duration) LatencySummary {
	slices.Sort(samples)
	if len(samples) == 0 {
		return LatencySummary{}
	}
	return LatencySummary{
		N:     len(samples),
		Min:   samples[0],
		Max:   samples[len(samples)-1],
		Mean:  Mean(samples),
		P50:   Percentile(samples, 50),
		P90:   Percentile(samples, 90),
		P99:   Percentile(samples, 99),
		P999:  Percentile(samples, 99.9),
		P9999: Percentile(samples, 99.99),
	}
}

// CDF summarises sorted samples as at most about `points` (x, y) pairs for
// plotting: x is the latency in microseconds and y the fraction of samples at
// or below it. Half the points are spread evenly in probability and half
// logarithmically towards the tail (p99, p99.9, ...), where a latency CDF
// carries its information; the last point is the maximum.
func CDF(sorted []time.Duration, points int) []Point {
	n := len(sorted)
	if n == 0 || points < 2 {
		return nil
	}
	levels := cdfLevels(n, points)
	out := make([]Point, 0, len(levels))
	for _, q := range levels {
		rank := int(math.Ceil(q*float64(n) - 1e-9))
		rank = min(max(rank, 1), n)
		out = append(out, Point{X: Micros(sorted[rank-1]), Y: float64(rank) / float64(n)})
	}
	return dedupePoints(out)
}

// cdfLevels returns ascending probability levels in (0, 1].
func cdfLevels(n, points int) []float64 {
	even := points / 2
	tail := points - even
	levels := make([]float64, 0, points+1)
	for i := 1; i <= even; i++ {
		levels = append(levels, float64(i)/float64(even+1))
	}
	// Tail: 1-q from 0.5 down to 1/n on a log scale.
	lo, hi := math.Log(1/float64(n)), math.Log(0.5)
	for i := 0; i < tail; i++ {
		frac := float64(i) / float64(max(tail-1, 1))
		levels = append(levels, 1-math.Exp(hi+(lo-hi)*frac))
	}
	levels = append(levels, 1)
	slices.Sort(levels)
	return levels
}

// dedupePoints drops points identical to their predecessor (many levels
// map to the same rank when there are few samples).
func dedupePoints(pts []Point) []Point {
	out := pts[:0]
	for i, p := range pts {
		if i > 0 && p == out[len(out)-1] {
			continue
		}
		out = append(out, p)
	}
	return out
}

// HistogramBin is one bucket of a latency histogram (fio's json+ bins).
type HistogramBin struct {
	Latency time.Duration `json:"latency_ns"`
	Count   int64         `json:"count"`
}

// HistogramPercentile returns the p-th percentile of a histogram sorted by
// latency, by the same nearest-rank rule as Percentile.
func HistogramPercentile(bins []HistogramBin, p float64) time.Duration {
	var total int64
	for _, b := range bins {
		total += b.Count
	}
	if total == 0 {
		return 0
	}
	rank := int64(math.Ceil(p/100*float64(total) - 1e-9))
	rank = min(max(rank, 1), total)
	var cum int64
	for _, b := range bins {
		cum += b.Count
		if cum >= rank {
			return b.Latency
		}
	}
	return bins[len(bins)-1].Latency
}

// HistogramCDF turns a histogram sorted by latency into CDF points
// (x in microseconds), thinned to about `points` points while keeping the
// tail: every bucket above p99 is kept.
func HistogramCDF(bins []HistogramBin, points int) []Point {
	var total int64
	for _, b := range bins {
		total += b.Count
	}
	if total == 0 || points < 2 {
		return nil
	}
	step := max(len(bins)/points, 1)
	var cum int64
	out := make([]Point, 0, points*2)
	for i, b := range bins {
		cum += b.Count
		y := float64(cum) / float64(total)
		if i%step == 0 || y > 0.99 || i == len(bins)-1 {
			out = append(out, Point{X: Micros(b.Latency), Y: y})
		}
	}
	return dedupePoints(out)
}

// Micros converts a duration to (fractional) microseconds, the unit every
// latency in the report uses.
func Micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// MeanFloat returns the mean of xs (0 for none).
func MeanFloat(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// MedianIndex returns the index of the median of xs (the lower one of an
// even count), so that a figure can quote the round the median came from;
// -1 for none.
func MedianIndex(xs []float64) int {
	if len(xs) == 0 {
		return -1
	}
	idx := make([]int, len(xs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(xs[a], xs[b]) })
	return idx[(len(xs)-1)/2]
}

// Spread returns (max-min)/mean of xs, the relative spread between repeated
// measurements that the report quotes as noise.
func Spread(xs []float64) float64 {
	if len(xs) < 2 {
		return 0
	}
	m := MeanFloat(xs)
	if m == 0 {
		return 0
	}
	return (slices.Max(xs) - slices.Min(xs)) / m
}

// RoundList renders per-round values for a figure's notes: whole numbers
// from 1000, one decimal from 10, three below.
func RoundList(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		switch {
		case x >= 1000:
			parts[i] = strconv.FormatFloat(x, 'f', 0, 64)
		case x >= 10:
			parts[i] = strconv.FormatFloat(x, 'f', 1, 64)
		default:
			parts[i] = strconv.FormatFloat(x, 'f', 3, 64)
		}
	}
	return strings.Join(parts, ", ")
}

// RoundOrder returns 0..n-1, reversed in odd rounds (ABBA), so that a
// machine drifting during a round favours no case.
func RoundOrder(n, round int) []int {
	o := make([]int, n)
	for i := range o {
		o[i] = i
		if round%2 == 1 {
			o[i] = n - 1 - i
		}
	}
	return o
}
