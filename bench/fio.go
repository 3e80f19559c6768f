package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Fio runs fio, the reference every I/O figure of the project is compared
// with. The zero value finds fio in PATH and does not pin it.
type Fio struct {
	// Path is the fio binary ("" = look it up in PATH).
	Path string
	// CPUs pins fio (and the job processes it forks, which inherit its mask).
	CPUs []int
	// SampleInterval is how often the CPU placement of fio is sampled
	// (100 ms if 0).
	SampleInterval time.Duration
}

// RunFio runs fio with args and parses its JSON output. Unless args choose an
// output format, --output-format=json+ is added: it is json plus the latency
// histogram bins, from which the report draws fio's CDFs.
func RunFio(ctx context.Context, args ...string) (FioResult, error) {
	return Fio{}.Run(ctx, args...)
}

// Run runs fio with args and parses its JSON output.
func (f Fio) Run(ctx context.Context, args ...string) (FioResult, error) {
	path := f.Path
	if path == "" {
		var err error
		if path, err = FindTool("fio"); err != nil {
			return FioResult{}, err
		}
	}
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--output-format") }) {
		args = append(args, "--output-format=json+")
	}
	cmd := exec.CommandContext(ctx, path, args...)
	// On cancellation fio gets SIGINT, which it handles by stopping its job
	// processes; SIGKILL would orphan them.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) }
	cmd.WaitDelay = 15 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := StartPinned(cmd, f.CPUs); err != nil {
		return FioResult{}, fmt.Errorf("start fio: %w", err)
	}
	sampler := StartCPUSampler(cmd.Process.Pid, f.SampleInterval)
	werr := cmd.Wait()
	placement := sampler.Stop()
	placement.Role, placement.Pinned = "fio", len(f.CPUs) > 0
	if werr != nil {
		if ctx.Err() != nil {
			return FioResult{}, fmt.Errorf("fio %s: %w", strings.Join(args, " "), ctx.Err())
		}
		return FioResult{}, fmt.Errorf("fio %s: %w: %s", strings.Join(args, " "), werr, strings.TrimSpace(tail(stderr.Bytes(), 600)))
	}
	res, err := ParseFioJSON(stdout.Bytes())
	if err != nil {
		return res, fmt.Errorf("fio %s: %w", strings.Join(args, " "), err)
	}
	res.Placement = placement
	for _, j := range res.Jobs {
		if j.Error != 0 {
			return res, fmt.Errorf("fio job %s: error %d (%s): %s", j.Name, j.Error, syscall.Errno(j.Error), strings.TrimSpace(tail(stderr.Bytes(), 600)))
		}
	}
	return res, nil
}

// FioResult is fio's JSON report.
type FioResult struct {
	Version string
	Jobs    []FioJob
	// Raw is fio's output as it came (notes fio prints before the JSON
	// included), kept so that callers can store it next to the results.
	Raw []byte
	// Placement is where fio's processes ran (RunFio only).
	Placement Placement
}

// FioJob is one job of a fio report (or one group with group_reporting).
type FioJob struct {
	Name      string
	GroupID   int
	Error     int
	RuntimeMS int64
	UsrCPU    float64 // percent
	SysCPU    float64 // percent
	Options   map[string]string
	Read      FioIO
	Write     FioIO
	Trim      FioIO
}

// FioIO is one direction of a job.
type FioIO struct {
	IOPS           float64
	BandwidthBytes float64 // bytes per second
	IOBytes        int64
	TotalIOs       int64
	RuntimeMS      int64
	// P50 and P99 are the completion latency percentiles (clat).
	P50, P99 time.Duration
	Clat     FioLatency // completion latency: submission to completion
	Lat      FioLatency // total latency (percentiles only with lat_percentiles=1)
}

// FioLatency is a latency distribution as fio reports it.
type FioLatency struct {
	N              int64
	Min, Max, Mean time.Duration
	// Percentiles are fio's own, sorted by P. fio computes them from
	// log-linear buckets, so each value is within ~1.6% of the exact one.
	Percentiles []FioPercentile
	// Bins is the histogram behind them (json+ output only), sorted by latency.
	Bins []HistogramBin
}

// FioPercentile is one entry of fio's percentile list.
type FioPercentile struct {
	P     float64
	Value time.Duration
}

// Percentile returns the p-th percentile: fio's own value when p is in its
// list, else one computed from the histogram bins when present.
func (l FioLatency) Percentile(p float64) (time.Duration, bool) {
	for _, q := range l.Percentiles {
		if math.Abs(q.P-p) < 1e-6 {
			return q.Value, true
		}
	}
	if len(l.Bins) > 0 {
		return HistogramPercentile(l.Bins, p), true
	}
	return 0, false
}

