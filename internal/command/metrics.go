package command

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewRegistry is the registry a command's metrics go to: it also holds the
// Go runtime's and the process's collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// MetricsHandler serves what g gathers in the Prometheus text format.
func MetricsHandler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{})
}

// Endpoint is the HTTP server of --metrics-addr.
type Endpoint struct {
	srv  *http.Server
	addr string
}

// ServeMetrics listens on addr, host:port (port 0: any free one), and
// serves h there until Close.
func ServeMetrics(addr string, h http.Handler) (*Endpoint, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	e := &Endpoint{srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}, addr: ln.Addr().String()}
	go e.srv.Serve(ln)
	return e, nil
}

// Addr is the address the endpoint listens on, with the port it got.
func (e *Endpoint) Addr() string { return e.addr }

// URL is the endpoint's URL for path ("/metrics").
func (e *Endpoint) URL(path string) string { return "http://" + e.addr + path }

// Close stops the endpoint at once: a scrape in progress is cut rather than
// waited for, so that a command's shutdown bound is its own.
func (e *Endpoint) Close() error {
	if err := e.srv.Close(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
