// Package blockdevbench is the blockdev experiment: 4 KiB random O_DIRECT
// reads of a backing file through the project's blockdev package, next to
// fio's figures on the same file in the same run.
package blockdevbench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/blockdev"
)

// PageSize is the read size of every measurement.
const PageSize = blockdev.PageSize

// FillPage writes the content of page index page of a file made with seed:
// pseudo-random words from a PCG stream keyed by (seed, page). Every page is
// different and incompressible, so a read that returns the wrong block, or
// one served from a shortcut for zeros, is caught.
func FillPage(p []byte, seed uint64, page int64) {
	rng := rand.NewPCG(seed, uint64(page))
	for i := 0; i+8 <= len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], rng.Uint64())
	}
}

// pageTag is the first word of a page's content: a cheap check, made on
// every measured read, that the right block came back.
func pageTag(seed uint64, page int64) uint64 {
	var rng rand.PCG // a value: no allocation on the measured path
	rng.Seed(seed, uint64(page))
	return rng.Uint64()
}

// VerifyPage checks that p holds the content of page index page.
func VerifyPage(p []byte, seed uint64, page int64) error {
	rng := rand.NewPCG(seed, uint64(page))
	for i := 0; i+8 <= len(p); i += 8 {
		if got, want := binary.LittleEndian.Uint64(p[i:]), rng.Uint64(); got != want {
			return fmt.Errorf("page %d: byte %d reads %#016x, want %#016x", page, i, got, want)
		}
	}
	return nil
}

// PrepareFile creates (or overwrites) a file of size bytes at path and fills
// it with FillPage content in large sequential O_DIRECT writes, then makes it
// durable, so that the reads that follow hit real, allocated blocks.
func PrepareFile(ctx context.Context, path string, size int64, seed uint64) error {
	if size <= 0 || size%PageSize != 0 {
		return fmt.Errorf("prepare %s: size %d is not a positive multiple of %d", path, size, PageSize)
	}
	// blockdev.Create keeps (and never shrinks) an existing file: start
	// afresh so that a larger leftover from an earlier run cannot hold
	// pages this run did not write.
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("prepare %s: %w", path, err)
	}
	if err := blockdev.Create(path, size); err != nil {
		return err
	}
	dev, err := blockdev.Open(path)
	if err != nil {
		return err
	}
	defer dev.Close()
	const chunk = 4 << 20
	buf := blockdev.AlignedBuffer(chunk)
	for off := int64(0); off < size; off += chunk {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("prepare %s: %w", path, err)
		}
		n := min(int64(chunk), size-off)
		for p := int64(0); p < n; p += PageSize {
			FillPage(buf[p:p+PageSize], seed, (off+p)/PageSize)
		}
		if _, err := dev.WriteAt(buf[:n], off); err != nil {
			return err
		}
	}
	return dev.Flush()
}

// ReadResult is one measurement of random reads.
type ReadResult struct {
	QD      int
	Samples []time.Duration // sorted ascending
	Summary bench.LatencySummary
	Ops     int64         // reads started inside the measured window
	Elapsed time.Duration // the measured window
	IOPS    float64
	// Longest is the longest single read of the whole run, warm-up and
	// reads straddling the window included: a read blocked across the
	// window leaves no sample but shows here (a stalled disk).
	Longest time.Duration
}

// RandomReads reads 4 KiB pages at uniformly random page offsets of dev from
// qd goroutines, each with one read in flight (queue depth qd), for warmup
// and then runtime. Latencies of reads started after the warmup are
// recorded; each is the wall time of one ReadAt. Every read's first word is
// checked against the content PrepareFile wrote with dataSeed.
func RandomReads(ctx context.Context, dev blockdev.Device, qd int, warmup, runtime time.Duration, seed, dataSeed uint64) (ReadResult, error) {
	if qd < 1 {
		return ReadResult{}, fmt.Errorf("random reads of %s: queue depth %d", dev.Path(), qd)
	}
	pages := dev.Size() / PageSize
	if pages < 1 {
		return ReadResult{}, fmt.Errorf("random reads of %s: smaller than one page", dev.Path())
	}
	start := time.Now()
	measureFrom := start.Add(warmup)
	end := measureFrom.Add(runtime)
	// Preallocating for a generous rate keeps slice growth (a copy of the
	// whole slice) out of the measured loop.
	capacity := int(runtime.Seconds()*200_000)/qd + 1024

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	perWorker := make([][]time.Duration, qd)
	longest := make([]time.Duration, qd)
	var wg sync.WaitGroup
	for w := range qd {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			buf := blockdev.AlignedBuffer(PageSize)
			samples := make([]time.Duration, 0, capacity)
			for ctx.Err() == nil {
				page := int64(rng.Uint64N(uint64(pages)))
				t0 := time.Now()
				if !t0.Before(end) {
					break
				}
				_, err := dev.ReadAt(buf, page*PageSize)
				lat := time.Since(t0)
				longest[w] = max(longest[w], lat)
				if err != nil {
					cancel(err)
					break
				}
				if got := binary.LittleEndian.Uint64(buf); got != pageTag(dataSeed, page) {
					cancel(fmt.Errorf("read %s page %d: wrong content (first word %#016x)", dev.Path(), page, got))
					break
				}
				if !t0.Before(measureFrom) {
					samples = append(samples, lat)
				}
			}
			perWorker[w] = samples
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return ReadResult{}, err
	}
	total := 0
	for _, s := range perWorker {
		total += len(s)
	}
	all := make([]time.Duration, 0, total)
	for _, s := range perWorker {
		all = append(all, s...)
	}
	res := ReadResult{QD: qd, Samples: all, Ops: int64(total), Elapsed: runtime, Longest: slices.Max(longest)}
	res.Summary = bench.Summarize(res.Samples) // sorts Samples
	res.IOPS = float64(total) / runtime.Seconds()
	return res, nil
}

// VerifySample reads n random pages of dev and checks their whole content:
// the figures are only worth something if the reads return the right bytes.
func VerifySample(dev blockdev.Device, n int, seed, dataSeed uint64) error {
	pages := dev.Size() / PageSize
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	buf := blockdev.AlignedBuffer(PageSize)
	var errs []error
	for range n {
		page := int64(rng.Uint64N(uint64(pages)))
		if _, err := dev.ReadAt(buf, page*PageSize); err != nil {
			return err
		}
		if err := VerifyPage(buf, dataSeed, page); err != nil {
			errs = append(errs, err)
			if len(errs) >= 3 {
				break
			}
		}
	}
	return errors.Join(errs...)
}

// mergeSamples pools sorted sample sets into one sorted set.
func mergeSamples(sets ...[]time.Duration) []time.Duration {
	n := 0
	for _, s := range sets {
		n += len(s)
	}
	out := make([]time.Duration, 0, n)
	for _, s := range sets {
		out = append(out, s...)
	}
	slices.Sort(out)
	return out
}
