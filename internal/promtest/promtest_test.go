package promtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestSum(t *testing.T) {
	reg := prometheus.NewRegistry()
	ops := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ops_total", Help: "ops"}, []string{"op", "status"})
	held := prometheus.NewGauge(prometheus.GaugeOpts{Name: "held", Help: "held"})
	reg.MustRegister(ops, held)
	ops.WithLabelValues("read", "ok").Add(3)
	ops.WithLabelValues("read", "error").Add(1)
	ops.WithLabelValues("write", "ok").Add(5)
	held.Set(2)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"ops_total", nil, 9},
		{"ops_total", []string{"op", "read"}, 4},
		{"ops_total", []string{"op", "read", "status", "ok"}, 3},
		{"ops_total", []string{"op", "trim"}, 0},
		{"held", nil, 2},
		{"absent", nil, 0},
	} {
		if got := Sum(t, reg, c.name, c.labels...); got != c.want {
			t.Errorf("Sum(%s, %q) = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}
