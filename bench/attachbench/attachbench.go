// Package attachbench is the attach-modes experiment: 4 KiB random reads
// through each way nprdma-initiator attaches a namespace — ublk, the
// kernel's NBD client, a loop device over a FUSE file, and the NBD socket
// (fio's nbd engine) — in the guest lab, where the kernel has ublk and NBD.
// Each mode serves an in-memory namespace (memserve), so that the figures
// compare the attach paths, not the initiator and target behind them.
// Figures are ratios to FUSE+loop measured in the same run, in interleaved
// rounds.
package attachbench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/lab"
)

// Name is the experiment's fixed name (--only attach-modes).
const Name = "attach-modes"

// Goals: ublk's shorter path (io_uring commands to this process, no loop
// driver, no FUSE) shows at QD1 as latency and at QD32 as throughput.
var (
	GoalQD1  = bench.Goal{Text: "4 KiB randread QD1 p50 through ublk ≤ 0.8× FUSE+loop (guest, TCG)", Op: bench.AtMost, Threshold: 0.8}
	GoalQD32 = bench.Goal{Text: "4 KiB randread QD32 IOPS through ublk ≥ 1.5× FUSE+loop (guest, TCG)", Op: bench.AtLeast, Threshold: 1.5}
)

// Config sizes the experiment.
type Config struct {
	Rounds  int
	Runtime time.Duration // of each fio job, after Ramp
	Ramp    time.Duration
	Size    int64 // of the in-memory namespace, read at random
}

// DefaultConfig returns the sizes for a mode: the mode's rounds,
// interleaved in one guest (a boot under TCG costs more than a round).
func DefaultConfig(m bench.Mode) Config {
	return Config{Rounds: m.Rounds(), Runtime: bench.ByMode(m, time.Second, 10*time.Second), Ramp: bench.WarmUp(m), Size: 64 << 20}
}

// Spec declares the experiment for the suite; repo is the module's root.
func Spec(repo string) bench.Spec {
	return bench.Spec{
		Name:  Name,
		Title: "Attach modes in the guest lab: ublk vs kernel NBD vs FUSE+loop vs the NBD socket, 4 KiB random reads",
		Goals: []string{GoalQD1.Text, GoalQD32.Text},
		// One guest runs every round.
		RoundsInside: true,
		Run: func(ctx context.Context, env *bench.Env) (*bench.Experiment, error) {
			return Measure(ctx, env, repo, DefaultConfig(env.Mode))
		},
	}
}

// modes are the cases, in the order of the first round; each round starts
// one further on.
var modes = []struct{ key, label string }{
	{"ublk", "ublk (/dev/ublkbN)"},
	{"nbd-kernel", "kernel NBD (/dev/nbdN)"},
	{"fuse", "FUSE+loop (/dev/loopN)"},
	{"nbd", "NBD socket (fio nbd engine)"},
}

// script serves an in-memory namespace through every mode at once (four
// memserve processes, idle but for the one measured) and runs the rounds;
// fio's JSON goes to $LAB_OUT/ROUND-MODE-qdN.json.
const script = `
cp "$MEMSERVE" /dev/shm/memserve
step "serve"
pids=()
for m in ublk nbd-kernel fuse nbd; do
	/dev/shm/memserve -mode $m -size $SIZE -ready /dev/shm/$m.use -run-dir /dev/shm/run-$m >"$LAB_OUT/memserve-$m.log" 2>&1 &
	pids+=($!)
done
for m in ublk nbd-kernel fuse nbd; do
	for i in $(seq 600); do [ -s /dev/shm/$m.use ] && break; sleep 0.1; done
	[ -s /dev/shm/$m.use ] || { cat "$LAB_OUT/memserve-$m.log"; exit 1; }
done
modes=(ublk nbd-kernel fuse nbd)
for r in $(seq "$ROUNDS"); do
	step "round $r"
	for i in 0 1 2 3; do
		m=${modes[$(( (i + r - 1) % 4 ))]}
		use=$(cat /dev/shm/$m.use)
		if [ $m = nbd ]; then target="--ioengine=nbd --uri=$use"; else target="--ioengine=libaio --direct=1 --filename=$use"; fi
		for qd in 1 32; do
			fio --name=$m --rw=randread --bs=4k --iodepth=$qd --size=$SIZE --time_based --runtime="$RUNTIME" --ramp_time="$RAMP" \
				--lat_percentiles=1 $target --output-format=json >"$LAB_OUT/$r-$m-qd$qd.json"
		done
	done
done
step "stop"
kill -TERM "${pids[@]}"
for p in "${pids[@]}"; do wait $p; done
`

