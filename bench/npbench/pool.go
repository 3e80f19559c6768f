package npbench

import (
	"context"
	"fmt"
	"time"

	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/bench/nprdmabench"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nprdma/tcp"
)

// PoolConfig sizes the pool experiment.
type PoolConfig struct {
	Sizes  []int         // READ sizes
	Run    time.Duration // each measurement
	Rounds int
}

// DefaultPoolConfig returns the sizes for a mode.
func DefaultPoolConfig(m bench.Mode) PoolConfig {
	return PoolConfig{Sizes: []int{4 << 10, 64 << 10}, Run: bench.ByMode(m, 300*time.Millisecond, 2*time.Second), Rounds: 1}
}

// PoolGoal: reading into pooled buffers is at least as fast as registering
// a buffer per I/O.
var PoolGoal = bench.Goal{Text: "pooled I/O throughput ≥ per-I/O registration throughput", Op: bench.AtLeast, Threshold: 1}

// PoolSpec is the "pool" experiment.
func PoolSpec() bench.Spec {
	return bench.Spec{
		Name:  "pool",
		Title: "Registered-buffer pool against per-I/O registration",
		Goals: []string{PoolGoal.Text + " (tcp and loop, 4 KiB and 64 KiB READs)", "registrations avoided reported (PoolStats)"},
		Run: func(ctx context.Context, env *bench.Env) (*bench.Experiment, error) {
			return MeasurePool(ctx, env, DefaultPoolConfig(env.Mode))
		},
	}
}

// MeasurePool runs the pool experiment with cfg.
func MeasurePool(ctx context.Context, env *bench.Env, cfg PoolConfig) (*bench.Experiment, error) {
	if cfg.Rounds < 1 || cfg.Run <= 0 || len(cfg.Sizes) == 0 {
		return nil, fmt.Errorf("pool: bad config %+v", cfg)
	}
	exp := &bench.Experiment{}
	type poolCase struct {
		prov          string
		size          int
		c             *nprdmabench.Pair
		pool          *nprdma.BufferPool
		mem           []byte
		pooled, perIO []float64 // ops/s per round
	}
	var cases []*poolCase
	defer func() {
		for _, pc := range cases {
			if pc.pool != nil {
				pc.pool.Close()
			}
			if pc.mem != nil {
				nprdma.FreeBuffer(pc.mem)
			}
			if pc.c != nil {
				pc.c.Close()
			}
		}
	}()
	maxSize := 0
	for _, s := range cfg.Sizes {
		maxSize = max(maxSize, s)
	}
	for _, name := range []string{"tcp", "loop"} {
		for _, size := range cfg.Sizes {
			var prov nprdma.Provider = tcp.New()
			if name == "loop" {
				prov = loop.New()
			}
			pc := &poolCase{prov: name, size: size}
			cases = append(cases, pc)
			var err error
			if pc.c, err = nprdmabench.NewPair(ctx, prov, nprdmabench.PairOptions{LocalSize: size, RemoteSize: size, Pin: true}); err != nil {
				return exp, fmt.Errorf("pool: %s: %w", name, err)
			}
			if pc.pool, err = nprdma.NewBufferPool(pc.c.Cli.PD(), nprdma.AccessLocalWrite); err != nil {
				return exp, err
			}
			if pc.mem, err = nprdma.AllocBuffer(size); err != nil {
				return exp, err
			}
		}
	}
	var pl bench.Placement
	pinned := len(env.CPUs) > 0
	for round := range cfg.Rounds {
		env.Logger().Info("pool: measuring", "round", round+1, "of", cfg.Rounds)
		for _, i := range bench.RoundOrder(len(cases), env.Round+round) {
			pc := cases[i]
			// Within a case too, the first of the two alternates.
			for _, j := range bench.RoundOrder(2, env.Round+round+i) {
				err := sampled(&pl, "nprdma-bench (initiator and target in one process): pool", pinned, func() error {
					if j == 0 {
						ops, took, err := pc.c.PooledReads(ctx, pc.pool, pc.size, cfg.Run)
						pc.pooled = append(pc.pooled, float64(ops)/took.Seconds())
						return err
					}
					ops, took, err := pc.c.RegisteredReads(ctx, pc.mem, pc.size, cfg.Run)
					pc.perIO = append(pc.perIO, float64(ops)/took.Seconds())
					return err
				})
				if err != nil {
					return exp, fmt.Errorf("pool: %s %d bytes: %w", pc.prov, pc.size, err)
				}
			}
		}
	}

	exp.Method = fmt.Sprintf("Initiator and target devices on one provider (nprdma/tcp over loopback, nprdma/loop), pinning "+
		"registration (mlock, as ibv_reg_mr). The initiator READs %s from a pinned target region at queue depth 1 for %v, "+
		"either into a buffer from a BufferPool (Get, READ, Release: slabs registered once) or into a buffer registered "+
		"with PD.Register before the READ and deregistered after it. %d rounds; cases and, within a case, the two ways "+
		"alternate in order. A figure is the mean of the per-round rates.", sizeList64(cfg.Sizes), cfg.Run, cfg.Rounds)
	exp.AddParam("sizes", sizeList64(cfg.Sizes))
	exp.AddParam("run per measurement", cfg.Run)
	exp.AddParam("rounds", cfg.Rounds)
	exp.AddParam("placement", placementParam())
	var cats []string
	var ptsPool, ptsReg []bench.Point
	for i, pc := range cases {
		name := fmt.Sprintf("%s %s READ", pc.prov, bench.FormatBytes(int64(pc.size)))
		exp.Add(figure(name+" pooled", pc.pooled, pc.perIO, "ops/s", "per-I/O Register/Deregister").WithGoal(PoolGoal))
		st := pc.pool.Stats()
		exp.Add(bench.NewFigure(name+" registrations avoided", float64(st.RegistrationsAvoided), "gets", "pool gets", float64(st.Gets)).
			WithNotes(fmt.Sprintf("%d slab registration(s) of %s in all for %d gets", st.Registrations, bench.FormatBytes(st.BytesRegistered), st.Gets)))
		if st.RegistrationsAvoided+st.Registrations < st.Gets {
			exp.Note("%s: the pool reports %d gets but only %d avoided + %d registrations.", name, st.Gets, st.RegistrationsAvoided, st.Registrations)
		}
		cats = append(cats, name)
		ptsPool = append(ptsPool, bench.Point{X: float64(i), Y: bench.MeanFloat(pc.pooled)})
		ptsReg = append(ptsReg, bench.Point{X: float64(i), Y: bench.MeanFloat(pc.perIO)})
		noteNoise(exp, "pooled rate", name, pc.pooled)
		noteNoise(exp, "per-I/O registration rate", name, pc.perIO)
	}
	exp.AddSeries(bench.Series{Name: "pooled", Label: "pooled buffers", YUnit: "ops/s", Points: ptsPool})
	exp.AddSeries(bench.Series{Name: "per-io", Label: "Register/Deregister per READ", YUnit: "ops/s", Points: ptsReg})
	exp.AddPlot(bench.Plot{File: "pool-throughput.svg", Kind: bench.PlotBars, LogY: true, Title: "READs per second at QD1: pooled buffers against per-I/O registration",
		YLabel: "READs per second", Categories: cats, Series: []string{"pooled", "per-io"},
		Caption: "Logarithmic axis: loop READs are an order of magnitude faster than tcp ones."})
	exp.Placements = append(exp.Placements, pl)
	return exp, nil
}

func sizeList64(sizes []int) string {
	s := make([]int64, len(sizes))
	for i, v := range sizes {
		s[i] = int64(v)
	}
	return sizeList(s)
}
