package swapbench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nprdma/nprdma/bench"
)

// The swap-rss goal is about "a process holding a region": measured inside
// the bench process, the figure would also carry what earlier experiments
// left in its heap (50+ MiB after a suite run). So the bench re-executes
// itself and the child measures nothing but the region.

// rssChildEnv carries the child's parameters (JSON rssChildArgs).
const rssChildEnv = "NPRDMA_BENCH_RSS_CHILD"

// inRSSChild is set in the measuring child, which exits after measuring.
var inRSSChild bool

type rssChildArgs struct {
	Path     string
	Budget   int64
	Ratio    int
	Duration time.Duration
}

// RunRSSChildIfAsked makes the calling program the measuring child when it
// was started as one by MeasureRSSInChild: it measures, prints the result
// as JSON and exits. Call it first thing in main.
func RunRSSChildIfAsked() {
	spec := os.Getenv(rssChildEnv)
	if spec == "" {
		return
	}
	var a rssChildArgs
	if err := json.Unmarshal([]byte(spec), &a); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", rssChildEnv, err)
		os.Exit(2)
	}
	inRSSChild = true
	res, err := MeasureRSS(context.Background(), a.Path, a.Budget, a.Ratio, a.Duration)
	if err != nil {
		fmt.Fprintln(os.Stderr, "swap-rss child:", err)
		os.Exit(1)
	}
	json.NewEncoder(os.Stdout).Encode(res)
	os.Exit(0)
}

// MeasureRSSInChild runs MeasureRSS in a fresh copy of the running program
// (which must call RunRSSChildIfAsked first thing in main); started is
// called with the child's PID once it runs (for CPU placement sampling).
func MeasureRSSInChild(ctx context.Context, path string, budget int64, ratio int, d time.Duration, started func(pid int)) (RSSResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return RSSResult{}, fmt.Errorf("swap-rss: own executable: %w", err)
	}
	spec, _ := json.Marshal(rssChildArgs{Path: path, Budget: budget, Ratio: ratio, Duration: d})
	child, err := bench.StartChild("swap-rss child", []string{exe}, nil, rssChildEnv+"="+string(spec))
	if err != nil {
		return RSSResult{}, err
	}
	defer os.Remove(path) // the child leaves its backing file behind
	if started != nil {
		started(child.PID())
	}
	if err := child.Run(ctx); err != nil {
		return RSSResult{}, err
	}
	// The result is the last line the child wrote.
	out := child.Output(0)
	var res RSSResult
	if err := json.Unmarshal([]byte(out[strings.LastIndexByte(out, '\n')+1:]), &res); err != nil {
		return RSSResult{}, fmt.Errorf("swap-rss child printed %q: %w", out, err)
	}
	return res, nil
}
