package main

import (
	"fmt"
	"net/http"

	"github.com/nprdma/nprdma/internal/command"
	"github.com/nprdma/nprdma/target"
	"github.com/prometheus/client_golang/prometheus"
)

// metricsHandler serves, on --metrics-addr, the Prometheus metrics at
// /metrics and every other path, and two plain-text states for service
// managers and alerts (docs/target.md §9):
//
//   - /healthz: 200 "ok" while everything the target runs on works; 503
//     with the cause once the metadata store failed. Block I/O is still
//     served then: it says an operator must act, not that the process is
//     dead, so it suits alerting rather than a liveness probe that
//     restarts (a restart on the same failed directory fails to start).
//   - /readyz: 200 "ready" while hosts may connect; 503 "shutting down"
//     from SIGTERM on (the server keeps answering until the exit).
func metricsHandler(reg *prometheus.Registry, tg *target.Target) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", command.MetricsHandler(reg))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if f := tg.Health().Metadata; f != nil {
			http.Error(w, fmt.Sprintf("%v: host-list and namespace changes are refused and a clean shutdown cannot be recorded; block I/O is served; restart on a working data directory", f),
				http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !tg.Health().Serving {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}
