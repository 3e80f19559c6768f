package npbench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/swap"
)

// RegistrationConfig sizes the registration experiment.
type RegistrationConfig struct {
	Unpinned []int64 // region sizes registered unpinned
	Pinned   []int64 // buffer sizes registered pinned (mlock)
	Rounds   int     // unpinned rounds (each size once per round)
	// PinnedRounds is smaller: a pinned GiB takes seconds.
	PinnedRounds int
}

// DefaultRegistrationConfig returns the sizes for a mode: unpinned from
// 64 MiB to 1 TiB; pinned up to what the mode's time allows (1 GiB quick,
// 4 GiB full, at about 3 s per GiB here).
func DefaultRegistrationConfig(m bench.Mode) RegistrationConfig {
	const mib, gib = 1 << 20, 1 << 30
	return RegistrationConfig{
		Unpinned: []int64{64 * mib, 256 * mib, gib, 4 * gib, 16 * gib, 64 * gib, 256 * gib, 1024 * gib},
		Pinned:   bench.ByMode(m, []int64{64 * mib, 256 * mib, gib}, []int64{64 * mib, 256 * mib, gib, 4 * gib}),
		// Unpinned registrations take microseconds: each round registers
		// every size five times and takes the median, so that a round's
		// slowest-against-fastest ratio is not the ratio of two outliers.
		Rounds:       bench.ByMode(m, 5, 9),
		PinnedRounds: 1,
	}
}

// Goals of registration.
var (
	UnpinnedGoal = bench.Goal{Text: "unpinned registration (swap region + RegisterUnpinned) ≤ 1 ms", Op: bench.AtMost, Threshold: 1}
	FlatGoal     = bench.Goal{Text: "unpinned registration of 1 GiB, 64 GiB and 1 TiB within 2× of each other", Op: bench.AtMost, Threshold: 2}
)

// RegistrationSpec is the "registration" experiment.
func RegistrationSpec() bench.Spec {
	return bench.Spec{
		Name:  "registration",
		Title: "Registration time against region size: unpinned vs pinned",
		Goals: []string{UnpinnedGoal.Text + " at every size from 1 GiB to 1 TiB", FlatGoal.Text,
			"pinned (mlock) registration of 1 GiB printed next to them (ratio pinned/unpinned); log-log plot"},
		Run: func(ctx context.Context, env *bench.Env) (*bench.Experiment, error) {
			return MeasureRegistration(ctx, env, DefaultRegistrationConfig(env.Mode))
		},
	}
}

// unpinnedOnce creates a region of size bytes over a new sparse file in dir
// and registers it unpinned: it returns the time of swap.New and of
// RegisterUnpinned.
func unpinnedOnce(dir string, pd *nprdma.PD, size int64) (create, register time.Duration, err error) {
	path := filepath.Join(dir, fmt.Sprintf("registration-%d.img", size))
	os.Remove(path)
	if err := blockdev.Create(path, size); err != nil {
		return 0, 0, err
	}
	defer os.Remove(path)
	dev, err := blockdev.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer dev.Close()
	t0 := time.Now()
	// The budget is fixed: the region's cost must not depend on its size.
	r, err := swap.New(dev, swap.WithBudget(64<<20))
	create = time.Since(t0)
	if err != nil {
		return 0, 0, err
	}
	defer r.Close()
	t0 = time.Now()
	mr, err := pd.RegisterUnpinned(r, nprdma.AccessRemoteRead)
	register = time.Since(t0)
	if err != nil {
		return 0, 0, err
	}
	if st := r.Stats(); st.Resident != 0 {
		return 0, 0, fmt.Errorf("registering %s made %d pages resident", bench.FormatBytes(size), st.Resident)
	}
	return create, register, mr.Deregister()
}

// pinnedOnce registers a fresh anonymous mapping of size bytes with mlock
// (what ibv_reg_mr does) and returns the time of Register.
func pinnedOnce(pd *nprdma.PD, size int64) (time.Duration, error) {
	buf, err := nprdma.AllocBuffer(int(size))
	if err != nil {
		return 0, err
	}
	defer nprdma.FreeBuffer(buf)
	t0 := time.Now()
	mr, err := pd.Register(buf, nprdma.AccessLocalWrite|nprdma.AccessRemoteRead)
	d := time.Since(t0)
	if err != nil {
		return 0, err
	}
	if !mr.Pinned() {
		return 0, fmt.Errorf("register of %s was not pinned", bench.FormatBytes(size))
	}
	return d, mr.Deregister()
}

