package swap

import (
	"fmt"
	"os"
	"runtime/debug"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestShareable runs tests of the region's behaviour on shareable regions:
// memory and state table in memory files, pages released by punching holes.
func TestShareable(t *testing.T) {
	shareAll = true
	defer func() { shareAll = false }()
	for name, fn := range map[string]func(*testing.T){
		"RegionMatchesModel":               TestRegionMatchesModel,
		"ResidentNeverExceedsBudget":       TestResidentNeverExceedsBudgetUnderLoad,
		"ReadWriteRoundTripUnderEviction":  TestReadWriteRoundTripUnderEviction,
		"TrimAndWriteZeroes":               TestTrimAndWriteZeroes,
		"ZeroPagesAreServedWithoutReading": TestZeroPagesAreServedWithoutReadingThem,
		"RawViewReadsEvictedData":          TestRawViewReadsEvictedData,
		"RawViewNeverSeesStaleContent":     TestRawViewNeverSeesStaleContentAfterWrite,
		"RawFaultPoisonsInsteadOfLying":    TestRawFaultWithFailingReadPoisonsInsteadOfLying,
		"SeqlockReadersSeeWholeVersions":   TestSeqlockReadersSeeWholeVersions,
		"HolesFaultMinorAndDataMajor":      TestHolesFaultMinorAndDataFaultsMajor,
		"GrowWhileInUse":                   TestGrowWhileInUse,
	} {
		t.Run(name, fn)
	}
}

// dataPages reports which pages of a shareable region's memory file hold
// memory (SEEK_DATA: a page the region released is a hole).
func dataPages(t *testing.T, r *Region) []bool {
	t.Helper()
	fd := int(r.shared.data.Fd())
	out := make([]bool, r.NumPages())
	for off := int64(0); off < r.Size(); {
		at, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err != nil {
			break // ENXIO: no data after off
		}
		end, err := unix.Seek(fd, at, unix.SEEK_HOLE)
		if err != nil {
			t.Fatal(err)
		}
		for p := at / PageSize; p < (end+PageSize-1)/PageSize && p < int64(len(out)); p++ {
			out[p] = true
		}
		off = end
	}
	return out
}

// TestShareableEvictionPunchesHoles checks that an evicted page of a
// shareable region holds no memory in its file (a released mapping alone
// would leave it in the page cache) and that what the file holds is exactly
// the resident pages.
func TestShareableEvictionPunchesHoles(t *testing.T) {
	const pages, budget = 256, 16
	r, _ := newRegion(t, pages*PageSize, WithBudget(budget*PageSize), WithShareable())
	for p := 0; p < pages; p += 2 {
		mustWrite(t, r, pagePattern(p, 1), int64(p)*PageSize)
	}
	waitQuiet(t, r)
	held := dataPages(t, r)
	n := 0
	for p := range held {
		present := atomic.LoadUint64(&r.States()[p])&StatePresent != 0
		if held[p] != present {
			t.Fatalf("page %d: memory in the file %v, present %v", p, held[p], present)
		}
		if held[p] {
			n++
		}
	}
	if n > budget {
		t.Fatalf("%d pages hold memory, budget %d", n, budget)
	}
	for p := 0; p < pages; p += 2 {
		expectBytes(t, fmt.Sprintf("page %d", p), mustRead(t, r, PageSize, int64(p)*PageSize), pagePattern(p, 1))
	}
}

// waitQuiet waits until no page of r is busy (the evictor and writeback
// are done with what they started).
func waitQuiet(t *testing.T, r *Region) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		busy := false
		for p := range r.States() {
			if atomic.LoadUint64(&r.States()[p])&(StateBusy|StateMaplock) != 0 {
				busy = true
				break
			}
		}
		if !busy && r.Stats().Resident <= r.Stats().Budget {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("region never quiet")
		}
		time.Sleep(time.Millisecond)
	}
}

// mapReadOnly maps a region's shared memory file as a reader in another
// process would, read-only and private.
func mapReadOnly(t *testing.T, f *os.File, n int) []byte {
	t.Helper()
	m, err := unix.Mmap(int(f.Fd()), 0, n, unix.PROT_READ, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(m) })
	return m
}

// TestPlantedPageIsReplaced plays a reader that does not follow the
// protocol: it touches an absent page of its plain mapping, which makes the
// kernel allocate a zero page in the region's memory file. The region's own
// fault-in must still install the real content (the page in the way is
// punched out), so the data is right for everybody afterwards.
func TestPlantedPageIsReplaced(t *testing.T) {
	const pages, budget = 64, 16
	r, _ := newRegion(t, pages*PageSize, WithBudget(budget*PageSize), WithShareable())
	for p := 0; p < pages; p++ {
		mustWrite(t, r, pagePattern(p, 3), int64(p)*PageSize)
	}
	waitQuiet(t, r)
	data, _, _, ok := r.ShareFiles()
	if !ok {
		t.Fatal("shareable region shares no files")
	}
	view := mapReadOnly(t, data, pages*PageSize)
	victim := -1
	for p := 0; p < pages; p++ {
		if atomic.LoadUint64(&r.States()[p])&StatePresent == 0 {
			victim = p
			break
		}
	}
	if victim < 0 {
		t.Fatal("no absent page")
	}
	touch(view, victim*PageSize)
	if !dataPages(t, r)[victim] {
		t.Fatal("touching the hole through a plain mapping did not allocate a page: the hazard this test is about is gone")
	}
	expectBytes(t, "explicit read of the planted page", mustRead(t, r, PageSize, int64(victim)*PageSize), pagePattern(victim, 3))
	got := make([]byte, PageSize)
	copy(got, view[victim*PageSize:])
	expectBytes(t, "the reader's view afterwards", got, pagePattern(victim, 3))
}

