package bench

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The testdata files are fio 3.33 output: two psync jobs without
// group_reporting in json+ (with the notes fio prints before the JSON), and a
// group_reporting group followed by a libaio randrw group in plain json.

func readTestdata(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseFioJSONPlus(t *testing.T) {
	res, err := ParseFioJSON(readTestdata(t, "fio-psync-2jobs.json"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Version != "fio-3.33" || len(res.Jobs) != 2 {
		t.Fatalf("version %q, %d jobs", res.Version, len(res.Jobs))
	}
	j := res.Jobs[0]
	if j.Name != "a" || j.GroupID != 0 || j.Options["ioengine"] != "psync" || j.Options["bs"] != "4k" {
		t.Fatalf("job header %+v", j)
	}
	r := j.Read
	// 8 MiB of 4 KiB reads is exactly 2048 reads per job.
	if r.TotalIOs != 2048 || r.IOBytes != 8<<20 || r.Clat.N != 2048 {
		t.Fatalf("read totals: %d ios, %d bytes, N %d", r.TotalIOs, r.IOBytes, r.Clat.N)
	}
	if r.IOPS != 5688.888889 || r.BandwidthBytes <= 0 {
		t.Fatalf("IOPS %v, bandwidth %v", r.IOPS, r.BandwidthBytes)
	}
	if r.P50 != 140288*time.Nanosecond || r.P99 != 1204224*time.Nanosecond {
		t.Fatalf("p50 %v p99 %v, want fio's 140288 ns and 1204224 ns", r.P50, r.P99)
	}
	if r.Clat.Mean != 171323*time.Nanosecond || r.Clat.Min <= 0 || r.Clat.Max < r.P99 {
		t.Fatalf("clat mean/min/max %v %v %v", r.Clat.Mean, r.Clat.Min, r.Clat.Max)
	}
	var binCount int64
	for i, b := range r.Clat.Bins {
		binCount += b.Count
		if i > 0 && b.Latency <= r.Clat.Bins[i-1].Latency {
			t.Fatalf("bins not sorted at %d", i)
		}
	}
	if binCount != 2048 {
		t.Fatalf("histogram holds %d reads, want 2048", binCount)
	}
	// The bins reproduce fio's own percentiles.
	for _, q := range r.Clat.Percentiles {
		if got := HistogramPercentile(r.Clat.Bins, q.P); got != q.Value {
			t.Fatalf("p%v from bins %v, fio says %v", q.P, got, q.Value)
		}
	}
	if p, ok := r.Clat.Percentile(42); !ok || p != HistogramPercentile(r.Clat.Bins, 42) {
		t.Fatalf("p42 (not in fio's list) = %v, %v", p, ok)
	}
	if pts := r.Clat.CDF(50); len(pts) < 10 || pts[len(pts)-1].Y != 1 {
		t.Fatalf("CDF from bins: %v", pts)
	}
	if j.Write.TotalIOs != 0 || j.Write.P50 != 0 {
		t.Fatalf("a read job has writes: %+v", j.Write)
	}

	// Two jobs of group 0 reported separately merge into one.
	g := res.GroupRead(0)
	a, b := res.Jobs[0].Read, res.Jobs[1].Read
	if g.TotalIOs != 4096 || g.IOPS != a.IOPS+b.IOPS || g.Clat.N != 4096 {
		t.Fatalf("merged group: %d ios, %v IOPS", g.TotalIOs, g.IOPS)
	}
	if g.P50 < min(a.P50, b.P50) || g.P50 > max(a.P50, b.P50) || g.Clat.Max != max(a.Clat.Max, b.Clat.Max) {
		t.Fatalf("merged p50 %v outside the jobs' %v and %v", g.P50, a.P50, b.P50)
	}
	if MergeFioIO().TotalIOs != 0 || MergeFioIO(a).P50 != a.P50 {
		t.Fatal("MergeFioIO of none or one")
	}
}

func TestParseFioJSONGroups(t *testing.T) {
	res, err := ParseFioJSON(readTestdata(t, "fio-groups.json"))
	if err != nil {
		t.Fatal(err)
	}
	grp, ok := res.Job("grp")
	if !ok || grp.Read.TotalIOs != 4096 || grp.Options["numjobs"] != "2" {
		t.Fatalf("group_reporting job: %+v", grp)
	}
	if len(grp.Read.Clat.Bins) != 0 || grp.Read.P50 != 132096*time.Nanosecond {
		t.Fatalf("plain json: bins %d, p50 %v", len(grp.Read.Clat.Bins), grp.Read.P50)
	}
	aio, ok := res.Job("aio")
	if !ok || aio.GroupID != 1 || aio.Read.TotalIOs != 1001 || aio.Write.TotalIOs != 1047 || aio.Write.P99 != 667648*time.Nanosecond {
		t.Fatalf("randrw job: %+v", aio)
	}
	if _, ok := res.Job("nope"); ok {
		t.Fatal("found a job that does not exist")
	}
	// Without bins, percentiles of several jobs cannot be merged.
	m := MergeFioIO(grp.Read, aio.Read)
	if m.TotalIOs != 5097 || len(m.Clat.Percentiles) != 0 || m.P50 != 0 {
		t.Fatalf("merging bin-less jobs: %d ios, %d percentiles, p50 %v", m.TotalIOs, len(m.Clat.Percentiles), m.P50)
	}
	if pts := grp.Read.Clat.CDF(10); len(pts) != len(grp.Read.Clat.Percentiles) {
		t.Fatalf("CDF from percentiles: %d points", len(pts))
	}
}

func TestParseFioJSONErrors(t *testing.T) {
	for name, in := range map[string]string{
		"empty":          "",
		"no JSON":        "fio: pid=1, err=2/file:filesetup.c:1, func=open, error=No such file",
		"truncated":      `{"fio version": "fio-3.33", "jobs": [{"jobname": "a"`,
		"not fio":        `{"hello": 1}`,
		"bad percentile": `{"fio version": "x", "jobs": [{"read": {"clat_ns": {"percentile": {"abc": 1}}}}]}`,
		"bad bin":        `{"fio version": "x", "jobs": [{"read": {"clat_ns": {"bins": {"-5": 1}}}}]}`,
		"negative count": `{"fio version": "x", "jobs": [{"write": {"lat_ns": {"bins": {"5": -1}}}}]}`,
	} {
		if _, err := ParseFioJSON([]byte(in)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func requireFio(t *testing.T) {
	t.Helper()
	if _, err := FindTool("fio"); err != nil {
		t.Skipf("skipping: %v", err)
	}
}

func TestRunFio(t *testing.T) {
	requireFio(t)
	file := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(file, make([]byte, 4<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	// Buffered reads so that the test also runs where /tmp is tmpfs.
	res, err := RunFio(context.Background(),
		"--name=seq", "--filename="+file, "--rw=read", "--bs=4k", "--size=4M", "--ioengine=psync",
		"--name=rand", "--stonewall", "--filename="+file, "--rw=randread", "--bs=4k", "--size=4M", "--ioengine=psync", "--numjobs=2")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Jobs) != 3 || len(res.Raw) == 0 || !strings.HasPrefix(res.Version, "fio-") {
		t.Fatalf("%d jobs, %d raw bytes, version %q", len(res.Jobs), len(res.Raw), res.Version)
	}
	seq, _ := res.Job("seq")
	if seq.Read.TotalIOs != 1024 || seq.Read.P50 <= 0 || len(seq.Read.Clat.Bins) == 0 {
		t.Fatalf("4 MiB in 4 KiB reads: %d reads, p50 %v, %d bins (json+ expected)", seq.Read.TotalIOs, seq.Read.P50, len(seq.Read.Clat.Bins))
	}
	if g := res.GroupRead(1); g.TotalIOs != 2048 {
		t.Fatalf("group 1 (two jobs) read %d times, want 2048", g.TotalIOs)
	}
	if res.Placement.Role != "fio" || res.Placement.Allowed == "" {
		t.Fatalf("placement %+v", res.Placement)
	}
	raw := filepath.Join(t.TempDir(), "raw", "fio.json")
	if err := res.SaveRaw(raw); err != nil {
		t.Fatal(err)
	}
	if back, err := os.ReadFile(raw); err != nil || string(back) != string(res.Raw) {
		t.Fatalf("SaveRaw: %v", err)
	}
}

func TestRunFioReportsFioErrors(t *testing.T) {
	requireFio(t)
	// A path under a regular file cannot be created: fio fails with ENOTDIR.
	notDir := filepath.Join(t.TempDir(), "file")
	os.WriteFile(notDir, nil, 0o644)
	_, err := RunFio(context.Background(), "--name=x", "--filename="+filepath.Join(notDir, "f"), "--rw=read", "--size=4k")
	if err == nil || !strings.Contains(err.Error(), "Not a directory") {
		t.Fatalf("fio on a path under a regular file: %v", err)
	}
	_, err = RunFio(context.Background(), "--name=x", "--no-such-option=1")
	if err == nil || !strings.Contains(err.Error(), "no-such-option") {
		t.Fatalf("unknown option: %v", err)
	}
}

func TestRunFioPinned(t *testing.T) {
	requireFio(t)
	cpus, err := Affinity(0)
	if err != nil {
		t.Fatal(err)
	}
	target := cpus[0]
	file := filepath.Join(t.TempDir(), "data")
	os.WriteFile(file, make([]byte, 1<<20), 0o644)
	res, err := Fio{CPUs: []int{target}, SampleInterval: 5 * time.Millisecond}.Run(context.Background(),
		"--name=busy", "--filename="+file, "--rw=randread", "--bs=4k", "--ioengine=psync", "--time_based", "--runtime=300ms")
	if err != nil {
		t.Fatal(err)
	}
	if !res.Placement.Pinned {
		t.Fatal("placement not marked pinned")
	}
	for _, s := range res.Placement.RanOn {
		if s.CPU != target {
			t.Fatalf("fio pinned to CPU %d ran on %d: %+v", target, s.CPU, res.Placement)
		}
	}
}

func TestRunFioCancel(t *testing.T) {
	requireFio(t)
	file := filepath.Join(t.TempDir(), "data")
	os.WriteFile(file, make([]byte, 1<<20), 0o644)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(300 * time.Millisecond)
		cancel()
	}()
	_, err := RunFio(ctx, "--name=long", "--filename="+file, "--rw=randread", "--bs=4k", "--ioengine=psync",
		"--numjobs=2", "--time_based", "--runtime=60s")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled fio: %v", err)
	}
	// fio's job processes must be gone with it: none of ours is left.
	if kids := descendants(os.Getpid())[1:]; len(kids) != 0 {
		t.Fatalf("processes left behind: %v", kids)
	}
}
