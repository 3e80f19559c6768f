package conformance

import (
	"crypto/rand"
	"testing"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/nprdmatest"
)

func testUnpinned(t *testing.T, h Harness) {
	require(t, caps(t, h).UnpinnedRegions, "unpinned regions")
	const pages, ps = 112, 4096
	cli, srv := connect(t, h, pairConfig{})
	pg, err := nprdmatest.NewPager(pages, ps)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	rand.Read(pg.Bytes())

	for _, bad := range []nprdma.Access{nprdma.AccessRemoteRead | nprdma.AccessRemoteWrite, nprdma.AccessLocalWrite | nprdma.AccessRemoteRead} {
		if _, err := srv.pd.RegisterUnpinned(pg, bad); err == nil {
			t.Fatalf("unpinned region granted %s", bad)
		}
	}
	mr, err := srv.pd.RegisterUnpinned(pg, nprdma.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Deregister()
	if pg.Begins() != 0 {
		t.Fatalf("registration touched %d pages", pg.Begins())
	}
	if mr.Pinned() || mr.Magic() == 0 || mr.PageSize() != ps || mr.Len() != pages*ps {
		t.Fatalf("unpinned region: pinned %v magic %#x page size %d len %d", mr.Pinned(), mr.Magic(), mr.PageSize(), mr.Len())
	}
	lmr, lbuf := cli.region(t, pages*ps, rw)
	id := uint64(0)
	read := func(off, n int) []byte {
		t.Helper()
		id++
		post(t, cli.qp, nprdma.SendWR{ID: id, Op: nprdma.OpRead, SG: []nprdma.SGE{lmr.SGE(0, n)}, RemoteAddr: mr.Addr() + uint64(off), RKey: mr.RKey(), Signaled: true})
		one(t, cli.scq, id, nprdma.OpRead, nprdma.StatusSuccess)
		return lbuf[:n]
	}
	// zeroPages are pages the pager says hold only zeros: a READ returns
	// zeros for them whatever their memory holds (random bytes here), which
	// shows the engine did not read it.
	zeroPages := map[int]bool{}
	setZero := func(p int) {
		pg.SetState(p, nprdmatest.Zero)
		zeroPages[p] = true
	}
	// expect is what a READ of [off, off+n) must return when the pages in
	// magic cannot be read: the magic at the byte's phase in its page.
	expect := func(off, n int, magic map[int]bool) []byte {
		out := append([]byte(nil), pg.Bytes()[off:off+n]...)
		for i := range out {
			p := off + i
			switch {
			case magic[p/ps]:
				out[i] = byte(mr.Magic() >> (8 * ((p % ps) % 8)))
			case zeroPages[p/ps]:
				out[i] = 0
			}
		}
		return out
	}
	srvBefore := srv.dev.Stats()
	cliBefore := cli.dev.Stats()
	var wantPages, wantMagic uint64

	check := func(name string, off, n int, magic map[int]bool, want []nprdma.PageRange) {
		t.Helper()
		got := read(off, n)
		sameBytes(t, name, got, expect(off, n, magic))
		ranges := cli.dev.FindMagicPages(got, mr.Addr()+uint64(off), mr.Addr(), mr.PageSize(), mr.Magic())
		if len(ranges) != len(want) {
			t.Fatalf("%s: suspected faults %+v, want %+v", name, ranges, want)
		}
		for i := range want {
			if ranges[i] != want[i] {
				t.Fatalf("%s: suspected fault %d is %+v, want %+v", name, i, ranges[i], want[i])
			}
		}
		wantPages += uint64((off+n-1)/ps - off/ps + 1)
		wantMagic += uint64(len(magic))
	}
	addr := func(off int) uint64 { return mr.Addr() + uint64(off) }

	check("resident page", 3*ps, ps, nil, nil)
	pg.SetState(5, nprdmatest.Absent)
	check("absent page", 5*ps, ps, map[int]bool{5: true}, []nprdma.PageRange{{Off: 0, Addr: addr(5 * ps), Len: ps}})
	sameBytes(t, "magic page", lbuf[:ps], nprdmatest.MagicPage(mr.Magic(), ps))
	pg.SetState(6, nprdmatest.Busy)
	check("busy page", 6*ps, ps, map[int]bool{6: true}, []nprdma.PageRange{{Off: 0, Addr: addr(6 * ps), Len: ps}})
	pg.ChangeDuringCopy(7)
	check("page changed during the copy", 7*ps, ps, map[int]bool{7: true}, []nprdma.PageRange{{Off: 0, Addr: addr(7 * ps), Len: ps}})
	check("same page once stable", 7*ps, ps, nil, nil)
	setZero(8)
	check("zero page", 8*ps, ps, nil, nil)
	sameBytes(t, "zero page", lbuf[:ps], make([]byte, ps))

	// Unaligned start and end, two adjacent magic pages (merged into one
	// range) and one more.
	setZero(11)
	pg.SetState(12, nprdmatest.Absent)
	pg.SetState(13, nprdmatest.Busy)
	pg.ChangeDuringCopy(15)
	off, n := 10*ps+100, 6*ps+2900 // ends at 16*ps+3000
	check("mixed unaligned", off, n, map[int]bool{12: true, 13: true, 15: true}, []nprdma.PageRange{
		{Off: 12*ps - off, Addr: addr(12 * ps), Len: 2 * ps},
		{Off: 15*ps - off, Addr: addr(15 * ps), Len: ps},
	})
	// A read starting and ending inside a magic page compares at the right
	// phase.
	pg.SetState(20, nprdmatest.Absent)
	check("inside a magic page", 20*ps+13, 1003, map[int]bool{20: true}, []nprdma.PageRange{{Off: 0, Addr: addr(20*ps + 13), Len: 1003}})

	// Larger than the engine's staging chunk, every 7th page absent.
	magic := map[int]bool{}
	var want []nprdma.PageRange
	for p := 24; p < 24+80; p++ {
		if p%11 == 0 {
			setZero(p)
		}
		if p%7 == 0 {
			pg.SetState(p, nprdmatest.Absent)
			magic[p] = true
			want = append(want, nprdma.PageRange{Off: (p - 24) * ps, Addr: addr(p * ps), Len: ps})
		}
	}
	check("large", 24*ps, 80*ps, magic, want)
	// The same pages from mid-page: the page that straddles two staging
	// chunks is still one page read, counted once.
	off, n = 24*ps+100, 70*ps
	inRange, want := map[int]bool{}, []nprdma.PageRange(nil)
	for p := 24; p <= (off+n-1)/ps; p++ {
		if magic[p] {
			inRange[p] = true
			want = append(want, nprdma.PageRange{Off: p*ps - off, Addr: addr(p * ps), Len: ps})
		}
	}
	check("large, unaligned", off, n, inRange, want)

	// Scattered into three SGEs whose boundaries fall inside pages, one of
	// them changing during its copy and one absent: each page part must
	// still come from one copy, all data or all magic, whatever the way the
	// destination is split.
	pg.ChangeDuringCopy(105)
	setZero(106)
	pg.SetState(107, nprdmatest.Absent)
	off, n = 104*ps+500, 3*ps+1000            // pages 104..107
	cuts := []int{0, ps + 700, 2*ps + 300, n} // inside pages 105 and 106
	var sges []nprdma.SGE
	for i := 0; i+1 < len(cuts); i++ {
		sges = append(sges, lmr.SGE((i+1)*8*ps+cuts[i], cuts[i+1]-cuts[i])) // apart, in the local region
	}
	id++
	post(t, cli.qp, nprdma.SendWR{ID: id, Op: nprdma.OpRead, SG: sges, RemoteAddr: addr(off), RKey: mr.RKey(), Signaled: true})
	one(t, cli.scq, id, nprdma.OpRead, nprdma.StatusSuccess)
	var got []byte
	for i := 0; i+1 < len(cuts); i++ {
		at := (i+1)*8*ps + cuts[i]
		got = append(got, lbuf[at:at+cuts[i+1]-cuts[i]]...)
	}
	sameBytes(t, "scattered read", got, expect(off, n, map[int]bool{105: true, 107: true}))
	wantPages += 4
	wantMagic += 2
	if ranges := cli.dev.FindMagicPages(got, addr(off), mr.Addr(), mr.PageSize(), mr.Magic()); len(ranges) != 2 ||
		ranges[0] != (nprdma.PageRange{Off: 105*ps - off, Addr: addr(105 * ps), Len: ps}) ||
		ranges[1] != (nprdma.PageRange{Off: 107*ps - off, Addr: addr(107 * ps), Len: off + n - 107*ps}) {
		t.Fatalf("scattered read: suspected faults %+v", ranges)
	}

	if pg.InFlight() != 0 {
		t.Fatalf("%d pager reads begun and never ended", pg.InFlight())
	}
	srvAfter, cliAfter := srv.dev.Stats(), cli.dev.Stats()
	if d := srvAfter.UnpinnedPagesRead - srvBefore.UnpinnedPagesRead; d != wantPages {
		t.Fatalf("unpinned pages read %d, want %d", d, wantPages)
	}
	if d := srvAfter.MagicPagesServed - srvBefore.MagicPagesServed; d != wantMagic {
		t.Fatalf("magic pages served %d, want %d", d, wantMagic)
	}
	if d := cliAfter.SuspectedFaults - cliBefore.SuspectedFaults; d != wantMagic {
		t.Fatalf("suspected faults %d, want %d", d, wantMagic)
	}

	// Remote writes into an unpinned region are refused before any copy.
	before := append([]byte(nil), pg.Page(30)...)
	post(t, cli.qp, nprdma.SendWR{ID: 1000, Op: nprdma.OpWrite, SG: []nprdma.SGE{lmr.SGE(0, 64)}, RemoteAddr: addr(30 * ps), RKey: mr.RKey(), Signaled: true})
	one(t, cli.scq, 1000, nprdma.OpWrite, nprdma.StatusRemoteAccess)
	sameBytes(t, "unpinned page after a refused WRITE", pg.Page(30), before)
}

// testUnpinnedShared reads a region whose pager may be shared with the
// requester (nprdmatest.NewSharedPager). Whoever executes the READs — the
// responder's NIC engine, or the requester in place after the responder
// shared the region — the bytes, the magic pages and the counters (the
// responder's and the requester's together) are the same. A deregistered
// region is refused either way.
func testUnpinnedShared(t *testing.T, h Harness) {
	require(t, caps(t, h).UnpinnedRegions, "unpinned regions")
	const pages, ps = 48, 4096
	cli, srv := connect(t, h, pairConfig{})
	pg, err := nprdmatest.NewSharedPager(pages, ps)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	rand.Read(pg.Bytes())
	mr, err := srv.pd.RegisterUnpinned(pg, nprdma.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Deregister()
	lmr, lbuf := cli.region(t, pages*ps, rw)
	id := uint64(0)
	readSG := func(off int, sges []nprdma.SGE, st nprdma.Status) {
		t.Helper()
		id++
		post(t, cli.qp, nprdma.SendWR{ID: id, Op: nprdma.OpRead, SG: sges, RemoteAddr: mr.Addr() + uint64(off), RKey: mr.RKey(), Signaled: true})
		one(t, cli.scq, id, nprdma.OpRead, st)
	}
	zero := map[int]bool{}
	// expect does not touch the memory of the magic pages: that would
	// bring released pages back.
	expect := func(off, n int, magic map[int]bool) []byte {
		out := make([]byte, n)
		for i := range out {
			p := off + i
			switch {
			case magic[p/ps]:
				out[i] = byte(mr.Magic() >> (8 * ((p % ps) % 8)))
			case !zero[p/ps]:
				out[i] = pg.Bytes()[p]
			}
		}
		return out
	}
	srvBefore, cliBefore := srv.dev.Stats(), cli.dev.Stats()
	var wantPages, wantMagic uint64
	check := func(name string, off, n int, magic map[int]bool) {
		t.Helper()
		readSG(off, []nprdma.SGE{lmr.SGE(0, n)}, nprdma.StatusSuccess)
		sameBytes(t, name, lbuf[:n], expect(off, n, magic))
		if r := cli.dev.FindMagicPages(lbuf[:n], mr.Addr()+uint64(off), mr.Addr(), ps, mr.Magic()); len(magic) == 0 && len(r) != 0 {
			t.Fatalf("%s: suspected faults %+v in resident pages", name, r)
		}
		wantPages += uint64((off+n-1)/ps - off/ps + 1)
		wantMagic += uint64(len(magic))
	}

	check("first read", 0, ps, nil)
	if h.SharesInPlace {
		// The responder shared the region when it served the first READ;
		// the requester reads in place once it has mapped it.
		eventually(t, "a READ executed in place", func() bool {
			check("resident page", ps, ps, nil)
			return cli.dev.Stats().LocalReads > cliBefore.LocalReads
		})
		pg.Accessed(1) // reads before the share do not mark it
	}
	check("resident page", 2*ps, 2*ps, nil)
	pg.SetState(5, nprdmatest.Absent)
	check("absent page", 5*ps, ps, map[int]bool{5: true})
	pg.SetState(6, nprdmatest.Busy)
	check("busy page", 6*ps, ps, map[int]bool{6: true})
	pg.SetState(8, nprdmatest.Zero)
	zero[8] = true
	check("zero page", 8*ps, ps, nil)
	pg.SetState(12, nprdmatest.Absent)
	pg.SetState(13, nprdmatest.Busy)
	pg.SetState(14, nprdmatest.Zero)
	zero[14] = true
	check("mixed unaligned", 10*ps+100, 6*ps+2900, map[int]bool{12: true, 13: true})

	// Scattered into three SGEs whose boundaries fall inside pages, one of
	// them absent: each page part is wholly data or wholly magic.
	pg.SetState(21, nprdmatest.Absent)
	off, n := 20*ps+500, 3*ps+1000 // pages 20..23
	cuts := []int{0, ps + 700, 2*ps + 300, n}
	var sges []nprdma.SGE
	for i := 0; i+1 < len(cuts); i++ {
		sges = append(sges, lmr.SGE((i+1)*8*ps+cuts[i], cuts[i+1]-cuts[i]))
	}
	readSG(off, sges, nprdma.StatusSuccess)
	var got []byte
	for i := 0; i+1 < len(cuts); i++ {
		at := (i+1)*8*ps + cuts[i]
		got = append(got, lbuf[at:at+cuts[i+1]-cuts[i]]...)
	}
	sameBytes(t, "scattered read", got, expect(off, n, map[int]bool{21: true}))
	if r := cli.dev.FindMagicPages(got, mr.Addr()+uint64(off), mr.Addr(), ps, mr.Magic()); len(r) != 1 || r[0].Addr != mr.Addr()+21*ps || r[0].Len != ps {
		t.Fatalf("scattered read: suspected faults %+v", r)
	}
	wantPages += 4
	wantMagic++

	srvAfter, cliAfter := srv.dev.Stats(), cli.dev.Stats()
	if d := (srvAfter.UnpinnedPagesRead - srvBefore.UnpinnedPagesRead) + (cliAfter.LocalPagesRead - cliBefore.LocalPagesRead); d != wantPages {
		t.Fatalf("pages read %d (responder) + %d (in place), want %d in all", srvAfter.UnpinnedPagesRead-srvBefore.UnpinnedPagesRead,
			cliAfter.LocalPagesRead-cliBefore.LocalPagesRead, wantPages)
	}
	if d := (srvAfter.MagicPagesServed - srvBefore.MagicPagesServed) + (cliAfter.LocalMagicPages - cliBefore.LocalMagicPages); d != wantMagic {
		t.Fatalf("magic pages %d (responder) + %d (in place), want %d", srvAfter.MagicPagesServed-srvBefore.MagicPagesServed,
			cliAfter.LocalMagicPages-cliBefore.LocalMagicPages, wantMagic)
	}
	if d := cliAfter.SuspectedFaults - cliBefore.SuspectedFaults; d != wantMagic {
		t.Fatalf("suspected faults %d, want %d", d, wantMagic)
	}
	if pg.InFlight() != 0 {
		t.Fatalf("%d pager reads begun and never ended", pg.InFlight())
	}
	if h.SharesInPlace {
		if !pg.Accessed(2) || !pg.Accessed(3) || pg.Accessed(5) || pg.Accessed(30) {
			t.Fatal("the access map does not say which pages were read in place")
		}
		// Absent pages were not brought back by the reads.
		for _, p := range []int{5, 12, 21} {
			if pg.Allocated(p) {
				t.Fatalf("page %d, absent, has memory again after the reads", p)
			}
		}
	}

	// Deregistered: refused, in place or not, and the queue pairs fail.
	if err := mr.Deregister(); err != nil {
		t.Fatal(err)
	}
	readSG(0, []nprdma.SGE{lmr.SGE(0, ps)}, nprdma.StatusRemoteAccess)
	expectErr(t, cli.qp, nprdma.ErrRemoteAccess)
}
