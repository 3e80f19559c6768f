package e2ebench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/lab"
)

// GuestNVMeTCPName is the experiment's fixed name (--only guest-nvmetcp).
const GuestNVMeTCPName = "guest-nvmetcp"

// GuestNVMeTCPGoal: a userspace target near the kernel's own (issue 23).
var GuestNVMeTCPGoal = bench.Goal{
	Text: "the Linux NVMe/TCP host in the guest, 4 KiB randread QD32 IOPS: nprdma-target ≥ 0.7× the kernel's nvmet-tcp (same guest, same fio job; under TCG)",
	Op:   bench.AtLeast, Threshold: 0.7,
}

// GuestNVMeTCPConfig sizes the experiment.
type GuestNVMeTCPConfig struct {
	// Rounds of both targets, each at QD32 then QD1, interleaved.
	Rounds int
	// Runtime of each fio run.
	Runtime time.Duration
	// Ramp is fio's --ramp_time before each run.
	Ramp time.Duration
	// NamespaceSize of both targets' namespaces (files in the guest's
	// /dev/shm): nprdma-target's --memory is twice it, so both serve from
	// DRAM and the figures compare the transports and controllers.
	NamespaceSize int64
}

// DefaultGuestNVMeTCPConfig returns the sizes for a mode: the mode's
// rounds, in one guest (a boot under TCG costs more than a round).
func DefaultGuestNVMeTCPConfig(m bench.Mode) GuestNVMeTCPConfig {
	return GuestNVMeTCPConfig{
		Rounds:        m.Rounds(),
		Runtime:       bench.ByMode(m, 2*time.Second, 20*time.Second),
		Ramp:          bench.WarmUp(m),
		NamespaceSize: 256 << 20,
	}
}

// GuestNVMeTCPSpec declares the experiment for the suite.
func GuestNVMeTCPSpec(bins *Binaries) bench.Spec {
	return bench.Spec{
		Name:  GuestNVMeTCPName,
		Title: "The Linux kernel's NVMe/TCP host against nprdma-target and against the kernel's nvmet-tcp, in one guest (TCG)",
		Goals: []string{GuestNVMeTCPGoal.Text, "QD1 p50 latency, ours against nvmet-tcp, reported"},
		// One guest runs every round: a boot costs more than a round.
		RoundsInside: true,
		Run: func(ctx context.Context, env *bench.Env) (*bench.Experiment, error) {
			return MeasureGuestNVMeTCP(ctx, env, bins, DefaultGuestNVMeTCPConfig(env.Mode))
		},
	}
}

// guestNVMeTCPScript serves two namespaces of the same size in the guest,
// one by the kernel's nvmet-tcp (port 4421), one by nprdma-target (4420),
// connects the kernel host to both, reads each whole once, then runs the
// same fio jobs against each, alternating which goes first every round.
const guestNVMeTCPScript = `
step setup
cp "$TARGET" /dev/shm/nprdma-target
truncate -s "$SIZE" /dev/shm/nvmet.img /dev/shm/ours.img
nvmet_export "$KNQN" /dev/shm/nvmet.img tcp 127.0.0.1 4421
/dev/shm/nprdma-target --backing /dev/shm/ours.img --memory "$MEMORY" \
	--listen 127.0.0.1:14420 --listen-nvme-tcp 127.0.0.1:4420 --nqn "$ONQN" --allow-any-host \
	--data-dir /dev/shm/data --log-level warn >/dev/shm/target.log 2>&1 &
echo $! >/dev/shm/target.pid
for ((i = 0; i < 300; i++)); do grep -q 'NVMe/TCP on' /dev/shm/target.log && break; sleep 0.1; done
grep -q 'NVMe/TCP on' /dev/shm/target.log
nvme connect -t tcp -a 127.0.0.1 -s 4421 -n "$KNQN"
nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$ONQN"
declare -A dev
dev[nvmet]=$(nvme_ns_dev "$KNQN")
dev[ours]=$(nvme_ns_dev "$ONQN")

step warm
for who in nvmet ours; do dd if="${dev[$who]}" of=/dev/null bs=1M iflag=direct status=none; done

step measure
for ((r = 1; r <= ROUNDS; r++)); do
	order="nvmet ours"
	((r % 2 == 0)) && order="ours nvmet"
	for who in $order; do
		for qd in 32 1; do
			fio --name=randread --filename="${dev[$who]}" --direct=1 --ioengine=libaio --rw=randread --bs=4k \
				--iodepth="$qd" --norandommap --randrepeat=0 --time_based --runtime="$RUNTIME" --ramp_time="$RAMP" \
				--output-format=json --output="$LAB_OUT/r$r-$who-qd$qd.json"
		done
	done
done

step teardown
nvme disconnect -n "$ONQN"
nvme disconnect -n "$KNQN"
kill "$(cat /dev/shm/target.pid)"
cp /dev/shm/target.log "$LAB_OUT/"
nvmet_clear
`