// TestReadOnlyDescriptorsCannotWrite checks that what a reader is given
// cannot change the region: the memory and state descriptors refuse
// writes, shared writable mappings and hole punching.
func TestReadOnlyDescriptorsCannotWrite(t *testing.T) {
	r, _ := newRegion(t, 16*PageSize, WithShareable())
	data, states, _, _ := r.ShareFiles()
	for _, f := range []*os.File{data, states} {
		if _, err := f.WriteAt([]byte{1}, 0); err == nil {
			t.Fatalf("%s: write through the reader's descriptor succeeded", f.Name())
		}
		if _, err := unix.Mmap(int(f.Fd()), 0, PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
			t.Fatalf("%s: shared writable mapping of the reader's descriptor succeeded", f.Name())
		}
		if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, PageSize); err == nil {
			t.Fatalf("%s: hole punched through the reader's descriptor", f.Name())
		}
		var st unix.Stat_t
		unix.Fstat(int(f.Fd()), &st)
		if st.Mode&0o222 != 0 {
			t.Fatalf("%s: mode %o lets others reopen it for writing", f.Name(), st.Mode&0o777)
		}
	}
}

// TestAccessMapKeepsPagesResident: pages a reader in another process uses
// only through the access map are referenced for the eviction policy, like
// pages the region's own readers use. The rest of the region is read
// through once (pages faulted in by a read start unreferenced), so without
// the access map the hot pages would go like any other.
func TestAccessMapKeepsPagesResident(t *testing.T) {
	const pages, budget, hot = 256, 32, 8
	for _, policy := range []Policy{PolicyCLOCK, PolicyS3FIFO} {
		t.Run(policy.String(), func(t *testing.T) {
			r, _ := newRegion(t, pages*PageSize, WithBudget(budget*PageSize), WithShareable(), WithPolicy(policy))
			for p := 0; p < pages; p++ {
				mustWrite(t, r, pagePattern(p, 5), int64(p)*PageSize)
			}
			if err := r.Flush(); err != nil {
				t.Fatal(err)
			}
			_, _, access, _ := r.ShareFiles()
			am, err := unix.Mmap(int(access.Fd()), 0, PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Munmap(am)
			bitsOf := unsafe.Slice((*uint64)(unsafe.Pointer(&am[0])), PageSize/8)
			for h := 0; h < hot; h++ {
				// Resident from here on, if the map works.
				mustRead(t, r, 8, int64(h)*PageSize)
				atomic.OrUint64(&bitsOf[h/64], 1<<(h%64))
			}
			for rounds := 0; rounds < 2; rounds++ {
				for p := hot; p < pages; p++ {
					for h := 0; h < hot; h++ {
						atomic.OrUint64(&bitsOf[h/64], 1<<(h%64))
					}
					mustRead(t, r, PageSize, int64(p)*PageSize)
				}
			}
			waitQuiet(t, r)
			for h := 0; h < hot; h++ {
				if atomic.LoadUint64(&r.States()[h])&StatePresent == 0 {
					t.Fatalf("hot page %d, used in place throughout, was evicted", h)
				}
			}
		})
	}
}

// TestAccessBitIsAReference checks the policy's view of a page directly: a
// set access bit counts as a reference of a present page, and is cleared
// by looking.
func TestAccessBitIsAReference(t *testing.T) {
	states := []uint64{StatePresent, 0, StatePresent | StateReferenced}
	access := []uint64{0b011}
	ref := referenced{states: states, access: access}
	if !ref.testAndClear(0) || ref.testAndClear(0) {
		t.Fatal("access bit of a present page: not a reference, or not cleared")
	}
	if ref.testAndClear(1) || access[0]&0b10 != 0 {
		t.Fatal("access bit of an absent page counted, or left set")
	}
	if !ref.testAndClear(2) || states[2]&StateReferenced != 0 {
		t.Fatal("referenced bit no longer counts")
	}
}

// TestCloseTruncatesSharedMemory: after Close a reader's mapping holds no
// memory of the region; touching it faults.
func TestCloseTruncatesSharedMemory(t *testing.T) {
	r, _ := newRegion(t, 16*PageSize, WithShareable())
	mustWrite(t, r, pagePattern(1, 1), PageSize)
	data, _, _, _ := r.ShareFiles()
	view := mapReadOnly(t, data, 16*PageSize)
	got := make([]byte, PageSize)
	copy(got, view[PageSize:])
	expectBytes(t, "reader's view", got, pagePattern(1, 1))
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	faulted := func() (f bool) {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() { f = recover() != nil }()
		touch(view, PageSize)
		return false
	}()
	if !faulted {
		t.Fatal("a reader's mapping still reads the region after Close")
	}
}
