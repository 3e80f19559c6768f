package blockdev

import (
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// metricValue gathers reg and returns the value of the series name{op,
// device}: a counter's value or a histogram's sample count.
func metricValue(t *testing.T, reg *prometheus.Registry, name, op, device string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range families {
		if fam.GetName() != name {
			continue
		}
		for _, m := range fam.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if len(labels) == 2 && labels["op"] == op && labels["device"] == device {
				if h := m.GetHistogram(); h != nil {
					return float64(h.GetSampleCount())
				}
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no series %s{op=%q,device=%q}", name, op, device)
	return 0
}

// seriesCount gathers reg and counts its series.
func seriesCount(t *testing.T, reg *prometheus.Registry) int {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fam := range families {
		n += len(fam.GetMetric())
	}
	return n
}

func TestMeteredCounts(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	faulty := NewFaulty(newMemDevice(64 * PageSize))
	m, err := NewMetered(faulty, reg, WithDeviceLabel("ns1"))
	if err != nil {
		t.Fatal(err)
	}
	if m.Unwrap() != faulty {
		t.Fatal("Unwrap does not return the device underneath")
	}
	buf := make([]byte, 2*PageSize)
	for range 3 {
		if _, err := m.ReadAt(buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := m.WriteAtFUA(buf[:PageSize], 0); err != nil {
		t.Fatal(err)
	}
	if err := m.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := m.Discard(0, 8*PageSize); err != nil {
		t.Fatal(err)
	}
	faulty.FailNth(OpWrite|OpDiscard, 1, FromThenOn)
	if _, err := m.WriteAt(buf, 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("write through Metered: %v, want the injected EIO", err)
	}
	if err := m.Discard(0, PageSize); !errors.Is(err, ErrInjected) {
		t.Fatalf("discard through Metered: %v, want the injected fault", err)
	}
	// Reads beyond the end are errors of the device underneath.
	if _, err := m.ReadAt(buf, 64*PageSize); !errors.Is(err, ErrOutOfRange) {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name, op string
		want     float64
	}{
		{"nprdma_blockdev_ops_total", "read", 4},
		{"nprdma_blockdev_ops_total", "write", 2},
		{"nprdma_blockdev_ops_total", "write-fua", 1},
		{"nprdma_blockdev_ops_total", "flush", 1},
		{"nprdma_blockdev_ops_total", "discard", 2},
		{"nprdma_blockdev_bytes_total", "read", 3 * 2 * PageSize},
		{"nprdma_blockdev_bytes_total", "write", 2 * PageSize},
		{"nprdma_blockdev_bytes_total", "write-fua", PageSize},
		{"nprdma_blockdev_bytes_total", "flush", 0},
		{"nprdma_blockdev_bytes_total", "discard", 8 * PageSize},
		{"nprdma_blockdev_errors_total", "read", 1},
		{"nprdma_blockdev_errors_total", "write", 1},
		{"nprdma_blockdev_errors_total", "write-fua", 0},
		{"nprdma_blockdev_errors_total", "flush", 0},
		{"nprdma_blockdev_errors_total", "discard", 1},
		{"nprdma_blockdev_op_latency_seconds", "read", 4},
		{"nprdma_blockdev_op_latency_seconds", "flush", 1},
		{"nprdma_blockdev_op_latency_seconds", "discard", 2},
	} {
		if got := metricValue(t, reg, c.name, c.op, "ns1"); got != c.want {
			t.Errorf("%s{op=%q} = %v, want %v", c.name, c.op, got, c.want)
		}
	}
}

func TestMeteredTwoDevicesOneRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := NewMetered(newMemDevice(16*PageSize), reg, WithDeviceLabel("a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewMetered(newMemDevice(16*PageSize), reg, WithDeviceLabel("b"))
	if err != nil {
		t.Fatalf("second device on the same registry: %v", err)
	}
	buf := make([]byte, PageSize)
	a.ReadAt(buf, 0)
	b.ReadAt(buf, 0)
	b.ReadAt(buf, 0)
	if got := metricValue(t, reg, "nprdma_blockdev_ops_total", "read", "a"); got != 1 {
		t.Errorf("device a: %v reads, want 1", got)
	}
	if got := metricValue(t, reg, "nprdma_blockdev_ops_total", "read", "b"); got != 2 {
		t.Errorf("device b: %v reads, want 2", got)
	}
	// Every series exists from the start, at zero: 4 metrics x 5 kinds x 2 devices.
	if n := seriesCount(t, reg); n != 40 {
		t.Errorf("%d series, want 40", n)
	}

	// A device label defaults to the device's path.
	c, err := NewMetered(newMemDevice(PageSize), reg)
	if err != nil {
		t.Fatal(err)
	}
	c.Flush()
	if got := metricValue(t, reg, "nprdma_blockdev_ops_total", "flush", "mem"); got != 1 {
		t.Errorf("device labelled by its path: %v flushes, want 1", got)
	}
}

func TestMeteredRegistrationConflict(t *testing.T) {
	reg := prometheus.NewRegistry()
	// Someone else owns the name with other labels.
	reg.MustRegister(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nprdma_blockdev_ops_total", Help: "x"}, []string{"disk"}))
	_, err := NewMetered(newMemDevice(PageSize), reg)
	if err == nil || !strings.Contains(err.Error(), "blockdev metrics") {
		t.Fatalf("NewMetered over a conflicting collector: %v", err)
	}
}

func TestMeteredNilRegistry(t *testing.T) {
	m, err := NewMetered(newMemDevice(PageSize), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.ReadAt(make([]byte, PageSize), 0); err != nil {
		t.Fatal(err)
	}
	var read dto.Metric
	if err := m.ops[OpRead.index()].Write(&read); err != nil {
		t.Fatal(err)
	}
	if got := read.GetCounter().GetValue(); got != 1 {
		t.Fatalf("unregistered counter = %v, want 1", got)
	}
}