// CDF returns CDF points (x in µs) from the histogram bins, or from the
// percentile list when there are no bins.
func (l FioLatency) CDF(points int) []Point {
	if len(l.Bins) > 0 {
		return HistogramCDF(l.Bins, points)
	}
	out := make([]Point, 0, len(l.Percentiles))
	for _, q := range l.Percentiles {
		out = append(out, Point{X: Micros(q.Value), Y: q.P / 100})
	}
	return out
}

// Job returns the job named name.
func (r FioResult) Job(name string) (FioJob, bool) {
	for _, j := range r.Jobs {
		if j.Name == name {
			return j, true
		}
	}
	return FioJob{}, false
}

// GroupRead merges the reads of every job in group gid: the figures of a
// group whose jobs were reported separately (no group_reporting).
func (r FioResult) GroupRead(gid int) FioIO {
	var ios []FioIO
	for _, j := range r.Jobs {
		if j.GroupID == gid {
			ios = append(ios, j.Read)
		}
	}
	return MergeFioIO(ios...)
}

// MergeFioIO combines several jobs' figures of one direction as if one job
// had done all their I/O at the same time: IOPS and bandwidth add up, and the
// latency distribution is the merged histogram (percentiles are recomputed
// from it; without bins they cannot be combined and are left empty unless
// there is only one input).
func MergeFioIO(ios ...FioIO) FioIO {
	switch len(ios) {
	case 0:
		return FioIO{}
	case 1:
		return ios[0]
	}
	var m FioIO
	for _, io := range ios {
		m.IOPS += io.IOPS
		m.BandwidthBytes += io.BandwidthBytes
		m.IOBytes += io.IOBytes
		m.TotalIOs += io.TotalIOs
		m.RuntimeMS = max(m.RuntimeMS, io.RuntimeMS)
	}
	m.Clat = mergeLatency(func(io FioIO) FioLatency { return io.Clat }, ios)
	m.Lat = mergeLatency(func(io FioIO) FioLatency { return io.Lat }, ios)
	m.P50, _ = m.Clat.Percentile(50)
	m.P99, _ = m.Clat.Percentile(99)
	return m
}

// standardPercentiles are the levels recomputed for merged histograms.
var standardPercentiles = []float64{1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99, 99.5, 99.9, 99.95, 99.99}

func mergeLatency(get func(FioIO) FioLatency, ios []FioIO) FioLatency {
	var m FioLatency
	var weighted float64
	bins := map[time.Duration]int64{}
	allBins := true
	for _, io := range ios {
		l := get(io)
		if l.N == 0 {
			continue
		}
		if m.N == 0 || l.Min < m.Min {
			m.Min = l.Min
		}
		m.Max = max(m.Max, l.Max)
		m.N += l.N
		weighted += float64(l.Mean) * float64(l.N)
		if len(l.Bins) == 0 {
			allBins = false
		}
		for _, b := range l.Bins {
			bins[b.Latency] += b.Count
		}
	}
	if m.N == 0 {
		return m
	}
	m.Mean = time.Duration(weighted / float64(m.N))
	if allBins && len(bins) > 0 {
		m.Bins = sortedBins(bins)
		for _, p := range standardPercentiles {
			m.Percentiles = append(m.Percentiles, FioPercentile{P: p, Value: HistogramPercentile(m.Bins, p)})
		}
	}
	return m
}

func sortedBins(bins map[time.Duration]int64) []HistogramBin {
	out := make([]HistogramBin, 0, len(bins))
	for lat, n := range bins {
		out = append(out, HistogramBin{Latency: lat, Count: n})
	}
	slices.SortFunc(out, func(a, b HistogramBin) int { return int(a.Latency - b.Latency) })
	return out
}

// The JSON shapes fio 3.x writes.
type fioJSON struct {
	Version string       `json:"fio version"`
	Jobs    []fioJobJSON `json:"jobs"`
}

type fioJobJSON struct {
	Name       string         `json:"jobname"`
	GroupID    int            `json:"groupid"`
	Error      int            `json:"error"`
	JobRuntime int64          `json:"job_runtime"`
	UsrCPU     float64        `json:"usr_cpu"`
	SysCPU     float64        `json:"sys_cpu"`
	Options    map[string]any `json:"job options"`
	Read       fioIOJSON      `json:"read"`
	Write      fioIOJSON      `json:"write"`
	Trim       fioIOJSON      `json:"trim"`
}

type fioIOJSON struct {
	IOBytes  int64      `json:"io_bytes"`
	BWBytes  float64    `json:"bw_bytes"`
	IOPS     float64    `json:"iops"`
	Runtime  int64      `json:"runtime"`
	TotalIOs int64      `json:"total_ios"`
	Clat     fioLatJSON `json:"clat_ns"`
	Lat      fioLatJSON `json:"lat_ns"`
}

