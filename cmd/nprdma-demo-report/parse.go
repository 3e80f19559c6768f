package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// fioResult is the part of fio's JSON output (--output-format=json, one
// group: --group_reporting) the summary uses.
type fioResult struct {
	Jobs []fioJob `json:"jobs"`
}

type fioJob struct {
	Name    string            `json:"jobname"`
	Error   int               `json:"error"`
	Options map[string]string `json:"job options"`
	Read    fioDirection      `json:"read"`
	Write   fioDirection      `json:"write"`
}

type fioDirection struct {
	IOBytes   int64   `json:"io_bytes"`
	BWBytes   float64 `json:"bw_bytes"`
	IOPS      float64 `json:"iops"`
	RuntimeMS int64   `json:"runtime"`
	CLat      struct {
		Percentile map[string]float64 `json:"percentile"`
	} `json:"clat_ns"`
}

// percentile returns the completion latency percentile p ("50.000000")
// in seconds, or -1 when fio did not report it.
func (d fioDirection) percentile(p string) float64 {
	v, ok := d.CLat.Percentile[p]
	if !ok {
		return -1
	}
	return v / 1e9
}

// parseFio reads fio's JSON output. fio may print warnings before the JSON
// ("fio: multiple writers may overwrite blocks..."), so reading starts at
// the first '{'.
func parseFio(data []byte) (fioJob, error) {
	i := bytes.IndexByte(data, '{')
	if i < 0 {
		return fioJob{}, fmt.Errorf("no JSON in fio output")
	}
	var r fioResult
	if err := json.Unmarshal(data[i:], &r); err != nil {
		return fioJob{}, fmt.Errorf("fio output: %w", err)
	}
	if len(r.Jobs) != 1 {
		return fioJob{}, fmt.Errorf("fio output: %d job groups, want 1 (--group_reporting)", len(r.Jobs))
	}
	return r.Jobs[0], nil
}

// sample is one line of the Prometheus text format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// metrics is a scraped page.
type metrics []sample

// parseMetrics reads the Prometheus text exposition format: comments are
// skipped; each sample is NAME[{LABELS}] VALUE [TIMESTAMP].
func parseMetrics(r io.Reader) (metrics, error) {
	var out metrics
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		s, err := parseSample(line)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d: %w", n, err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

func parseSample(line string) (sample, error) {
	s := sample{labels: map[string]string{}}
	i := strings.IndexAny(line, "{ ")
	if i <= 0 {
		return s, fmt.Errorf("no value in %q", line)
	}
	s.name, line = line[:i], line[i:]
	if line[0] == '{' {
		rest, err := parseLabels(line[1:], s.labels)
		if err != nil {
			return s, fmt.Errorf("%s: %w", s.name, err)
		}
		line = rest
	}
	fields := strings.Fields(line)
	if len(fields) == 0 || len(fields) > 2 {
		return s, fmt.Errorf("%s: want a value and an optional timestamp, got %q", s.name, line)
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return s, fmt.Errorf("%s: value: %w", s.name, err)
	}
	s.value = v
	return s, nil
}

// parseLabels reads name="value" pairs up to the closing '}' and returns
// what follows it. Values may contain escaped quotes, backslashes and
// newlines.
func parseLabels(s string, into map[string]string) (string, error) {
	for {
		s = strings.TrimLeft(s, " ,")
		if s == "" {
			return "", fmt.Errorf("labels not closed")
		}
		if s[0] == '}' {
			return s[1:], nil
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return "", fmt.Errorf("bad label in %q", s)
		}
		name := strings.TrimSpace(s[:eq])
		var val strings.Builder
		i := eq + 2
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					val.WriteByte('\n')
				default:
					val.WriteByte(s[i])
				}
				continue
			}
			val.WriteByte(s[i])
		}
		if i >= len(s) {
			return "", fmt.Errorf("label %s: value not closed", name)
		}
		into[name] = val.String()
		s = s[i+1:]
	}
}

// sum adds the samples called name whose labels include every pair of match.
func (m metrics) sum(name string, match ...string) float64 {
	var total float64
next:
	for _, s := range m {
		if s.name != name {
			continue
		}
		for i := 0; i+1 < len(match); i += 2 {
			if s.labels[match[i]] != match[i+1] {
				continue next
			}
		}
		total += s.value
	}
	return total
}

// parseStatus reads the memory figures (kB) of /proc/PID/status.
func parseStatus(data []byte) (rss, peak int64, err error) {
	for _, line := range strings.Split(string(data), "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok || (key != "VmRSS" && key != "VmHWM") {
			continue
		}
		f := strings.Fields(val)
		if len(f) != 2 || f[1] != "kB" {
			return 0, 0, fmt.Errorf("status: %s: %q", key, val)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("status: %s: %w", key, err)
		}
		if key == "VmRSS" {
			rss = kb << 10
		} else {
			peak = kb << 10
		}
	}
	if rss == 0 {
		return 0, 0, fmt.Errorf("status: no VmRSS")
	}
	return rss, peak, nil
}