// MeasureRegistration runs the registration experiment with cfg.
func MeasureRegistration(ctx context.Context, env *bench.Env, cfg RegistrationConfig) (*bench.Experiment, error) {
	if cfg.Rounds < 1 || cfg.PinnedRounds < 1 || len(cfg.Unpinned) == 0 {
		return nil, fmt.Errorf("registration: bad config %+v", cfg)
	}
	exp := &bench.Experiment{}
	dev := nprdma.NewDevice(loop.New(), nprdma.WithName("npbench-registration"))
	defer dev.Close()
	pd := dev.AllocPD()
	create := map[int64][]float64{}   // µs per round
	register := map[int64][]float64{} // µs per round
	pinned := map[int64][]float64{}   // µs per round
	var pl bench.Placement
	isPinned := len(env.CPUs) > 0
	log := env.Logger()
	for round := range cfg.Rounds {
		if err := ctx.Err(); err != nil {
			return exp, err
		}
		for _, i := range bench.RoundOrder(len(cfg.Unpinned), env.Round+round) {
			size := cfg.Unpinned[i]
			err := sampled(&pl, "nprdma-bench: registration", isPinned, func() error {
				c, r, err := unpinnedOnce(env.ScratchDir, pd, size)
				create[size] = append(create[size], bench.Micros(c))
				register[size] = append(register[size], bench.Micros(r))
				return err
			})
			if err != nil {
				return exp, fmt.Errorf("registration: unpinned %s: %w", bench.FormatBytes(size), err)
			}
		}
	}
	for round := range cfg.PinnedRounds {
		for _, i := range bench.RoundOrder(len(cfg.Pinned), env.Round+round) {
			size := cfg.Pinned[i]
			if err := ctx.Err(); err != nil {
				return exp, err
			}
			log.Info("registration: pinned", "size", bench.FormatBytes(size), "round", round+1, "of", cfg.PinnedRounds)
			err := sampled(&pl, "nprdma-bench: registration", isPinned, func() error {
				d, err := pinnedOnce(pd, size)
				pinned[size] = append(pinned[size], bench.Micros(d))
				return err
			})
			if err != nil {
				return exp, fmt.Errorf("registration: pinned %s: %w", bench.FormatBytes(size), err)
			}
		}
	}

	total := func(size int64) []float64 {
		out := make([]float64, len(create[size]))
		for i := range out {
			out[i] = create[size][i] + register[size][i]
		}
		return out
	}
	exp.Method = fmt.Sprintf("Unpinned: a sparse file of the region's size is created in the scratch directory, a swap.Region "+
		"(64 MiB budget, userfaultfd registered) is made over it with swap.New, and the region is registered with "+
		"PD.RegisterUnpinned(region, AccessRemoteRead); both calls are timed, the region is checked to hold no resident "+
		"page, then everything is released. Sizes %s, %d rounds, the order reversed every other round. Pinned: a fresh "+
		"anonymous mapping (AllocBuffer) is registered with PD.Register, which pins it with mlock and so populates every "+
		"page, as ibv_reg_mr does; sizes %s, %d rounds. A figure is the median of the rounds (registration is a one-off "+
		"event; the median keeps one scheduling hiccup from deciding it).",
		sizeList(cfg.Unpinned), cfg.Rounds, sizeList(cfg.Pinned), cfg.PinnedRounds)
	exp.AddParam("unpinned sizes", sizeList(cfg.Unpinned))
	exp.AddParam("pinned sizes", sizeList(cfg.Pinned))
	exp.AddParam("rounds (unpinned, pinned)", fmt.Sprintf("%d, %d", cfg.Rounds, cfg.PinnedRounds))
	exp.AddParam("placement", placementParam())

	const bound = 1000.0 // µs
	for _, size := range cfg.Unpinned {
		name := "unpinned " + bench.FormatBytes(size) + " (swap.New + RegisterUnpinned)"
		f := bench.NewFigure(name, bench.Median(total(size)), "µs", "1 ms", bound).
			WithNotes(fmt.Sprintf("swap.New %s µs; RegisterUnpinned %s µs (per round)", bench.RoundList(create[size]), bench.RoundList(register[size])))
		if size >= 1<<30 {
			f = f.WithGoal(UnpinnedGoal)
		}
		exp.Add(f)
	}
	var flat []int64
	for _, s := range []int64{1 << 30, 64 << 30, 1 << 40} {
		if len(create[s]) > 0 {
			flat = append(flat, s)
		}
	}
	if len(flat) >= 2 {
		slowest, fastest := flat[0], flat[0]
		for _, s := range flat {
			if bench.Median(total(s)) > bench.Median(total(slowest)) {
				slowest = s
			}
			if bench.Median(total(s)) < bench.Median(total(fastest)) {
				fastest = s
			}
		}
		// The name stays the same whichever size is slowest, so that the
		// suite can merge the figure over rounds; the sizes are in the notes.
		exp.Add(bench.NewFigure("slowest of "+sizeList(flat)+" unpinned vs the fastest", bench.Median(total(slowest)), "µs",
			"fastest", bench.Median(total(fastest))).WithGoal(FlatGoal).
			WithNotes("slowest " + bench.FormatBytes(slowest) + ", fastest " + bench.FormatBytes(fastest)))
	}
	for _, size := range cfg.Pinned {
		if len(create[size]) == 0 {
			continue
		}
		exp.Add(bench.NewFigure("pinned "+bench.FormatBytes(size)+" (Register, mlock)", bench.Median(pinned[size]), "µs",
			"unpinned "+bench.FormatBytes(size), bench.Median(total(size))).WithNotes("per round: " + bench.RoundList(pinned[size]) + " µs"))
	}

	gib := func(b int64) float64 { return float64(b) / (1 << 30) }
	var ptsTotal, ptsReg, ptsPinned []bench.Point
	for _, s := range cfg.Unpinned {
		ptsTotal = append(ptsTotal, bench.Point{X: gib(s), Y: bench.Median(total(s))})
		ptsReg = append(ptsReg, bench.Point{X: gib(s), Y: bench.Median(register[s])})
	}
	for _, s := range cfg.Pinned {
		ptsPinned = append(ptsPinned, bench.Point{X: gib(s), Y: bench.Median(pinned[s])})
	}
	exp.AddSeries(bench.Series{Name: "unpinned-total", Label: "unpinned: swap.New + RegisterUnpinned", XUnit: "GiB", YUnit: "µs", Points: ptsTotal})
	exp.AddSeries(bench.Series{Name: "unpinned-register", Label: "unpinned: RegisterUnpinned alone", XUnit: "GiB", YUnit: "µs", Points: ptsReg})
	exp.AddSeries(bench.Series{Name: "pinned", Label: "pinned: Register (mlock)", XUnit: "GiB", YUnit: "µs", Points: ptsPinned})
	exp.AddPlot(bench.Plot{File: "registration-vs-size.svg", Kind: bench.PlotLine, LogX: true, LogY: true,
		Title: "Registration time against region size", XLabel: "region size (GiB)", YLabel: "time (µs)",
		Caption: "Log-log; median of the rounds. Pinned registration grows with the size (every page is populated and locked); unpinned does not.",
		Series:  []string{"unpinned-total", "unpinned-register", "pinned"}})
	exp.Placements = append(exp.Placements, pl)
	for _, s := range cfg.Pinned {
		noteNoise(exp, "pinned registration time", "pinned "+bench.FormatBytes(s), pinned[s])
	}
	exp.Note("The unpinned time is dominated by swap.New (two NORESERVE mappings, userfaultfd registration, the hole scan of the " +
		"backing file and starting the region's workers); RegisterUnpinned itself draws a random magic and rkey and touches no page.")
	return exp, nil
}

func sizeList(sizes []int64) string {
	out := ""
	for i, s := range sizes {
		if i > 0 {
			out += ", "
		}
		out += bench.FormatBytes(s)
	}
	return out
}