// MeasureGuestNVMeTCP runs the experiment with cfg.
func MeasureGuestNVMeTCP(ctx context.Context, env *bench.Env, bins *Binaries, cfg GuestNVMeTCPConfig) (*bench.Experiment, error) {
	if cfg.Rounds < 1 || cfg.Runtime < time.Second || cfg.NamespaceSize < 16<<20 {
		return nil, fmt.Errorf("%s: bad config %+v", GuestNVMeTCPName, cfg)
	}
	if err := lab.Available(); err != nil {
		return nil, fmt.Errorf("%s: the guest lab cannot run here: %w", GuestNVMeTCPName, err)
	}
	tgtBin, _, err := bins.Resolve(ctx, env)
	if err != nil {
		return nil, err
	}
	out, err := env.Dir(GuestNVMeTCPName)
	if err != nil {
		return nil, err
	}
	spec := lab.Spec{
		Modules: []string{"nvme-tcp", "nvmet-tcp"},
		Script:  guestNVMeTCPScript,
		Env: map[string]string{
			"TARGET": tgtBin, "SIZE": fmt.Sprint(cfg.NamespaceSize), "MEMORY": fmt.Sprint(2 * cfg.NamespaceSize),
			"KNQN": "nqn.2026-11.io.nprdma:bench-nvmet", "ONQN": "nqn.2026-11.io.nprdma:bench-ours",
			"ROUNDS": fmt.Sprint(cfg.Rounds), "RUNTIME": bench.FioTime(cfg.Runtime), "RAMP": bench.FioTime(cfg.Ramp),
		},
		// Boot, two 256 MiB reads and 4 runs of Runtime+1 s per round,
		// with room for TCG on a loaded machine.
		Timeout: 3*time.Minute + time.Duration(cfg.Rounds)*4*(cfg.Runtime+5*time.Second),
	}
	res, err := lab.Run(ctx, spec)
	if res != nil {
		defer os.RemoveAll(res.Dir)
		_ = os.WriteFile(filepath.Join(out, "guest-output.txt"), []byte(res.Output), 0o644)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", GuestNVMeTCPName, err)
	}
	if res.ExitCode != 0 {
		return nil, fmt.Errorf("%s: the guest script failed in step %q; output in %s", GuestNVMeTCPName, res.FailedStep, out)
	}
	exp := &bench.Experiment{}
	exp.Method = fmt.Sprintf("One guest of the lab (QEMU TCG, Debian 6.12 kernel, 2 vCPUs): the kernel's nvmet-tcp serves a %s file of the guest's /dev/shm, "+
		"nprdma-target (--memory %s, so every page is resident after one read) another of the same size, both on the guest's loopback; "+
		"the kernel's NVMe/TCP host connects to both, reads each whole once, then runs fio 4 KiB randread (libaio, O_DIRECT, "+
		"norandommap) for %v at QD32 and at QD1 against each, %d rounds alternating which target goes first. "+
		"A figure's ratio is the median of the per-round ratios of ours against nvmet-tcp.",
		bench.FormatBytes(cfg.NamespaceSize), bench.FormatBytes(2*cfg.NamespaceSize), cfg.Runtime, cfg.Rounds)
	exp.Params = []bench.Param{{Name: "rounds", Value: fmt.Sprint(cfg.Rounds)}, {Name: "runtime", Value: cfg.Runtime.String()},
		{Name: "namespace", Value: bench.FormatBytes(cfg.NamespaceSize)}}
	var iops, p50 [2][]float64 // [nvmet, ours]
	for r := 1; r <= cfg.Rounds; r++ {
		for k, who := range []string{"nvmet", "ours"} {
			for _, qd := range []int{32, 1} {
				name := fmt.Sprintf("r%d-%s-qd%d.json", r, who, qd)
				raw, err := os.ReadFile(filepath.Join(res.Dir, name))
				if err != nil {
					return exp, fmt.Errorf("%s: %w", GuestNVMeTCPName, err)
				}
				_ = os.WriteFile(filepath.Join(out, name), raw, 0o644)
				fr, err := bench.ParseFioJSON(raw)
				if err != nil || len(fr.Jobs) != 1 || fr.Jobs[0].Error != 0 {
					return exp, fmt.Errorf("%s: %s: %v", GuestNVMeTCPName, name, err)
				}
				rd := fr.Jobs[0].Read
				if qd == 32 {
					iops[k] = append(iops[k], rd.IOPS)
				} else {
					p50[k] = append(p50[k], bench.Micros(rd.P50))
				}
			}
		}
	}
	exp.Add(
		bench.RoundsFigure("QD32 IOPS, ours vs nvmet-tcp (TCG)", "IOPS", "the kernel's nvmet-tcp, same guest", iops[1], iops[0]).
			WithGoal(GuestNVMeTCPGoal),
		bench.RoundsFigure("QD1 p50, ours vs nvmet-tcp (TCG)", "µs", "the kernel's nvmet-tcp, same guest", p50[1], p50[0]),
	)
	exp.Note("Per round, QD32 IOPS: ours %s; nvmet-tcp %s. QD1 p50 µs: ours %s; nvmet-tcp %s.",
		bench.RoundList(iops[1]), bench.RoundList(iops[0]), bench.RoundList(p50[1]), bench.RoundList(p50[0]))
	exp.Note("Measured under TCG (no KVM here): both targets and the host share the guest's two emulated vCPUs, so only the ratio means anything; " +
		"absolute figures are those of an emulated CPU.")
	exp.Note("The guest's output and fio's JSON are in %s.", out)
	return exp, nil
}
