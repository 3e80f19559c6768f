package bench

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func TestPercentileNearestRank(t *testing.T) {
	var hundred []time.Duration
	for i := 1; i <= 100; i++ {
		hundred = append(hundred, ms(i))
	}
	ten := hundred[:10]
	for _, tc := range []struct {
		samples []time.Duration
		p       float64
		want    time.Duration
	}{
		{hundred, 50, ms(50)},
		{hundred, 99, ms(99)},
		{hundred, 99.5, ms(100)},
		{hundred, 100, ms(100)},
		{hundred, 0, ms(1)},
		{hundred, 0.5, ms(1)},
		{hundred, 1, ms(1)},
		{hundred, 1.01, ms(2)},
		{ten, 50, ms(5)},
		{ten, 51, ms(6)},
		{ten, 95, ms(10)},
		{ten[:1], 99, ms(1)},
		{nil, 50, 0},
	} {
		if got := Percentile(tc.samples, tc.p); got != tc.want {
			t.Errorf("Percentile(%d samples, %v) = %v, want %v", len(tc.samples), tc.p, got, tc.want)
		}
	}
}

func TestMeanAndSummarize(t *testing.T) {
	if got := Mean(nil); got != 0 {
		t.Fatalf("Mean(nil) = %v", got)
	}
	samples := []time.Duration{ms(5), ms(1), ms(3), ms(2), ms(4)}
	if got := Mean(samples); got != ms(3) {
		t.Fatalf("Mean = %v, want 3ms", got)
	}
	s := Summarize(samples)
	if !slices.IsSorted(samples) {
		t.Fatalf("Summarize did not sort its input: %v", samples)
	}
	want := LatencySummary{N: 5, Min: ms(1), Mean: ms(3), Max: ms(5), P50: ms(3), P90: ms(5), P99: ms(5), P999: ms(5), P9999: ms(5)}
	if s != want {
		t.Fatalf("Summarize = %+v, want %+v", s, want)
	}
	if (Summarize(nil) != LatencySummary{}) {
		t.Fatal("Summarize(nil) is not zero")
	}
}

func TestCDF(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	samples := make([]time.Duration, 100_000)
	for i := range samples {
		samples[i] = time.Duration(50_000 + rng.ExpFloat64()*20_000)
	}
	slices.Sort(samples)
	pts := CDF(samples, 200)
	if len(pts) < 150 || len(pts) > 202 {
		t.Fatalf("CDF gave %d points for 200 requested", len(pts))
	}
	for i := 1; i < len(pts); i++ {
		if pts[i].X < pts[i-1].X || pts[i].Y <= pts[i-1].Y {
			t.Fatalf("CDF not increasing at %d: %v then %v", i, pts[i-1], pts[i])
		}
	}
	last := pts[len(pts)-1]
	if last.Y != 1 || last.X != Micros(samples[len(samples)-1]) {
		t.Fatalf("last CDF point %v, want (max=%v µs, 1)", last, Micros(samples[len(samples)-1]))
	}
	// The tail is resolved: some point lies between p99 and p99.99.
	if !slices.ContainsFunc(pts, func(p Point) bool { return p.Y > 0.99 && p.Y < 0.9999 }) {
		t.Fatal("CDF has no point between p99 and p99.99")
	}
	// Each point is an exact sample at its level.
	for _, p := range pts {
		if want := Micros(Percentile(samples, p.Y*100)); p.X != want {
			t.Fatalf("point %v: the sample at that level is %v µs", p, want)
		}
	}
	if CDF(nil, 200) != nil || CDF(samples, 1) != nil {
		t.Fatal("CDF of nothing should be nil")
	}
	few := CDF([]time.Duration{ms(1), ms(2)}, 200)
	if len(few) != 2 || few[0] != (Point{1000, 0.5}) || few[1] != (Point{2000, 1}) {
		t.Fatalf("CDF of two samples = %v", few)
	}
}

func TestHistogramPercentileMatchesSamples(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 50 {
		var bins []HistogramBin
		var samples []time.Duration
		lat := time.Duration(0)
		for range 1 + rng.IntN(20) {
			lat += time.Duration(1 + rng.IntN(1000))
			n := int64(rng.IntN(5)) // empty bins happen in fio output too
			bins = append(bins, HistogramBin{Latency: lat, Count: n})
			for range n {
				samples = append(samples, lat)
			}
		}
		for _, p := range []float64{0, 1, 25, 50, 90, 99, 99.9, 100} {
			want := Percentile(samples, p)
			if got := HistogramPercentile(bins, p); got != want {
				t.Fatalf("trial %d: HistogramPercentile(p%v) = %v, exact percentile of the same data is %v", trial, p, got, want)
			}
		}
	}
}

func TestHistogramCDF(t *testing.T) {
	bins := []HistogramBin{{ms(1), 50}, {ms(2), 0}, {ms(3), 49}, {ms(10), 1}}
	pts := HistogramCDF(bins, 200)
	want := []Point{{1000, 0.5}, {3000, 0.99}, {10000, 1}}
	// The empty bucket repeats the previous y; it is kept (x differs).
	if len(pts) != 4 || pts[0] != want[0] || pts[2] != want[1] || pts[3] != want[2] {
		t.Fatalf("HistogramCDF = %v, want points %v", pts, want)
	}
	if HistogramCDF(nil, 10) != nil {
		t.Fatal("empty histogram gave points")
	}
}

func TestSpreadAndMeanFloat(t *testing.T) {
	if got := Spread([]float64{90, 110}); got != 0.2 {
		t.Fatalf("Spread = %v, want 0.2", got)
	}
	if Spread([]float64{5}) != 0 || Spread(nil) != 0 || Spread([]float64{0, 0}) != 0 {
		t.Fatal("Spread of fewer than two values or a zero mean should be 0")
	}
	if MeanFloat([]float64{1, 2, 6}) != 3 || MeanFloat(nil) != 0 {
		t.Fatal("MeanFloat wrong")
	}
}

func TestRoundList(t *testing.T) {
	if got, want := RoundList([]float64{12345.6, 57.25, 0.98765}), "12346, 57.2, 0.988"; got != want {
		t.Fatalf("RoundList = %q, want %q", got, want)
	}
	if got := RoundList(nil); got != "" {
		t.Fatalf("RoundList(nil) = %q", got)
	}
}

func TestRoundOrderAlternates(t *testing.T) {
	if got := RoundOrder(3, 0); !slices.Equal(got, []int{0, 1, 2}) {
		t.Fatalf("round 0: %v", got)
	}
	if got := RoundOrder(3, 1); !slices.Equal(got, []int{2, 1, 0}) {
		t.Fatalf("round 1: %v", got)
	}
}

func TestMedianIndex(t *testing.T) {
	if got := MedianIndex([]float64{0.9, 0.7, 1.3, 0.8, 1.1}); got != 0 {
		t.Fatalf("odd count: index %d, want 0 (0.9)", got)
	}
	if got := MedianIndex([]float64{4, 1, 3, 2}); got != 3 {
		t.Fatalf("even count: index %d, want 3 (2, the lower median)", got)
	}
	if got := MedianIndex([]float64{5, 5, 5}); got != 1 {
		t.Fatalf("ties: index %d, want 1 (stable)", got)
	}
	if MedianIndex(nil) != -1 {
		t.Fatal("no values: want -1")
	}
}
