package np_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nprdma/nprdma/integration/np/npread"
	"github.com/nprdma/nprdma/nprdma/shm"
	"github.com/nprdma/nprdma/swap"
)

// TestStressReadersSeeWholeVersions runs readers doing one-sided READs with
// the slow path over a real swap.Region 8× its budget, while writers rewrite
// pages with versioned content and the evictor churns. Every page part a
// reader gets must be one complete version that existed (never torn), never
// older than the newest write completed before the READ was posted.
func TestStressReadersSeeWholeVersions(t *testing.T) {
	for _, p := range providers {
		t.Run(p.name, func(t *testing.T) { stress(t, p) })
	}
}

func stress(t *testing.T, p provider) {
	const (
		pages   = 512
		budget  = pages / 8
		writers = 3
		readers = 3
		maxSpan = 8         // pages per multi-page read
		hot     = 16        // most accesses go to pages [0, hot): resident, raced by writers
		zeros   = pages / 8 // the last pages are never written: zero pages, minor faults
	)
	// Writers write at least writes pages each and go on until the readers
	// have made minReads reads while they wrote (or writeFor passed: the
	// test is about what readers see, not how fast they are).
	writes, minReads, writeFor := 1000, int64(1500), 2*time.Minute
	if longTests() {
		writes, minReads, writeFor = 20000, 20000, 10*time.Minute
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("NPRDMA_NP_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("NPRDMA_NP_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (NPRDMA_NP_SEED replays)", seed)

	region := newRegion(t, pages, p.regionOpts(swap.WithBudget(budget*pageSize))...)
	// Three quarters of the pages start at version 1; the rest are zero
	// until a writer picks them, and the last eighth stays zero.
	var started, completed [pages]atomic.Uint64
	for pg := 0; pg < pages*3/4; pg++ {
		mustWrite(t, region, versionedPage(pg, 1), int64(pg)*pageSize)
		started[pg].Store(1)
		completed[pg].Store(1)
	}
	tg, in := setup(t, p, region)
	regionBefore := region.Stats()

	ctx, cancel := context.WithTimeout(context.Background(), writeFor+time.Minute)
	defer cancel()
	errs := make(chan error, readers+writers)
	var failed atomic.Bool // a reader or writer failed: everybody stops
	fail := func(err error) { failed.Store(true); errs <- err }
	stop := make(chan struct{})
	var reads, partsChecked, versionsChecked atomic.Int64

	reqs := make([]*npread.Requester, readers)
	for i := range reqs {
		reqs[i] = in.dial(t, tg, npread.WithMaxRead(maxSpan*pageSize+pageSize))
	}
	var readersWG sync.WaitGroup
	for g := 0; g < readers; g++ {
		readersWG.Add(1)
		go func(g int) {
			defer readersWG.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(100+g)))
			rq := reqs[g]
			floors := make([]uint64, maxSpan+1)
			for {
				select {
				case <-stop:
					return
				default:
				}
				var off, n int
				// Reader 0 reads the whole region (the slow path, faults
				// and evictions); the others mostly the hot pages, racing
				// the writers one-sided.
				span := hot + maxSpan
				if g == 0 || rng.IntN(16) == 0 {
					span = pages
				}
				switch rng.IntN(3) {
				case 0: // one page
					off, n = rng.IntN(span)*pageSize, pageSize
				case 1: // several whole pages
					k := 2 + rng.IntN(maxSpan-1)
					off, n = rng.IntN(span-k+1)*pageSize, k*pageSize
				default: // 8-byte aligned offset and length, spanning partial pages
					n = 8 * (1 + rng.IntN(maxSpan*pageSize/8))
					off = 8 * rng.IntN((span*pageSize-n)/8+1)
				}
				first, last := off/pageSize, (off+n-1)/pageSize
				// The floors are read before the READ is posted.
				for pg := first; pg <= last; pg++ {
					floors[pg-first] = completed[pg].Load()
				}
				buf, _, err := rq.Read(ctx, int64(off), n)
				if err != nil {
					fail(fmt.Errorf("reader %d: read [%d, +%d): %w", g, off, n, err))
					return
				}
				reads.Add(1)
				for pg := first; pg <= last; pg++ {
					lo := max(off, pg*pageSize)
					hi := min(off+n, (pg+1)*pageSize)
					versioned, err := checkPagePart(pg, lo-pg*pageSize, buf[lo-off:hi-off], floors[pg-first], started[pg].Load())
					if err != nil {
						fail(fmt.Errorf("reader %d: read [%d, +%d): page %d bytes [%d, %d): %w", g, off, n, pg,
							lo-pg*pageSize, hi-pg*pageSize, err))
						return
					}
					partsChecked.Add(1)
					if versioned {
						versionsChecked.Add(1)
					}
				}
			}
		}(g)
	}

	var writersWG sync.WaitGroup
	writeUntil := time.Now().Add(writeFor)
	for g := 0; g < writers; g++ {
		writersWG.Add(1)
		go func(g int) {
			defer writersWG.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			for i := 0; !failed.Load() && (i < writes || (reads.Load() < minReads && time.Now().Before(writeUntil))); i++ {
				span := hot
				if rng.IntN(8) == 0 {
					span = pages - zeros
				}
				pg := g + writers*rng.IntN((span-g+writers-1)/writers) // each writer owns page ≡ g (mod writers)
				v := completed[pg].Load() + 1
				started[pg].Store(v)
				if _, err := region.WriteAt(versionedPage(pg, v), int64(pg)*pageSize); err != nil {
					fail(fmt.Errorf("writer %d: page %d version %d: %w", g, pg, v, err))
					return
				}
				completed[pg].Store(v)
			}
		}(g)
	}
	writingStart := time.Now()
	writersWG.Wait()
	readsWhileWriting := reads.Load()
	writing := time.Since(writingStart)
	close(stop)
	readersWG.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}

	var sum npread.Stats
	for _, rq := range reqs {
		s := rq.Stats()
		sum.Reads += s.Reads
		sum.Pages += s.Pages
		sum.OneSidedHits += s.OneSidedHits
		sum.SuspectedFaults += s.SuspectedFaults
		sum.FalsePositives += s.FalsePositives
		sum.SlowPathReads += s.SlowPathReads
		sum.MinorFaults += s.MinorFaults
		sum.MajorFaults += s.MajorFaults
	}
	rs := region.Stats()
	t.Logf("%s: %d reads while the writers ran (%v), %d in all", p.name, readsWhileWriting, writing.Round(time.Millisecond), reads.Load())
	if readsWhileWriting < minReads {
		t.Logf("%s: fewer reads than the %d wanted while the writers ran: the machine is slow; the checks still hold", p.name, minReads)
	}
	t.Logf("%s: %d reads, %d page parts checked (%d with a version), %d pages one-sided, %d suspected faults, "+
		"%d slow-path reads, %d minor + %d major faults, %d false positives; region: %d evictions, %d writebacks",
		p.name, reads.Load(), partsChecked.Load(), versionsChecked.Load(), sum.OneSidedHits, sum.SuspectedFaults,
		sum.SlowPathReads, sum.MinorFaults, sum.MajorFaults, sum.FalsePositives, rs.Evictions-regionBefore.Evictions,
		rs.Writebacks-regionBefore.Writebacks)

	switch {
	case sum.Reads != uint64(reads.Load()):
		t.Errorf("requesters counted %d reads, the readers made %d", sum.Reads, reads.Load())
	case sum.OneSidedHits+sum.SuspectedFaults != sum.Pages:
		t.Errorf("hits %d + suspected %d != pages %d", sum.OneSidedHits, sum.SuspectedFaults, sum.Pages)
	case sum.SuspectedFaults == 0 || sum.OneSidedHits == 0:
		t.Errorf("no suspected fault or no one-sided hit in %d pages: the test did not exercise both paths", sum.Pages)
	case sum.FalsePositives != 0:
		t.Errorf("%d false positives, but no page holds the magic pattern", sum.FalsePositives)
	case rs.Evictions == regionBefore.Evictions:
		t.Error("the evictor never ran")
	case readsWhileWriting == 0:
		t.Error("no read while the writers ran")
	}
	// Every magic page delivered (by the target's NIC engine, or by the
	// initiator reading in place) is a suspected fault the initiator
	// found, and nothing else is.
	if served, found := magicServed(tg, in), in.dev.Stats().SuspectedFaults; served != found || found != sum.SuspectedFaults {
		t.Errorf("magic pages delivered %d, suspected faults found by the device %d, by the requesters %d", served, found, sum.SuspectedFaults)
	}
	// Only the slow path faulted pages in (writers write whole pages, which
	// install without a fault), so its reports add up to the region's.
	if dm, dM := rs.MinorFaults-regionBefore.MinorFaults, rs.MajorFaults-regionBefore.MajorFaults; dm != sum.MinorFaults || dM != sum.MajorFaults {
		t.Errorf("requesters saw %d minor + %d major faults, the region counted %d + %d", sum.MinorFaults, sum.MajorFaults, dm, dM)
	}
	if sum.MinorFaults == 0 || sum.MajorFaults == 0 {
		t.Errorf("minor %d, major %d: both kinds of resolution should occur", sum.MinorFaults, sum.MajorFaults)
	}
	if sp, ok := in.dev.Provider().(*shm.Provider); ok {
		st := in.dev.Stats()
		t.Logf("%s: %d READs in place (%d pages, %d magic), %d copies met a released page", p.name, st.LocalReads,
			st.LocalPagesRead, st.LocalMagicPages, sp.Stats().InPlaceFaults)
		if st.LocalReads == 0 {
			t.Error("no READ was executed in place")
		}
		checkNoPlantedPages(t, region)
	}
}

// checkNoPlantedPages checks, once the region is quiet, that the pages
// holding memory in a shareable region's memory file are exactly its
// present pages: no reader in place brought a released page back.
func checkNoPlantedPages(t *testing.T, r *swap.Region) {
	t.Helper()
	data, _, _, ok := r.ShareFiles()
	if !ok {
		t.Fatal("region is not shareable")
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		held, err := filePages(data, r.NumPages())
		if err != nil {
			t.Fatal(err)
		}
		var wrong []int
		for pg := range held {
			s := atomic.LoadUint64(&r.States()[pg])
			if s&swap.StateBusy == 0 && held[pg] != (s&swap.StatePresent != 0) {
				wrong = append(wrong, pg)
			}
		}
		if len(wrong) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pages %v: memory in the region's file does not match their state (present or not)", wrong)
		}
		time.Sleep(10 * time.Millisecond) // the evictor may still be finishing a batch
	}
}
