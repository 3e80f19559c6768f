package initiator

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Stats are a controller's counters since Connect.
type Stats struct {
	// Reads is the number of read transfers (a ReadAt is split by MDTS).
	Reads uint64
	// ReadsOneSided: transfers served entirely by the one-sided READ (no
	// page was suspected).
	ReadsOneSided uint64
	// OneSidedReads, OneSidedPages, OneSidedBytes: RDMA READs issued.
	OneSidedReads, OneSidedPages, OneSidedBytes uint64
	// SuspectedPages: pages found holding the magic page after a READ.
	SuspectedPages uint64
	// FallbackReads, FallbackPages: NVMe Reads issued for suspected pages.
	FallbackReads, FallbackPages uint64
	// FalsePositives: suspected pages whose real content is the magic page.
	FalsePositives uint64
	// MinorResolved, MajorResolved: faults the target reports it resolved
	// for the fallback reads (zero fill / read from its backing device).
	MinorResolved, MajorResolved uint64
	// FrameTableReads, FrameMisses, FrameRejects, for a target that serves
	// frames (docs/np-rdma.md §11): buckets of its table read; blocks the
	// table did not hold; blocks whose frame did not prove itself the
	// block's current content. Both kinds are read two-sided and counted
	// in SuspectedPages too.
	FrameTableReads, FrameMisses, FrameRejects uint64
	// TwoSidedReads: transfers read with NVMe Read alone (no region
	// descriptor, or one-sided reads disabled).
	TwoSidedReads                       uint64
	Writes, Flushes, Trims, WriteZeroes uint64
	// Reconnects: sessions re-established after a loss.
	Reconnects uint64
	// TargetRestarts: reconnects that found another target process;
	// TargetRestartsUnclean: those after a stop without a clean shutdown, or
	// from a target that keeps no record of how it stopped, where writes
	// not flushed may have been lost (see Namespace.PossiblyLost).
	TargetRestarts, TargetRestartsUnclean uint64
}

// OneSidedShare is the fraction of read transfers that completed with the
// one-sided READ alone (0 when nothing was read).
func (s Stats) OneSidedShare() float64 {
	if s.Reads == 0 {
		return 0
	}
	return float64(s.ReadsOneSided) / float64(s.Reads)
}

type counters struct {
	readsOneSided, oneSidedReads, oneSidedPages, oneSidedBytes   atomic.Uint64
	suspectedPages, fallbackReads, fallbackPages, falsePositives atomic.Uint64
	minorResolved, majorResolved, twoSidedReads                  atomic.Uint64
	writes, flushes, trims, writeZeroes, reconnects              atomic.Uint64
	targetRestarts, targetRestartsUnclean                        atomic.Uint64
	frameTableReads, frameMisses, frameRejects                   atomic.Uint64
}

// Stats returns a snapshot of the controller's counters.
func (c *Controller) Stats() Stats {
	k := &c.ctr
	s := Stats{
		ReadsOneSided: k.readsOneSided.Load(), OneSidedReads: k.oneSidedReads.Load(),
		OneSidedPages: k.oneSidedPages.Load(), OneSidedBytes: k.oneSidedBytes.Load(),
		SuspectedPages: k.suspectedPages.Load(), FallbackReads: k.fallbackReads.Load(),
		FallbackPages: k.fallbackPages.Load(), FalsePositives: k.falsePositives.Load(),
		MinorResolved: k.minorResolved.Load(), MajorResolved: k.majorResolved.Load(),
		TwoSidedReads: k.twoSidedReads.Load(), Writes: k.writes.Load(), Flushes: k.flushes.Load(),
		Trims: k.trims.Load(), WriteZeroes: k.writeZeroes.Load(), Reconnects: k.reconnects.Load(),
		TargetRestarts: k.targetRestarts.Load(), TargetRestartsUnclean: k.targetRestartsUnclean.Load(),
		FrameTableReads: k.frameTableReads.Load(), FrameMisses: k.frameMisses.Load(), FrameRejects: k.frameRejects.Load(),
	}
	s.Reads = s.OneSidedReads + s.TwoSidedReads
	return s
}

// Read paths and operations, as metric labels.
const (
	pathOneSided  = "one_sided"
	pathFallback  = "fallback"
	pathTwoSided  = "two_sided"
	opWrite       = "write"
	opFlush       = "flush"
	opTrim        = "trim"
	opWriteZeroes = "write_zeroes"
)

func (c *Controller) observeRead(path string, d time.Duration) {
	if c.prom != nil {
		c.prom.readLatency.WithLabelValues(path).Observe(d.Seconds())
	}
}

func (c *Controller) observe(op string, d time.Duration) {
	if c.prom != nil {
		c.prom.opLatency.WithLabelValues(op).Observe(d.Seconds())
	}
}

// promMetrics exports a controller's counters (read at scrape time) and
// latency histograms as nprdma_initiator_*.
type promMetrics struct {
	reg         prometheus.Registerer
	c           *Controller
	readLatency *prometheus.HistogramVec
	opLatency   *prometheus.HistogramVec
	descs       map[string]*prometheus.Desc
}

