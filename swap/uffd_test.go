package swap

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// withDeadlock fails the test with every goroutine's stack if body does not
// finish within limit: the failure mode under test is a hang.
func withDeadlock(t *testing.T, limit time.Duration, body func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- body() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(limit):
		buf := make([]byte, 1<<20)
		t.Fatalf("no progress within %v (deadlock?):\n%s", limit, buf[:runtime.Stack(buf, true)])
	}
}

// evictByPressure reads other pages until page is absent.
func evictByPressure(t *testing.T, r *Region, page int) {
	t.Helper()
	buf := make([]byte, 1)
	for i := 0; atomic.LoadUint64(&r.States()[page])&StatePresent != 0; i++ {
		if i > 100*r.NumPages() {
			t.Fatalf("page %d still resident after %d reads elsewhere", page, i)
		}
		p := i % r.NumPages()
		if p == page {
			continue
		}
		if _, err := r.ReadAt(buf, int64(p)*PageSize); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRawViewReadsEvictedData(t *testing.T) {
	const pages = 256
	r, _ := newRegion(t, pages*PageSize, WithBudget(16*PageSize))
	for p := 0; p < pages; p++ {
		mustWrite(t, r, pagePattern(p, 9), int64(p)*PageSize)
	}
	if err := r.Trim(200*PageSize, 8*PageSize); err != nil {
		t.Fatal(err)
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	evictByPressure(t, r, 3)
	before := r.Stats()
	got := make([]byte, PageSize)
	copy(got, r.Bytes()[3*PageSize:4*PageSize])
	expectBytes(t, "evicted page through the raw view", got, pagePattern(3, 9))
	// Every other page too, absent or not, and trimmed pages read zeros.
	zero := make([]byte, PageSize)
	for p := 0; p < pages; p++ {
		want := pagePattern(p, 9)
		if p >= 200 && p < 208 {
			want = zero
		}
		copy(got, r.Bytes()[p*PageSize:(p+1)*PageSize])
		expectBytes(t, fmt.Sprintf("raw page %d", p), got, want)
	}
	after := r.Stats()
	if after.UffdMajorFaults <= before.UffdMajorFaults || after.UffdMinorFaults <= before.UffdMinorFaults {
		t.Fatalf("raw reads of absent pages were not served by the fault threads: before %+v after %+v", before, after)
	}
	// The evictor brings resident back under the budget after raw fills.
	deadline := time.Now().Add(20 * time.Second)
	for r.Stats().Resident > r.Stats().Budget {
		if time.Now().After(deadline) {
			t.Fatalf("resident %d stays above budget %d after raw-view fills", r.Stats().Resident, r.Stats().Budget)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestRawViewNoDeadlockUnderGC(t *testing.T) {
	for _, procs := range []int{1, 2} {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			const pages = 512
			r, _ := newRegion(t, pages*PageSize, WithBudget(32*PageSize))
			for p := 0; p < pages; p++ {
				mustWrite(t, r, pagePattern(p, 10), int64(p)*PageSize)
			}
			if err := r.Flush(); err != nil {
				t.Fatal(err)
			}
			stopGC := make(chan struct{})
			var gcs sync.WaitGroup
			gcs.Add(1)
			go func() {
				defer gcs.Done()
				for {
					select {
					case <-stopGC:
						return
					default:
						runtime.GC()
					}
				}
			}()
			defer func() { close(stopGC); gcs.Wait() }()
			withDeadlock(t, 60*time.Second, func() error {
				var wg sync.WaitGroup
				errs := make(chan error, 4)
				for g := 0; g < 4; g++ {
					wg.Add(1)
					go func(seed uint64) {
						defer wg.Done()
						rng := rand.New(rand.NewPCG(seed, 1))
						buf := make([]byte, PageSize)
						for i := 0; i < 150; i++ {
							p := rng.IntN(pages)
							copy(buf, r.Bytes()[p*PageSize:(p+1)*PageSize])
							if !bytes.Equal(buf, pagePattern(p, 10)) {
								errs <- fmt.Errorf("raw read of page %d returned wrong bytes", p)
								return
							}
							if i%10 == 0 {
								// Explicit reads keep the evictor busy too.
								if _, err := r.ReadAt(buf[:100], int64(rng.IntN(pages))*PageSize); err != nil {
									errs <- err
									return
								}
							}
						}
					}(uint64(g))
				}
				wg.Wait()
				close(errs)
				return <-errs
			})
			if st := r.Stats(); st.UffdFaults == 0 {
				t.Fatalf("no raw faults happened: %+v", st)
			}
		})
	}
}

func TestConcurrentRawFaultsOnOnePageShareOneRead(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	const pages = 64
	path := newBackingFile(t, pages*PageSize)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(pagePattern(40, 11), 40*PageSize); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// Budget holds the whole region: nothing is evicted, so one fill must
	// serve every toucher.
	r, _ := newRegionOver(t, path, WithBudget(pages*PageSize), WithFaultThreads(4))
	start := make(chan struct{})
	var wg sync.WaitGroup
	var bad atomic.Int32
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, PageSize)
			<-start
			copy(buf, r.Bytes()[40*PageSize:41*PageSize])
			if !bytes.Equal(buf, pagePattern(40, 11)) {
				bad.Add(1)
			}
		}()
	}
	withDeadlock(t, 60*time.Second, func() error { close(start); wg.Wait(); return nil })
	if n := bad.Load(); n > 0 {
		t.Fatalf("%d of 32 concurrent raw readers got wrong bytes", n)
	}
	// The fill thread counts after its UFFDIO_COPY has woken the readers.
	st := r.Stats()
	for deadline := time.Now().Add(10 * time.Second); st.UffdMajorFaults == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		st = r.Stats()
	}
	if st.UffdMajorFaults != 1 {
		t.Fatalf("page 40 was filled %d times, want once: %+v", st.UffdMajorFaults, st)
	}
	t.Logf("fault messages %d, shared %d, woken %d", st.UffdFaults, st.UffdShared, st.UffdFaults-st.UffdShared-1)
}

