package npbench

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/bench/nprdmabench"
	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/integration/np/npread"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nprdma/tcp"
	"github.com/nprdma/nprdma/swap"
)

const pageSize = swap.PageSize

// NPReadConfig sizes the np-read experiment.
type NPReadConfig struct {
	// Samples is the number of fault samples of each kind (minor, major,
	// raw read, round trip, two-sided read) per provider per round; each
	// comes with NoFaultPairs pairs of no-fault NP and pinned READs.
	Samples       int
	NoFaultPairs  int
	Rounds        int
	ResidentPages int // the resident part of the region, read without faults
}

// DefaultNPReadConfig returns the sizes for a mode.
func DefaultNPReadConfig(m bench.Mode) NPReadConfig {
	return NPReadConfig{
		Samples:       bench.ByMode(m, 1500, 6000),
		NoFaultPairs:  4,
		Rounds:        1,
		ResidentPages: bench.ByMode(m, 4096, 16384),
	}
}

// Goals of np-read, as the issue states them.
var (
	NPGoalTCP  = bench.Goal{Text: "tcp: 4 KiB one-sided READ of an unpinned swap region, resident (no fault), ≤ 1.05× a READ of a pinned MR of the same size", Op: bench.AtMost, Threshold: 1.05}
	NPGoalLoop = bench.Goal{Text: "loop: 4 KiB one-sided READ of an unpinned swap region, resident (no fault), ≤ 1.10× a READ of a pinned MR of the same size", Op: bench.AtMost, Threshold: 1.10}
	MinorGoal  = bench.Goal{Text: "minor fault (READ → magic page → slow path → zero page) ≤ no-fault READ + one round trip + 10 µs", Op: bench.AtMost, Threshold: 1}
	MajorGoal  = bench.Goal{Text: "major fault (READ → magic page → slow path → backing read) ≤ no-fault READ + one round trip + 10 µs + 1.2× a raw O_DIRECT 4 KiB read", Op: bench.AtMost, Threshold: 1}
)

// NPReadSpec is the "np-read" experiment.
func NPReadSpec() bench.Spec {
	return bench.Spec{
		Name:  "np-read",
		Title: "One-sided 4 KiB READ of an unpinned region: no fault, minor fault, major fault",
		Goals: []string{NPGoalTCP.Text + " (p50 and p99)", NPGoalLoop.Text + " (p50 and p99)", MinorGoal.Text + " (p50, both providers)",
			MajorGoal.Text + " (p50, both providers)", "raw socket round trip and raw O_DIRECT read measured in the same run; CDF plot"},
		Run: func(ctx context.Context, env *bench.Env) (*bench.Experiment, error) {
			return MeasureNPRead(ctx, env, DefaultNPReadConfig(env.Mode))
		},
	}
}

// pageTag is the first word of data page p of the backing file, which every
// measured read checks.
func pageTag(p int) uint64 { return 0x4e50_5244_0000_0000 | uint64(p) }

// writeBacking writes dataPages pages of per-page distinct content followed
// by holePages pages of hole, makes it durable and drops it from the page
// cache, so that reads of it go to the device.
func writeBacking(path string, dataPages, holePages int) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	rng := rand.New(rand.NewPCG(7, 11))
	chunk := make([]byte, 256*pageSize)
	for first := 0; first < dataPages; first += 256 {
		n := min(256, dataPages-first)
		for i := range n * pageSize / 8 {
			binary.LittleEndian.PutUint64(chunk[8*i:], rng.Uint64())
		}
		for k := range n {
			binary.LittleEndian.PutUint64(chunk[k*pageSize:], pageTag(first+k))
		}
		if _, err := f.WriteAt(chunk[:n*pageSize], int64(first)*pageSize); err != nil {
			return err
		}
	}
	if err := f.Truncate(int64(dataPages+holePages) * pageSize); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

