// Package promtest reads metrics back in tests: what a Prometheus scrape of
// a registry would show, as numbers to assert on.
package promtest

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Sum gathers g and sums the values of the counter and gauge series of
// family name that carry every label given as name, value pairs (every
// series if none). A family that is absent sums to 0.
func Sum(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	if len(labels)%2 != 0 {
		t.Fatalf("promtest.Sum(%s): labels %q are not name, value pairs", name, labels)
	}
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			switch {
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func hasLabels(m *dto.Metric, pairs []string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == pairs[i] && l.GetValue() == pairs[i+1] }) {
			return false
		}
	}
	return true
}
