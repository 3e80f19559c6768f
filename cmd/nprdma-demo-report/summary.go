package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
)

// modeRun is what the demo measured through one attachment.
type modeRun struct {
	mode   string // directory name: nbd, fuse
	title  string // column heading
	how    string // second heading line
	verify fioJob
	read   fioJob
	// Snapshots of the target's metrics before and after the jobs, and of
	// the attach process's around the random reads.
	targetStart, targetEnd metrics
	initMid, initEnd       metrics
}

// demoRun is a whole demo run.
type demoRun struct {
	env        map[string]string
	modes      []modeRun
	rss, peak  int64
	resident   float64 // bytes of the region resident at the end
	skipped    []string
	namespace  int64
	budget     int64
	readPhase  string
	verifyDesc string
}

func loadEnv(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s: %q is not KEY=VALUE", path, line)
		}
		env[k] = v
	}
	return env, nil
}

// loadRun reads a demo run's directory (see the package comment).
func loadRun(dir string) (*demoRun, error) {
	env, err := loadEnv(filepath.Join(dir, "run.env"))
	if err != nil {
		return nil, err
	}
	r := &demoRun{env: env, verifyDesc: env["VERIFY_JOB"], readPhase: env["READ_JOB"]}
	if r.namespace, err = strconv.ParseInt(env["NAMESPACE_BYTES"], 10, 64); err != nil {
		return nil, fmt.Errorf("run.env: NAMESPACE_BYTES: %w", err)
	}
	if r.budget, err = strconv.ParseInt(env["BUDGET_BYTES"], 10, 64); err != nil {
		return nil, fmt.Errorf("run.env: BUDGET_BYTES: %w", err)
	}
	for _, m := range []struct{ dir, title, how, use string }{
		{"nbd", "NBD socket", "fio nbd engine", env["NBD_USE"]},
		{"fuse", env["FUSE_USE"], "FUSE + loop, libaio", env["FUSE_USE"]},
	} {
		if why, ok := env[strings.ToUpper(m.dir)+"_SKIPPED"]; ok {
			r.skipped = append(r.skipped, fmt.Sprintf("%s mode skipped: %s", m.dir, why))
			continue
		}
		mr := modeRun{mode: m.dir, title: m.title, how: m.how}
		d := filepath.Join(dir, m.dir)
		if mr.verify, err = loadFio(filepath.Join(d, "fio-verify.json")); err != nil {
			return nil, err
		}
		if mr.read, err = loadFio(filepath.Join(d, "fio-read.json")); err != nil {
			return nil, err
		}
		for _, f := range []struct {
			name string
			into *metrics
		}{{"target-start.prom", &mr.targetStart}, {"target-end.prom", &mr.targetEnd},
			{"initiator-mid.prom", &mr.initMid}, {"initiator-end.prom", &mr.initEnd}} {
			if *f.into, err = loadMetrics(filepath.Join(d, f.name)); err != nil {
				return nil, err
			}
		}
		r.modes = append(r.modes, mr)
	}
	if len(r.modes) == 0 {
		return nil, errors.New("no mode was measured")
	}
	status, err := os.ReadFile(filepath.Join(dir, "target-status"))
	if err != nil {
		return nil, err
	}
	if r.rss, r.peak, err = parseStatus(status); err != nil {
		return nil, err
	}
	last := r.modes[len(r.modes)-1].targetEnd
	r.resident = last.sum("nprdma_swap_resident_pages") * 4096
	return r, nil
}

func loadFio(path string) (fioJob, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return fioJob{}, err
	}
	j, err := parseFio(data)
	if err != nil {
		return fioJob{}, fmt.Errorf("%s: %w", path, err)
	}
	return j, nil
}

