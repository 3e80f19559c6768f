// Package swapbench measures swap.Region: fault latency next to a raw read of
// the backing device in the same run, eviction and writeback throughput, the
// hit ratio of the eviction policies, and the memory a region really uses.
// The bench framework (bench/) calls these functions and records their
// results; swapbench_test.go runs them at small sizes so they keep working.
package swapbench

import (
	"github.com/nprdma/nprdma/bench"

	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/swap"
)

const pageSize = swap.PageSize

// FaultLatency compares, in one run on one backing file, 4 KiB random reads
// of the backing device (O_DIRECT, the physical limit) with faults through
// the region's explicit API (ReadAt of an absent page) and through the raw
// view (userfaultfd). Samples of every kind are interleaved so that they
// share the machine's conditions.
type FaultLatency struct {
	RawReadP50, RawReadP99     time.Duration
	MinorP50, MinorP99         time.Duration // explicit API, zero page
	MajorP50, MajorP99         time.Duration // explicit API, backing read
	UffdMinorP50, UffdMinorP99 time.Duration // raw view, zero page
	UffdMajorP50, UffdMajorP99 time.Duration // raw view, backing read
	Samples                    int
	Direct                     bool // the backing file was opened with O_DIRECT

	// dist holds the sorted samples of each kind, for CDF plots.
	dist map[string][]time.Duration
}

// MajorBound is the acceptance bound for a major fault: 1.2x the raw read
// plus 10 µs (at the median).
func (f FaultLatency) MajorBound() time.Duration {
	return f.RawReadP50*12/10 + 10*time.Microsecond
}

// MeasureFaults creates a backing file at backingPath (replacing any file
// there, and removing it afterwards) with samples*3 data pages followed by a
// hole of samples*2 pages, and measures samples of each kind.
func MeasureFaults(ctx context.Context, backingPath string, samples int) (FaultLatency, error) {
	if samples < 2 {
		return FaultLatency{}, errors.New("need at least 2 samples")
	}
	dataPages, holePages := 3*samples, 2*samples
	if err := makeBacking(backingPath, dataPages, holePages); err != nil {
		return FaultLatency{}, err
	}
	defer os.Remove(backingPath)
	dev, err := blockdev.Open(backingPath)
	if err != nil {
		return FaultLatency{}, err
	}
	defer dev.Close()
	total := int64(dataPages + holePages)
	// The budget holds every page faulted in, and the evictor keeps no
	// margin: nothing is evicted during the run.
	r, err := swap.New(dev, swap.WithBudget(total*pageSize), swap.WithFreeMargin(1))
	if err != nil {
		return FaultLatency{}, err
	}
	defer r.Close()

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	data := rng.Perm(dataPages) // raw reads, explicit majors, raw-view majors
	holes := rng.Perm(holePages)
	raw, minor, major, uminor, umajor := make([]time.Duration, samples), make([]time.Duration, samples),
		make([]time.Duration, samples), make([]time.Duration, samples), make([]time.Duration, samples)
	buf := blockdev.AlignedBuffer(pageSize)
	view := r.Bytes()
	var sink byte
	for i := 0; i < samples; i++ {
		if err := ctx.Err(); err != nil {
			return FaultLatency{}, err
		}
		start := time.Now()
		if _, err := dev.ReadAt(buf, int64(data[3*i])*pageSize); err != nil {
			return FaultLatency{}, err
		}
		raw[i] = time.Since(start)

		start = time.Now()
		if _, err := r.ReadAt(buf, int64(data[3*i+1])*pageSize); err != nil {
			return FaultLatency{}, err
		}
		major[i] = time.Since(start)

		start = time.Now()
		sink ^= view[int64(data[3*i+2])*pageSize]
		umajor[i] = time.Since(start)

		start = time.Now()
		if _, err := r.ReadAt(buf, int64(dataPages+holes[2*i])*pageSize); err != nil {
			return FaultLatency{}, err
		}
		minor[i] = time.Since(start)

		start = time.Now()
		sink ^= view[int64(dataPages+holes[2*i+1])*pageSize]
		uminor[i] = time.Since(start)
	}
	keep(sink)
	// The fault threads count a fill after the toucher has been woken.
	st := r.Stats()
	for deadline := time.Now().Add(10 * time.Second); st.UffdMajorFaults+st.UffdMinorFaults < uint64(2*samples) &&
		time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		st = r.Stats()
	}
	if st.MajorFaults != uint64(samples) || st.MinorFaults != uint64(samples) ||
		st.UffdMajorFaults != uint64(samples) || st.UffdMinorFaults != uint64(samples) {
		return FaultLatency{}, fmt.Errorf("fault counts do not match the samples (%d): %+v", samples, st)
	}
	f := FaultLatency{Samples: samples, Direct: dev.Direct(), dist: map[string][]time.Duration{}}
	for name, d := range map[string][]time.Duration{"raw": raw, "major": major, "minor": minor,
		"uffd-major": umajor, "uffd-minor": uminor} {
		f.dist[name] = slices.Sorted(slices.Values(d))
	}
	f.RawReadP50, f.RawReadP99 = percentiles(raw)
	f.MinorP50, f.MinorP99 = percentiles(minor)
	f.MajorP50, f.MajorP99 = percentiles(major)
	f.UffdMinorP50, f.UffdMinorP99 = percentiles(uminor)
	f.UffdMajorP50, f.UffdMajorP99 = percentiles(umajor)
	return f, nil
}

