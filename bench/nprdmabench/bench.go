// Package nprdmabench measures the nprdma fabric: operation latency and
// throughput over a provider, next to a raw request/response over a plain
// loopback TCP socket measured in the same run, the NP read path, and
// explicit buffer reuse against per-I/O registration. The bench framework
// (bench/) calls these functions and reports ratios.
package nprdmabench

import (
	"github.com/nprdma/nprdma/bench"

	"fmt"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// LatencyResult summarizes per-operation latencies.
type LatencyResult struct {
	Name           string
	P50, P99, Mean time.Duration
	Samples        int
}

// ThroughputResult is the rate of a run of operations of Size bytes with QD
// outstanding.
type ThroughputResult struct {
	Name                 string
	Size, QD             int
	MiBPerSec, OpsPerSec float64
}

func summarize(name string, lat []time.Duration) LatencyResult {
	r := LatencyResult{Name: name, Samples: len(lat)}
	if len(lat) == 0 {
		return r
	}
	s := bench.Summarize(lat)
	r.P50, r.P99, r.Mean = s.P50, s.P99, s.Mean
	return r
}

func throughput(name string, size, qd, ops int, elapsed time.Duration) ThroughputResult {
	s := elapsed.Seconds()
	return ThroughputResult{Name: name, Size: size, QD: qd, OpsPerSec: float64(ops) / s, MiBPerSec: float64(ops) * float64(size) / s / (1 << 20)}
}

// CPUPlacement says which CPUs this process may run on and how many Ps the
// Go scheduler uses: every figure depends on it (waking a goroutine on
// another vCPU costs tens of microseconds here).
func CPUPlacement() string {
	var set unix.CPUSet
	cpus := "unknown"
	if err := unix.SchedGetaffinity(0, &set); err == nil {
		var ids []string
		for i := 0; i < 1024; i++ {
			if set.IsSet(i) {
				ids = append(ids, strconv.Itoa(i))
			}
		}
		cpus = strings.Join(ids, ",")
	}
	return fmt.Sprintf("cpus=%s (%d online) GOMAXPROCS=%d", cpus, runtime.NumCPU(), runtime.GOMAXPROCS(0))
}