func loadMetrics(path string) (metrics, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m, err := parseMetrics(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

func (r *demoRun) print(w io.Writer) {
	fmt.Fprintln(w, "nprdma demo: summary")
	fmt.Fprintln(w, "====================")
	fmt.Fprintf(w, "Target: one %s namespace (a sparse file) with a DRAM budget of %s: the namespace is %.0fx the memory.\n",
		bytesText(float64(r.namespace)), bytesText(float64(r.budget)), float64(r.namespace)/float64(r.budget))
	if len(r.modes) > 1 {
		fmt.Fprintln(w, "Both attachments use that namespace, each its own range.")
	}
	for _, s := range r.skipped {
		fmt.Fprintln(w, s)
	}
	fmt.Fprintln(w)

	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	row := func(label string, cell func(m modeRun) string) {
		cells := []string{label}
		for _, m := range r.modes {
			cells = append(cells, cell(m))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	row("", func(m modeRun) string { return m.title })
	row("", func(m modeRun) string { return "(" + m.how + ")" })
	row("Random writes, then verified reads", func(modeRun) string { return "" })
	if r.verifyDesc != "" {
		row("  ("+r.verifyDesc+")", func(modeRun) string { return "" })
	}
	row("  written / read back and verified", func(m modeRun) string {
		status := "verified OK"
		if m.verify.Error != 0 {
			status = fmt.Sprintf("fio error %d", m.verify.Error)
		}
		return fmt.Sprintf("%s / %s, %s", bytesText(float64(m.verify.Write.IOBytes)), bytesText(float64(m.verify.Read.IOBytes)), status)
	})
	row("  write / verify throughput", func(m modeRun) string {
		return bytesText(m.verify.Write.BWBytes) + "/s / " + bytesText(m.verify.Read.BWBytes) + "/s"
	})
	row("Random reads", func(modeRun) string { return "" })
	if r.readPhase != "" {
		row("  ("+r.readPhase+")", func(modeRun) string { return "" })
	}
	row("  IOPS", func(m modeRun) string { return countText(m.read.Read.IOPS) })
	row("  latency p50 / p99", func(m modeRun) string {
		return durText(m.read.Read.percentile("50.000000")) + " / " + durText(m.read.Read.percentile("99.000000"))
	})
	initDelta := func(m modeRun, name string) float64 { return m.initEnd.sum(name) - m.initMid.sum(name) }
	targetDelta := func(from, to metrics, name string, match ...string) float64 {
		return to.sum(name, match...) - from.sum(name, match...)
	}
	row("  reads served wholly one-sided", func(m modeRun) string {
		reads, one := initDelta(m, "nprdma_initiator_reads_total"), initDelta(m, "nprdma_initiator_reads_one_sided_total")
		return fmt.Sprintf("%s (%s of %s)", pct(one, reads), countText(one), countText(reads))
	})
	row("  pages not resident (magic page seen)", func(m modeRun) string {
		return countText(initDelta(m, "nprdma_initiator_suspected_faults_total"))
	})
	row("  ... re-read two-sided: major / minor", func(m modeRun) string {
		return countText(initDelta(m, "nprdma_initiator_major_faults_total")) + " / " + countText(initDelta(m, "nprdma_initiator_minor_faults_total"))
	})
	row("  false positives (data equal to magic)", func(m modeRun) string {
		return countText(initDelta(m, "nprdma_initiator_false_positives_total"))
	})
	row("Target, over both jobs", func(modeRun) string { return "" })
	row("  one-sided READs served (no NVMe command)", func(m modeRun) string {
		return countText(targetDelta(m.targetStart, m.targetEnd, "nprdma_fabric_one_sided_reads_total"))
	})
	row("  page faults major / minor", func(m modeRun) string {
		return countText(targetDelta(m.targetStart, m.targetEnd, "nprdma_swap_faults_total", "kind", "major")) + " / " +
			countText(targetDelta(m.targetStart, m.targetEnd, "nprdma_swap_faults_total", "kind", "minor"))
	})
	row("  pages evicted / written back", func(m modeRun) string {
		return countText(targetDelta(m.targetStart, m.targetEnd, "nprdma_swap_evictions_total")) + " / " +
			countText(targetDelta(m.targetStart, m.targetEnd, "nprdma_swap_writebacks_total"))
	})
	tw.Flush()

	fmt.Fprintln(w)
	fmt.Fprintf(w, "Target memory: RSS %s (peak %s) with a budget of %s; %s of the namespace resident at the end.\n",
		bytesText(float64(r.rss)), bytesText(float64(r.peak)), bytesText(float64(r.budget)), bytesText(r.resident))
	fmt.Fprintln(w)
	fmt.Fprintln(w, "What the numbers mean:")
	for _, line := range []string{
		"- A one-sided read is an RDMA READ straight out of the target's memory, with no NVMe command, queue or",
		"  page fault on the target (with an RDMA NIC its CPU would take no part; here software RDMA serves it).",
		"  A read that lands on a page the target has moved to its SSD gets a recognisable \"magic page\" back",
		"  (a suspected fault) and only those pages are read again with a two-sided NVMe Read, for which the",
		"  target brings the page back from its SSD (major fault) or zero-fills it (minor: never written).",
		"- Each range written is larger than the DRAM budget, so some random reads miss the target's memory:",
		"  that is the share that is not one-sided. The data still verifies: every byte came back right.",
		"- The target's RSS stays near its budget although far more was written: cold pages live on the SSD.",
		"  (RSS also counts the Go runtime, buffers and metadata on top of the resident pages.)",
		"- Latencies are at queue depth 32 on 2 vCPUs shared by fio, the initiators and the target, so they are",
		"  mostly queueing, and a miss costs an SSD read. Software RDMA over TCP stands in for a real NIC here.",
	} {
		fmt.Fprintln(w, line)
	}
}

func bytesText(n float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	s := strconv.FormatFloat(n, 'f', 1, 64)
	return strings.TrimSuffix(s, ".0") + " " + units[i]
}

func countText(n float64) string {
	switch {
	case n >= 1e6:
		return strconv.FormatFloat(n/1e6, 'f', 2, 64) + "M"
	case n >= 1e4:
		return strconv.FormatFloat(n/1e3, 'f', 1, 64) + "k"
	}
	return strconv.FormatFloat(n, 'f', 0, 64)
}

func durText(s float64) string {
	switch {
	case s < 0:
		return "n/a"
	case s < 1e-3:
		return strconv.FormatFloat(s*1e6, 'f', 0, 64) + " µs"
	case s < 1:
		return strconv.FormatFloat(s*1e3, 'f', 1, 64) + " ms"
	}
	return strconv.FormatFloat(s, 'f', 2, 64) + " s"
}

func pct(part, whole float64) string {
	if whole == 0 {
		return "n/a"
	}
	return strconv.FormatFloat(100*part/whole, 'f', 1, 64) + "%"
}
