package nprdma

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

type counters struct {
	qpsOpen            atomic.Int64
	qpsCreated         atomic.Uint64
	registrations      atomic.Uint64
	registeredBytes    atomic.Int64
	unpinnedBytes      atomic.Int64
	readsServed        atomic.Uint64
	readBytesServed    atomic.Uint64
	writesServed       atomic.Uint64
	writeBytesServed   atomic.Uint64
	unpinnedPagesRead  atomic.Uint64
	magicPagesServed   atomic.Uint64
	remoteAccessErrors atomic.Uint64
	rnrNaksSent        atomic.Uint64
	rnrRetries         atomic.Uint64
	localReads         atomic.Uint64
	localPagesRead     atomic.Uint64
	localMagicPages    atomic.Uint64
}

// Stats are a device's counters.
type Stats struct {
	QPs                int64  // queue pairs open
	QPsCreated         uint64 // queue pairs ever created
	Registrations      uint64 // memory registrations (pinned and unpinned)
	RegisteredBytes    int64  // bytes in live regions from Register
	UnpinnedBytes      int64  // bytes in live regions from RegisterUnpinned
	ReadsServed        uint64 // one-sided READs served as responder
	ReadBytesServed    uint64
	WritesServed       uint64 // one-sided WRITEs executed as responder
	WriteBytesServed   uint64
	UnpinnedPagesRead  uint64 // pages of unpinned regions read for READs (per page touched)
	MagicPagesServed   uint64 // of which delivered as the magic page
	SuspectedFaults    uint64 // magic pages found by Device.FindMagicPages (requester)
	RemoteAccessErrors uint64 // READs and WRITEs refused as responder
	RNRNaksSent        uint64 // SENDs refused for lack of a receive, as responder
	RNRRetries         uint64 // RNR NAKs received, as requester
	LocalReads         uint64 // READs executed by the requester in the peer's shared memory (LocalReader)
	LocalPagesRead     uint64 // pages they touched
	LocalMagicPages    uint64 // of which delivered as the magic page
}

// Stats returns a snapshot of the device's counters.
func (d *softDevice) Stats() Stats {
	c := &d.ctr
	return Stats{
		QPs:                c.qpsOpen.Load(),
		QPsCreated:         c.qpsCreated.Load(),
		Registrations:      c.registrations.Load(),
		RegisteredBytes:    c.registeredBytes.Load(),
		UnpinnedBytes:      c.unpinnedBytes.Load(),
		ReadsServed:        c.readsServed.Load(),
		ReadBytesServed:    c.readBytesServed.Load(),
		WritesServed:       c.writesServed.Load(),
		WriteBytesServed:   c.writeBytesServed.Load(),
		UnpinnedPagesRead:  c.unpinnedPagesRead.Load(),
		MagicPagesServed:   c.magicPagesServed.Load(),
		RemoteAccessErrors: c.remoteAccessErrors.Load(),
		RNRNaksSent:        c.rnrNaksSent.Load(),
		RNRRetries:         c.rnrRetries.Load(),
		LocalReads:         c.localReads.Load(),
		LocalPagesRead:     c.localPagesRead.Load(),
		LocalMagicPages:    c.localMagicPages.Load(),
	}
}

// Collector exports a device's counters, and those of buffer pools, as
// Prometheus metrics named nprdma_fabric_*, labelled with the device name.
// Register it on a registry of your own:
//
//	reg.MustRegister(nprdma.NewPrometheusCollector(dev, pool))
type Collector struct {
	dev   *Device
	pools []*BufferPool
}

// NewPrometheusCollector returns a collector for dev and pools. It reads the
// counters at scrape time; the data path only increments atomics.
func NewPrometheusCollector(dev *Device, pools ...*BufferPool) *Collector {
	return &Collector{dev: dev, pools: pools}
}

type metricDesc struct {
	desc    *prometheus.Desc
	kind    prometheus.ValueType
	value   func(s *Stats) float64
	poolVal func(s *PoolStats) float64
}

