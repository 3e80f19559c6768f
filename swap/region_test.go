package swap

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"

	"golang.org/x/sys/unix"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/internal/leaktest"
	"github.com/nprdma/nprdma/nprdma"
)

// *Region is what nprdma's unpinned memory regions read through.
var _ nprdma.Pager = (*Region)(nil)

func TestStateLayoutMatchesC(t *testing.T) {
	want := map[string]uint64{
		"present":      StatePresent,
		"busy":         StateBusy,
		"dirty":        StateDirty,
		"referenced":   StateReferenced,
		"zero":         StateZero,
		"writeback":    StateWriteback,
		"maplock":      StateMaplock,
		"tracked":      StateTracked,
		"readersShift": StateReadersShift,
		"readersMask":  StateReadersMask,
		"versionShift": StateVersionShift,
		"pageSize":     PageSize,
	}
	got := cStateLayout()
	if len(got) != len(want) {
		t.Fatalf("C layout has %d entries, Go %d", len(got), len(want))
	}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s: C %#x, Go %#x", name, got[name], v)
		}
	}
	// The fields must not overlap.
	var seen uint64
	all := ^uint64(0)
	for _, f := range []uint64{StatePresent, StateBusy, StateDirty, StateReferenced, StateZero,
		StateWriteback, StateMaplock, StateTracked, StateReadersMask, all << StateVersionShift} {
		if seen&f != 0 {
			t.Errorf("field %#x overlaps %#x", f, seen)
		}
		seen |= f
	}
}

func TestReadWriteRoundTripUnderEviction(t *testing.T) {
	const pages = 256
	r, _ := newRegion(t, pages*PageSize, WithBudget(16*PageSize))
	for p := 0; p < pages; p++ {
		mustWrite(t, r, pagePattern(p, 1), int64(p)*PageSize)
	}
	// Partial writes straddling page boundaries, into evicted pages.
	for p := 0; p < pages; p += 3 {
		off := int64(p)*PageSize + PageSize - 100
		if off+200 > pages*PageSize {
			break
		}
		mustWrite(t, r, bytes.Repeat([]byte{0xAB}, 200), off)
	}
	for p := 0; p < pages; p++ {
		want := pagePattern(p, 1)
		if p%3 == 0 && p < pages-1 {
			copy(want[PageSize-100:], bytes.Repeat([]byte{0xAB}, 100))
		}
		if p%3 == 1 && p > 0 {
			copy(want[:100], bytes.Repeat([]byte{0xAB}, 100))
		}
		expectBytes(t, "page", mustRead(t, r, PageSize, int64(p)*PageSize), want)
	}
	st := r.Stats()
	if st.Evictions == 0 || st.Writebacks == 0 || st.MajorFaults == 0 {
		t.Fatalf("expected evictions, writebacks and major faults with a 16-page budget over 256 pages: %+v", st)
	}
	if st.Resident > st.Budget {
		t.Fatalf("resident %d > budget %d", st.Resident, st.Budget)
	}
}

// TestEvictionReleasesTheMemory checks with mincore that an evicted page's
// memory is really given back (the state word alone could lie), both with
// batched releases and with the one-madvise-per-run fallback.
func TestEvictionReleasesTheMemory(t *testing.T) {
	for _, batched := range []bool{true, false} {
		t.Run(fmt.Sprintf("batched=%v", batched), func(t *testing.T) {
			const pages, budget = 512, 16
			r, _ := newRegion(t, pages*PageSize, WithBudget(budget*PageSize))
			if !r.c.uffd {
				t.Skip("no userfaultfd: the region is not demand-paged")
			}
			if batched && !r.c.batchDiscard() {
				t.Skip("this kernel has no process_madvise(MADV_DONTNEED) on its own pidfd")
			}
			r.c.setBatchDiscard(batched)
			// Every other page, so that releases come as many short runs.
			for p := 0; p < pages; p += 2 {
				mustWrite(t, r, pagePattern(p, 1), int64(p)*PageSize)
			}
			// The states before mincore: eviction may go on in the
			// background, and a page is marked absent only after its memory
			// is released, so a page absent here holds none at mincore.
			wasAbsent := make([]bool, pages)
			for p := 0; p < pages; p += 2 {
				wasAbsent[p] = atomic.LoadUint64(&r.States()[p])&(StatePresent|StateBusy) == 0
			}
			vec := make([]byte, pages)
			mem := r.Bytes()
			if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)),
				uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
				t.Fatalf("mincore: %v", errno)
			}
			absent, inCore := 0, 0
			for p := 0; p < pages; p += 2 {
				if !wasAbsent[p] {
					continue
				}
				absent++
				if vec[p]&1 != 0 {
					inCore++
				}
			}
			if absent < pages/2-2*budget {
				t.Fatalf("only %d of %d written pages absent with a %d-page budget", absent, pages/2, budget)
			}
			if inCore > 0 {
				t.Fatalf("%d of %d evicted pages still hold memory", inCore, absent)
			}
			if batched != r.c.batchDiscard() {
				t.Fatalf("batched releases %v after the run, want %v", r.c.batchDiscard(), batched)
			}
			for p := 0; p < pages; p += 2 {
				expectBytes(t, "page", mustRead(t, r, PageSize, int64(p)*PageSize), pagePattern(p, 1))
			}
		})
	}
}

