package target

import (
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nvme"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the target's Prometheus series (nprdma_target_*), with the
// fabric's collector on the same registry.
type metrics struct {
	commands    *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	controllers prometheus.Gauge
	connections prometheus.Gauge
	inline      *prometheus.CounterVec
	handedOff   *prometheus.CounterVec
	refused     prometheus.Counter
	kaExpired   prometheus.Counter
	replaced    prometheus.Counter
	auths       *prometheus.CounterVec

	// Fencing of failed queues (fence.go).
	held         prometheus.Gauge
	heldTimeouts prometheus.Counter
	fenceDropped prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, t *Target) (*metrics, error) {
	m := &metrics{
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nprdma_target_commands_total",
			Help: "Commands completed, by command and status.",
		}, []string{"opcode", "status"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "nprdma_target_command_latency_seconds",
			Help:    "Time from a command's arrival to its completion being posted, by command.",
			Buckets: prometheus.ExponentialBuckets(2e-6, 2, 22),
		}, []string{"opcode"}),
		inline: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nprdma_target_commands_inline_total",
			Help: "Commands executed on their queue's receive loop, by command: they completed without waiting (a resident read, a cached write of in-capsule data into resident pages, admin commands that read or set controller state).",
		}, []string{"opcode"}),
		handedOff: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nprdma_target_commands_handed_off_total",
			Help: "Commands executed by a worker goroutine of their queue, by command: they may wait (a fault, a flush, a write through, host data to fetch, a write held by a failed queue's change).",
		}, []string{"opcode"}),
		controllers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nprdma_target_controllers", Help: "Controllers alive (I/O and discovery).",
		}),
		connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nprdma_target_connections", Help: "Queues (queue pairs) connected.",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nprdma_target_hosts_refused_total", Help: "Connects refused because the host is not allowed.",
		}),
		kaExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nprdma_target_keepalive_expired_total", Help: "Controllers torn down by their keep-alive timeout.",
		}),
		replaced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nprdma_target_controllers_replaced_total",
			Help: "Controllers torn down because their host connected a replacement naming them (their link failed silently).",
		}),
		auths: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nprdma_target_authentications_total",
			Help: "DH-HMAC-CHAP transactions that ended, by result (success or failure).",
		}, []string{"result"}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nprdma_target_commands_held",
			Help: "Commands waiting now for a command of their host's failed queue that still changes the same blocks.",
		}),
		heldTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nprdma_target_held_timeouts_total",
			Help: "Commands failed with Namespace Not Ready after waiting the fence timeout for a failed queue's command.",
		}),
		fenceDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nprdma_target_fenced_commands_dropped_total",
			Help: "Commands of a failed queue dropped before they changed a namespace (never acknowledged).",
		}),
	}
	// The metadata store's state (meta.go): 1 while it works or without a
	// data directory, 0 from its first failure on.
	metaHealthy := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "nprdma_target_metadata_healthy",
		Help: "1 while the metadata store works (or there is none), 0 once a write or probe of it failed: host-list and namespace changes are refused, block I/O is served.",
	}, func() float64 {
		if t.meta != nil && t.meta.failed() != nil {
			return 0
		}
		return 1
	})
	metaErrors := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "nprdma_target_metadata_write_errors_total",
		Help: "Metadata writes (and directory probes) that failed, and writes refused because the metadata store had failed.",
	}, func() float64 {
		if t.meta == nil {
			return 0
		}
		return float64(t.meta.writeErrors.Load())
	})
	for _, c := range []prometheus.Collector{m.commands, m.latency, m.inline, m.handedOff, m.controllers, m.connections, m.refused, m.kaExpired,
		m.replaced, m.auths, m.held, m.heldTimeouts, m.fenceDropped, metaHealthy, metaErrors, nprdma.NewPrometheusCollector(t.dev, t.pool),
		newFrameCollector(t)} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) observe(opcode string, st nvme.Status, d time.Duration) {
	name := st.Code().Name()
	if name == "" {
		name = "unknown"
	}
	m.commands.WithLabelValues(opcode, name).Inc()
	m.latency.WithLabelValues(opcode).Observe(d.Seconds())
}
