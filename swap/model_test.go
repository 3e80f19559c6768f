package swap

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
)

// testSeed returns the seed from NPRDMA_SWAP_SEED (to replay a failure) or a
// fresh one, and logs it.
func testSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("NPRDMA_SWAP_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("NPRDMA_SWAP_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (replay with NPRDMA_SWAP_SEED=%d)", seed, seed)
	return seed
}

func longTests() bool { return os.Getenv("NPRDMA_LONG") == "1" }

// TestRegionMatchesModel runs random operations from several goroutines, each
// on its own range of a region 8x larger than its budget, against a plain
// []byte model, and checks every read, the budget throughout, and the data
// after a close and reopen.
func TestRegionMatchesModel(t *testing.T) {
	for _, policy := range []Policy{PolicyS3FIFO, PolicyCLOCK} {
		t.Run(policy.String(), func(t *testing.T) { runModel(t, policy) })
	}
}

func runModel(t *testing.T, policy Policy) {
	const (
		workers     = 4
		pagesPerWkr = 64
		pages       = workers * pagesPerWkr
		budget      = pages / 8
	)
	opsPerWorker := 1500
	if longTests() {
		opsPerWorker = 25000
	}
	seed := testSeed(t)
	path := newBackingFile(t, pages*PageSize)
	dev := openDevice(t, path)
	r, err := New(dev, testOptions(WithBudget(budget*PageSize), WithPolicy(policy), WithDirtyLimit(budget/2))...)
	if err != nil {
		t.Fatal(err)
	}
	model := make([]byte, pages*PageSize) // a sparse file reads zeros
	mon := watchResident(r)

	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			lo := int64(w * pagesPerWkr * PageSize)
			span := int64(pagesPerWkr * PageSize)
			mine := model[lo : lo+span]
			if err := modelWorker(r, rng, lo, mine, opsPerWorker); err != nil {
				errs <- fmt.Errorf("worker %d: %w", w, err)
			}
		}(w)
	}
	wg.Wait()
	peak := mon.finish()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := r.Stats()
	t.Logf("%s: peak resident %d of budget %d; %+v", policy, peak, budget, st)
	if peak > budget {
		t.Fatalf("resident reached %d pages, budget %d", peak, budget)
	}
	if st.Evictions == 0 || st.MajorFaults == 0 || st.MinorFaults == 0 || st.Writebacks == 0 {
		t.Fatalf("the run did not exercise eviction, both fault kinds and writeback: %+v", st)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	// Everything acknowledged is on the backing device after Close.
	r2, err := New(dev, WithBudget(budget*PageSize), WithPolicy(policy), WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	expectBytes(t, "reopened region", mustRead(t, r2, pages*PageSize, 0), model)
}

// modelWorker applies ops random operations to [lo, lo+len(model)) of r and
// to model, checking every read.
func modelWorker(r *Region, rng *rand.Rand, lo int64, model []byte, ops int) error {
	span := int64(len(model))
	pages := int(span / PageSize)
	randRange := func(maxLen int64) (int64, int64) {
		off := rng.Int64N(span)
		n := 1 + rng.Int64N(min(maxLen, span-off))
		return off, n
	}
	randData := func(n int64) []byte {
		b := make([]byte, n)
		fillRandom(rng, b)
		return b
	}
	check := func(op string, off, n int64) error {
		got := make([]byte, n)
		if k, err := r.ReadAt(got, lo+off); err != nil || k != int(n) {
			return fmt.Errorf("%s: ReadAt [%d, +%d) = %d, %v", op, lo+off, n, k, err)
		}
		for i := range got {
			if got[i] != model[off+int64(i)] {
				return fmt.Errorf("%s: byte %d of [%d, +%d) is %#x, model says %#x",
					op, i, lo+off, n, got[i], model[off+int64(i)])
			}
		}
		return nil
	}
	for i := 0; i < ops; i++ {
		switch k := rng.IntN(100); {
		case k < 35: // read
			off, n := randRange(3 * PageSize)
			if err := check("read", off, n); err != nil {
				return fmt.Errorf("op %d: %w", i, err)
			}
		case k < 55: // partial write
			off, n := randRange(2 * PageSize)
			data := randData(n)
			if _, err := r.WriteAt(data, lo+off); err != nil {
				return fmt.Errorf("op %d: write: %w", i, err)
			}
			copy(model[off:], data)
		case k < 70: // full-page writes
			p, n := rng.IntN(pages), 1+rng.IntN(3)
			n = min(n, pages-p)
			data := randData(int64(n * PageSize))
			if _, err := r.WriteAt(data, lo+int64(p)*PageSize); err != nil {
				return fmt.Errorf("op %d: full write: %w", i, err)
			}
			copy(model[p*PageSize:], data)
		case k < 75: // FUA write
			off, n := randRange(PageSize + 100)
			data := randData(n)
			if _, err := r.WriteAtFUA(data, lo+off); err != nil {
				return fmt.Errorf("op %d: FUA write: %w", i, err)
			}
			copy(model[off:], data)
		case k < 81: // trim
			off, n := randRange(5 * PageSize)
			if err := r.Trim(lo+off, n); err != nil {
				return fmt.Errorf("op %d: trim: %w", i, err)
			}
			clear(model[off : off+n])
			if err := check("read after trim", off, n); err != nil {
				return fmt.Errorf("op %d: %w", i, err)
			}
		case k < 85: // write zeroes
			off, n := randRange(3 * PageSize)
			if err := r.WriteZeroes(lo+off, n); err != nil {
				return fmt.Errorf("op %d: write zeroes: %w", i, err)
			}
			clear(model[off : off+n])
		case k < 88: // flush
			if err := r.Flush(); err != nil {
				return fmt.Errorf("op %d: flush: %w", i, err)
			}
		case k < 94: // prefetch
			off, n := randRange(4 * PageSize)
			if err := r.Prefetch(lo+off, n); err != nil {
				return fmt.Errorf("op %d: prefetch: %w", i, err)
			}
		default: // advise
			off, n := randRange(4 * PageSize)
			if err := r.Advise(lo+off, n); err != nil {
				return fmt.Errorf("op %d: advise: %w", i, err)
			}
		}
	}
	return check("final read", 0, span)
}

func fillRandom(rng *rand.Rand, b []byte) {
	for i := 0; i < len(b); i += 8 {
		v := rng.Uint64()
		for j := i; j < min(i+8, len(b)); j++ {
			b[j] = byte(v)
			v >>= 8
		}
	}
}

// TestResidentNeverExceedsBudgetUnderLoad samples the resident count while two
// goroutines read and write random pages of a region 8x its budget.
func TestResidentNeverExceedsBudgetUnderLoad(t *testing.T) {
	const pages, budget = 512, 64
	r, _ := newRegion(t, pages*PageSize, WithBudget(budget*PageSize))
	seed := testSeed(t)
	mon := watchResident(r)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			buf := make([]byte, PageSize)
			for i := 0; i < 3000; i++ {
				off := rng.Int64N(pages*PageSize - PageSize)
				var err error
				if rng.IntN(2) == 0 {
					_, err = r.ReadAt(buf, off)
				} else {
					_, err = r.WriteAt(buf[:1+rng.IntN(PageSize)], off)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	peak := mon.finish()
	st := r.Stats()
	t.Logf("peak resident %d of %d; %+v", peak, budget, st)
	if peak > budget {
		t.Fatalf("resident reached %d pages, budget %d", peak, budget)
	}
	if st.Evictions == 0 {
		t.Fatalf("no evictions: the load did not press the budget")
	}
}