func TestDataSurvivesCloseAndReopen(t *testing.T) {
	const pages = 64
	path := newBackingFile(t, pages*PageSize)
	dev := openDevice(t, path)
	r, err := New(dev, WithBudget(16*PageSize), WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	for p := 0; p < pages; p++ {
		mustWrite(t, r, pagePattern(p, 2), int64(p)*PageSize)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadAt(make([]byte, 1), 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("ReadAt after Close: %v, want ErrClosed", err)
	}
	// The file itself holds every page at offset page*PageSize.
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for p := 0; p < pages; p++ {
		expectBytes(t, "backing file page", raw[p*PageSize:(p+1)*PageSize], pagePattern(p, 2))
	}
	r2, err := New(dev, WithBudget(16*PageSize), WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	for p := pages - 1; p >= 0; p-- {
		expectBytes(t, "reopened page", mustRead(t, r2, PageSize, int64(p)*PageSize), pagePattern(p, 2))
	}
}

func TestFullPageWriteToAbsentPageSkipsRead(t *testing.T) {
	path := newBackingFile(t, 64*PageSize)
	fd := blockdev.NewFaulty(openDevice(t, path))
	var reads atomic.Int64
	fd.Intercept(blockdev.OpRead, func(blockdev.Op, int64, int64) error { reads.Add(1); return nil })
	r, err := New(fd, WithBudget(16*PageSize), WithZeroScan(false), WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	mustWrite(t, r, pagePattern(5, 3), 5*PageSize)
	if n := reads.Load(); n != 0 {
		t.Fatalf("full-page write read the device %d times", n)
	}
	// A partial write must read the old content first (no zero scan: the
	// page is not known to be zero).
	mustWrite(t, r, []byte("x"), 9*PageSize+10)
	if n := reads.Load(); n != 1 {
		t.Fatalf("partial write to an absent page read the device %d times, want 1", n)
	}
	if st := r.Stats(); st.MajorFaults != 1 || st.MinorFaults != 0 {
		t.Fatalf("faults: %+v", st)
	}
}

func TestHolesFaultMinorAndDataFaultsMajor(t *testing.T) {
	const pages = 64
	path := newBackingFile(t, pages*PageSize)
	// Pages 10..19 hold data; the rest is a hole.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	for p := 10; p < 20; p++ {
		if _, err := f.WriteAt(pagePattern(p, 4), int64(p)*PageSize); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	r, _ := newRegionOver(t, path, WithBudget(pages*PageSize))
	zero := make([]byte, PageSize)
	for p := 0; p < pages; p++ {
		want := zero
		if p >= 10 && p < 20 {
			want = pagePattern(p, 4)
		}
		expectBytes(t, "page", mustRead(t, r, PageSize, int64(p)*PageSize), want)
	}
	st := r.Stats()
	if st.MinorFaults != pages-10 || st.MajorFaults != 10 {
		t.Fatalf("minor %d major %d, want %d and 10", st.MinorFaults, st.MajorFaults, pages-10)
	}
}

func newRegionOver(t testing.TB, path string, opts ...Option) (*Region, *blockdev.File) {
	t.Helper()
	dev := openDevice(t, path)
	r, err := New(dev, testOptions(opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, dev
}

func TestTrimAndWriteZeroes(t *testing.T) {
	const pages = 64
	path := newBackingFile(t, pages*PageSize)
	r, _ := newRegionOver(t, path, WithBudget(16*PageSize))
	for p := 0; p < pages; p++ {
		mustWrite(t, r, pagePattern(p, 5), int64(p)*PageSize)
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	// Trim from the middle of page 3 to the middle of page 40.
	off, length := int64(3*PageSize+1000), int64(37*PageSize)
	if err := r.Trim(off, length); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteZeroes(50*PageSize+7, 3); err != nil {
		t.Fatal(err)
	}
	model := make([]byte, pages*PageSize)
	for p := 0; p < pages; p++ {
		copy(model[p*PageSize:], pagePattern(p, 5))
	}
	clear(model[off : off+length])
	clear(model[50*PageSize+7 : 50*PageSize+10])
	expectBytes(t, "region after trim", mustRead(t, r, pages*PageSize, 0), model)
	// Trimmed whole pages fault in as zero pages (minor).
	before := r.Stats()
	for p := 0; p < pages; p++ {
		r.ReadAt(make([]byte, 1), int64(p)*PageSize)
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	// The backing file agrees after a flush: trimmed pages were discarded.
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	expectBytes(t, "backing file after trim and flush", raw, model)
	if after := r.Stats(); after.MinorFaults <= before.MinorFaults {
		t.Fatalf("trimmed pages did not fault in as minor faults: before %+v after %+v", before, after)
	}
}

// A resident zero page is served without reading its memory: ReadAt and
// ReadBegin's zero flag (the NIC engine's) rely on the zero state, so the
// state must be cleared by every write and set again by a trim. The test
// proves the memory is not read by scribbling on it through the raw view,
// which a real user must not do.
func TestZeroPagesAreServedWithoutReadingThem(t *testing.T) {
	r, _ := newRegion(t, 8*PageSize, WithBudget(8*PageSize))
	expectBytes(t, "hole page", mustRead(t, r, PageSize, 2*PageSize), make([]byte, PageSize))
	seq, zero, ok := r.ReadBegin(2)
	if !ok || !zero {
		t.Fatalf("ReadBegin of a faulted-in hole page: ok %v, zero %v; want both", ok, zero)
	}
	if !r.ReadEnd(2, seq) {
		t.Fatal("ReadEnd reported a change with no writer")
	}
	view := r.Bytes()[2*PageSize : 3*PageSize]
	copy(view, "scribbled through the raw view")
	expectBytes(t, "zero page after a raw-view scribble", mustRead(t, r, PageSize, 2*PageSize), make([]byte, PageSize))

	// A partial write clears the zero state: the page is read again.
	mustWrite(t, r, []byte("data"), 2*PageSize+100)
	want := make([]byte, PageSize)
	copy(want, "scribbled through the raw view")
	copy(want[100:], "data")
	expectBytes(t, "zero page after a write", mustRead(t, r, PageSize, 2*PageSize), want)
	if _, zero, ok := r.ReadBegin(2); !ok || zero {
		t.Fatalf("ReadBegin after a write: ok %v, zero %v; want ok, not zero", ok, zero)
	} else {
		r.ReadEnd(2, 0)
	}

	// A trim makes it a zero page again.
	if err := r.Trim(2*PageSize, PageSize); err != nil {
		t.Fatal(err)
	}
	expectBytes(t, "trimmed page", mustRead(t, r, PageSize, 2*PageSize), make([]byte, PageSize))
	seq, zero, ok = r.ReadBegin(2)
	if !ok || !zero {
		t.Fatalf("ReadBegin of a trimmed page read back: ok %v, zero %v; want both", ok, zero)
	}
	r.ReadEnd(2, seq)
}

func TestWriteAtFUAIsDurableAtOnce(t *testing.T) {
	const pages = 32
	path := newBackingFile(t, pages*PageSize)
	r, _ := newRegionOver(t, path, WithBudget(pages*PageSize))
	data := bytes.Repeat([]byte("fua!"), 3*PageSize/4)
	off := int64(2*PageSize + 512)
	if n, err := r.WriteAtFUA(data, off); err != nil || n != len(data) {
		t.Fatalf("WriteAtFUA = %d, %v", n, err)
	}
	if st := r.Stats(); st.Dirty != 0 {
		t.Fatalf("dirty pages after a FUA write: %d", st.Dirty)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	expectBytes(t, "backing after FUA", raw[off:off+int64(len(data))], data)
}

func TestOutOfRange(t *testing.T) {
	r, _ := newRegion(t, 16*PageSize)
	for name, err := range map[string]error{
		"read past end":   func() error { _, err := r.ReadAt(make([]byte, 2), r.Size()-1); return err }(),
		"write negative":  func() error { _, err := r.WriteAt(make([]byte, 2), -1); return err }(),
		"trim past end":   r.Trim(0, r.Size()+1),
		"prefetch":        r.Prefetch(r.Size(), 1),
		"advise negative": r.Advise(-PageSize, PageSize),
	} {
		if !errors.Is(err, ErrOutOfRange) {
			t.Errorf("%s: %v, want ErrOutOfRange", name, err)
		}
	}
	if _, _, ok := r.ReadBegin(r.NumPages()); ok {
		t.Error("ReadBegin past the end succeeded")
	}
}

func TestNewRejectsBadSizes(t *testing.T) {
	dev := openDevice(t, newBackingFile(t, 16*PageSize))
	for _, opt := range []Option{WithSize(17 * PageSize), WithSize(PageSize + 1), WithPolicy(Policy(99))} {
		if r, err := New(dev, opt, WithLogger(quietLogger())); err == nil {
			r.Close()
			t.Errorf("New accepted a bad option")
		}
	}
}

func TestReadBeginEnd(t *testing.T) {
	r, _ := newRegion(t, 32*PageSize, WithBudget(32*PageSize))
	if _, _, ok := r.ReadBegin(3); ok {
		t.Fatal("ReadBegin succeeded on an absent page")
	}
	mustWrite(t, r, pagePattern(3, 6), 3*PageSize)
	seq, zero, ok := r.ReadBegin(3)
	if !ok || zero {
		t.Fatalf("ReadBegin on a written page: ok %v, zero %v; want ok, not zero", ok, zero)
	}
	if got := StateReaders(atomic.LoadUint64(&r.States()[3])); got != 1 {
		t.Fatalf("readers = %d, want 1", got)
	}
	if !bytes.Equal(r.Bytes()[3*PageSize:4*PageSize], pagePattern(3, 6)) {
		t.Fatal("raw view differs from the written page")
	}
	if !r.ReadEnd(3, seq) {
		t.Fatal("ReadEnd reported a change with no writer")
	}
	seq, _, _ = r.ReadBegin(3)
	mustWrite(t, r, []byte("changed"), 3*PageSize)
	if r.ReadEnd(3, seq) {
		t.Fatal("ReadEnd missed a write between ReadBegin and ReadEnd")
	}
	// A busy page refuses readers.
	atomic.OrUint64(&r.States()[3], StateBusy)
	if _, _, ok := r.ReadBegin(3); ok {
		t.Fatal("ReadBegin succeeded on a busy page")
	}
	atomic.AndUint64(&r.States()[3], ^StateBusy)
}

func TestAdvisePrefetchesInBackground(t *testing.T) {
	r, _ := newRegion(t, 64*PageSize, WithBudget(64*PageSize))
	if err := r.Advise(8*PageSize, 8*PageSize); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for p := 8; p < 16; p++ {
		for atomic.LoadUint64(&r.States()[p])&StatePresent == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("page %d not resident after Advise", p)
			}
			time.Sleep(time.Millisecond)
		}
	}
	if err := r.Prefetch(20*PageSize, 3*PageSize); err != nil {
		t.Fatal(err)
	}
	for p := 20; p < 23; p++ {
		if atomic.LoadUint64(&r.States()[p])&StatePresent == 0 {
			t.Fatalf("page %d not resident after Prefetch", p)
		}
	}
}

func TestCreateIsConstantTimeInSize(t *testing.T) {
	const size = 1 << 40 // 1 TiB sparse file
	path := newBackingFile(t, size)
	dev := openDevice(t, path)
	start := time.Now()
	r, err := New(dev, WithBudget(64<<20), WithLogger(quietLogger()))
	elapsed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("New over a 1 TiB sparse file took %v (%d pages)", elapsed, r.NumPages())
	if r.Size() != size {
		t.Fatalf("size %d", r.Size())
	}
	// The far end works too.
	off := int64(size - PageSize)
	mustWrite(t, r, pagePattern(r.NumPages()-1, 7), off)
	expectBytes(t, "last page", mustRead(t, r, PageSize, off), pagePattern(r.NumPages()-1, 7))
	start = time.Now()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Close took %v", time.Since(start))
}

func TestCloseReleasesGoroutinesAndThreads(t *testing.T) {
	before := runtime.NumGoroutine()
	for i := 0; i < 3; i++ {
		dev := openDevice(t, newBackingFile(t, 64*PageSize))
		r, err := New(dev, WithBudget(16*PageSize), WithLogger(quietLogger()))
		if err != nil {
			t.Fatal(err)
		}
		for p := 0; p < 64; p++ {
			mustWrite(t, r, pagePattern(p, 8), int64(p)*PageSize)
		}
		touch(r.Bytes(), 63*PageSize) // a raw fault through the C threads
		if n := faultThreads(t); n != 2 {
			t.Fatalf("%d fault threads running, want 2", n)
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		if err := r.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	}
	if n := faultThreads(t); n != 0 {
		t.Fatalf("%d fault threads still running after Close", n)
	}
	leaktest.WaitGoroutines(t, before, 10*time.Second)
}

func TestPrometheusObserverMetricsMove(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := NewPrometheusObserver(reg, prometheus.Labels{"namespace": "1"})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := newRegion(t, 128*PageSize, WithBudget(16*PageSize), WithObserver(obs), WithZeroScan(false))
	for p := 0; p < 128; p++ {
		mustWrite(t, r, []byte{1}, int64(p)*PageSize) // partial: major faults
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
		m := f.GetMetric()
		labels := map[string]string{}
		for _, l := range m[0].GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["namespace"] != "1" {
			t.Errorf("metric %s lacks the namespace label", f.GetName())
		}
		switch f.GetName() {
		case "nprdma_swap_budget_pages":
			if v := m[0].GetGauge().GetValue(); v != 16 {
				t.Errorf("budget gauge %v, want 16", v)
			}
		case "nprdma_swap_evictions_total", "nprdma_swap_writebacks_total":
			if v := m[0].GetCounter().GetValue(); v == 0 {
				t.Errorf("%s did not move", f.GetName())
			}
		case "nprdma_swap_faults_total":
			for _, s := range m {
				for _, l := range s.GetLabel() {
					if l.GetName() == "kind" && l.GetValue() == "major" && s.GetCounter().GetValue() != 128 {
						t.Errorf("major faults %v, want 128", s.GetCounter().GetValue())
					}
				}
			}
		}
		if !strings.HasPrefix(f.GetName(), "nprdma_swap_") {
			t.Errorf("metric %s is not named nprdma_swap_*", f.GetName())
		}
	}
	for _, want := range []string{"nprdma_swap_resident_pages", "nprdma_swap_dirty_pages", "nprdma_swap_budget_pages",
		"nprdma_swap_faults_total", "nprdma_swap_fault_latency_seconds", "nprdma_swap_evictions_total",
		"nprdma_swap_writebacks_total"} {
		if !names[want] {
			t.Errorf("metric %s missing", want)
		}
	}
}

// faultThreads counts this process's threads named like swap's fault threads.
func faultThreads(t *testing.T) int {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Skipf("cannot list threads: %v", err)
	}
	n := 0
	for _, task := range tasks {
		comm, err := os.ReadFile("/proc/self/task/" + task.Name() + "/comm")
		if err == nil && strings.TrimSpace(string(comm)) == "nprdma-uffd" {
			n++
		}
	}
	return n
}

// A region whose budget covers every page must keep every page resident: a
// free margin there would only push a fully budgeted namespace out of memory.
// That holds for a region that may grow beyond its budget later
// (WithMaxSize), as the target's namespaces may, while it has not.
func TestFullBudgetKeepsEveryPageResident(t *testing.T) {
	const pages = 256
	for _, c := range []struct {
		name string
		opts []Option
	}{
		{"budget above the size", []Option{WithBudget(2 * pages * PageSize)}},
		{"budget equal to the size, room to grow", []Option{WithBudget(pages * PageSize), WithMaxSize(4 * pages * PageSize)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, _ := newRegion(t, pages*PageSize, c.opts...)
			for p := 0; p < pages; p++ {
				mustWrite(t, r, pagePattern(p, 1), int64(p)*PageSize)
			}
			// Read everything twice over: nothing may have been evicted.
			buf := make([]byte, PageSize)
			for round := 0; round < 2; round++ {
				for p := 0; p < pages; p++ {
					if _, err := r.ReadAt(buf, int64(p)*PageSize); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(buf, pagePattern(p, 1)) {
						t.Fatalf("page %d: wrong content", p)
					}
				}
			}
			st := r.Stats()
			if st.Resident != pages || st.Evictions != 0 || st.MajorFaults != 0 {
				t.Fatalf("resident %d, evictions %d, major faults %d; want %d, 0, 0", st.Resident, st.Evictions, st.MajorFaults, pages)
			}
		})
	}
}
