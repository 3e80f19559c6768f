package swap

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
)

// newFaultyRegion creates a region over blockdev's fault-injection decorator.
func newFaultyRegion(t *testing.T, pages int, opts ...Option) (*Region, *blockdev.Faulty, string) {
	t.Helper()
	path := newBackingFile(t, int64(pages)*PageSize)
	fd := blockdev.NewFaulty(openDevice(t, path))
	r, err := New(fd, append([]Option{WithLogger(quietLogger())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, fd, path
}

func TestWritebackErrorKeepsPagesDirtyUntilALaterFlush(t *testing.T) {
	const pages = 32
	r, fd, path := newFaultyRegion(t, pages, WithBudget(pages*PageSize))
	for p := 0; p < 8; p++ {
		mustWrite(t, r, pagePattern(p, 30), int64(p)*PageSize)
	}
	failWrites := fd.FailNth(blockdev.OpWrite|blockdev.OpWriteFUA, 1, blockdev.FromThenOn)
	err := r.Flush()
	if !errors.Is(err, blockdev.ErrInjected) {
		t.Fatalf("Flush with failing writes: %v, want the injected error", err)
	}
	if !strings.Contains(err.Error(), "pages [0, +8)") {
		t.Errorf("flush error does not name the pages: %v", err)
	}
	st := r.Stats()
	if st.Dirty != 8 || st.WritebackErrors == 0 {
		t.Fatalf("after a failed flush: dirty %d (want 8), writeback errors %d", st.Dirty, st.WritebackErrors)
	}
	// The data is still served from memory.
	for p := 0; p < 8; p++ {
		expectBytes(t, "page after failed writeback", mustRead(t, r, PageSize, int64(p)*PageSize), pagePattern(p, 30))
	}
	fd.Remove(failWrites)
	if err := r.Flush(); err != nil {
		t.Fatalf("Flush after the fault cleared: %v", err)
	}
	if st := r.Stats(); st.Dirty != 0 {
		t.Fatalf("dirty %d after a successful flush", st.Dirty)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for p := 0; p < 8; p++ {
		expectBytes(t, "backing page", raw[p*PageSize:(p+1)*PageSize], pagePattern(p, 30))
	}
}

// With every writeback failing, nothing can be evicted: writes that need a
// page fail with ErrNoMemory after the bounded wait instead of hanging, and
// nothing acknowledged is lost once the device recovers.
func TestFailingWritebackUnderPressureFailsCleanlyAndLosesNothing(t *testing.T) {
	const pages, budget = 128, 16
	r, fd, _ := newFaultyRegion(t, pages, WithBudget(budget*PageSize), WithReclaimTimeout(200*time.Millisecond))
	failWrites := fd.FailNth(blockdev.OpWrite|blockdev.OpWriteFUA, 1, blockdev.FromThenOn)
	acked := map[int]bool{}
	var noMem error
	for p := 0; p < pages; p++ {
		if _, err := r.WriteAt(pagePattern(p, 31), int64(p)*PageSize); err != nil {
			noMem = err
			break
		}
		acked[p] = true
	}
	if !errors.Is(noMem, ErrNoMemory) {
		t.Fatalf("writes beyond the budget with failing writeback: %v, want ErrNoMemory", noMem)
	}
	if st := r.Stats(); st.WritebackErrors == 0 || st.ReclaimStalls == 0 || st.Resident > st.Budget {
		t.Fatalf("stats: %+v", st)
	}
	fd.Remove(failWrites)
	// The background workers retry; a further write forces reclaim now.
	for p := 0; p < pages; p++ {
		if !acked[p] {
			mustWrite(t, r, pagePattern(p, 31), int64(p)*PageSize)
			acked[p] = true
		}
	}
	for p := 0; p < pages; p++ {
		expectBytes(t, "page after recovery", mustRead(t, r, PageSize, int64(p)*PageSize), pagePattern(p, 31))
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
}

func TestFaultInErrorReturnsErrorAndLaterReadSucceeds(t *testing.T) {
	const pages = 32
	path := newBackingFile(t, pages*PageSize)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	for p := 0; p < pages; p++ {
		f.WriteAt(pagePattern(p, 32), int64(p)*PageSize)
	}
	f.Close()
	fd := blockdev.NewFaulty(openDevice(t, path))
	r, err := New(fd, WithBudget(pages*PageSize), WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	failReads := fd.FailNth(blockdev.OpRead, 1, blockdev.FromThenOn)
	buf := make([]byte, PageSize)
	n, err := r.ReadAt(buf, 7*PageSize)
	if n != 0 || !errors.Is(err, blockdev.ErrInjected) {
		t.Fatalf("ReadAt with failing reads = %d, %v; want 0 and the injected error", n, err)
	}
	var be *blockdev.Error
	if !errors.As(err, &be) || be.Op != "read" {
		t.Fatalf("error does not wrap blockdev's: %v", err)
	}
	if s := r.States()[7]; s&(StatePresent|StateBusy) != 0 {
		t.Fatalf("page state after a failed fault-in: %#x", s)
	}
	// A partial write to an absent page needs its old content: it fails too,
	// and nothing is acknowledged.
	if _, err := r.WriteAt([]byte("x"), 8*PageSize+1); !errors.Is(err, blockdev.ErrInjected) {
		t.Fatalf("partial write with failing reads: %v", err)
	}
	if st := r.Stats(); st.FaultErrors < 2 || st.Resident != 0 {
		t.Fatalf("stats after failed fault-ins: %+v", st)
	}
	fd.Remove(failReads)
	expectBytes(t, "page after the fault cleared", mustRead(t, r, PageSize, 7*PageSize), pagePattern(7, 32))
	expectBytes(t, "page 8", mustRead(t, r, PageSize, 8*PageSize), pagePattern(8, 32))
}

func TestTrimFallsBackToWritingZerosWhenDiscardFails(t *testing.T) {
	const pages = 32
	r, fd, path := newFaultyRegion(t, pages, WithBudget(pages*PageSize))
	for p := 0; p < pages; p++ {
		mustWrite(t, r, pagePattern(p, 33), int64(p)*PageSize)
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	fd.FailNth(blockdev.OpDiscard, 1, blockdev.FromThenOn)
	if err := r.Trim(4*PageSize, 8*PageSize); err != nil {
		t.Fatalf("Trim with a failing discard: %v", err)
	}
	zero := make([]byte, 8*PageSize)
	expectBytes(t, "trimmed range", mustRead(t, r, 8*PageSize, 4*PageSize), zero)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	expectBytes(t, "backing of the trimmed range", raw[4*PageSize:12*PageSize], zero)
	// If writing zeros fails too, the trim fails and the old data stays
	// consistent between memory and device.
	fd.FailNth(blockdev.OpWrite, 1, blockdev.FromThenOn)
	if err := r.Trim(16*PageSize, 2*PageSize); !errors.Is(err, blockdev.ErrInjected) {
		t.Fatalf("Trim with failing discard and writes: %v", err)
	}
	fd.Clear()
	got := mustRead(t, r, PageSize, 16*PageSize)
	raw, _ = os.ReadFile(path)
	expectBytes(t, "page 16 memory vs device after a failed trim", got, raw[16*PageSize:17*PageSize])
}

// The background writeback workers keep retrying failed writebacks: once the
// device recovers, the dirty pages drain below the limit without a Flush.
func TestBackgroundWritebackRetriesAfterErrors(t *testing.T) {
	const pages, limit = 64, 8
	r, fd, _ := newFaultyRegion(t, pages, WithBudget(pages*PageSize), WithDirtyLimit(limit))
	failWrites := fd.FailNth(blockdev.OpWrite, 1, blockdev.FromThenOn)
	for p := 0; p < 32; p++ {
		mustWrite(t, r, pagePattern(p, 34), int64(p)*PageSize)
	}
	deadline := time.Now().Add(20 * time.Second)
	for r.Stats().WritebackErrors == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the workers never tried to write back: %+v", r.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	if d := r.Stats().Dirty; d != 32 {
		t.Fatalf("dirty %d while every writeback fails, want 32", d)
	}
	fd.Remove(failWrites)
	for r.Stats().Dirty > limit {
		if time.Now().After(deadline) {
			t.Fatalf("dirty pages did not drain after the device recovered: %+v", r.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	for p := 0; p < 32; p++ {
		expectBytes(t, "page", mustRead(t, r, PageSize, int64(p)*PageSize), pagePattern(p, 34))
	}
}
