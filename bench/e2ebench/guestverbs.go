package e2ebench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/lab"
)

// GuestVerbsName is the experiment's fixed name (--only guest-verbs).
const GuestVerbsName = "guest-verbs"

// GuestVerbsGoal: a read served one-sided through frames is faster than the
// two-sided NVMe Read it saves (docs/np-rdma.md §11).
var GuestVerbsGoal = bench.Goal{
	Text: "over Soft-RoCE in the guest, 4 KiB randread QD1 p50 of a resident hot set through attach: one-sided (frames) ≤ 1.0× two-sided NVMe Read (same guest, same fio job; under TCG)",
	Op:   bench.AtMost, Threshold: 1.0,
}

// GuestVerbsConfig sizes the experiment.
type GuestVerbsConfig struct {
	// Rounds of each attachment, interleaved.
	Rounds int
	// Runtime of each fio run, after Ramp.
	Runtime, Ramp time.Duration
	// Budgets are the --memory values whose frame registration is timed.
	Budgets []int64
}

// DefaultGuestVerbsConfig returns the sizes for a mode.
func DefaultGuestVerbsConfig(m bench.Mode) GuestVerbsConfig {
	return GuestVerbsConfig{
		Rounds:  m.Rounds(),
		Runtime: bench.ByMode(m, 2*time.Second, 15*time.Second),
		Ramp:    bench.WarmUp(m),
		Budgets: []int64{32 << 20, 128 << 20, 512 << 20},
	}
}

// GuestVerbsSpec declares the experiment for the suite.
func GuestVerbsSpec(bins *Binaries) bench.Spec {
	return bench.Spec{
		Name:  GuestVerbsName,
		Title: "nprdma over an RDMA NIC (Soft-RoCE in one guest, TCG): one-sided reads through frames, their registration, verbs against the tcp provider",
		Goals: []string{GuestVerbsGoal.Text,
			"frame registration time against the budget (linear) and against the namespace size (none), reported",
			"the same fio job through attach over verbs against over the tcp provider, reported"},
		// One guest runs every round: a boot costs more than a round.
		RoundsInside: true,
		Run: func(ctx context.Context, env *bench.Env) (*bench.Experiment, error) {
			return MeasureGuestVerbs(ctx, env, bins, DefaultGuestVerbsConfig(env.Mode))
		},
	}
}

// guestVerbsScript: registrations timed at each budget (a namespace 4x the
// budget, then one 16x a budget, started and stopped); then two targets of
// one 256 MiB namespace with --memory 512 MiB (everything resident): one
// over verbs (frames), one over tcp; three attachments (verbs one-sided,
// verbs two-sided, tcp) read the same hot set with the same fio jobs,
// rotating which goes first.
const guestVerbsScript = `
start_target() { # NAME BACKING MEMORY PROVIDER LISTEN
	setsid /dev/shm/nprdma-target --provider "$4" --listen "$5" --backing "$2" --memory "$3" --allow-any-host \
		--nqn "nqn.2026-11.io.nprdma:$1" --data-dir "/dev/shm/data-$1" --log-level info >"/dev/shm/$1.log" 2>&1 &
	echo $! >"/dev/shm/$1.pid"
	for ((i = 0; i < 300; i++)); do grep -q 'connect with' "/dev/shm/$1.log" && return 0; sleep 0.1; done
	cat "/dev/shm/$1.log"; return 1
}
stop_target() { kill "$(cat "/dev/shm/$1.pid")"; while kill -0 "$(cat "/dev/shm/$1.pid")" 2>/dev/null; do sleep 0.1; done; }

step setup
rxe_up
cp "$TARGET" "$INITIATOR" /dev/shm/

step registration
for b in $BUDGETS; do
	for mult in 4 16; do
		truncate -s $((b * mult)) /dev/shm/reg.img
		start_target "reg-$b-$mult" /dev/shm/reg.img "$b" verbs 10.0.2.15:4430
		grep 'frames registered' "/dev/shm/reg-$b-$mult.log" >"$LAB_OUT/reg-$b-$mult"
		stop_target "reg-$b-$mult"
		rm -f /dev/shm/reg.img
	done
done

step targets
truncate -s 256M /dev/shm/v.img /dev/shm/t.img
start_target v /dev/shm/v.img 512MiB verbs 10.0.2.15:4420
start_target t /dev/shm/t.img 512MiB tcp 127.0.0.1:14420
ini=/dev/shm/nprdma-initiator
$ini --provider verbs attach --target 10.0.2.15:4420 --nqn nqn.2026-11.io.nprdma:v --name one --mode nbd --socket /dev/shm/one.sock --run-dir /dev/shm/run --daemon
$ini --provider verbs attach --target 10.0.2.15:4420 --nqn nqn.2026-11.io.nprdma:v --name two --mode nbd --socket /dev/shm/two.sock --run-dir /dev/shm/run --daemon --two-sided
$ini --provider tcp attach --target 127.0.0.1:14420 --nqn nqn.2026-11.io.nprdma:t --name tcp --mode nbd --socket /dev/shm/tcp.sock --run-dir /dev/shm/run --daemon

step warm
for a in one two tcp; do
	fio --name=warm --ioengine=nbd --uri="nbd+unix:///?socket=/dev/shm/$a.sock" --rw=read --bs=256k --size=32M --output-format=terse >/dev/null
done

step measure
for ((r = 1; r <= ROUNDS; r++)); do
	case $((r % 3)) in 0) order="one two tcp" ;; 1) order="two tcp one" ;; 2) order="tcp one two" ;; esac
	for a in $order; do
		for qd in 1 16; do
			fio --name=randread --ioengine=nbd --uri="nbd+unix:///?socket=/dev/shm/$a.sock" --rw=randread --bs=4k \
				--size=32M --iodepth="$qd" --norandommap --randrepeat=0 --time_based --runtime="$RUNTIME" --ramp_time="$RAMP" \
				--output-format=json --output="$LAB_OUT/r$r-$a-qd$qd.json"
		done
	done
done

step teardown
$ini detach --run-dir /dev/shm/run --all
stop_target v
stop_target t
`

