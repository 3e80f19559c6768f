package swapbench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"time"
)

// The swap-rss goal is about "a process holding a region": measured inside
// the bench process, the figure would also carry what earlier experiments
// left in its heap (50+ MiB after a suite run). So the bench re-executes
// itself and the child measures nothing but the region.

// rssChildEnv carries the child's parameters (JSON rssChildArgs).
const rssChildEnv = "NPRDMA_BENCH_RSS_CHILD"

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
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), rssChildEnv+"="+string(spec))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		return RSSResult{}, fmt.Errorf("swap-rss: start child %s: %w", exe, err)
	}
	if started != nil {
		started(cmd.Process.Pid)
	}
	if err := cmd.Wait(); err != nil {
		return RSSResult{}, fmt.Errorf("swap-rss child: %w: %s", err, bytes.TrimSpace(errOut.Bytes()))
	}
	var res RSSResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		return RSSResult{}, fmt.Errorf("swap-rss child printed %q: %w", out.String(), err)
	}
	return res, nil
}
