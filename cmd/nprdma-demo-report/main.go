// Command nprdma-demo-report is the helper of scripts/demo.sh (make demo):
// it snapshots Prometheus endpoints and turns the fio results, the metrics
// of the initiators and the target, and the target's memory use into the
// summary the demo ends with.
//
//	nprdma-demo-report scrape ADDR FILE      # http://ADDR/metrics → FILE
//	nprdma-demo-report rss PID FILE          # VmRSS/VmHWM of /proc/PID/status → FILE
//	nprdma-demo-report summary DIR           # print the summary of a demo run
//
// DIR holds run.env (KEY=VALUE lines: NAMESPACE, BUDGET, TARGET_RSS, ...)
// and one directory per attach mode (nbd, fuse) with fio-verify.json and
// fio-read.json (fio's JSON output), target-start.prom and target-end.prom
// (the target's metrics before and after both jobs), initiator-mid.prom and
// initiator-end.prom (the attach process's, before and after the reads).
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "nprdma-demo-report:", err)
		os.Exit(1)
	}
}

const usage = "usage: nprdma-demo-report scrape ADDR FILE | rss PID FILE | summary DIR"

func run(args []string, out io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%s", usage)
	}
	switch cmd, rest := args[0], args[1:]; {
	case len(args) == 1 && (cmd == "-h" || cmd == "--help" || cmd == "help"):
		fmt.Fprintln(out, usage)
		return nil
	case cmd == "scrape" && len(rest) == 2:
		return scrape(rest[0], rest[1])
	case cmd == "rss" && len(rest) == 2:
		return saveRSS(rest[0], rest[1])
	case cmd == "summary" && len(rest) == 1:
		s, err := loadRun(rest[0])
		if err != nil {
			return err
		}
		s.print(out)
		return nil
	}
	return fmt.Errorf("%s", usage)
}

// scrape saves the metrics page of a Prometheus endpoint.
func scrape(addr, file string) error {
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		return fmt.Errorf("scrape %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("scrape %s: %s", addr, resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("scrape %s: %w", addr, err)
	}
	return os.WriteFile(file, body, 0o644)
}

// saveRSS copies the memory lines of /proc/PID/status to file.
func saveRSS(pid, file string) error {
	data, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return fmt.Errorf("memory of pid %s: %w", pid, err)
	}
	return os.WriteFile(file, data, 0o644)
}
