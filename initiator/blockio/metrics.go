package blockio

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Prometheus collectors shared by every instrumented backend
// of one registry; the frontend label tells the attach modes apart.
type Metrics struct {
	ops      *prometheus.CounterVec
	errors   *prometheus.CounterVec
	bytes    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewMetrics creates the collectors and registers them on reg (once per
// registry; share the result between frontends):
//
//	nprdma_attach_ops_total{frontend,op}
//	nprdma_attach_op_errors_total{frontend,op}
//	nprdma_attach_bytes_total{frontend,op}            (read, write)
//	nprdma_attach_op_duration_seconds{frontend,op}
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	labels := []string{"frontend", "op"}
	m := &Metrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nprdma_attach_ops_total",
			Help: "Requests an attach frontend passed to its backend.",
		}, labels),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nprdma_attach_op_errors_total",
			Help: "Backend requests of an attach frontend that failed.",
		}, labels),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nprdma_attach_bytes_total",
			Help: "Bytes read or written through an attach frontend.",
		}, labels),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "nprdma_attach_op_duration_seconds",
			Help:    "Time the backend took to serve a request of an attach frontend.",
			Buckets: prometheus.ExponentialBuckets(5e-6, 2, 20), // 5 µs .. 2.6 s
		}, labels),
	}
	for _, c := range []prometheus.Collector{m.ops, m.errors, m.bytes, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("attach metrics: %w", err)
		}
	}
	return m, nil
}

// Instrument returns b counting and timing every call under the given
// frontend label ("nbd", "fuse").
func Instrument(b Backend, m *Metrics, frontend string) Backend {
	in := &instrumented{b: b}
	for op := range in.ops {
		name := opNames[op]
		in.ops[op] = opMetrics{
			count:    m.ops.WithLabelValues(frontend, name),
			errors:   m.errors.WithLabelValues(frontend, name),
			bytes:    m.bytes.WithLabelValues(frontend, name),
			duration: m.duration.WithLabelValues(frontend, name),
		}
	}
	return in
}

const (
	opRead = iota
	opWrite
	opWriteFUA
	opFlush
	opTrim
	opWriteZeroes
	opCount
)

var opNames = [opCount]string{"read", "write", "write_fua", "flush", "trim", "write_zeroes"}

type opMetrics struct {
	count, errors, bytes prometheus.Counter
	duration             prometheus.Observer
}

func (o *opMetrics) done(start time.Time, n int, err error) {
	o.count.Inc()
	o.duration.Observe(time.Since(start).Seconds())
	if n > 0 {
		o.bytes.Add(float64(n))
	}
	if err != nil {
		o.errors.Inc()
	}
}

type instrumented struct {
	b   Backend
	ops [opCount]opMetrics
}

func (in *instrumented) Size() int64     { return in.b.Size() }
func (in *instrumented) BlockSize() int  { return in.b.BlockSize() }
func (in *instrumented) Unwrap() Backend { return in.b }

func (in *instrumented) ReadAt(p []byte, off int64) (int, error) {
	start := time.Now()
	n, err := in.b.ReadAt(p, off)
	in.ops[opRead].done(start, n, err)
	return n, err
}

func (in *instrumented) WriteAt(p []byte, off int64) (int, error) {
	start := time.Now()
	n, err := in.b.WriteAt(p, off)
	in.ops[opWrite].done(start, n, err)
	return n, err
}

func (in *instrumented) WriteAtFUA(p []byte, off int64) (int, error) {
	start := time.Now()
	n, err := in.b.WriteAtFUA(p, off)
	in.ops[opWriteFUA].done(start, n, err)
	return n, err
}

func (in *instrumented) Flush() error {
	start := time.Now()
	err := in.b.Flush()
	in.ops[opFlush].done(start, 0, err)
	return err
}

func (in *instrumented) Trim(off, length int64) error {
	start := time.Now()
	err := in.b.Trim(off, length)
	in.ops[opTrim].done(start, 0, err)
	return err
}

func (in *instrumented) WriteZeroes(off, length int64) error {
	start := time.Now()
	err := in.b.WriteZeroes(off, length)
	in.ops[opWriteZeroes].done(start, 0, err)
	return err
}
