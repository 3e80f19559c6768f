package shm

import (
	"testing"

	"github.com/nprdma/nprdma/nprdma/nprdmatest"
)

// TestReadInPlaceAllocatesNothing: a READ executed in place, posted and
// waited for, allocates nothing in the steady state.
func TestReadInPlaceAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	pg, err := nprdmatest.NewSharedPager(16, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	fillVersion(pg.Page(1), 1, 1) // memory behind the page: a hole would fault (and recover) every time
	pr := newPair(t, New(), pg)
	r := pr.dial(t, 4096)
	pr.waitInPlace(t, r)
	before := pr.cli.Stats().LocalReads
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := r.read(pr.mr, 4096, 4096); err != nil {
			t.Fatal(err)
		}
	})
	if st := pr.cli.Stats(); st.LocalReads-before < 1000 || st.LocalMagicPages != 0 {
		t.Fatalf("%d of the READs ran in place, %d pages magic", st.LocalReads-before, st.LocalMagicPages)
	}
	if allocs != 0 {
		t.Fatalf("%.1f allocations per READ in place", allocs)
	}
}