var regLine = regexp.MustCompile(`bytes=(\d+) took=(\S+) namespace=(\d+)`)

// MeasureGuestVerbs runs the experiment with cfg.
func MeasureGuestVerbs(ctx context.Context, env *bench.Env, bins *Binaries, cfg GuestVerbsConfig) (*bench.Experiment, error) {
	if cfg.Rounds < 1 || cfg.Runtime < time.Second || len(cfg.Budgets) < 2 {
		return nil, fmt.Errorf("%s: bad config %+v", GuestVerbsName, cfg)
	}
	if err := lab.Available(); err != nil {
		return nil, fmt.Errorf("%s: the guest lab cannot run here: %w", GuestVerbsName, err)
	}
	tgt, ini, err := bins.Resolve(ctx, env)
	if err != nil {
		return nil, err
	}
	out, err := env.Dir(GuestVerbsName)
	if err != nil {
		return nil, err
	}
	budgets := ""
	for _, b := range cfg.Budgets {
		budgets += fmt.Sprint(b) + " "
	}
	res, err := lab.Run(ctx, lab.Spec{
		Modules: []string{"rdma_rxe", "rdma_ucm"},
		Script:  guestVerbsScript,
		Env: map[string]string{"TARGET": tgt, "INITIATOR": ini, "BUDGETS": budgets,
			"ROUNDS": fmt.Sprint(cfg.Rounds), "RUNTIME": bench.FioTime(cfg.Runtime), "RAMP": bench.FioTime(cfg.Ramp)},
		Timeout: 4*time.Minute + time.Duration(cfg.Rounds)*6*(cfg.Runtime+5*time.Second),
	})
	if res != nil {
		defer os.RemoveAll(res.Dir)
		_ = os.WriteFile(filepath.Join(out, "guest-output.txt"), []byte(res.Output), 0o644)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", GuestVerbsName, err)
	}
	if res.ExitCode != 0 {
		return nil, fmt.Errorf("%s: the guest script failed in step %q; output in %s", GuestVerbsName, res.FailedStep, out)
	}
	exp := &bench.Experiment{}
	exp.Method = fmt.Sprintf("One guest of the lab (QEMU TCG, Debian 6.12 kernel, 2 vCPUs, Soft-RoCE rxe0 over eth0). "+
		"Registration: nprdma-target --provider verbs started with --memory %s, each with a namespace 4× and 16× the budget; "+
		"the time the target logs for registering (pinning) the frames and their table. "+
		"Reads: two targets of a 256 MiB namespace with --memory 512 MiB (all resident), one over verbs (read through frames), "+
		"one over the tcp provider (read through the unpinned region); three attachments through the NBD socket "+
		"(verbs one-sided, verbs --two-sided, tcp), each warmed by reading a 32 MiB hot set, then fio 4 KiB randread "+
		"of the hot set for %v at QD1 and QD16, %d rounds rotating the order. A figure's ratio is the median of the per-round ratios.",
		budgetList(cfg.Budgets), cfg.Runtime, cfg.Rounds)
	exp.Params = []bench.Param{{Name: "rounds", Value: fmt.Sprint(cfg.Rounds)}, {Name: "runtime", Value: cfg.Runtime.String()}}

	// Registration.
	var perGiB []float64
	var small, large time.Duration
	for i, b := range cfg.Budgets {
		var took [2]time.Duration
		for k, mult := range []int{4, 16} {
			raw, err := os.ReadFile(filepath.Join(res.Dir, fmt.Sprintf("reg-%d-%d", b, mult)))
			if err != nil {
				return exp, fmt.Errorf("%s: %w", GuestVerbsName, err)
			}
			m := regLine.FindSubmatch(raw)
			if m == nil {
				return exp, fmt.Errorf("%s: no registration logged at budget %d: %q", GuestVerbsName, b, raw)
			}
			bytes, _ := strconv.ParseFloat(string(m[1]), 64)
			took[k], err = time.ParseDuration(string(m[2]))
			if err != nil {
				return exp, fmt.Errorf("%s: %w", GuestVerbsName, err)
			}
			if mult == 4 {
				perGiB = append(perGiB, took[k].Seconds()/(bytes/(1<<30))*1000)
			}
		}
		exp.Note("Budget %s: frames registered in %v with a namespace 4× it, %v with one 16× it.", bench.FormatBytes(b), took[0].Round(time.Microsecond), took[1].Round(time.Microsecond))
		if i == 0 {
			small = took[0]
		}
		if i == len(cfg.Budgets)-1 {
			large = took[0]
		}
	}
	exp.Add(bench.NewFigure(fmt.Sprintf("frame registration, budget %s vs %s (TCG)", bench.FormatBytes(cfg.Budgets[len(cfg.Budgets)-1]), bench.FormatBytes(cfg.Budgets[0])),
		large.Seconds()*1000, "ms", "the smallest budget", small.Seconds()*1000).
		WithNotes(fmt.Sprintf("budget ratio %.0f×; ms per GiB registered: %s", float64(cfg.Budgets[len(cfg.Budgets)-1])/float64(cfg.Budgets[0]), bench.RoundList(perGiB))))

	// Reads.
	p50 := map[string][]float64{}
	iops := map[string][]float64{}
	for r := 1; r <= cfg.Rounds; r++ {
		for _, a := range []string{"one", "two", "tcp"} {
			for _, qd := range []int{1, 16} {
				name := fmt.Sprintf("r%d-%s-qd%d.json", r, a, qd)
				raw, err := os.ReadFile(filepath.Join(res.Dir, name))
				if err != nil {
					return exp, fmt.Errorf("%s: %w", GuestVerbsName, err)
				}
				_ = os.WriteFile(filepath.Join(out, name), raw, 0o644)
				fr, err := bench.ParseFioJSON(raw)
				if err != nil || len(fr.Jobs) != 1 || fr.Jobs[0].Error != 0 {
					return exp, fmt.Errorf("%s: %s: %v", GuestVerbsName, name, err)
				}
				if qd == 1 {
					p50[a] = append(p50[a], bench.Micros(fr.Jobs[0].Read.P50))
				} else {
					iops[a] = append(iops[a], fr.Jobs[0].Read.IOPS)
				}
			}
		}
	}
	exp.Add(
		bench.RoundsFigure("QD1 p50, one-sided through frames vs two-sided NVMe Read, over rxe (TCG)", "µs",
			"the same attachment's NVMe Read (--two-sided)", p50["one"], p50["two"]).WithGoal(GuestVerbsGoal),
		bench.RoundsFigure("QD16 IOPS, verbs (frames) vs the tcp provider (unpinned region) (TCG)", "IOPS",
			"the tcp provider, same guest", iops["one"], iops["tcp"]),
		bench.RoundsFigure("QD1 p50, verbs (frames) vs the tcp provider (unpinned region) (TCG)", "µs",
			"the tcp provider, same guest", p50["one"], p50["tcp"]),
	)
	exp.Note("Per round, QD1 p50 µs: frames %s; two-sided %s; tcp %s. QD16 IOPS: frames %s; two-sided %s; tcp %s.",
		bench.RoundList(p50["one"]), bench.RoundList(p50["two"]), bench.RoundList(p50["tcp"]),
		bench.RoundList(iops["one"]), bench.RoundList(iops["two"]), bench.RoundList(iops["tcp"]))
	exp.Note("Measured under TCG (no KVM here): Soft-RoCE is the kernel copying packets through the guest's emulated CPUs, so only ratios in one run mean anything.")
	exp.Note("The guest's output and fio's JSON are in %s.", out)
	return exp, nil
}

func budgetList(bs []int64) string {
	s := ""
	for i, b := range bs {
		if i > 0 {
			s += ", "
		}
		s += bench.FormatBytes(b)
	}
	return s
}
