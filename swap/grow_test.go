package swap

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
)

// TestGrowWhileInUse grows a region (and its file) while writers keep
// changing its first half-megabyte, then fills the new range: the data
// written before, during and after the growth reads back, the new range
// starts as zeros, and a flush puts all of it on the file.
func TestGrowWhileInUse(t *testing.T) {
	const small, large = 1 << 20, 4 << 20
	r, dev := newRegion(t, small, WithMaxSize(8<<20), WithBudget(256<<10))
	if r.Size() != small || r.MaxSize() != 8<<20 || len(r.Bytes()) != small || len(r.States()) != small/PageSize {
		t.Fatalf("size %d max %d bytes %d states %d", r.Size(), r.MaxSize(), len(r.Bytes()), len(r.States()))
	}
	if _, _, ok := r.ReadBegin(small / PageSize); ok {
		t.Fatal("ReadBegin beyond the size succeeded")
	}

	// Refusals change nothing.
	if err := r.Grow(large); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("Grow beyond the device: %v, want ErrOutOfRange", err)
	}
	if err := r.Grow(small - PageSize); err == nil {
		t.Fatal("Grow to a smaller size succeeded")
	}
	if err := r.Grow(small + 100); err == nil {
		t.Fatal("Grow to an unaligned size succeeded")
	}
	if r.Size() != small {
		t.Fatalf("size after refused Grows: %d", r.Size())
	}

	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 4)
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := byte(1); ; round++ {
				for p := w; p < 128; p += 2 {
					if _, err := r.WriteAt(pagePattern(p, round), int64(p)*PageSize); err != nil {
						errs <- err
						return
					}
				}
				select {
				case <-stop:
					return
				default:
				}
			}
		}()
	}
	if err := blockdev.Grow(dev, large); err != nil {
		t.Fatal(err)
	}
	if err := r.Grow(large); err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatalf("write during the growth: %v", err)
	default:
	}
	if r.Size() != large || len(r.Bytes()) != large || len(r.States()) != large/PageSize {
		t.Fatalf("after Grow: size %d bytes %d states %d", r.Size(), len(r.Bytes()), len(r.States()))
	}
	if got := mustRead(t, r, 64<<10, large-64<<10); !bytes.Equal(got, make([]byte, 64<<10)) {
		t.Fatal("the grown range does not read zeros")
	}
	// The raw view faults the new range in from the file too.
	if b := r.Bytes()[large-PageSize]; b != 0 {
		t.Fatalf("raw view of the grown range: %#x", b)
	}
	for p := small / PageSize; p < large/PageSize; p++ {
		mustWrite(t, r, pagePattern(p, 9), int64(p)*PageSize)
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(dev.Path())
	if err != nil {
		t.Fatal(err)
	}
	if len(file) != large {
		t.Fatalf("file holds %d bytes", len(file))
	}
	for p := small / PageSize; p < large/PageSize; p++ {
		if !bytes.Equal(file[p*PageSize:(p+1)*PageSize], pagePattern(p, 9)) {
			t.Fatalf("page %d of the grown range is not on the file", p)
		}
	}
	for p := range 128 {
		got := mustRead(t, r, PageSize, int64(p)*PageSize)
		if !bytes.Equal(got, file[p*PageSize:(p+1)*PageSize]) || !bytes.HasPrefix(got, []byte(fmt.Sprintf("page %d tag ", p))) {
			t.Fatalf("page %d: not a writer's page, or region and file differ after the flush", p)
		}
	}

	if err := blockdev.Grow(dev, 16<<20); err != nil {
		t.Fatal(err)
	}
	if err := r.Grow(16 << 20); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("Grow beyond the reservation: %v, want ErrOutOfRange", err)
	}
	r.Close()
	if err := r.Grow(8 << 20); !errors.Is(err, ErrClosed) {
		t.Fatalf("Grow of a closed region: %v, want ErrClosed", err)
	}
}

func TestMaxSizeBelowSizeIsRefused(t *testing.T) {
	dev := openDevice(t, newBackingFile(t, 1<<20))
	if _, err := New(dev, WithMaxSize(512<<10), WithLogger(quietLogger())); err == nil {
		t.Fatal("New with a maximum size below the size succeeded")
	}
}

// TestGrowBeyondTheBudgetKeepsAFreeMargin: a region whose budget covered it
// keeps no free slots, and once Grow made it larger than its budget the
// evictor keeps the free margin again after the new range is read.
func TestGrowBeyondTheBudgetKeepsAFreeMargin(t *testing.T) {
	const pages = 256
	r, dev := newRegion(t, pages*PageSize, WithBudget(pages*PageSize), WithMaxSize(2*pages*PageSize), WithFreeMargin(8))
	mustRead(t, r, pages*PageSize, 0)
	if st := r.Stats(); st.Resident != pages || st.Evictions != 0 {
		t.Fatalf("before the growth: resident %d, evictions %d; want %d, 0", st.Resident, st.Evictions, pages)
	}
	if err := blockdev.Grow(dev, 2*pages*PageSize); err != nil {
		t.Fatal(err)
	}
	if err := r.Grow(2 * pages * PageSize); err != nil {
		t.Fatal(err)
	}
	mustRead(t, r, pages*PageSize, pages*PageSize)
	// The evictor works in the background: wait for it, bounded.
	deadline := time.Now().Add(10 * time.Second)
	for r.Stats().Resident > pages-8 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if st := r.Stats(); st.Resident > pages-8 || st.Evictions == 0 {
		t.Fatalf("after the growth: resident %d, evictions %d; want at most %d resident and evictions", st.Resident, st.Evictions, pages-8)
	}
}
