package nbd

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the server's Prometheus collectors. A nil *metrics records
// nothing, so the server calls it unconditionally.
type metrics struct {
	connections prometheus.Gauge
	handshakes  *prometheus.CounterVec
	requests    *prometheus.CounterVec
	errors      *prometheus.CounterVec
	handoffs    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nprdma_nbd_connections",
			Help: "NBD connections in the transmission phase.",
		}),
		handshakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nprdma_nbd_handshakes_total",
			Help: "NBD handshakes by outcome (transmission, abort, error, shutdown).",
		}, []string{"result"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nprdma_nbd_requests_total",
			Help: "NBD requests served, by command.",
		}, []string{"command"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nprdma_nbd_request_errors_total",
			Help: "NBD requests answered with an error, by command and NBD error value.",
		}, []string{"command", "error"}),
		handoffs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nprdma_nbd_handoffs_total",
			Help: "NBD requests whose goroutine handed the reading of the next request to another before serving them (more than one in flight, or slow); the others were served by the goroutine that read them.",
		}),
	}
	for _, c := range []prometheus.Collector{m.connections, m.handshakes, m.requests, m.errors, m.handoffs} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("nbd metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) connected(delta float64) {
	if m != nil {
		m.connections.Add(delta)
	}
}

func (m *metrics) handshake(result string) {
	if m != nil {
		m.handshakes.WithLabelValues(result).Inc()
	}
}

func (m *metrics) request(cmd uint16, errno uint32) {
	if m == nil {
		return
	}
	name := "unknown" // clients choose the value: keep the label set bounded
	if cmd <= CmdResize {
		name = CommandName(cmd)
	}
	m.requests.WithLabelValues(name).Inc()
	if errno != 0 {
		m.errors.WithLabelValues(name, ErrorName(errno)).Inc()
	}
}

func (m *metrics) handoff() {
	if m != nil {
		m.handoffs.Inc()
	}
}

// ErrorName names an NBD error value.
func ErrorName(errno uint32) string {
	switch errno {
	case EPERM:
		return "EPERM"
	case EIO:
		return "EIO"
	case ENOMEM:
		return "ENOMEM"
	case EINVAL:
		return "EINVAL"
	case ENOSPC:
		return "ENOSPC"
	case EOVERFLOW:
		return "EOVERFLOW"
	case ENOTSUP:
		return "ENOTSUP"
	case ESHUTDOWN:
		return "ESHUTDOWN"
	}
	return fmt.Sprintf("error %d", errno)
}