// A write that returned is visible through the raw view, even while the page
// is evicted and refilled concurrently: a fill never installs stale content.
func TestRawViewNeverSeesStaleContentAfterWrite(t *testing.T) {
	const pages = 128
	r, _ := newRegion(t, pages*PageSize, WithBudget(16*PageSize))
	page := make([]byte, PageSize)
	fill := func(p int, v uint64) []byte {
		for i := 0; i < PageSize; i += 8 {
			binary.LittleEndian.PutUint64(page[i:], uint64(p)<<32|v)
		}
		return page
	}
	for p := 0; p < pages; p++ {
		mustWrite(t, r, fill(p, 0), int64(p)*PageSize)
	}
	stop := make(chan struct{})
	var churn sync.WaitGroup
	churn.Add(2)
	go func() { // explicit reads evict the writers' pages
		defer churn.Done()
		buf := make([]byte, 64)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			r.ReadAt(buf, int64(8+i%(pages-8))*PageSize)
		}
	}()
	go func() { // raw readers race with the writers' fills
		defer churn.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			touch(r.Bytes(), (i%8)*PageSize+i%PageSize)
		}
	}()
	withDeadlock(t, 60*time.Second, func() error {
		defer func() { close(stop); churn.Wait() }()
		got := make([]byte, PageSize)
		for v := uint64(1); v <= 300; v++ {
			p := int(v % 8)
			buf := make([]byte, PageSize)
			copy(buf, fill(p, v))
			if _, err := r.WriteAt(buf, int64(p)*PageSize); err != nil {
				return err
			}
			if v%3 == 0 {
				if err := r.Flush(); err != nil {
					return err
				}
			}
			copy(got, r.Bytes()[p*PageSize:(p+1)*PageSize])
			if !bytes.Equal(got, buf) {
				return fmt.Errorf("page %d: raw view shows %x after writing version %d",
					p, binary.LittleEndian.Uint64(got), v)
			}
		}
		return nil
	})
}

// A raw fault whose backing read keeps failing must not return wrong bytes:
// the page is poisoned and the toucher gets SIGBUS (a recoverable panic with
// SetPanicOnFault). The explicit API then maps the page over the marker.
func TestRawFaultWithFailingReadPoisonsInsteadOfLying(t *testing.T) {
	const pages = 32
	path := newBackingFile(t, pages*PageSize)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(pagePattern(9, 12), 9*PageSize)
	f.Close()
	r, _ := newRegionOver(t, path, WithBudget(pages*PageSize))
	r.c.setFailFills(true)
	// SetPanicOnFault is per goroutine: the touching goroutine sets it.
	var faulted error
	withDeadlock(t, 60*time.Second, func() error {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() {
			if v := recover(); v != nil {
				faulted = fmt.Errorf("%v", v)
			}
		}()
		touch(r.Bytes(), 9*PageSize)
		return nil
	})
	r.c.setFailFills(false)
	st := r.Stats()
	if st.UffdPoisoned == 0 {
		if faulted == nil {
			t.Logf("%+v", st)
			t.Skip("the kernel cannot poison pages (UFFDIO_POISON, Linux 6.6): the toucher waits instead")
		}
	}
	if faulted == nil {
		t.Fatalf("raw read of a page whose backing read fails returned without a fault: %+v", st)
	}
	t.Logf("toucher got: %v; %+v", faulted, st)
	// The evictor heals the poisoned page; a later raw touch retries the
	// (now working) read and gets the right bytes.
	got := make([]byte, PageSize)
	withDeadlock(t, 60*time.Second, func() error {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		for {
			ok := func() (ok bool) {
				defer func() {
					if recover() != nil {
						time.Sleep(time.Millisecond)
					}
				}()
				copy(got, r.Bytes()[9*PageSize:10*PageSize])
				return true
			}()
			if ok {
				return nil
			}
		}
	})
	expectBytes(t, "raw read after the device recovered", got, pagePattern(9, 12))
	expectBytes(t, "explicit read", mustRead(t, r, PageSize, 9*PageSize), pagePattern(9, 12))
}