// npKinds are the latency distributions np-read measures per provider.
var npKinds = []struct{ key, label string }{
	{"np", "NP READ, unpinned swap region, resident"},
	{"pinned", "READ of a pinned MR"},
	{"minor", "minor fault: READ, slow path, zero page"},
	{"major", "major fault: READ, slow path, backing read"},
	{"slow", "two-sided read of a resident page (slow path alone)"},
	{"raw-read", "raw O_DIRECT 4 KiB read of the backing"},
	{"rtt", "raw TCP round trip (4 KiB)"},
}

// npProvider is one provider's side of the experiment.
type npProvider struct {
	name      string
	goal      bench.Goal
	srvDev    *nprdma.Device
	cliDev    *nprdma.Device
	srv       *npread.Server
	rq        *npread.Requester
	pinnedMR  *nprdma.MR
	pinnedBuf []byte
	raw       *nprdmabench.RawRoundTrip // tcp only
	cancel    context.CancelFunc
	served    chan error
}

// npVariant is a provider measured with a given GOMAXPROCS.
type npVariant struct {
	*npProvider
	name       string // "tcp", "tcp, GOMAXPROCS=1", ...
	key        string // series prefix
	procs      int    // GOMAXPROCS while measuring (0: unchanged)
	cases      map[string]*latencyCase
	placement  bench.Placement
	unexpected int // no-fault reads that met a magic page
}

func newNPVariant(p *npProvider, procs int) *npVariant {
	v := &npVariant{npProvider: p, name: p.name, key: p.name, procs: procs, cases: map[string]*latencyCase{}}
	if procs > 0 {
		v.name = fmt.Sprintf("%s, GOMAXPROCS=%d", p.name, procs)
		v.key = fmt.Sprintf("%s-procs%d", p.name, procs)
	}
	for _, k := range npKinds {
		v.cases[k.key] = &latencyCase{key: v.key + "-" + k.key, label: v.name + ": " + k.label}
	}
	return v
}

func (p *npProvider) close() {
	if p.rq != nil {
		p.rq.Close()
	}
	if p.cancel != nil {
		p.cancel()
		<-p.served
	}
	if p.srv != nil {
		p.srv.Close()
	}
	if p.raw != nil {
		p.raw.Close()
	}
	p.cliDev.Close()
	p.srvDev.Close() // deregisters the regions
	if p.pinnedBuf != nil {
		nprdma.FreeBuffer(p.pinnedBuf)
	}
}

