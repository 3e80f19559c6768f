package nprdma

import (
	"bytes"
	"testing"
)

// countingPager is a Pager over memory whose pages are resident unless
// absent; change makes a page change during its next copy. It counts
// ReadBegin calls and the reads in flight.
type countingPager struct {
	mem      []byte
	absent   map[int]bool
	change   map[int]bool
	version  []uint64
	begins   int
	inFlight int
}

func (p *countingPager) Bytes() []byte { return p.mem }
func (p *countingPager) PageSize() int { return 4096 }
func (p *countingPager) ReadBegin(i int) (uint64, bool, bool) {
	p.begins++
	if p.absent[i] {
		return 0, false, false
	}
	p.inFlight++
	return p.version[i], false, true
}
func (p *countingPager) ReadEnd(i int, seq uint64) bool {
	p.inFlight--
	if p.change[i] {
		delete(p.change, i)
		p.version[i]++
	}
	return p.version[i] == seq
}
func (p *countingPager) Advise(off, length int64) error { return nil }

func newSourceFixture(t *testing.T) (*softDevice, *softMR, *countingPager) {
	t.Helper()
	const pages = 8
	pg := &countingPager{mem: make([]byte, pages*4096), absent: map[int]bool{}, change: map[int]bool{}, version: make([]uint64, pages)}
	for i := range pg.mem {
		pg.mem[i] = byte(i * 7)
	}
	dev := NewDevice(nullProvider{}, WithPinning(false))
	mr, err := dev.AllocPD().RegisterUnpinned(pg, AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	return dev.drv.(*softDevice), mr.drv.(*softMR), pg
}

// want is what a READ of [off, off+n) returns when the pages in magic
// cannot be read.
func wantRead(mr *softMR, pg *countingPager, off, n int, magic map[int]bool) []byte {
	out := append([]byte(nil), pg.mem[off:off+n]...)
	for i := range out {
		if p := off + i; magic[p/4096] {
			out[i] = byte(mr.magic >> (8 * (p % 8)))
		}
	}
	return out
}

// A destination split inside pages gets each page part from one copy:
// the page that changes during its copy is magic in both halves.
func TestUnpinnedSourceKeepsPagesWhole(t *testing.T) {
	dev, mr, pg := newSourceFixture(t)
	pg.absent[3] = true
	pg.change[2] = true
	off, n := 1*4096+100, 4*4096 // pages 1..5
	src := getUnpinnedSource(dev, mr, off, n)
	got := make([]byte, n)
	for _, cut := range [][2]int{{0, 3000}, {3000, 4096 + 1000}, {4096 + 1000, 4096 + 1001}, {4096 + 1001, n}} {
		src.Read(got[cut[0]:cut[1]])
	}
	// Counted and released with the last byte: the requester's completion
	// follows the payload, and may come before the link releases the packet.
	if st := dev.Stats(); st.MagicPagesServed != 2 || mr.serving.Load() != 0 {
		t.Fatalf("after the last byte: %d magic pages counted, region held by %d", st.MagicPagesServed, mr.serving.Load())
	}
	src.Release()
	if want := wantRead(mr, pg, off, n, map[int]bool{2: true, 3: true}); !bytes.Equal(got, want) {
		i := 0
		for got[i] == want[i] {
			i++
		}
		t.Fatalf("split read differs at byte %d (page %d)", i, (off+i)/4096)
	}
	if pg.inFlight != 0 || pg.begins != 5 {
		t.Fatalf("pager: %d reads in flight, %d begun, want 0 and 5 (one per page)", pg.inFlight, pg.begins)
	}
	st := dev.Stats()
	if st.MagicPagesServed != 2 {
		t.Fatalf("counters: %d magic pages, want 2", st.MagicPagesServed)
	}
	if mr.serving.Load() != 0 {
		t.Fatalf("region still held by %d reads", mr.serving.Load())
	}
}

// Discarded bytes are not read; the rest still comes whole.
func TestUnpinnedSourceDiscard(t *testing.T) {
	dev, mr, pg := newSourceFixture(t)
	src := getUnpinnedSource(dev, mr, 0, 3*4096)
	got := make([]byte, 100)
	src.Read(got)           // page 0, spilled
	src.Discard(4096 - 100) // the rest of page 0
	src.Discard(4096)       // page 1, never read
	rest := make([]byte, 4096)
	src.Read(rest)
	src.Release()
	if !bytes.Equal(got, pg.mem[:100]) || !bytes.Equal(rest, pg.mem[2*4096:3*4096]) {
		t.Fatal("wrong bytes around a discard")
	}
	if pg.begins != 2 || pg.inFlight != 0 {
		t.Fatalf("pager: %d reads begun, %d in flight, want 2 and 0", pg.begins, pg.inFlight)
	}
}

// A region deregistered between the request and the copy reads as magic
// pages, and the pager is not touched.
func TestUnpinnedSourceAfterDeregister(t *testing.T) {
	dev, mr, pg := newSourceFixture(t)
	src := getUnpinnedSource(dev, mr, 4096, 2*4096)
	if err := mr.Deregister(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 2*4096)
	src.Read(got)
	src.Release()
	if want := wantRead(mr, pg, 4096, 2*4096, map[int]bool{1: true, 2: true}); !bytes.Equal(got, want) {
		t.Fatal("deregistered region: not the magic pages")
	}
	if pg.begins != 0 {
		t.Fatalf("pager touched %d times after Deregister", pg.begins)
	}
}
