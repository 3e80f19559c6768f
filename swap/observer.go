package swap

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Observer receives a region's events. Calls come from many goroutines at
// once and must be cheap. Gauges (resident, dirty, budget) are read through
// Region.Stats instead.
type Observer interface {
	// FaultDone: one page was faulted in through the explicit API.
	FaultDone(kind FaultKind, d time.Duration)
	// Evicted: pages were released.
	Evicted(pages int)
	// WroteBack: one write of pages consecutive pages to the backing device
	// ended, taking d, with err (nil on success).
	WroteBack(pages int, d time.Duration, err error)
	// ReclaimStalled: an operation waited d for memory (direct reclaim).
	ReclaimStalled(d time.Duration)
}

// regionAttacher is implemented by observers that read gauges from the
// regions they observe; New and Close attach and detach them.
type regionAttacher interface {
	attach(r *Region)
	detach(r *Region)
}

type nopObserver struct{}

func (nopObserver) FaultDone(FaultKind, time.Duration)  {}
func (nopObserver) Evicted(int)                         {}
func (nopObserver) WroteBack(int, time.Duration, error) {}
func (nopObserver) ReclaimStalled(time.Duration)        {}

// PrometheusObserver exports a region's events and gauges as nprdma_swap_*
// metrics. Use one per region (or per set of regions whose gauges should be
// summed) and pass it with WithObserver.
type PrometheusObserver struct {
	faults       *prometheus.CounterVec
	faultLatency *prometheus.HistogramVec
	evictions    prometheus.Counter
	writebacks   prometheus.Counter
	wbErrors     prometheus.Counter
	wbLatency    prometheus.Histogram
	stalls       prometheus.Counter
	stallSeconds prometheus.Histogram
	minor, major prometheus.Counter

	mu      sync.Mutex
	regions map[*Region]struct{}

	residentDesc, dirtyDesc, budgetDesc, uffdDesc *prometheus.Desc
}

// NewPrometheusObserver registers the swap metrics on reg, with constLabels
// (for example the namespace) on every series.
func NewPrometheusObserver(reg prometheus.Registerer, constLabels prometheus.Labels) (*PrometheusObserver, error) {
	// Faults take microseconds (minor) to a few hundred (major); stalls and
	// writebacks up to seconds when the device struggles.
	latency := prometheus.ExponentialBuckets(1e-6, 2, 22)
	o := &PrometheusObserver{
		faults: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nprdma_swap_faults_total", ConstLabels: constLabels,
			Help: "Pages faulted in through the explicit API, by kind (minor: zero page; major: backing read).",
		}, []string{"kind"}),
		faultLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "nprdma_swap_fault_latency_seconds", ConstLabels: constLabels, Buckets: latency,
			Help: "Time to fault a page in, by kind.",
		}, []string{"kind"}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nprdma_swap_evictions_total", ConstLabels: constLabels,
			Help: "Pages evicted (released from memory).",
		}),
		writebacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nprdma_swap_writebacks_total", ConstLabels: constLabels,
			Help: "Pages written back to the backing device.",
		}),
		wbErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nprdma_swap_writeback_errors_total", ConstLabels: constLabels,
			Help: "Pages whose writeback failed (they stay dirty and are retried).",
		}),
		wbLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "nprdma_swap_writeback_latency_seconds", ConstLabels: constLabels, Buckets: latency,
			Help: "Time of one writeback I/O (up to 32 consecutive pages).",
		}),
		stalls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nprdma_swap_reclaim_stalls_total", ConstLabels: constLabels,
			Help: "Operations that had to evict synchronously before they could proceed.",
		}),
		stallSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "nprdma_swap_reclaim_stall_seconds", ConstLabels: constLabels, Buckets: latency,
			Help: "Time operations waited for memory.",
		}),
		regions: make(map[*Region]struct{}),
		residentDesc: prometheus.NewDesc("nprdma_swap_resident_pages",
			"Resident pages (including in-flight fault reservations).", nil, constLabels),
		dirtyDesc: prometheus.NewDesc("nprdma_swap_dirty_pages",
			"Pages newer than the backing device.", nil, constLabels),
		budgetDesc: prometheus.NewDesc("nprdma_swap_budget_pages",
			"DRAM budget in pages.", nil, constLabels),
		uffdDesc: prometheus.NewDesc("nprdma_swap_uffd_faults_total",
			"Faults on the raw view served by the userfaultfd threads, by kind.", []string{"kind"}, constLabels),
	}
	o.minor = o.faults.WithLabelValues(FaultMinor.String())
	o.major = o.faults.WithLabelValues(FaultMajor.String())
	for _, c := range []prometheus.Collector{o.faults, o.faultLatency, o.evictions, o.writebacks,
		o.wbErrors, o.wbLatency, o.stalls, o.stallSeconds, (*regionCollector)(o)} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return o, nil
}

func (o *PrometheusObserver) FaultDone(kind FaultKind, d time.Duration) {
	if kind == FaultMajor {
		o.major.Inc()
	} else {
		o.minor.Inc()
	}
	o.faultLatency.WithLabelValues(kind.String()).Observe(d.Seconds())
}

func (o *PrometheusObserver) Evicted(pages int) { o.evictions.Add(float64(pages)) }

func (o *PrometheusObserver) WroteBack(pages int, d time.Duration, err error) {
	o.wbLatency.Observe(d.Seconds())
	if err != nil {
		o.wbErrors.Add(float64(pages))
		return
	}
	o.writebacks.Add(float64(pages))
}

func (o *PrometheusObserver) ReclaimStalled(d time.Duration) {
	o.stalls.Inc()
	o.stallSeconds.Observe(d.Seconds())
}

func (o *PrometheusObserver) attach(r *Region) {
	o.mu.Lock()
	o.regions[r] = struct{}{}
	o.mu.Unlock()
}

func (o *PrometheusObserver) detach(r *Region) {
	o.mu.Lock()
	delete(o.regions, r)
	o.mu.Unlock()
}

// regionCollector reports the gauges of the attached regions, summed.
type regionCollector PrometheusObserver

func (c *regionCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.residentDesc
	ch <- c.dirtyDesc
	ch <- c.budgetDesc
	ch <- c.uffdDesc
}

func (c *regionCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	var resident, dirty, budget int64
	var uffdMinor, uffdMajor uint64
	for r := range c.regions {
		st := r.Stats()
		resident += st.Resident
		dirty += st.Dirty
		budget += st.Budget
		uffdMinor += st.UffdMinorFaults
		uffdMajor += st.UffdMajorFaults
	}
	c.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.residentDesc, prometheus.GaugeValue, float64(resident))
	ch <- prometheus.MustNewConstMetric(c.dirtyDesc, prometheus.GaugeValue, float64(dirty))
	ch <- prometheus.MustNewConstMetric(c.budgetDesc, prometheus.GaugeValue, float64(budget))
	ch <- prometheus.MustNewConstMetric(c.uffdDesc, prometheus.CounterValue, float64(uffdMinor), "minor")
	ch <- prometheus.MustNewConstMetric(c.uffdDesc, prometheus.CounterValue, float64(uffdMajor), "major")
}