// Measure runs the experiment in one guest; repo is the module's root, where
// memserve is built.
func Measure(ctx context.Context, env *bench.Env, repo string, cfg Config) (*bench.Experiment, error) {
	if cfg.Rounds < 1 || cfg.Runtime < time.Second || cfg.Size < 1<<20 || cfg.Size%4096 != 0 {
		return nil, fmt.Errorf("%s: bad config %+v", Name, cfg)
	}
	if err := lab.Available(); err != nil {
		return nil, fmt.Errorf("%s: the guest lab cannot run here: %w", Name, err)
	}
	if repo == "" {
		return nil, fmt.Errorf("%s: the repository root is unknown: run the bench inside the nprdma repository", Name)
	}
	bin, err := os.MkdirTemp(env.ScratchDir, "attach-modes-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(bin)
	memserve := filepath.Join(bin, "memserve")
	build := exec.CommandContext(ctx, "go", "build", "-o", memserve, "./bench/attachbench/memserve")
	build.Dir = repo
	if msg, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%s: go build of memserve: %w: %s", Name, err, strings.TrimSpace(string(msg)))
	}
	res, err := lab.Run(ctx, lab.Spec{
		Modules: []string{"ublk_drv", "nbd", "loop", "fuse"},
		Env: map[string]string{"MEMSERVE": memserve, "ROUNDS": fmt.Sprint(cfg.Rounds), "SIZE": fmt.Sprint(cfg.Size),
			"RUNTIME": bench.FioTime(cfg.Runtime), "RAMP": bench.FioTime(cfg.Ramp)},
		Timeout: time.Duration(cfg.Rounds)*8*(cfg.Runtime+cfg.Ramp+5*time.Second) + 3*time.Minute,
		Script:  script,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	defer os.RemoveAll(res.Dir)
	if res.ExitCode != 0 {
		return nil, fmt.Errorf("%s: the guest script failed in step %q (exit %d): %s", Name, res.FailedStep, res.ExitCode, tailOf(res.Output, 1500))
	}
	out, err := env.Dir(Name)
	if err != nil {
		return nil, err
	}

	// p50 at QD1 (µs) and IOPS at QD32, per mode, per round.
	p50 := make([][]float64, len(modes))
	iops := make([][]float64, len(modes))
	for r := 1; r <= cfg.Rounds; r++ {
		for i, m := range modes {
			for _, qd := range []int{1, 32} {
				name := fmt.Sprintf("%d-%s-qd%d.json", r, m.key, qd)
				raw, err := os.ReadFile(filepath.Join(res.Dir, name))
				if err != nil {
					return nil, fmt.Errorf("%s: %w", Name, err)
				}
				os.WriteFile(filepath.Join(out, name), raw, 0o644)
				fr, err := bench.ParseFioJSON(raw)
				if err != nil || len(fr.Jobs) != 1 {
					return nil, fmt.Errorf("%s: %s: %v", Name, name, err)
				}
				if qd == 1 {
					// Total latency, not completion latency: the kernel's
					// NBD client sends the request inside io_submit, so
					// most of its time is submission latency.
					lat, ok := fr.Jobs[0].Read.Lat.Percentile(50)
					if !ok {
						return nil, fmt.Errorf("%s: %s: no total latency percentiles", Name, name)
					}
					p50[i] = append(p50[i], float64(lat.Nanoseconds())/1000)
				} else {
					iops[i] = append(iops[i], fr.Jobs[0].Read.IOPS)
				}
			}
		}
	}

	exp := &bench.Experiment{Name: Name}
	exp.Method = fmt.Sprintf("In the guest lab (QEMU under TCG, kernel 6.12, 2 vCPUs), four memserve processes (bench/attachbench/memserve) "+
		"each serve a %s in-memory namespace (blockio.Memory) through one attach mode, with the frontends nprdma-initiator attach "+
		"uses and their defaults (one queue or connection per CPU, depth 128): ublk, nbd-kernel, fuse and the NBD socket. An in-memory "+
		"namespace, not the target: through the initiator and the target each 4 KiB read costs tens of milliseconds of CPU under TCG "+
		"in either process, the same in every mode, which hides the attach paths' differences. Each round runs, for each mode in "+
		"turn (each round starting one mode further on), fio 4 KiB random reads over the whole namespace at QD1 then QD32 for %v "+
		"after a %v ramp: libaio with O_DIRECT on the block devices, fio's nbd engine on the NBD socket. The latency is fio's total "+
		"latency (submission to completion: the kernel's NBD client sends a request inside io_submit, so its completion latency "+
		"alone would leave out most of its cost). %d rounds; a figure's ratio is the median of the per-round ratios. Measured under TCG: only the "+
		"ratios between modes mean anything, not the absolute figures.",
		bench.FormatBytes(cfg.Size), cfg.Runtime, cfg.Ramp, cfg.Rounds)
	exp.AddParam("rounds", cfg.Rounds)
	exp.AddParam("fio runtime per job", cfg.Runtime)
	exp.AddParam("namespace (in memory)", bench.FormatBytes(cfg.Size))
	exp.AddParam("guest boot (this machine's clock)", res.Boot.Round(100*time.Millisecond))
	fuse := 2
	for i, m := range modes {
		if i == fuse {
			continue
		}
		f := bench.RoundsFigure(m.label+": randread QD1 p50", "µs", modes[fuse].label, p50[i], p50[fuse]).
			WithNotes(fmt.Sprintf("measured under TCG; per round: %s; baseline %s", bench.RoundList(p50[i]), bench.RoundList(p50[fuse])))
		if m.key == "ublk" {
			f = f.WithGoal(GoalQD1)
		}
		exp.Add(f)
		f = bench.RoundsFigure(m.label+": randread QD32 IOPS", "IOPS", modes[fuse].label, iops[i], iops[fuse]).
			WithNotes(fmt.Sprintf("measured under TCG; per round: %s; baseline %s", bench.RoundList(iops[i]), bench.RoundList(iops[fuse])))
		if m.key == "ublk" {
			f = f.WithGoal(GoalQD32)
		}
		exp.Add(f)
	}
	cats := make([]string, len(modes))
	var lat, thr []bench.Point
	for i, m := range modes {
		cats[i] = m.label
		lat = append(lat, bench.Point{X: float64(i), Y: bench.Median(p50[i])})
		thr = append(thr, bench.Point{X: float64(i), Y: bench.Median(iops[i])})
		exp.Note("%s: QD1 p50 spread %.0f%%, QD32 IOPS spread %.0f%% across rounds (max-min over mean).", m.label,
			100*bench.Spread(p50[i]), 100*bench.Spread(iops[i]))
	}
	exp.Note("Measured under TCG in the guest lab: an emulated CPU makes every system call, wake-up and copy costlier, and the " +
		"ratios between modes are what carries over, not the microseconds.")
	exp.AddSeries(bench.Series{Name: "qd1-p50", Label: "QD1 p50", YUnit: "µs", Points: lat})
	exp.AddSeries(bench.Series{Name: "qd32-iops", Label: "QD32 IOPS", YUnit: "IOPS", Points: thr})
	exp.AddPlot(bench.Plot{File: "attach-qd1.svg", Kind: bench.PlotBars, Title: "4 KiB randread QD1 p50 by attach mode (guest, TCG)",
		YLabel: "µs", Categories: cats, Series: []string{"qd1-p50"}})
	exp.AddPlot(bench.Plot{File: "attach-qd32.svg", Kind: bench.PlotBars, Title: "4 KiB randread QD32 IOPS by attach mode (guest, TCG)",
		YLabel: "IOPS", Categories: cats, Series: []string{"qd32-iops"}})
	return exp, nil
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
