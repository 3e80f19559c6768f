package nprdmabench

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nprdma/nprdmatest"
	"github.com/nprdma/nprdma/nprdma/tcp"
)

// TestMeasure prints the figures docs/nprdma.md reports. It runs only with
// NPRDMA_MEASURE=1 (WHAT=lat,tput,pool picks parts; SAMPLES sets the
// latency sample count), on a machine nobody else is using.
func TestMeasure(t *testing.T) {
	if os.Getenv("NPRDMA_MEASURE") != "1" {
		t.Skip("set NPRDMA_MEASURE=1 to measure")
	}
	ctx := context.Background()
	what := os.Getenv("WHAT")
	samples := 20000
	if s := os.Getenv("SAMPLES"); s != "" {
		samples, _ = strconv.Atoi(s)
	}
	fmt.Println(CPUPlacement())
	pl := func(r LatencyResult, err error) {
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("%-40s p50 %8v p99 %8v mean %8v n=%d\n", r.Name, r.P50, r.P99, r.Mean, r.Samples)
	}
	pt := func(r ThroughputResult, err error) {
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("%-40s %9.1f MiB/s %9.0f ops/s\n", r.Name, r.MiBPerSec, r.OpsPerSec)
	}
	if what == "" || strings.Contains(what, "lat") {
		pl(RawTCPRoundTrip(ctx, 4096, samples))
		for _, bp := range []bool{false, true} {
			for _, op := range []nprdma.Opcode{nprdma.OpRead, nprdma.OpWrite, nprdma.OpSend} {
				pl(OpLatency(ctx, tcp.New(), op, 4096, samples, bp))
			}
		}
		pl(RawTCPRoundTrip(ctx, 4096, samples))
		pl(OpLatency(ctx, loop.New(), nprdma.OpRead, 4096, samples, false))
		pg, _ := nprdmatest.NewPager(256, 4096)
		pl(UnpinnedReadLatency(ctx, tcp.New(), pg, 4096, samples))
		pl(UnpinnedReadLatency(ctx, loop.New(), pg, 4096, samples))
		pg.Close()
	}
	if what == "" || strings.Contains(what, "tput") {
		d := time.Second
		for _, size := range []int{4096, 128 << 10} {
			for _, qd := range []int{1, 4, 32} {
				pt(RawTCPStream(ctx, size, qd, d))
				pt(OpThroughput(ctx, tcp.New(), nprdma.OpRead, size, qd, d, false))
				pt(OpThroughput(ctx, tcp.New(), nprdma.OpWrite, size, qd, d, false))
				pt(OpThroughput(ctx, tcp.New(), nprdma.OpSend, size, qd, d, false))
			}
		}
	}
	if what == "" || strings.Contains(what, "pool") {
		a, b, err := PoolVsRegister(ctx, tcp.New(), 65536, time.Second)
		pt(a, err)
		pt(b, err)
	}
}

// TestMeasureInterleaved alternates short runs of the raw round trip and of
// each op, so that both see the same background load, and prints the median
// over rounds of each p50 and of its ratio to the raw p50 of its round.
func TestMeasureInterleaved(t *testing.T) {
	if os.Getenv("NPRDMA_MEASURE") != "1" {
		t.Skip("set NPRDMA_MEASURE=1 to measure")
	}
	ctx := context.Background()
	rounds, per := 15, 1000
	fmt.Println(CPUPlacement())
	type variant struct {
		name string
		run  func() (LatencyResult, error)
	}
	pg, err := nprdmatest.NewPager(256, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	vs := []variant{
		{"raw", func() (LatencyResult, error) { return RawTCPRoundTrip(ctx, 4096, per) }},
	}
	for _, bp := range []bool{false, true} {
		for _, op := range []nprdma.Opcode{nprdma.OpRead, nprdma.OpWrite, nprdma.OpSend} {
			vs = append(vs, variant{fmt.Sprintf("%s busypoll=%v", op, bp), func() (LatencyResult, error) { return OpLatency(ctx, tcp.New(), op, 4096, per, bp) }})
		}
	}
	vs = append(vs, variant{"unpinned READ", func() (LatencyResult, error) { return UnpinnedReadLatency(ctx, tcp.New(), pg, 4096, per) }})
	p50 := make([][]float64, len(vs))
	ratio := make([][]float64, len(vs))
	for r := 0; r < rounds; r++ {
		var raw float64
		for i, v := range vs {
			res, err := v.run()
			if err != nil {
				t.Fatal(err)
			}
			us := float64(res.P50) / 1e3
			if i == 0 {
				raw = us
			}
			p50[i] = append(p50[i], us)
			ratio[i] = append(ratio[i], us/raw)
		}
	}
	med := func(x []float64) float64 { s := append([]float64(nil), x...); sort.Float64s(s); return s[len(s)/2] }
	for i, v := range vs {
		fmt.Printf("%-28s p50 %6.1f µs  ratio to raw %.2f\n", v.name, med(p50[i]), med(ratio[i]))
	}
}

// TestMeasureThroughputInterleaved alternates short raw streams and READ,
// WRITE and SEND runs at each size and queue depth, and prints the median
// over rounds of the rate and of its ratio to the raw stream of its round.
func TestMeasureThroughputInterleaved(t *testing.T) {
	if os.Getenv("NPRDMA_MEASURE") != "1" {
		t.Skip("set NPRDMA_MEASURE=1 to measure")
	}
	ctx := context.Background()
	rounds, d := 5, 300*time.Millisecond
	fmt.Println(CPUPlacement())
	med := func(x []float64) float64 { s := append([]float64(nil), x...); sort.Float64s(s); return s[len(s)/2] }
	for _, size := range []int{4096, 128 << 10} {
		for _, qd := range []int{1, 4, 32} {
			ops := []nprdma.Opcode{nprdma.OpRead, nprdma.OpWrite, nprdma.OpSend}
			rate := make([][]float64, len(ops)+1)
			ratio := make([][]float64, len(ops)+1)
			for r := 0; r < rounds; r++ {
				raw, err := RawTCPStream(ctx, size, qd, d)
				if err != nil {
					t.Fatal(err)
				}
				rate[0] = append(rate[0], raw.MiBPerSec)
				for i, op := range ops {
					res, err := OpThroughput(ctx, tcp.New(), op, size, qd, d, false)
					if err != nil {
						t.Fatal(err)
					}
					rate[i+1] = append(rate[i+1], res.MiBPerSec)
					ratio[i+1] = append(ratio[i+1], res.MiBPerSec/raw.MiBPerSec)
				}
			}
			fmt.Printf("size %6d qd %2d: raw %7.1f MiB/s", size, qd, med(rate[0]))
			for i, op := range ops {
				fmt.Printf(" | %s %7.1f (%.2f)", op, med(rate[i+1]), med(ratio[i+1]))
			}
			fmt.Println()
		}
	}
}