var sinkValue atomic.Uint32

// keep stops the compiler from dropping the raw-view loads.
func keep(b byte) { sinkValue.Add(uint32(b)) }

func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	s := bench.Summarize(slices.Clone(d))
	return s.P50, s.P99
}

// makeBacking writes random data to the first dataPages pages of a new file
// and leaves holePages pages of hole after them, then drops the file's page
// cache so that reads go to the device.
func makeBacking(path string, dataPages, holePages int) error {
	os.Remove(path)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	chunk := make([]byte, 256*pageSize)
	for off := 0; off < dataPages*pageSize; off += len(chunk) {
		n := min(len(chunk), dataPages*pageSize-off)
		for i := 0; i < n; i += 8 {
			v := rng.Uint64()
			for j := i; j < i+8; j++ {
				chunk[j] = byte(v)
				v >>= 8
			}
		}
		if _, err := f.WriteAt(chunk[:n], int64(off)); err != nil {
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

// EvictionThroughput is what the evictor and the writeback workers sustain
// while two goroutines read and rewrite random pages of a region four times
// its budget, next to the rate of raw 4 KiB random O_DIRECT writes to the same
// file by two goroutines in the same run (the device's limit for writeback).
type EvictionThroughput struct {
	EvictionsPerSec  float64
	WritebacksPerSec float64
	MiBPerSec        float64 // written back
	RawWritesPerSec  float64 // baseline: 4 KiB random writes of the backing file
}

// MeasureEviction runs the writers for duration over a new file at
// backingPath (removed afterwards).
func MeasureEviction(ctx context.Context, backingPath string, budget int64, duration time.Duration) (EvictionThroughput, error) {
	pages := int(4 * budget / pageSize)
	if pages < 64 {
		return EvictionThroughput{}, fmt.Errorf("budget %d is too small", budget)
	}
	r, cleanup, err := regionOverNewFile(backingPath, pages, swap.WithBudget(budget))
	if err != nil {
		return EvictionThroughput{}, err
	}
	defer cleanup()
	// Fill the region once so that the measured phase evicts dirty and
	// clean pages alike.
	page := make([]byte, pageSize)
	for p := 0; p < pages; p++ {
		page[0] = byte(p)
		if _, err := r.WriteAt(page, int64(p)*pageSize); err != nil {
			return EvictionThroughput{}, err
		}
	}
	before := r.Stats()
	start := time.Now()
	err = runFor(ctx, duration, 2, func(rng *rand.Rand, buf []byte) error {
		off := int64(rng.IntN(pages)) * pageSize
		if rng.IntN(2) == 0 {
			_, err := r.ReadAt(buf, off)
			return err
		}
		_, err := r.WriteAt(buf, off)
		return err
	})
	elapsed := time.Since(start).Seconds()
	if err != nil {
		return EvictionThroughput{}, err
	}
	after := r.Stats()
	wb := float64(after.Writebacks - before.Writebacks)
	res := EvictionThroughput{
		EvictionsPerSec:  float64(after.Evictions-before.Evictions) / elapsed,
		WritebacksPerSec: wb / elapsed,
		MiBPerSec:        wb * pageSize / (1 << 20) / elapsed,
	}
	// Baseline: the same file, raw random page writes from two goroutines
	// (the region, idle now, still holds the file's exclusive claim).
	dev, err := blockdev.Open(backingPath, blockdev.WithoutExclusive())
	if err != nil {
		return res, err
	}
	defer dev.Close()
	var writes atomic.Int64
	start = time.Now()
	err = runFor(ctx, duration, 2, func(rng *rand.Rand, _ []byte) error {
		buf := alignedPages.Get().(*[]byte)
		defer alignedPages.Put(buf)
		_, err := dev.WriteAt(*buf, int64(rng.IntN(pages))*pageSize)
		writes.Add(1)
		return err
	})
	res.RawWritesPerSec = float64(writes.Load()) / time.Since(start).Seconds()
	return res, err
}

var alignedPages = sync.Pool{New: func() any { b := blockdev.AlignedBuffer(pageSize); return &b }}

// runFor runs op from workers goroutines until duration passes or ctx ends.
func runFor(ctx context.Context, duration time.Duration, workers int, op func(rng *rand.Rand, buf []byte) error) error {
	deadline := time.Now().Add(duration)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(w)))
			buf := make([]byte, pageSize)
			for i := 0; ; i++ {
				if i%64 == 0 && (time.Now().After(deadline) || ctx.Err() != nil) {
					return
				}
				if err := op(rng, buf); err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	return ctx.Err()
}

// regionOverNewFile creates a sparse file of pages pages at path and a region
// over it; cleanup closes both and removes the file.
func regionOverNewFile(path string, pages int, opts ...swap.Option) (*swap.Region, func(), error) {
	os.Remove(path)
	if err := blockdev.Create(path, int64(pages)*pageSize); err != nil {
		return nil, nil, err
	}
	dev, err := blockdev.Open(path)
	if err != nil {
		os.Remove(path)
		return nil, nil, err
	}
	r, err := swap.New(dev, opts...)
	if err != nil {
		dev.Close()
		os.Remove(path)
		return nil, nil, err
	}
	return r, func() { r.Close(); dev.Close(); os.Remove(path) }, nil
}

// RSSResult is the peak resident memory of this process while it held a
// region ratio times its budget under random reads and writes.
type RSSResult struct {
	BudgetBytes   int64
	BaselineBytes int64 // VmRSS before the region existed
	PeakRSSBytes  int64 // peak VmRSS while the load ran
	LimitBytes    int64 // budget + 10% + 64 MiB: the acceptance bound
}

// Within reports whether the peak stayed within the limit.
func (r RSSResult) Within() bool { return r.PeakRSSBytes <= r.LimitBytes }

// Growth is how much the process grew while it held the region: the region's
// own cost (budget, state table, bookkeeping, I/O buffers).
func (r RSSResult) Growth() int64 { return r.PeakRSSBytes - r.BaselineBytes }

// MeasureRSS measures this process: it first returns free heap memory to the
// system, then samples VmRSS every 5 ms while two goroutines read and write
// random pages of a region of ratio*budget bytes over a new file at
// backingPath (removed afterwards).
func MeasureRSS(ctx context.Context, backingPath string, budget int64, ratio int, duration time.Duration) (RSSResult, error) {
	res := RSSResult{BudgetBytes: budget, LimitBytes: budget + budget/10 + 64<<20}
	// Return what earlier work left on the heap, so that the baseline is the
	// process itself rather than its history.
	debug.FreeOSMemory()
	base, err := bench.ReadMemStatus(0)
	if err != nil {
		return res, err
	}
	res.BaselineBytes = base.RSS
	pages := int(int64(ratio) * budget / pageSize)
	r, cleanup, err := regionOverNewFile(backingPath, pages, swap.WithBudget(budget))
	if err != nil {
		return res, err
	}
	// Closing the region writes back every dirty page: with a full budget of
	// random 4 KiB writes, half a minute on a busy disk. A child that exits
	// right after measuring leaves that to the kernel and the file to its
	// parent (MeasureRSSInChild).
	if !inRSSChild {
		defer cleanup()
	}
	rss := bench.StartRSSSampler(0, 5*time.Millisecond)
	err = runFor(ctx, duration, 2, func(rng *rand.Rand, buf []byte) error {
		off := int64(rng.IntN(pages)) * pageSize
		if rng.IntN(2) == 0 {
			_, err := r.ReadAt(buf, off)
			return err
		}
		buf[rng.IntN(pageSize)]++
		_, err := r.WriteAt(buf, off)
		return err
	})
	rep, rerr := rss.Stop()
	res.PeakRSSBytes = rep.PeakRSS
	return res, errors.Join(err, rerr)
}
