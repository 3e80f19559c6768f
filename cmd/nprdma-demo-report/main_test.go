package main

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseMetrics(t *testing.T) {
	text := `# HELP nprdma_swap_faults_total Faults.
# TYPE nprdma_swap_faults_total counter
nprdma_swap_faults_total{kind="major",nsid="1",subsystem="nqn.x:a"} 120
nprdma_swap_faults_total{kind="minor",nsid="1",subsystem="nqn.x:a"} 3
nprdma_swap_faults_total{kind="major",nsid="2",subsystem="nqn.x:a"} 5 1700000000000
nprdma_initiator_reads_total{subsystem="nqn.x:a"} 1.5e+06
odd_labels{msg="a \"quoted\", \\ back\nslash",other="}"} 7
no_labels 2.5
hist_bucket{le="+Inf"} 9
`
	m, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		match []string
		want  float64
	}{
		{"nprdma_swap_faults_total", nil, 128},
		{"nprdma_swap_faults_total", []string{"kind", "major"}, 125},
		{"nprdma_swap_faults_total", []string{"kind", "major", "nsid", "1"}, 120},
		{"nprdma_swap_faults_total", []string{"kind", "none"}, 0},
		{"nprdma_initiator_reads_total", nil, 1.5e6},
		{"odd_labels", []string{"msg", "a \"quoted\", \\ back\nslash", "other", "}"}, 7},
		{"no_labels", nil, 2.5},
		{"hist_bucket", []string{"le", "+Inf"}, 9},
		{"absent", nil, 0},
	} {
		if got := m.sum(c.name, c.match...); got != c.want {
			t.Errorf("sum(%s, %v) = %v, want %v", c.name, c.match, got, c.want)
		}
	}
	for _, bad := range []string{
		"name_without_value",
		`x{a="1"`,
		`x{a=1} 2`,
		`x{a="1} 2`,
		`x 1 2 3`,
		`x abc`,
	} {
		if _, err := parseMetrics(strings.NewReader(bad + "\n")); err == nil {
			t.Errorf("parseMetrics(%q) accepted", bad)
		}
	}
}

const fioJSON = `fio: multiple writers may overwrite blocks that belong to other jobs. This can cause verification failures.
{
  "fio version" : "fio-3.33",
  "jobs" : [
    {
      "jobname" : "fio-%s",
      "error" : 0,
      "job options" : {"rw" : "randwrite", "bs" : "64k"},
      "read" : {"io_bytes" : %d, "bw_bytes" : %d, "iops" : %f, "runtime" : 20000,
                "clat_ns" : {"percentile" : {"50.000000" : %d, "99.000000" : %d}}},
      "write" : {"io_bytes" : %d, "bw_bytes" : %d, "iops" : 0, "runtime" : 10000,
                 "clat_ns" : {"percentile" : {"50.000000" : 0, "99.000000" : 0}}}
    }
  ]
}
`

func TestParseFio(t *testing.T) {
	j, err := parseFio([]byte(fmt.Sprintf(fioJSON, "read", 1<<30, 50<<20, 12345.6, 2500000, 9800000, 0, 0)))
	if err != nil {
		t.Fatal(err)
	}
	if j.Name != "fio-read" || j.Read.IOBytes != 1<<30 || j.Read.IOPS != 12345.6 || j.Read.percentile("50.000000") != 2.5e-3 ||
		j.Read.percentile("99.900000") != -1 || j.Options["bs"] != "64k" {
		t.Errorf("%+v", j)
	}
	for _, bad := range []string{"", "fio: error\n", `{"jobs": []}`, `{"jobs": [{}, {}]}`, `{"jobs": [`} {
		if _, err := parseFio([]byte(bad)); err == nil {
			t.Errorf("parseFio(%q) accepted", bad)
		}
	}
}

func TestParseStatus(t *testing.T) {
	status := "Name:\tnprdma-target\nVmPeak:\t 9000000 kB\nVmHWM:\t 1200000 kB\nVmRSS:\t 1048576 kB\nThreads:\t12\n"
	rss, peak, err := parseStatus([]byte(status))
	if err != nil || rss != 1<<30 || peak != 1200000<<10 {
		t.Errorf("parseStatus = %d, %d, %v", rss, peak, err)
	}
	for _, bad := range []string{"Name:\tx\n", "VmRSS:\t12 MB\n", "VmRSS:\tx kB\n"} {
		if _, _, err := parseStatus([]byte(bad)); err == nil {
			t.Errorf("parseStatus(%q) accepted", bad)
		}
	}
}