func openNPProvider(ctx context.Context, name string, prov nprdma.Provider, region *swap.Region, resident int) (p *npProvider, err error) {
	p = &npProvider{name: name,
		srvDev: nprdma.NewDevice(prov, nprdma.WithName("npbench-target")),
		cliDev: nprdma.NewDevice(prov, nprdma.WithName("npbench-initiator"))}
	p.goal = NPGoalTCP
	if name == "loop" {
		p.goal = NPGoalLoop
	}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	spd := p.srvDev.AllocPD()
	mr, err := spd.RegisterUnpinned(region, nprdma.AccessRemoteRead)
	if err != nil {
		return p, err
	}
	// The baseline region: pinned, as large as the swap region, holding the
	// same bytes in its resident part.
	if p.pinnedBuf, err = nprdma.AllocBuffer(int(region.Size())); err != nil {
		return p, err
	}
	if _, err := region.ReadAt(p.pinnedBuf[:resident*pageSize], 0); err != nil {
		return p, err
	}
	if p.pinnedMR, err = spd.Register(p.pinnedBuf, nprdma.AccessRemoteRead); err != nil {
		return p, err
	}
	if p.srv, err = npread.NewServer(mr, region, npread.WithFaultCounts(func() (uint64, uint64) {
		s := region.Stats()
		return s.MinorFaults, s.MajorFaults
	})); err != nil {
		return p, err
	}
	ln, err := p.srvDev.Listen(nprdmabench.ListenAddr(prov))
	if err != nil {
		return p, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	p.cancel, p.served = cancel, make(chan error, 1)
	go func() { p.served <- p.srv.Serve(sctx, ln); ln.Close() }()
	if p.rq, err = npread.Dial(ctx, p.cliDev.AllocPD(), ln.Addr(), npread.WithMaxRead(64<<10)); err != nil {
		return p, err
	}
	if name == "tcp" {
		if p.raw, err = nprdmabench.DialRawRoundTrip(ctx, pageSize, ""); err != nil {
			return p, err
		}
	}
	return p, nil
}

// npPages hands out pages of the backing file that no read touched yet.
type npPages struct {
	resident     int
	data, holes  []int
	nextD, nextH int
}

func (pp *npPages) freshData() (int, error) {
	if pp.nextD == len(pp.data) {
		return 0, fmt.Errorf("np-read: out of untouched data pages")
	}
	pp.nextD++
	return pp.data[pp.nextD-1], nil
}

func (pp *npPages) freshHole() (int, error) {
	if pp.nextH == len(pp.holes) {
		return 0, fmt.Errorf("np-read: out of untouched hole pages")
	}
	pp.nextH++
	return pp.holes[pp.nextH-1], nil
}

// round measures one round of every kind on p, interleaved sample by
// sample so that all kinds share the machine's conditions.
func (p *npVariant) round(ctx context.Context, cfg NPReadConfig, pp *npPages, dev *blockdev.File, rng *rand.Rand) error {
	if p.procs > 0 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(p.procs))
	}
	got := map[string][]time.Duration{}
	ioBuf := blockdev.AlignedBuffer(pageSize)
	checkTag := func(what string, b []byte, page int) error {
		if w := binary.LittleEndian.Uint64(b); w != pageTag(page) {
			return fmt.Errorf("np-read %s: %s of page %d: first word %#x, want %#x", p.name, what, page, w, pageTag(page))
		}
		return nil
	}
	// timed runs one read of a kind and records its latency; check runs
	// after the clock stopped. Every measured read follows an unmeasured
	// pinned READ, so that each kind starts from the same state: after a
	// major fault, the server's goroutine has blocked in a disk read and
	// the next hand-offs between goroutines cost more, which would
	// otherwise land on whichever kind came next.
	warm := func() error {
		_, err := p.rq.ReadOneSided(ctx, p.pinnedMR.Addr(), p.pinnedMR.RKey(), pageSize)
		return err
	}
	timed := func(kind string, read func() error, check func() error) error {
		if kind != "np" && kind != "pinned" { // those come in a warm run of their own
			if err := warm(); err != nil {
				return err
			}
		}
		t0 := time.Now()
		err := read()
		d := time.Since(t0)
		if err != nil {
			return fmt.Errorf("np-read %s: %s: %w", p.name, kind, err)
		}
		got[kind] = append(got[kind], d)
		return check()
	}
	var b []byte
	var info npread.ReadInfo
	npRead := func(page int) func() error {
		return func() (err error) { b, info, err = p.rq.Read(ctx, int64(page)*pageSize, pageSize); return err }
	}
	for i := 0; i < cfg.Samples; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := warm(); err != nil {
			return err
		}
		for k := 0; k < cfg.NoFaultPairs; k++ {
			page := rng.IntN(pp.resident)
			for j := 0; j < 2; j++ {
				var err error
				if (i+k+j)%2 == 0 { // alternate which of the two goes first
					err = timed("np", npRead(page), func() error {
						if info.Suspected != 0 {
							p.unexpected++
						}
						return checkTag("NP READ", b, page)
					})
				} else {
					err = timed("pinned", func() (err error) {
						b, err = p.rq.ReadOneSided(ctx, p.pinnedMR.Addr()+uint64(page)*pageSize, p.pinnedMR.RKey(), pageSize)
						return err
					}, func() error { return checkTag("pinned READ", b, page) })
				}
				if err != nil {
					return err
				}
			}
		}
		if p.raw != nil {
			if err := timed("rtt", func() (err error) { _, err = p.raw.Once(); return err }, func() error { return nil }); err != nil {
				return err
			}
		}
		hole, err := pp.freshHole()
		if err != nil {
			return err
		}
		if err := timed("minor", npRead(hole), func() error {
			if info.Suspected != 1 || info.MinorFaults != 1 || info.MajorFaults != 0 || !isZero(b) {
				return fmt.Errorf("np-read %s: read of hole page %d was not one minor fault (%+v)", p.name, hole, info)
			}
			return nil
		}); err != nil {
			return err
		}
		resident := rng.IntN(pp.resident)
		if err := timed("slow", func() (err error) {
			b, _, err = p.rq.SlowRead(ctx, int64(resident)*pageSize, pageSize)
			return err
		}, func() error { return checkTag("two-sided read", b, resident) }); err != nil {
			return err
		}
		absent, err := pp.freshData()
		if err != nil {
			return err
		}
		if err := timed("major", npRead(absent), func() error {
			if info.Suspected != 1 || info.MajorFaults != 1 || info.MinorFaults != 0 {
				return fmt.Errorf("np-read %s: read of absent page %d was not one major fault (%+v)", p.name, absent, info)
			}
			return checkTag("major fault", b, absent)
		}); err != nil {
			return err
		}
	}
	// The raw reads of the backing run as a batch of their own, in the
	// same round: a blocking read in the requester's goroutine moves it to
	// another thread, and the network kinds after it would pay for that.
	for i := 0; i < cfg.Samples; i++ {
		other, err := pp.freshData()
		if err != nil {
			return err
		}
		if err := timed("raw-read", func() error { _, err := dev.ReadAt(ioBuf, int64(other)*pageSize); return err },
			func() error { return checkTag("raw read", ioBuf, other) }); err != nil {
			return err
		}
	}
	for key, s := range got {
		p.cases[key].add(s)
	}
	return nil
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// MeasureNPRead runs np-read with cfg.
func MeasureNPRead(ctx context.Context, env *bench.Env, cfg NPReadConfig) (*bench.Experiment, error) {
	if cfg.Samples < 2 || cfg.Rounds < 1 || cfg.ResidentPages < 1 || cfg.NoFaultPairs < 1 {
		return nil, fmt.Errorf("np-read: bad config %+v", cfg)
	}
	exp := &bench.Experiment{}
	names := []string{"tcp", "loop"}
	// Each provider is measured as configured and with GOMAXPROCS=1 (no
	// cross-CPU hand-off between goroutines).
	procs := []int{0, 1}
	perKind := cfg.Samples * cfg.Rounds * len(names) * len(procs)
	dataPages := cfg.ResidentPages + 2*perKind // resident, then major faults and raw reads
	holePages := perKind                       // minor faults
	path := filepath.Join(env.ScratchDir, "np-read.img")
	env.Logger().Info("np-read: writing the backing file", "path", path, "size", bench.FormatBytes(int64(dataPages+holePages)*pageSize))
	if err := writeBacking(path, dataPages, holePages); err != nil {
		os.Remove(path)
		return exp, fmt.Errorf("np-read: backing file: %w", err)
	}
	defer os.Remove(path)
	dev, err := blockdev.Open(path)
	if err != nil {
		return exp, err
	}
	defer dev.Close()
	total := dataPages + holePages
	// The budget holds every page the run touches: nothing is evicted, so
	// the resident part stays resident and every fault is a first touch.
	region, err := swap.New(dev, swap.WithBudget(int64(total)*pageSize), swap.WithFreeMargin(1))
	if err != nil {
		return exp, err
	}
	defer region.Close()
	prime := make([]byte, 64*pageSize)
	for off := 0; off < cfg.ResidentPages*pageSize; off += len(prime) {
		n := min(len(prime), cfg.ResidentPages*pageSize-off)
		if _, err := region.ReadAt(prime[:n], int64(off)); err != nil {
			return exp, err
		}
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	pp := &npPages{resident: cfg.ResidentPages}
	for _, i := range rng.Perm(2 * perKind) {
		pp.data = append(pp.data, cfg.ResidentPages+i)
	}
	for _, i := range rng.Perm(holePages) {
		pp.holes = append(pp.holes, dataPages+i)
	}

	provs := make([]*npProvider, len(names))
	defer func() {
		for _, p := range provs {
			if p != nil {
				p.close()
			}
		}
	}()
	for i, name := range names {
		var prov nprdma.Provider = tcp.New()
		if name == "loop" {
			prov = loop.New()
		}
		if provs[i], err = openNPProvider(ctx, name, prov, region, cfg.ResidentPages); err != nil {
			return exp, fmt.Errorf("np-read: set up %s: %w", name, err)
		}
	}
	var vs []*npVariant
	for _, p := range provs {
		for _, n := range procs {
			vs = append(vs, newNPVariant(p, n))
		}
	}
	pinned := len(env.CPUs) > 0
	for round := range cfg.Rounds {
		for _, i := range bench.RoundOrder(len(vs), env.Round+round) {
			v := vs[i]
			env.Logger().Info("np-read: measuring", "variant", v.name, "round", round+1, "of", cfg.Rounds)
			err := sampled(&v.placement, "nprdma-bench (initiator, target and region in one process): np-read over "+v.name, pinned,
				func() error { return v.round(ctx, cfg, pp, dev, rng) })
			if err != nil {
				return exp, err
			}
		}
	}
	st := region.Stats()
	if st.Evictions != 0 {
		exp.Note("The region evicted %d pages during the run; the resident part may not have stayed resident.", st.Evictions)
	}

	exp.Method = fmt.Sprintf("One swap.Region over a %s file in the scratch directory (O_DIRECT), its budget large enough that "+
		"nothing is evicted: %d pages of per-page distinct data made resident before the run, %d data pages and %d pages of "+
		"hole left absent. For each provider (nprdma/tcp over loopback, nprdma/loop in process) the target registers the region "+
		"unpinned and, in the same PD, a pinned region of the same size holding the same resident bytes; an npread slow-path "+
		"server answers two-sided reads; one requester (one queue pair) reads. Each sample step does %d pairs of 4 KiB "+
		"one-sided READs of random resident pages, NP (READ + FindMagicPages) and pinned alternately, then, each after an unmeasured pinned "+
		"READ so that every kind starts from the same state (after a disk read, the next hand-offs between goroutines cost "+
		"more here): on tcp a raw 8-byte request / 4 KiB "+
		"response over a loopback TCP socket; a READ of a never-touched hole page (magic page → slow path → minor fault); a "+
		"two-sided read of a resident page (the slow path alone); a READ of a never-touched data page (magic page → slow path → "+
		"major fault: backing read). After the steps, as many raw O_DIRECT 4 KiB reads of other untouched data pages through "+
		"blockdev (a batch of their own: a blocking read in the requester's goroutine moves it to another thread, which the "+
		"network kinds after it would pay for). "+
		"%d steps per variant per round, %d rounds, the variants in reverse order every other round; every read's "+
		"first word (or zero page) and fault kind are checked. Each provider is measured twice per round (two variants), as configured and "+
		"with GOMAXPROCS=1 (goals are evaluated on the former). A figure is the mean of the per-round percentiles. The round "+
		"trip in the fault goals is the raw TCP round trip on tcp and the pinned READ on loop (the loop fabric's round trip: "+
		"there is no socket).",
		bench.FormatBytes(int64(total)*pageSize), cfg.ResidentPages, 2*perKind, holePages, cfg.NoFaultPairs, cfg.Samples, cfg.Rounds)
	exp.AddParam("region", bench.FormatBytes(int64(total)*pageSize))
	exp.AddParam("resident pages", cfg.ResidentPages)
	exp.AddParam("steps per provider per round", cfg.Samples)
	exp.AddParam("no-fault pairs per step", cfg.NoFaultPairs)
	exp.AddParam("rounds", cfg.Rounds)
	exp.AddParam("backing file O_DIRECT", dev.Direct())
	exp.AddParam("placement", placementParam())

	for _, v := range vs {
		c := v.cases
		rtt, rttName := c["rtt"], "raw TCP round trip"
		if v.npProvider.name != "tcp" {
			rtt, rttName = c["pinned"], "pinned READ (loop round trip)"
		}
		minorBound, majorBound := make([]float64, cfg.Rounds), make([]float64, cfg.Rounds)
		for r := range cfg.Rounds {
			minorBound[r] = c["np"].p50[r] + rtt.p50[r] + 10
			majorBound[r] = minorBound[r] + 1.2*c["raw-read"].p50[r]
		}
		n := v.name + ": "
		np50 := figure(n+"NP READ p50 (unpinned, resident)", c["np"].p50, c["pinned"].p50, "µs", "pinned-MR READ p50")
		np99 := figure(n+"NP READ p99 (unpinned, resident)", c["np"].p99, c["pinned"].p99, "µs", "pinned-MR READ p99")
		minor := figure(n+"minor fault p50", c["minor"].p50, minorBound, "µs", "NP READ p50 + "+rttName+" p50 + 10 µs")
		major := figure(n+"major fault p50", c["major"].p50, majorBound, "µs", "NP READ p50 + "+rttName+" p50 + 10 µs + 1.2× raw read p50")
		slow := figure(n+"two-sided read p50 (slow path alone)", c["slow"].p50, rtt.p50, "µs", rttName+" p50")
		if v.procs > 0 {
			// Informational: where the goals would stand without cross-CPU
			// hand-offs between goroutines.
			exp.Add(np50, minor, major, slow)
			continue
		}
		exp.Add(np50.WithGoal(v.goal), np99.WithGoal(v.goal), minor.WithGoal(MinorGoal), major.WithGoal(MajorGoal),
			figure(n+"minor fault p50 vs no fault", c["minor"].p50, c["np"].p50, "µs", "NP READ p50"),
			figure(n+"minor fault p99", c["minor"].p99, c["np"].p99, "µs", "NP READ p99"),
			figure(n+"major fault p50 vs raw read", c["major"].p50, c["raw-read"].p50, "µs", "raw O_DIRECT read p50"),
			figure(n+"major fault p99", c["major"].p99, c["raw-read"].p99, "µs", "raw O_DIRECT read p99"),
			slow,
		)
		if v.npProvider.name == "tcp" {
			exp.Add(figure(n+"NP READ p50 vs raw round trip", c["np"].p50, rtt.p50, "µs", "raw TCP round trip p50"))
		}
		var names []string
		for _, k := range npKinds {
			lc := c[k.key]
			if len(lc.all) == 0 {
				continue
			}
			exp.AddSeries(lc.series())
			names = append(names, "cdf-"+lc.key)
		}
		exp.AddPlot(bench.Plot{File: "np-read-" + v.key + "-cdf.svg", Kind: bench.PlotCDF, LogX: true,
			Title:  "4 KiB READ latency over " + v.name + ": no fault, minor and major fault, and their limits",
			XLabel: "latency (µs)", YLabel: "fraction of reads", Series: names,
			Caption: "All rounds pooled. Faults are end to end: one-sided READ, magic page found, two-sided slow path, fault-in, RDMA WRITE of the data, response."})
	}
	for _, v := range vs {
		for _, k := range npKinds {
			if lc := v.cases[k.key]; len(lc.p50) > 0 {
				noteNoise(exp, "p50", lc.key, lc.p50)
			}
		}
		exp.Placements = append(exp.Placements, v.placement)
		if v.unexpected > 0 {
			exp.Note("%s: %d no-fault READs met a magic page (a resident page busy or changed during the copy) and took the slow path; they are included.", v.name, v.unexpected)
		}
	}
	if !dev.Direct() {
		exp.Note("The scratch file system refused O_DIRECT: raw reads and major faults went through the page cache.")
	}
	if !pinned {
		exp.Note("Not pinned: initiator, target, the region's fault threads and the raw peers share the bench process and run wherever the scheduler puts them.")
	}
	return exp, nil
}
