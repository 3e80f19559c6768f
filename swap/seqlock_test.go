package swap

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestSeqlockReadersSeeWholeVersions plays the NIC engine against writers and
// the evictor: writers rewrite pages with one repeated version number (every
// other write tried with TryWriteAt first), a churn goroutine keeps evicting,
// and readers use ReadBegin/copy/ReadEnd, or TryReadAt (a receive loop's
// read). Every accepted copy must be one complete version, no older than the
// last write that completed before its ReadBegin.
func TestSeqlockReadersSeeWholeVersions(t *testing.T) {
	const (
		pages       = 128
		hot         = 32 // pages 0..hot-1 are written and read by the "NIC"
		budget      = 16
		writesPerWr = 1500
	)
	writes := writesPerWr
	if longTests() {
		writes = 20000
	}
	r, _ := newRegion(t, pages*PageSize, WithBudget(budget*PageSize))
	word := func(page int, v uint64) uint64 { return uint64(page)<<32 | v }
	pageOf := func(page int, v uint64) []byte {
		b := make([]byte, PageSize)
		for i := 0; i < PageSize; i += 8 {
			binary.LittleEndian.PutUint64(b[i:], word(page, v))
		}
		return b
	}
	var completed [hot]atomic.Uint64
	for p := 0; p < hot; p++ {
		mustWrite(t, r, pageOf(p, 1), int64(p)*PageSize)
		completed[p].Store(1)
	}
	seed := testSeed(t)
	stop := make(chan struct{})
	var readers, others sync.WaitGroup
	var accepted, refused, retried, tried, triedWrites atomic.Int64
	errs := make(chan error, 8)

	for g := 0; g < 3; g++ { // NIC readers, and a TryReadAt reader (g 2)
		readers.Add(1)
		go func(g int) {
			defer readers.Done()
			rng := rand.New(rand.NewPCG(seed, 100+uint64(g)))
			buf := make([]byte, PageSize)
			for {
				select {
				case <-stop:
					return
				default:
				}
				p := rng.IntN(hot)
				floor := completed[p].Load()
				if g == 2 {
					if !r.TryReadAt(buf, int64(p)*PageSize) {
						refused.Add(1)
						continue
					}
					tried.Add(1)
				} else {
					seq, zero, ok := r.ReadBegin(p)
					if !ok {
						refused.Add(1)
						continue
					}
					if zero {
						clear(buf)
					} else {
						copy(buf, r.Bytes()[p*PageSize:(p+1)*PageSize])
					}
					if !r.ReadEnd(p, seq) {
						retried.Add(1)
						continue
					}
				}
				first := binary.LittleEndian.Uint64(buf)
				for i := 8; i < PageSize; i += 8 {
					if w := binary.LittleEndian.Uint64(buf[i:]); w != first {
						errs <- fmt.Errorf("page %d: torn copy accepted: word 0 %#x, word %d %#x", p, first, i/8, w)
						return
					}
				}
				if int(first>>32) != p || first&0xffffffff < floor {
					errs <- fmt.Errorf("page %d: accepted version %#x, but version %d had completed before ReadBegin",
						p, first, floor)
					return
				}
				accepted.Add(1)
			}
		}(g)
	}
	others.Add(1)
	go func() { // churn: reads of cold pages evict the hot ones
		defer others.Done()
		rng := rand.New(rand.NewPCG(seed, 200))
		buf := make([]byte, 100)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := r.ReadAt(buf, int64(hot+rng.IntN(pages-hot))*PageSize); err != nil {
				errs <- err
				return
			}
		}
	}()
	var writers sync.WaitGroup
	for g := 0; g < 2; g++ {
		writers.Add(1)
		go func(g int) {
			defer writers.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			for i := 0; i < writes; i++ {
				p := g + 2*rng.IntN(hot/2) // each writer owns half the pages
				v := completed[p].Load() + 1
				b := pageOf(p, v)
				if i%2 == 1 && r.TryWriteAt(b, int64(p)*PageSize) {
					triedWrites.Add(1)
				} else if _, err := r.WriteAt(b, int64(p)*PageSize); err != nil {
					errs <- err
					return
				}
				completed[p].Store(v)
			}
		}(g)
	}
	writers.Wait()
	// Let the readers also run without writers until they have accepted
	// copies (the check is about correctness, not speed).
	for deadline := time.Now().Add(30 * time.Second); (accepted.Load() < 100 || tried.Load() == 0) && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	readers.Wait()
	others.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("accepted %d (TryReadAt %d), refused at ReadBegin or by TryReadAt %d, refused at ReadEnd %d; TryWriteAt %d; %+v",
		accepted.Load(), tried.Load(), refused.Load(), retried.Load(), triedWrites.Load(), r.Stats())
	if accepted.Load() == 0 || tried.Load() == 0 || triedWrites.Load() == 0 {
		t.Fatal("no NIC read, TryReadAt or TryWriteAt was ever accepted")
	}
	if r.Stats().Evictions == 0 {
		t.Fatal("the evictor never ran")
	}
}
