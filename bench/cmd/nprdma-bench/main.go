// Command nprdma-bench runs nprdma's benchmark suite and writes
// bench/out/results.json, the report docs/bench.md with its plots, and the
// results table of README.md.
//
//	go run ./bench/cmd/nprdma-bench                      # quick mode, every experiment, 5 rounds
//	go run ./bench/cmd/nprdma-bench --mode smoke         # one round of everything, nothing judged
//	go run ./bench/cmd/nprdma-bench --mode full          # long runs (make bench BENCH=full)
//	go run ./bench/cmd/nprdma-bench --only blockdev      # one experiment; the others are carried over
//	go run ./bench/cmd/nprdma-bench --list               # names, status and goals
//	go run ./bench/cmd/nprdma-bench --render-only        # redraw the report from bench/out/results.json
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/bench/swapbench"
	"github.com/nprdma/nprdma/internal/command"
)

func main() {
	swapbench.RunRSSChildIfAsked()
	command.Main(newApp(), os.Args)
}

func newApp() *cli.App {
	return &cli.App{
		Name:  "nprdma-bench",
		Usage: "run nprdma's benchmarks; every figure is a ratio to a baseline measured in the same run",
		// A --note is free text: commas in it must not split it.
		DisableSliceFlagSeparator: true,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "mode", Value: "quick", EnvVars: []string{"BENCH"}, Usage: "quick (5 rounds of every judged point, whole suite ≤ 15 minutes), full (bigger sizes, longer runs) or smoke (one round, nothing judged)"},
			&cli.StringFlag{Name: "only", Usage: "run only these experiments (comma-separated names); the others keep their earlier results"},
			&cli.StringFlag{Name: "out", Value: "bench/out", Usage: "directory for results.json and raw outputs (relative paths are taken from the repository root)"},
			&cli.StringFlag{Name: "report", Value: "docs/bench.md", Usage: "markdown report to write; plots and a copy of the results go to a directory named after it"},
			&cli.BoolFlag{Name: "no-report", Usage: "write results.json only"},
			&cli.StringFlag{Name: "readme", Usage: "README whose results table (between the bench-table markers) is rewritten with the report (default: README.md in the directory above the report's, so docs/bench.md → README.md)"},
			&cli.StringFlag{Name: "scratch", Usage: "directory for large temporary files such as backing files (default: --out); must be on a disk, not tmpfs"},
			&cli.StringFlag{Name: "cpus", Usage: "pin the bench and every process it starts to these CPUs (e.g. 1 or 0-1); default: not pinned, placement is only observed"},
			&cli.BoolFlag{Name: "install-missing", Value: true, Usage: "apt-get install missing peers (fio, nbdkit, ...) when running as root"},
			&cli.StringSliceFlag{Name: "note", Usage: "a note printed at the top of the report (repeatable), e.g. that the machine was shared"},
			&cli.BoolFlag{Name: "carry-over", Value: true, Usage: "keep earlier results of experiments this run does not run"},
			&cli.BoolFlag{Name: "render-only", Usage: "measure nothing: regenerate the report from --out's results.json (--note adds to its notes)"},
			&cli.BoolFlag{Name: "list", Usage: "list the experiments, their status and goals, and exit"},
			&cli.StringFlag{Name: "cpuprofile", Usage: "write a CPU profile of the measurements (pprof format) to this file, e.g. to build with -pgo"},
		},
		Action: run,
	}
}

func run(c *cli.Context) error {
	specs := experiments()
	if c.Bool("list") {
		return list(c, specs)
	}
	mode, err := bench.ParseMode(c.String("mode"))
	if err != nil {
		return err
	}
	var only []string
	if s := c.String("only"); s != "" {
		only = strings.Split(s, ",")
	}
	if _, err := bench.SelectSpecs(specs, only); err != nil {
		return err
	}
	root := repoRoot()
	outDir := fromRoot(root, c.String("out"))
	reportPath := fromRoot(root, c.String("report"))
	readmePath := filepath.Join(filepath.Dir(filepath.Dir(reportPath)), "README.md")
	if r := c.String("readme"); r != "" {
		readmePath = fromRoot(root, r)
	}
	if c.Bool("render-only") {
		return renderOnly(root, filepath.Join(outDir, "results.json"), reportPath, readmePath, c.StringSlice("note"))
	}
	scratch := outDir
	if s := c.String("scratch"); s != "" {
		scratch = fromRoot(root, s)
	}
	for _, d := range []string{outDir, scratch} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	env := &bench.Env{Mode: mode, OutDir: outDir, ScratchDir: scratch, Log: log,
		Tools: &bench.Tools{Install: c.Bool("install-missing"), Log: log}}
	if s := c.String("cpus"); s != "" {
		cpus, err := bench.ParseCPUList(s)
		if err != nil {
			return err
		}
		if err := bench.PinProcess(os.Getpid(), cpus); err != nil {
			return err
		}
		env.CPUs = cpus
		log.Info("pinned the bench and its children", "cpus", bench.FormatCPUList(cpus))
	}

	if p := c.String("cpuprofile"); p != "" {
		stopProfile, err := startCPUProfile(p)
		if err != nil {
			return err
		}
		defer stopProfile()
	}
	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	result, err := bench.RunSuite(ctx, specs, env, only)
	if err != nil {
		return err
	}
	if result, err = result.WithoutRoot(root); err != nil {
		return err
	}
	result.Command = commandLine()
	result.Revision = bench.GitRevision(context.Background(), root)
	result.Notes = c.StringSlice("note")
	if len(env.CPUs) > 0 {
		result.Notes = append(result.Notes, "The bench and every process it started were pinned to CPUs "+bench.FormatCPUList(env.CPUs)+" (--cpus).")
	}

	resultsPath := filepath.Join(outDir, "results.json")
	assetsResults := filepath.Join(strings.TrimSuffix(reportPath, filepath.Ext(reportPath)), "results.json")
	if c.Bool("carry-over") && len(only) > 0 {
		prev, perr := bench.LoadPrevious(resultsPath, assetsResults)
		if perr != nil {
			log.Warn("earlier results unreadable; experiments not run are reported as not run", "err", perr)
		}
		result.CarryOver(prev)
	}
	if err := result.WriteJSON(resultsPath); err != nil {
		return err
	}
	fmt.Println("results:", resultsPath)
	if !c.Bool("no-report") {
		if err := writeReport(result, reportPath, readmePath); err != nil {
			return err
		}
	}
	summarize(result)
	if failed := result.Failed(); len(failed) > 0 {
		names := make([]string, len(failed))
		for i, e := range failed {
			names[i] = e.Name
		}
		return fmt.Errorf("experiments failed: %s", strings.Join(names, ", "))
	}
	if ctx.Err() != nil {
		return errors.New("interrupted: the results hold what finished")
	}
	return nil
}