// writeRun lays out a demo run directory the way scripts/demo.sh does.
func writeRun(t *testing.T, skipFUSE bool) string {
	t.Helper()
	dir := t.TempDir()
	env := "NAMESPACE_BYTES=4294967296\nBUDGET_BYTES=1073741824\nVERIFY_JOB=fio randwrite 64 KiB\nREAD_JOB=fio randread 4 KiB, 20 s\n" +
		"NBD_USE=nbd+unix:///demo-nbd?socket=/x.sock\n"
	if skipFUSE {
		env += "FUSE_SKIPPED=not root\n"
	} else {
		env += "FUSE_USE=/dev/loop3\n"
	}
	write := func(name, content string) {
		t.Helper()
		os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("run.env", env)
	write("target-status", "VmHWM:\t 1258291 kB\nVmRSS:\t 1153434 kB\n")
	for i, mode := range []string{"nbd", "fuse"} {
		if mode == "fuse" && skipFUSE {
			continue
		}
		k := float64(i + 1) // the second mode's figures are twice the first's
		write(mode+"/fio-verify.json", fmt.Sprintf(fioJSON, "verify", 3<<29, 60<<20, 960.0, 1, 1, 3<<29, 110<<20))
		write(mode+"/fio-read.json", fmt.Sprintf(fioJSON, "read", 1<<28, 32<<20, 12345.0*k, 2100000, 16600000, 0, 0))
		write(mode+"/target-start.prom", "nprdma_swap_faults_total{kind=\"major\"} 1000\nnprdma_swap_evictions_total 10\n"+
			"nprdma_swap_writebacks_total 5\nnprdma_fabric_one_sided_reads_total{device=\"target\"} 0\n")
		write(mode+"/target-end.prom", fmt.Sprintf("nprdma_swap_faults_total{kind=\"major\"} %v\nnprdma_swap_faults_total{kind=\"minor\"} 7\n"+
			"nprdma_swap_evictions_total 600010\nnprdma_swap_writebacks_total 393221\nnprdma_fabric_one_sided_reads_total{device=\"target\"} 181900\n"+
			"nprdma_swap_resident_pages{nsid=\"1\"} 258048\n", 1000+465100*k))
		write(mode+"/initiator-mid.prom", "nprdma_initiator_reads_total{subsystem=\"s\"} 1000\nnprdma_initiator_reads_one_sided_total{subsystem=\"s\"} 500\n")
		write(mode+"/initiator-end.prom", "nprdma_initiator_reads_total{subsystem=\"s\"} 2000\nnprdma_initiator_reads_one_sided_total{subsystem=\"s\"} 1250\n"+
			"nprdma_initiator_suspected_faults_total{subsystem=\"s\"} 250\nnprdma_initiator_major_faults_total{subsystem=\"s\"} 249\n"+
			"nprdma_initiator_minor_faults_total{subsystem=\"s\"} 1\nnprdma_initiator_false_positives_total{subsystem=\"s\"} 0\n")
	}
	return dir
}

func TestSummary(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"summary", writeRun(t, false)}, &out); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{
		"one 4 GiB namespace (a sparse file) with a DRAM budget of 1 GiB: the namespace is 4x the memory",
		"NBD socket", "/dev/loop3",
		"1.5 GiB / 1.5 GiB, verified OK",
		"110 MiB/s / 60 MiB/s",
		"12.3k", "24.7k", // IOPS of the two modes
		"2.1 ms / 16.6 ms",
		"75.0% (750 of 1000)", // one-sided share during the reads: deltas of the initiator's counters
		"249 / 1",
		"465.1k / 7", "930.2k / 7", // target faults: deltas
		"600.0k / 393.2k",
		"RSS 1.1 GiB (peak 1.2 GiB) with a budget of 1 GiB; 1008 MiB of the namespace resident",
		"What the numbers mean:",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("summary lacks %q:\n%s", want, text)
		}
	}

	out.Reset()
	if err := run([]string{"summary", writeRun(t, true)}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "fuse mode skipped: not root") || strings.Contains(out.String(), "/dev/loop3") {
		t.Errorf("summary without the fuse mode:\n%s", out.String())
	}

	// A run with a file missing fails, naming it.
	dir := writeRun(t, false)
	os.Remove(filepath.Join(dir, "fuse", "fio-read.json"))
	if err := run([]string{"summary", dir}, &out); err == nil || !strings.Contains(err.Error(), "fio-read.json") {
		t.Errorf("summary with a missing file: %v", err)
	}
}

func TestScrapeAndRSS(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, "up 1")
	}))
	defer srv.Close()
	file := filepath.Join(t.TempDir(), "m.prom")
	addr := strings.TrimPrefix(srv.URL, "http://")
	if err := run([]string{"scrape", addr, file}, nil); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(file); string(b) != "up 1\n" {
		t.Errorf("scraped %q", b)
	}
	status := filepath.Join(t.TempDir(), "status")
	if err := run([]string{"rss", fmt.Sprint(os.Getpid()), status}, nil); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(status)
	if rss, _, err := parseStatus(b); err != nil || rss <= 0 {
		t.Errorf("rss of this process: %d %v", rss, err)
	}
	if err := run([]string{"summary"}, nil); err == nil || !strings.Contains(err.Error(), "usage") {
		t.Errorf("bad arguments: %v", err)
	}
	var help strings.Builder
	if err := run([]string{"--help"}, &help); err != nil || !strings.HasPrefix(help.String(), "usage:") {
		t.Errorf("--help: %q, %v", help.String(), err)
	}
}
