package np_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/nprdma/nprdma/integration/np/npread"
	"github.com/nprdma/nprdma/swap"
)

// TestRequesterCountsEveryResolution reads pages in each state a one-sided
// READ can meet — resident, absent zero (minor fault), absent with data on
// the device (major fault), resident with the magic pattern as content
// (false positive) — alone and mixed in one unaligned READ, and checks the
// bytes and every counter: the requester's, both devices' and the
// region's.
func TestRequesterCountsEveryResolution(t *testing.T) {
	for _, p := range providers {
		t.Run(p.name, func(t *testing.T) { countResolutions(t, p) })
	}
}

func countResolutions(t *testing.T, p provider) {
	const pages = 64
	resident := []int{1, 10, 14}
	onDevice := []int{3, 12, 13} // written, then the region is closed: absent, data on the device
	// Pages 2 and 11 are never written (holes: minor faults); 4 and 15 get
	// the magic pattern once the region is registered.
	dev := newBacking(t, pages*pageSize)
	first := openRegion(t, dev)
	for _, pg := range append(append([]int(nil), resident...), onDevice...) {
		mustWrite(t, first, versionedPage(pg, 1), int64(pg)*pageSize)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	region := openRegion(t, dev, p.regionOpts(swap.WithBudget(32*pageSize))...)
	buf := make([]byte, pageSize)
	for _, pg := range resident {
		if _, err := region.ReadAt(buf, int64(pg)*pageSize); err != nil {
			t.Fatal(err)
		}
	}
	tg, in := setup(t, p, region)
	magic := magicPage(tg.mr.Magic())
	for _, pg := range []int{4, 15} {
		mustWrite(t, region, magic, int64(pg)*pageSize)
	}
	want := func(pg int) []byte { // the content of page pg
		switch pg {
		case 1, 3, 10, 12, 13, 14:
			return versionedPage(pg, 1)
		case 4, 15:
			return magic
		}
		return make([]byte, pageSize)
	}
	expect := func(off, n int) []byte {
		var b []byte
		for pg := off / pageSize; pg <= (off+n-1)/pageSize; pg++ {
			b = append(b, want(pg)...)
		}
		return b[off%pageSize : off%pageSize+n]
	}
	rq := in.dial(t, tg)
	regionBefore, srvBefore := region.Stats(), tg.srv.Stats()

	var total npread.ReadInfo
	for _, tc := range []struct {
		name   string
		off, n int
		want   npread.ReadInfo
	}{
		{"resident", 1 * pageSize, pageSize, npread.ReadInfo{Pages: 1}},
		{"zero page: minor fault", 2 * pageSize, pageSize, npread.ReadInfo{Pages: 1, Suspected: 1, SlowPathReads: 1, MinorFaults: 1}},
		{"page on the device: major fault", 3 * pageSize, pageSize, npread.ReadInfo{Pages: 1, Suspected: 1, SlowPathReads: 1, MajorFaults: 1}},
		{"magic content: false positive", 4 * pageSize, pageSize, npread.ReadInfo{Pages: 1, Suspected: 1, FalsePositives: 1, SlowPathReads: 1}},
		{"faulted pages are resident now", 2 * pageSize, 2 * pageSize, npread.ReadInfo{Pages: 2}},
		// Pages 10..15 from byte 100 to 100 bytes before the end: 11-13 is
		// one run (one request, 12 and 13 read with one device I/O), 15
		// another; 10 and 14 are one-sided hits.
		{"mixed, unaligned", 10*pageSize + 100, 6*pageSize - 200,
			npread.ReadInfo{Pages: 6, Suspected: 4, FalsePositives: 1, SlowPathReads: 2, MinorFaults: 1, MajorFaults: 2}},
		{"inside the magic page, odd phase", 4*pageSize + 13, 1003, npread.ReadInfo{Pages: 1, Suspected: 1, FalsePositives: 1, SlowPathReads: 1}},
	} {
		got, info, err := rq.Read(context.Background(), int64(tc.off), tc.n)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !bytes.Equal(got, expect(tc.off, tc.n)) {
			t.Fatalf("%s: wrong bytes", tc.name)
		}
		if info != tc.want {
			t.Fatalf("%s: %+v, want %+v", tc.name, info, tc.want)
		}
		total.Pages += info.Pages
		total.Suspected += info.Suspected
		total.FalsePositives += info.FalsePositives
		total.SlowPathReads += info.SlowPathReads
		total.MinorFaults += info.MinorFaults
		total.MajorFaults += info.MajorFaults
	}

	st := rq.Stats()
	wantStats := npread.Stats{Reads: 7, Pages: uint64(total.Pages), OneSidedHits: uint64(total.Pages - total.Suspected),
		SuspectedFaults: uint64(total.Suspected), FalsePositives: uint64(total.FalsePositives),
		SlowPathReads: uint64(total.SlowPathReads), MinorFaults: uint64(total.MinorFaults), MajorFaults: uint64(total.MajorFaults)}
	if st != wantStats {
		t.Fatalf("requester stats %+v, want %+v", st, wantStats)
	}
	if got := in.dev.Stats().SuspectedFaults; got != st.SuspectedFaults {
		t.Errorf("initiator device counted %d suspected faults, the requester %d", got, st.SuspectedFaults)
	}
	if got := pagesRead(tg, in); got != st.Pages {
		t.Errorf("the NIC engine and the initiator in place read %d pages of the region, the requester %d", got, st.Pages)
	}
	// The magic page was delivered only for pages that could not be read:
	// not for the false positives, which were read.
	if got := magicServed(tg, in); got != st.SuspectedFaults-st.FalsePositives {
		t.Errorf("%d magic pages delivered, want %d", got, st.SuspectedFaults-st.FalsePositives)
	}
	rs := region.Stats()
	if dm, dM := rs.MinorFaults-regionBefore.MinorFaults, rs.MajorFaults-regionBefore.MajorFaults; dm != st.MinorFaults || dM != st.MajorFaults {
		t.Errorf("region counted %d minor + %d major faults, the requester %d + %d", dm, dM, st.MinorFaults, st.MajorFaults)
	}
	if ss := tg.srv.Stats(); ss.Requests-srvBefore.Requests != st.SlowPathReads || ss.Errors != 0 || ss.Connections != 1 {
		t.Errorf("server stats %+v, want %d requests, no errors, one connection", ss, st.SlowPathReads)
	}
}

// TestFalsePositive: a page whose content is exactly the region's magic page
// is flagged by the one-sided READ, re-read two-sided, and returned
// correctly; the false-positive counter moves, and a neighbouring page that
// differs from the magic in its last byte only is not flagged.
func TestFalsePositive(t *testing.T) {
	for _, p := range providers {
		t.Run(p.name, func(t *testing.T) {
			region := newRegion(t, 16, p.regionOpts()...)
			tg, in := setup(t, p, region)
			magic := magicPage(tg.mr.Magic())
			mustWrite(t, region, magic, 5*pageSize)
			almost := append([]byte(nil), magic...)
			almost[pageSize-1] ^= 1
			mustWrite(t, region, almost, 6*pageSize)
			rq := in.dial(t, tg)
			srvBefore := tg.srv.Stats()

			got, info, err := rq.Read(context.Background(), 5*pageSize, 2*pageSize)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[:pageSize], magic) || !bytes.Equal(got[pageSize:], almost) {
				t.Fatal("wrong bytes")
			}
			if want := (npread.ReadInfo{Pages: 2, Suspected: 1, FalsePositives: 1, SlowPathReads: 1}); info != want {
				t.Fatalf("read info %+v, want %+v", info, want)
			}
			if st := rq.Stats(); st.FalsePositives != 1 || st.SuspectedFaults != 1 || st.OneSidedHits != 1 {
				t.Fatalf("requester stats %+v", st)
			}
			if got := tg.srv.Stats().Requests - srvBefore.Requests; got != 1 {
				t.Fatalf("server answered %d slow-path requests, want 1", got)
			}
			if served := magicServed(tg, in); served != 0 {
				t.Fatalf("%d magic pages delivered for resident pages", served)
			}
		})
	}
}
