package blockdev

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var _ interface {
	Device
	Wrapper
} = (*Metered)(nil)

// Metered is a Device decorator that counts operations, bytes and errors and
// records latency histograms, labelled by operation kind and device:
//
//	nprdma_blockdev_ops_total{op,device}           operations issued
//	nprdma_blockdev_bytes_total{op,device}         bytes moved (read, written, discarded)
//	nprdma_blockdev_errors_total{op,device}        operations that returned an error
//	nprdma_blockdev_op_latency_seconds{op,device}  time per operation, failed ones included
//
// Several Metered devices share the collectors on one registry, told apart by
// the device label.
type Metered struct {
	dev     Device
	ops     [numOps]prometheus.Counter
	bytes   [numOps]prometheus.Counter
	errs    [numOps]prometheus.Counter
	latency [numOps]prometheus.Observer
}

type meteredOptions struct {
	device string
}

// MeteredOption configures NewMetered.
type MeteredOption func(*meteredOptions)

// WithDeviceLabel sets the device label (default: the device's Path).
func WithDeviceLabel(name string) MeteredOption {
	return func(o *meteredOptions) { o.device = name }
}

// LatencyBuckets are the histogram buckets of op_latency_seconds: 10 µs (a
// page-cache hit) to 100 ms (a stalled disk) in steps of about 2x.
var LatencyBuckets = prometheus.ExponentialBucketsRange(10e-6, 100e-3, 14)

// NewMetered wraps dev and registers its metrics on reg (nil: the metrics
// are kept but not exported). Collectors another Metered already registered
// on reg are reused.
func NewMetered(dev Device, reg prometheus.Registerer, opts ...MeteredOption) (*Metered, error) {
	o := meteredOptions{device: dev.Path()}
	for _, opt := range opts {
		opt(&o)
	}
	labels := []string{"op", "device"}
	ops, err := registerShared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nprdma_blockdev_ops_total",
		Help: "Operations issued to the backing device, by kind.",
	}, labels))
	if err != nil {
		return nil, err
	}
	bytes, err := registerShared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nprdma_blockdev_bytes_total",
		Help: "Bytes read, written or discarded on the backing device.",
	}, labels))
	if err != nil {
		return nil, err
	}
	errs, err := registerShared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nprdma_blockdev_errors_total",
		Help: "Backing device operations that returned an error, by kind.",
	}, labels))
	if err != nil {
		return nil, err
	}
	latency, err := registerShared(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "nprdma_blockdev_op_latency_seconds",
		Help:    "Time each backing device operation took, failed ones included.",
		Buckets: LatencyBuckets,
	}, labels))
	if err != nil {
		return nil, err
	}
	m := &Metered{dev: dev}
	// Resolve the label values once; every series exists (at zero) from
	// the start, so a dashboard shows an idle device as idle, not absent.
	for i := range numOps {
		name := opNames[i]
		m.ops[i] = ops.WithLabelValues(name, o.device)
		m.bytes[i] = bytes.WithLabelValues(name, o.device)
		m.errs[i] = errs.WithLabelValues(name, o.device)
		m.latency[i] = latency.WithLabelValues(name, o.device)
	}
	return m, nil
}

// registerShared registers c on reg or returns the equal collector already
// there.
func registerShared[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if reg == nil {
		return c, nil
	}
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	var zero C
	return zero, fmt.Errorf("blockdev metrics: %w", err)
}

func (m *Metered) record(op Op, start time.Time, n int64, err error) {
	i := op.index()
	m.ops[i].Inc()
	m.latency[i].Observe(time.Since(start).Seconds())
	if n > 0 {
		m.bytes[i].Add(float64(n))
	}
	if err != nil {
		m.errs[i].Inc()
	}
}

// ReadAt implements Device.
func (m *Metered) ReadAt(p []byte, off int64) (int, error) {
	start := time.Now()
	n, err := m.dev.ReadAt(p, off)
	m.record(OpRead, start, int64(n), err)
	return n, err
}

// WriteAt implements Device.
func (m *Metered) WriteAt(p []byte, off int64) (int, error) {
	start := time.Now()
	n, err := m.dev.WriteAt(p, off)
	m.record(OpWrite, start, int64(n), err)
	return n, err
}

// WriteAtFUA implements Device.
func (m *Metered) WriteAtFUA(p []byte, off int64) (int, error) {
	start := time.Now()
	n, err := m.dev.WriteAtFUA(p, off)
	m.record(OpWriteFUA, start, int64(n), err)
	return n, err
}

// Flush implements Device.
func (m *Metered) Flush() error {
	start := time.Now()
	err := m.dev.Flush()
	m.record(OpFlush, start, 0, err)
	return err
}

// Discard implements Device; a successful discard counts its length as bytes.
func (m *Metered) Discard(off, length int64) error {
	start := time.Now()
	err := m.dev.Discard(off, length)
	n := length
	if err != nil {
		n = 0
	}
	m.record(OpDiscard, start, n, err)
	return err
}

func (m *Metered) Size() int64    { return m.dev.Size() }
func (m *Metered) BlockSize() int { return m.dev.BlockSize() }
func (m *Metered) Path() string   { return m.dev.Path() }

// Close closes the device underneath. Its series stay registered: counters
// are cumulative, and a device opened again under the same label continues
// them.
func (m *Metered) Close() error { return m.dev.Close() }

// Unwrap implements Wrapper.
func (m *Metered) Unwrap() Device { return m.dev }
