package np_test

import (
	"bytes"
	"context"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nprdma/nprdma/integration/np/npread"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/swap"
)

// TestUnpinnedRegistrationTouchesNothing creates swap regions of 1 GiB,
// 64 GiB and 1 TiB over sparse files and registers each unpinned. Times are
// logged (bench/npbench's registration experiment measures them); asserted
// is the behaviour that makes them O(1): no page is made resident or marked
// in the state table, resident memory does not grow with the region, and
// the far end of the region still reads correctly through the NP path.
func TestUnpinnedRegistrationTouchesNothing(t *testing.T) {
	const rssSlack = 8 << 20
	for _, size := range []int64{1 << 30, 64 << 30, 1 << 40} {
		t.Run(fmt.Sprintf("%dGiB", size>>30), func(t *testing.T) {
			dev := newBacking(t, size)
			debug.FreeOSMemory()
			rssBefore := vmRSS(t)
			start := time.Now()
			region := openRegion(t, dev, swap.WithBudget(16<<20))
			newTime := time.Since(start)
			nic := nprdma.NewDevice(loop.New())
			defer nic.Close()
			pd := nic.AllocPD()
			start = time.Now()
			mr, err := pd.RegisterUnpinned(region, nprdma.AccessRemoteRead)
			regTime := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			rssAfter := vmRSS(t)
			t.Logf("%d GiB: swap.New %v, RegisterUnpinned %v; VmRSS %+d KiB", size>>30, newTime, regTime, (rssAfter-rssBefore)>>10)

			if mr.Len() != int(size) || mr.Pinned() || mr.Magic() == 0 {
				t.Fatalf("region: len %d pinned %v magic %#x", mr.Len(), mr.Pinned(), mr.Magic())
			}
			if d := nic.Stats(); d.UnpinnedBytes != size || d.Registrations != 1 {
				t.Fatalf("device counted %d unpinned bytes, %d registrations; want %d, 1", d.UnpinnedBytes, d.Registrations, size)
			}
			if st := region.Stats(); st.Resident != 0 || st.MinorFaults+st.MajorFaults+st.UffdFaults != 0 {
				t.Fatalf("registration made pages resident or faulted: %+v", st)
			}
			states := region.States()
			last := len(states) - 1
			for _, pg := range []int{0, 1, last / 3, last / 2, last - 1, last} {
				if s := atomic.LoadUint64(&states[pg]); s != 0 {
					t.Fatalf("page %d state %#x after registration, want untouched (0)", pg, s)
				}
			}
			if grew := rssAfter - rssBefore; grew > rssSlack {
				t.Fatalf("VmRSS grew by %d KiB with the region and its registration, want ≤ %d KiB", grew>>10, rssSlack>>10)
			}

			if err := mr.Deregister(); err != nil {
				t.Fatal(err)
			}

			// The far end works: the last page is absent (magic), the slow
			// path faults it in as a zero page, and then it is a one-sided hit.
			tg, in := setup(t, providers[0], region)
			rq := in.dial(t, tg)
			off := size - pageSize
			got, info, err := rq.Read(context.Background(), off, pageSize)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, make([]byte, pageSize)) {
				t.Fatal("last page is not zero")
			}
			if want := (npread.ReadInfo{Pages: 1, Suspected: 1, SlowPathReads: 1, MinorFaults: 1}); info != want {
				t.Fatalf("first read of the last page: %+v, want %+v", info, want)
			}
			if _, info, err = rq.Read(context.Background(), off, pageSize); err != nil || info.Suspected != 0 {
				t.Fatalf("second read of the last page: %+v, %v; want a one-sided hit", info, err)
			}
		})
	}
}
