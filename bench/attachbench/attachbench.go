// Package attachbench is the attach-modes experiment: 4 KiB random reads
// through each way nprdma-initiator attaches a namespace — ublk, the
// kernel's NBD client, a loop device over a FUSE file, and the NBD socket
// (fio's nbd engine) — in the guest lab, where the kernel has ublk and NBD,
// with the target in the same guest. Figures are ratios to FUSE+loop
// measured in the same run, in interleaved rounds.
package attachbench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/bench/e2ebench"
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
	Runtime time.Duration // of each fio job, after a 1 s ramp
	Range   int64         // the bytes read at random (resident in the target)
}

// DefaultConfig returns the sizes for a mode: 5 interleaved rounds.
func DefaultConfig(m bench.Mode) Config {
	return Config{Rounds: 5, Runtime: bench.ByMode(m, 3*time.Second, 10*time.Second), Range: 32 << 20}
}

// Spec declares the experiment for the suite.
func Spec(bins *e2ebench.Binaries) bench.Spec {
	return bench.Spec{
		Name:  Name,
		Title: "Attach modes in the guest lab: ublk vs kernel NBD vs FUSE+loop vs the NBD socket, 4 KiB random reads",
		Goals: []string{GoalQD1.Text, GoalQD32.Text},
		Run: func(ctx context.Context, env *bench.Env) (*bench.Experiment, error) {
			return Measure(ctx, env, bins, DefaultConfig(env.Mode))
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

// script attaches the namespace in every mode at once (four controllers of
// one target, idle but for the one measured), fills the range, and runs
// the rounds; fio's JSON goes to $LAB_OUT/ROUND-MODE-qdN.json.
const script = `
cp "$BIN/nprdma-target" "$BIN/nprdma-initiator" /dev/shm/
I=/dev/shm/nprdma-initiator
step "target"
mkdir -p /dev/shm/target
/dev/shm/nprdma-target --allow-any-host --data-dir /dev/shm/target --default-size 64MiB --memory 128MiB \
	--listen 127.0.0.1:4420 --log-level warn >"$LAB_OUT/target.log" 2>&1 &
TP=$!
sleep 1
step "attach"
for m in ublk nbd-kernel fuse nbd; do
	"$I" --hostid-file /dev/shm/hostid attach --daemon --json --mode $m --name b-$m --target 127.0.0.1:4420 \
		--nqn nqn.2024-01.io.nprdma:default >"$LAB_OUT/attach-$m.json"
done
use() { python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r.get('device') or r['uri'])" "$LAB_OUT/attach-$1.json"; }
step "fill"
dd if=/dev/urandom of=$(use ublk) bs=1M count=$((RANGE >> 20)) oflag=direct status=none
modes=(ublk nbd-kernel fuse nbd)
for r in $(seq "$ROUNDS"); do
	step "round $r"
	for i in 0 1 2 3; do
		m=${modes[$(( (i + r - 1) % 4 ))]}
		if [ $m = nbd ]; then target="--ioengine=nbd --uri=$(use nbd)"; else target="--ioengine=libaio --direct=1 --filename=$(use $m)"; fi
		for qd in 1 32; do
			fio --name=$m --rw=randread --bs=4k --iodepth=$qd --size=$RANGE --time_based --runtime="$RUNTIME" --ramp_time=1 \
				--lat_percentiles=1 $target --output-format=json >"$LAB_OUT/$r-$m-qd$qd.json"
		done
	done
done
step "detach"
"$I" detach --all
kill -TERM $TP
wait $TP
`

// Measure runs the experiment in one guest.
func Measure(ctx context.Context, env *bench.Env, bins *e2ebench.Binaries, cfg Config) (*bench.Experiment, error) {
	if cfg.Rounds < 1 || cfg.Runtime < time.Second {
		return nil, fmt.Errorf("%s: bad config %+v", Name, cfg)
	}
	if err := lab.Available(); err != nil {
		return nil, fmt.Errorf("%s: the guest lab cannot run here: %w", Name, err)
	}
	tgt, ini, err := bins.Resolve(ctx, env)
	if err != nil {
		return nil, err
	}
	bin, err := os.MkdirTemp(env.ScratchDir, "attach-modes-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(bin)
	for _, b := range []string{tgt, ini} {
		if err := os.Symlink(b, filepath.Join(bin, filepath.Base(b))); err != nil {
			return nil, err
		}
	}
	res, err := lab.Run(ctx, lab.Spec{
		Modules: []string{"ublk_drv", "nbd", "loop", "fuse"},
		Env: map[string]string{"BIN": bin, "ROUNDS": fmt.Sprint(cfg.Rounds), "RANGE": fmt.Sprint(cfg.Range),
			"RUNTIME": fmt.Sprintf("%ds", int(cfg.Runtime/time.Second))},
		Timeout: time.Duration(cfg.Rounds)*8*(cfg.Runtime+2*time.Second) + 3*time.Minute,
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
	exp.Method = fmt.Sprintf("In the guest lab (QEMU under TCG, kernel 6.12, 2 vCPUs), nprdma-target serves a 64 MiB namespace "+
		"with a 128 MiB budget (every page resident: the attach paths are measured, not faults) on the guest's loopback, and "+
		"nprdma-initiator attaches it four times at once: ublk, nbd-kernel, fuse and nbd (defaults: one queue or connection per "+
		"CPU). A %s range is filled through ublk first. Each round runs, for each mode in turn (each round starting one mode "+
		"further on), fio 4 KiB random reads at QD1 then QD32 for %v after a 1 s ramp: libaio with O_DIRECT on the block devices, "+
		"fio's nbd engine on the NBD socket. The latency is fio's total latency (submission to completion; the kernel's NBD "+
		"client sends a request inside io_submit, so its completion latency alone would leave out most of its cost). %d rounds; the figures are medians of the rounds. Measured under TCG: only the ratios "+
		"between modes mean anything, not the absolute figures.",
		bench.FormatBytes(cfg.Range), cfg.Runtime, cfg.Rounds)
	exp.AddParam("rounds", cfg.Rounds)
	exp.AddParam("fio runtime per job", cfg.Runtime)
	exp.AddParam("range", bench.FormatBytes(cfg.Range))
	exp.AddParam("guest boot (this machine's clock)", res.Boot.Round(100*time.Millisecond))
	fuse := 2
	median := func(xs []float64) float64 { return xs[bench.MedianIndex(xs)] }
	for i, m := range modes {
		if i == fuse {
			continue
		}
		f := bench.NewFigure(m.label+": randread QD1 p50", median(p50[i]), "µs", modes[fuse].label, median(p50[fuse])).
			WithNotes(fmt.Sprintf("measured under TCG; per round: %s; baseline %s", bench.RoundList(p50[i]), bench.RoundList(p50[fuse])))
		if m.key == "ublk" {
			f = f.WithGoal(GoalQD1)
		}
		exp.Add(f)
		f = bench.NewFigure(m.label+": randread QD32 IOPS", median(iops[i]), "IOPS", modes[fuse].label, median(iops[fuse])).
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
		lat = append(lat, bench.Point{X: float64(i), Y: median(p50[i])})
		thr = append(thr, bench.Point{X: float64(i), Y: median(iops[i])})
		exp.Note("%s: QD1 p50 spread %.0f%%, QD32 IOPS spread %.0f%% across rounds (max-min over mean).", m.label,
			100*bench.Spread(p50[i]), 100*bench.Spread(iops[i]))
	}
	exp.Note("Measured under TCG in the guest lab, both ends in the guest: an emulated CPU makes every system call, wake-up and " +
		"copy costlier, and the ratios between modes are what carries over, not the microseconds.")
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