var (
	deviceMetrics = []metricDesc{
		gauge("qps", "Queue pairs open.", func(s *Stats) float64 { return float64(s.QPs) }),
		counter("qps_created_total", "Queue pairs created.", func(s *Stats) float64 { return float64(s.QPsCreated) }),
		counter("registrations_total", "Memory registrations.", func(s *Stats) float64 { return float64(s.Registrations) }),
		gauge("registered_bytes", "Bytes in live memory regions registered with Register (pinned).", func(s *Stats) float64 { return float64(s.RegisteredBytes) }),
		gauge("unpinned_registered_bytes", "Bytes in live unpinned memory regions.", func(s *Stats) float64 { return float64(s.UnpinnedBytes) }),
		counter("one_sided_reads_total", "One-sided READs served as responder.", func(s *Stats) float64 { return float64(s.ReadsServed) }),
		counter("one_sided_read_bytes_total", "Bytes of one-sided READs served.", func(s *Stats) float64 { return float64(s.ReadBytesServed) }),
		counter("one_sided_writes_total", "One-sided WRITEs executed as responder.", func(s *Stats) float64 { return float64(s.WritesServed) }),
		counter("one_sided_write_bytes_total", "Bytes of one-sided WRITEs executed.", func(s *Stats) float64 { return float64(s.WriteBytesServed) }),
		counter("unpinned_pages_read_total", "Pages of unpinned regions read for one-sided READs.", func(s *Stats) float64 { return float64(s.UnpinnedPagesRead) }),
		counter("magic_pages_served_total", "Pages delivered as the magic page (absent, busy or changed).", func(s *Stats) float64 { return float64(s.MagicPagesServed) }),
		counter("suspected_faults_total", "Magic pages found in READ data by the requester.", func(s *Stats) float64 { return float64(s.SuspectedFaults) }),
		counter("remote_access_errors_total", "READs and WRITEs refused by the NIC engine.", func(s *Stats) float64 { return float64(s.RemoteAccessErrors) }),
		counter("rnr_naks_total", "SENDs refused for lack of a posted receive.", func(s *Stats) float64 { return float64(s.RNRNaksSent) }),
		counter("rnr_retries_total", "RNR NAKs received by requesters.", func(s *Stats) float64 { return float64(s.RNRRetries) }),
		counter("local_reads_total", "READs the requester executed in the peer's shared memory.", func(s *Stats) float64 { return float64(s.LocalReads) }),
		counter("local_pages_read_total", "Pages read by READs executed in the peer's shared memory.", func(s *Stats) float64 { return float64(s.LocalPagesRead) }),
		counter("local_magic_pages_total", "Pages of READs executed in shared memory delivered as the magic page.", func(s *Stats) float64 { return float64(s.LocalMagicPages) }),
	}
	poolMetrics = []metricDesc{
		poolGauge("pool_slabs", "Slabs registered by buffer pools.", func(s *PoolStats) float64 { return float64(s.Slabs) }),
		poolGauge("pool_registered_bytes", "Bytes registered by buffer pools.", func(s *PoolStats) float64 { return float64(s.BytesRegistered) }),
		poolGauge("pool_in_use_bytes", "Bytes of pool buffers handed out.", func(s *PoolStats) float64 { return float64(s.InUseBytes) }),
		poolCounter("pool_registrations_total", "Registrations made by buffer pools.", func(s *PoolStats) float64 { return float64(s.Registrations) }),
		poolCounter("pool_gets_total", "Buffers handed out by buffer pools.", func(s *PoolStats) float64 { return float64(s.Gets) }),
		poolCounter("pool_registrations_avoided_total", "Buffers handed out without a registration.", func(s *PoolStats) float64 { return float64(s.RegistrationsAvoided) }),
	}
)

func newDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc("nprdma_fabric_"+name, help, []string{"device"}, nil)
}

func gauge(name, help string, v func(*Stats) float64) metricDesc {
	return metricDesc{desc: newDesc(name, help), kind: prometheus.GaugeValue, value: v}
}

func counter(name, help string, v func(*Stats) float64) metricDesc {
	return metricDesc{desc: newDesc(name, help), kind: prometheus.CounterValue, value: v}
}

func poolGauge(name, help string, v func(*PoolStats) float64) metricDesc {
	return metricDesc{desc: newDesc(name, help), kind: prometheus.GaugeValue, poolVal: v}
}

func poolCounter(name, help string, v func(*PoolStats) float64) metricDesc {
	return metricDesc{desc: newDesc(name, help), kind: prometheus.CounterValue, poolVal: v}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range deviceMetrics {
		ch <- m.desc
	}
	if len(c.pools) > 0 {
		for _, m := range poolMetrics {
			ch <- m.desc
		}
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.dev.Stats()
	for _, m := range deviceMetrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(&s), c.dev.name)
	}
	if len(c.pools) == 0 {
		return
	}
	var total PoolStats
	for _, p := range c.pools {
		ps := p.Stats()
		total.Slabs += ps.Slabs
		total.BytesRegistered += ps.BytesRegistered
		total.InUseBytes += ps.InUseBytes
		total.Registrations += ps.Registrations
		total.Gets += ps.Gets
		total.RegistrationsAvoided += ps.RegistrationsAvoided
	}
	for _, m := range poolMetrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.poolVal(&total), c.dev.name)
	}
}