var counterHelp = map[string]string{
	"nprdma_initiator_reads_total":                   "Read transfers (ReadAt split by the transfer limit).",
	"nprdma_initiator_reads_one_sided_total":         "Read transfers served by the one-sided READ alone.",
	"nprdma_initiator_one_sided_read_ops_total":      "One-sided RDMA READs issued.",
	"nprdma_initiator_one_sided_read_pages_total":    "Pages read with one-sided RDMA READs.",
	"nprdma_initiator_one_sided_read_bytes_total":    "Bytes read with one-sided RDMA READs.",
	"nprdma_initiator_suspected_faults_total":        "Pages found holding the magic page (suspected remote faults).",
	"nprdma_initiator_fallback_reads_total":          "NVMe Read commands issued for suspected pages.",
	"nprdma_initiator_fallback_pages_total":          "Pages read with NVMe Read commands for suspected pages.",
	"nprdma_initiator_two_sided_reads_total":         "Read transfers done with NVMe Read alone (no one-sided READ).",
	"nprdma_initiator_writes_total":                  "Write commands completed.",
	"nprdma_initiator_flushes_total":                 "Flush commands completed.",
	"nprdma_initiator_trims_total":                   "Dataset Management (deallocate) commands completed.",
	"nprdma_initiator_write_zeroes_total":            "Write Zeroes commands completed.",
	"nprdma_initiator_false_positives_total":         "Suspected pages whose content really is the magic page.",
	"nprdma_initiator_minor_faults_total":            "Faults the target resolved without device I/O for fallback reads.",
	"nprdma_initiator_major_faults_total":            "Faults the target resolved from its backing device for fallback reads.",
	"nprdma_initiator_reconnects_total":              "Sessions re-established after a connection loss.",
	"nprdma_initiator_target_restarts_total":         "Reconnects that found another target process.",
	"nprdma_initiator_target_unclean_restarts_total": "Target restarts after a stop without a clean shutdown (or with no record of it): unflushed writes may be lost.",
	"nprdma_initiator_frame_table_reads_total":       "Buckets of a target's frame table read with one-sided RDMA READs.",
	"nprdma_initiator_frame_misses_total":            "Blocks a target's frame table did not hold (read with NVMe Read).",
	"nprdma_initiator_frame_rejects_total":           "Frames that did not prove themselves the block's current content (read with NVMe Read).",
}

func newPromMetrics(reg prometheus.Registerer, c *Controller) (*promMetrics, error) {
	labels := prometheus.Labels{"subsystem": c.subNQN}
	m := &promMetrics{reg: reg, c: c, descs: map[string]*prometheus.Desc{},
		readLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "nprdma_initiator_read_latency_seconds", ConstLabels: labels,
			Help:    "Latency of one read transfer, by path (one_sided, fallback: one-sided then NVMe Read of faulted pages, two_sided).",
			Buckets: prometheus.ExponentialBuckets(2e-6, 2, 22),
		}, []string{"path"}),
		opLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "nprdma_initiator_command_latency_seconds", ConstLabels: labels,
			Help:    "Latency of write, flush, trim and write-zeroes commands.",
			Buckets: prometheus.ExponentialBuckets(2e-6, 2, 22),
		}, []string{"op"}),
	}
	for name, help := range counterHelp {
		m.descs[name] = prometheus.NewDesc(name, help, nil, labels)
	}
	m.descs["nprdma_initiator_one_sided_share"] = prometheus.NewDesc("nprdma_initiator_one_sided_share",
		"Fraction of read transfers served by the one-sided READ alone.", nil, labels)
	for _, col := range []prometheus.Collector{m.readLatency, m.opLatency, m} {
		if err := reg.Register(col); err != nil {
			m.unregister()
			return nil, err
		}
	}
	return m, nil
}

func (m *promMetrics) unregister() {
	m.reg.Unregister(m.readLatency)
	m.reg.Unregister(m.opLatency)
	m.reg.Unregister(m)
}

// Describe implements prometheus.Collector.
func (m *promMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range m.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *promMetrics) Collect(ch chan<- prometheus.Metric) {
	s := m.c.Stats()
	values := map[string]uint64{
		"nprdma_initiator_reads_total":                   s.Reads,
		"nprdma_initiator_reads_one_sided_total":         s.ReadsOneSided,
		"nprdma_initiator_one_sided_read_ops_total":      s.OneSidedReads,
		"nprdma_initiator_one_sided_read_pages_total":    s.OneSidedPages,
		"nprdma_initiator_one_sided_read_bytes_total":    s.OneSidedBytes,
		"nprdma_initiator_suspected_faults_total":        s.SuspectedPages,
		"nprdma_initiator_fallback_reads_total":          s.FallbackReads,
		"nprdma_initiator_fallback_pages_total":          s.FallbackPages,
		"nprdma_initiator_two_sided_reads_total":         s.TwoSidedReads,
		"nprdma_initiator_writes_total":                  s.Writes,
		"nprdma_initiator_flushes_total":                 s.Flushes,
		"nprdma_initiator_trims_total":                   s.Trims,
		"nprdma_initiator_write_zeroes_total":            s.WriteZeroes,
		"nprdma_initiator_false_positives_total":         s.FalsePositives,
		"nprdma_initiator_minor_faults_total":            s.MinorResolved,
		"nprdma_initiator_major_faults_total":            s.MajorResolved,
		"nprdma_initiator_reconnects_total":              s.Reconnects,
		"nprdma_initiator_target_restarts_total":         s.TargetRestarts,
		"nprdma_initiator_target_unclean_restarts_total": s.TargetRestartsUnclean,
		"nprdma_initiator_frame_table_reads_total":       s.FrameTableReads,
		"nprdma_initiator_frame_misses_total":            s.FrameMisses,
		"nprdma_initiator_frame_rejects_total":           s.FrameRejects,
	}
	for name, v := range values {
		ch <- prometheus.MustNewConstMetric(m.descs[name], prometheus.CounterValue, float64(v))
	}
	ch <- prometheus.MustNewConstMetric(m.descs["nprdma_initiator_one_sided_share"], prometheus.GaugeValue, s.OneSidedShare())
}
