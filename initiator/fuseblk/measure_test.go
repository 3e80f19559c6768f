package fuseblk

// TestMeasureAttachModes runs the same fio jobs against nbdkit's memory
// plugin (the baseline peer), this project's NBD server and its loop device,
// all over memory backends, in one run, and logs each figure with its ratio
// to the baseline. It only runs with NPRDMA_LONG=1; it asserts nothing about
// speed. docs/attach.md quotes its output.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/initiator/blockio"
	"github.com/nprdma/nprdma/initiator/nbd"
)

type fioFigures struct {
	iops  float64
	p50us float64
	p99us float64
}

func runFio(t *testing.T, target []string, rw string, depth int) fioFigures {
	t.Helper()
	args := append([]string{
		"--name=m", "--rw=" + rw, "--bs=4k", fmt.Sprintf("--iodepth=%d", depth),
		"--size=128M", "--time_based", "--runtime=5", "--ramp_time=1",
		"--output-format=json",
	}, target...)
	cmd := exec.Command("fio", args...)
	cmd.Dir = t.TempDir()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("fio %v: %v\n%s", args, err, out)
	}
	var res struct {
		Jobs []struct {
			Read, Write struct {
				IOPS  float64 `json:"iops"`
				ClatN struct {
					Percentile map[string]float64 `json:"percentile"`
				} `json:"clat_ns"`
			}
		} `json:"jobs"`
	}
	if err := json.Unmarshal(out[strings.IndexByte(string(out), '{'):], &res); err != nil {
		t.Fatal(err)
	}
	side := res.Jobs[0].Read
	if strings.Contains(rw, "write") {
		side = res.Jobs[0].Write
	}
	return fioFigures{side.IOPS, side.ClatN.Percentile["50.000000"] / 1e3, side.ClatN.Percentile["99.000000"] / 1e3}
}

func TestMeasureAttachModes(t *testing.T) {
	if os.Getenv("NPRDMA_LONG") != "1" {
		t.Skip("measurement: set NPRDMA_LONG=1 to run")
	}
	requireTool(t, "fio")
	requireTool(t, "nbdkit")
	requireFUSE(t, true)
	const size = 256 << 20
	dir := t.TempDir()

	// Baseline: nbdkit's memory plugin on a unix socket.
	kitSock := filepath.Join(dir, "nbdkit.sock")
	kit := exec.Command("nbdkit", "-f", "-U", kitSock, "memory", fmt.Sprint(size))
	if err := kit.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { kit.Process.Kill(); kit.Wait() }()
	for i := 0; ; i++ {
		if _, err := os.Stat(kitSock); err == nil {
			break
		}
		if i > 200 {
			t.Fatal("nbdkit did not create its socket")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Our NBD server.
	srv, err := nbd.NewServer(blockio.NewMemory(size, 4096), nbd.WithMultiConn(true))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := nbd.ListenUnix(filepath.Join(dir, "nprdma.sock"))
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(context.Background(), ln)
	defer srv.Close()

	// Our loop device.
	a, _ := attachMemory(t, size)

	targets := []struct {
		name string
		args []string
	}{
		{"nbdkit memory (nbd engine)", []string{"--ioengine=nbd", "--uri=nbd+unix:///?socket=" + kitSock}},
		{"nprdma nbd (nbd engine)", []string{"--ioengine=nbd", "--uri=" + nbd.URI(ln.Addr(), "")}},
		{"nprdma loop (libaio, direct)", []string{"--ioengine=libaio", "--direct=1", "--filename=" + a.LoopDevice()}},
	}
	jobs := []struct {
		rw    string
		depth int
	}{{"randread", 1}, {"randread", 32}, {"randwrite", 32}}
	for _, job := range jobs {
		var base fioFigures
		for i, target := range targets {
			f := runFio(t, target.args, job.rw, job.depth)
			if i == 0 {
				base = f
			}
			t.Logf("%-9s QD%-2d %-30s %8.0f IOPS (x%.2f)  p50 %6.0f µs (x%.2f)  p99 %6.0f µs",
				job.rw, job.depth, target.name, f.iops, f.iops/base.iops, f.p50us, f.p50us/base.p50us, f.p99us)
		}
	}
}