// startCPUProfile profiles the process into path until the returned
// function is called.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// renderOnly regenerates the report from stored results: the report is a
// pure function of them, so styling changes need no new measurements. Notes
// given now (say, on runs made after the stored one) are added to the stored
// run's, in results.json too, so that the record and the report agree.
func renderOnly(root, resultsPath, reportPath, readmePath string, notes []string) error {
	r, err := bench.ReadRun(resultsPath)
	if err != nil {
		return err
	}
	if r, err = r.WithoutRoot(root); err != nil {
		return err
	}
	r.Notes = append(r.Notes, notes...)
	if err := r.WriteJSON(resultsPath); err != nil {
		return err
	}
	fmt.Println("from", resultsPath)
	return writeReport(r, reportPath, readmePath)
}

// writeReport writes the report and the README's results table, which
// links to the report. A README that is missing or has no table markers is
// reported and left alone: the measurements are in the report either way.
func writeReport(r *bench.Run, reportPath, readmePath string) error {
	if err := bench.WriteReport(r, reportPath); err != nil {
		return err
	}
	fmt.Println("report:", reportPath)
	rel, err := filepath.Rel(filepath.Dir(readmePath), reportPath)
	if err != nil {
		return err
	}
	if err := bench.WriteStandingTable(r, readmePath, filepath.ToSlash(rel)); err != nil {
		fmt.Fprintln(os.Stderr, "nprdma-bench: README results table not written:", err)
		return nil
	}
	fmt.Println("results table:", readmePath)
	return nil
}

func list(c *cli.Context, specs []bench.Spec) error {
	w := c.App.Writer
	for _, s := range specs {
		status := "ready"
		if s.Pending() {
			status = "pending"
		}
		fmt.Fprintf(w, "%-13s %-8s %s\n", s.Name, status, s.Title)
		for _, g := range s.Goals {
			fmt.Fprintf(w, "%-13s %-8s   goal: %s\n", "", "", g)
		}
	}
	return nil
}

// summarize prints each experiment's goals and whether they were met.
func summarize(r *bench.Run) {
	for _, e := range r.Experiments {
		switch e.Status {
		case bench.StatusDone, bench.StatusFailed:
			suffix := ""
			if e.CarriedFrom != "" {
				suffix = " (carried over from " + e.CarriedFrom + ")"
			}
			fmt.Printf("%-13s %s%s\n", e.Name, e.Status, suffix)
			if e.Error != "" {
				fmt.Printf("%-13s   error: %s\n", "", e.Error)
			}
			for _, f := range e.Figures {
				if f.Goal == nil {
					continue
				}
				mark := "MET"
				switch {
				case !f.Judged():
					mark = fmt.Sprintf("not judged (%d of %d rounds)", f.Rounds(), bench.MinRounds)
				case f.Met == nil || !*f.Met:
					mark = "NOT MET"
				}
				lo, hi := f.RatioRange()
				fmt.Printf("%-13s   %s: %.3g %s vs %.3g %s (%s) median ratio %.2f (%.2f–%.2f over %d rounds), goal %s: %s\n", "", f.Name, f.Value, f.Unit,
					f.BaselineValue, f.Unit, f.Baseline, f.Ratio, lo, hi, f.Rounds(), f.Goal.Expression(), mark)
			}
		default:
			fmt.Printf("%-13s %s\n", e.Name, e.Status)
		}
	}
}

// commandLine reconstructs how the bench was invoked; under `go run` the
// binary lives in a temporary build directory, so name the package instead.
func commandLine() string {
	prog := filepath.Base(os.Args[0])
	if strings.Contains(os.Args[0], "go-build") {
		prog = "go run ./bench/cmd/nprdma-bench"
	}
	args := make([]string, 0, len(os.Args))
	args = append(args, prog)
	for _, a := range os.Args[1:] {
		if strings.ContainsAny(a, " \t\"'$") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		args = append(args, a)
	}
	return strings.Join(args, " ")
}

// repoRoot finds the nprdma module root above the working directory, so
// that default paths land in the repository wherever the bench is started;
// "" when not inside it.
func repoRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains(string(b), "module github.com/nprdma/nprdma\n") {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

func fromRoot(root, p string) string {
	if filepath.IsAbs(p) || root == "" {
		return p
	}
	return filepath.Join(root, p)
}