type fioLatJSON struct {
	Min        float64            `json:"min"`
	Max        float64            `json:"max"`
	Mean       float64            `json:"mean"`
	N          int64              `json:"N"`
	Percentile map[string]float64 `json:"percentile"`
	Bins       map[string]int64   `json:"bins"`
}

// ParseFioJSON parses fio's --output-format=json or json+ output. fio may
// print notes ("note: both iodepth >= 1 and synchronous I/O engine ...")
// before the JSON document; they are skipped.
func ParseFioJSON(out []byte) (FioResult, error) {
	start := bytes.Index(out, []byte("\n{"))
	if bytes.HasPrefix(out, []byte("{")) {
		start = 0
	} else if start >= 0 {
		start++
	}
	if start < 0 {
		return FioResult{Raw: out}, fmt.Errorf("no JSON document in fio output: %q", head(out, 300))
	}
	var doc fioJSON
	dec := json.NewDecoder(bytes.NewReader(out[start:]))
	if err := dec.Decode(&doc); err != nil {
		return FioResult{Raw: out}, fmt.Errorf("fio JSON: %w", err)
	}
	if doc.Version == "" && doc.Jobs == nil {
		return FioResult{Raw: out}, errors.New("fio JSON: neither a version nor jobs: not fio output")
	}
	res := FioResult{Version: doc.Version, Raw: out}
	for _, j := range doc.Jobs {
		job := FioJob{Name: j.Name, GroupID: j.GroupID, Error: j.Error, RuntimeMS: j.JobRuntime,
			UsrCPU: j.UsrCPU, SysCPU: j.SysCPU, Options: map[string]string{}}
		for k, v := range j.Options {
			job.Options[k] = fmt.Sprint(v)
		}
		var err error
		if job.Read, err = j.Read.convert(); err != nil {
			return res, fmt.Errorf("fio job %s read: %w", j.Name, err)
		}
		if job.Write, err = j.Write.convert(); err != nil {
			return res, fmt.Errorf("fio job %s write: %w", j.Name, err)
		}
		if job.Trim, err = j.Trim.convert(); err != nil {
			return res, fmt.Errorf("fio job %s trim: %w", j.Name, err)
		}
		res.Jobs = append(res.Jobs, job)
	}
	return res, nil
}

func (j fioIOJSON) convert() (FioIO, error) {
	io := FioIO{IOPS: j.IOPS, BandwidthBytes: j.BWBytes, IOBytes: j.IOBytes, TotalIOs: j.TotalIOs, RuntimeMS: j.Runtime}
	var err error
	if io.Clat, err = j.Clat.convert(); err != nil {
		return io, fmt.Errorf("clat: %w", err)
	}
	if io.Lat, err = j.Lat.convert(); err != nil {
		return io, fmt.Errorf("lat: %w", err)
	}
	io.P50, _ = io.Clat.Percentile(50)
	io.P99, _ = io.Clat.Percentile(99)
	return io, nil
}

func (l fioLatJSON) convert() (FioLatency, error) {
	out := FioLatency{N: l.N, Min: nsDuration(l.Min), Max: nsDuration(l.Max), Mean: nsDuration(l.Mean)}
	for k, v := range l.Percentile {
		p, err := strconv.ParseFloat(k, 64)
		if err != nil || p < 0 || p > 100 {
			return out, fmt.Errorf("bad percentile key %q", k)
		}
		out.Percentiles = append(out.Percentiles, FioPercentile{P: p, Value: nsDuration(v)})
	}
	slices.SortFunc(out.Percentiles, func(a, b FioPercentile) int {
		switch {
		case a.P < b.P:
			return -1
		case a.P > b.P:
			return 1
		}
		return 0
	})
	if len(l.Bins) > 0 {
		bins := make(map[time.Duration]int64, len(l.Bins))
		for k, n := range l.Bins {
			ns, err := strconv.ParseInt(k, 10, 64)
			if err != nil || ns < 0 || n < 0 {
				return out, fmt.Errorf("bad histogram bin %q: %d", k, n)
			}
			bins[time.Duration(ns)] += n
		}
		out.Bins = sortedBins(bins)
	}
	return out, nil
}

func nsDuration(ns float64) time.Duration {
	if !isFinite(ns) || ns < 0 {
		return 0
	}
	return time.Duration(math.Round(ns))
}

func head(b []byte, n int) string {
	if len(b) > n {
		b = b[:n]
	}
	return string(b)
}

// SaveRaw writes fio's raw output to path (for auditing a run's figures).
func (r FioResult) SaveRaw(path string) error {
	return writeFileAtomic(path, r.Raw)
}

// FioTime renders a duration as fio takes it (--runtime, --ramp_time), in
// milliseconds.
func FioTime(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) + "ms" }
