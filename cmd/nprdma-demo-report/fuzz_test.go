package main

import (
	"bytes"
	"strings"
	"testing"
)

// FuzzParseMetrics feeds arbitrary pages to the Prometheus text parser (the
// summary scrapes them over HTTP): it must return samples or an error, never
// panic, and every sample it returns must have a name and its labels.
func FuzzParseMetrics(f *testing.F) {
	f.Add("nprdma_swap_faults_total{kind=\"major\",nsid=\"1\"} 120\n")
	f.Add("# HELP x y\n# TYPE x counter\nx 1 1700000000000\n")
	f.Add("x{a=\"q\\\"\\\\\\n\",b=\"}\"} +Inf\n")
	f.Add("x{")
	f.Add("{a=\"1\"} 2\n")
	f.Fuzz(func(t *testing.T, page string) {
		m, err := parseMetrics(strings.NewReader(page))
		if err != nil {
			return
		}
		for _, s := range m {
			if s.name == "" || strings.ContainsAny(s.name, "{ \n") || s.labels == nil {
				t.Fatalf("sample %+v from %q", s, page)
			}
		}
	})
}

// FuzzParseFio: fio's output is read from a file fio wrote, but a
// truncated or garbled one must still give an error, not a panic.
func FuzzParseFio(f *testing.F) {
	f.Add([]byte(`{"jobs":[{"jobname":"x","read":{"iops":1,"clat_ns":{"percentile":{"50.000000":1000}}}}]}`))
	f.Add([]byte("fio: warning\n{\"jobs\": [}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		j, err := parseFio(data)
		if err == nil && !bytes.Contains(data, []byte("{")) {
			t.Fatalf("parsed %+v from data without JSON", j)
		}
	})
}
