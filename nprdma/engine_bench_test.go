package nprdma

import (
	"testing"

	"github.com/nprdma/nprdma/nprdma/link"
)

// sinkLink is a link that consumes every packet at once, as a peer's
// delivery would: payloads are copied into dst (the requester's buffer)
// and released. It isolates the NIC engine's cost from any transport.
type sinkLink struct {
	dst []byte
}

func (l *sinkLink) Start(link.Receiver) {}
func (l *sinkLink) Send(pkts []link.Packet) {
	for i := range pkts {
		p := &pkts[i]
		off := int(p.Offset)
		if p.Src != nil {
			p.Src.Read(l.dst[off : off+int(p.Len)])
		} else if p.Fill {
			fillPhase(l.dst[off:off+int(p.Len)], p.Pattern, 0)
		} else {
			for _, d := range p.Data {
				off += copy(l.dst[off:], d)
			}
		}
		if p.Buf != nil {
			p.Buf.Release()
		}
	}
}
func (l *sinkLink) Flush() {}

// copyingSinkLink is a sinkLink that copies at delivery, as loop does.
type copyingSinkLink struct{ sinkLink }

func (*copyingSinkLink) CopiesAtDelivery() {}
func (l *sinkLink) Close()                 {}
func (l *sinkLink) Abort()                 {}

// benchPager is a Pager over memory whose pages are all resident.
type benchPager struct {
	mem   []byte
	words []uint64
}

func (p *benchPager) Bytes() []byte { return p.mem }
func (p *benchPager) PageSize() int { return 4096 }
func (p *benchPager) ReadBegin(i int) (uint64, bool, bool) {
	return p.words[i], false, p.words[i]&1 != 0
}
func (p *benchPager) ReadEnd(i int, seq uint64) bool { return p.words[i] == seq }
func (p *benchPager) Advise(off, length int64) error { return nil }

// benchServe measures serving READs of n bytes from a pinned or an
// unpinned region with every page resident: the responder's side of the
// no-fault NP read path, against the pinned baseline.
func benchServe(b *testing.B, unpinned, atDelivery bool, n int) {
	dev := NewDevice(nullProvider{}, WithPinning(false))
	pd := dev.AllocPD()
	const pages = 64
	mem, err := AllocBuffer(pages * 4096)
	if err != nil {
		b.Fatal(err)
	}
	defer FreeBuffer(mem)
	for i := range mem {
		mem[i] = byte(i)
	}
	var mr *MR
	if unpinned {
		pg := &benchPager{mem: mem, words: make([]uint64, pages)}
		for i := range pg.words {
			pg.words[i] = 1
		}
		mr, err = pd.RegisterUnpinned(pg, AccessRemoteRead)
	} else {
		mr, err = pd.Register(mem, AccessRemoteRead)
	}
	if err != nil {
		b.Fatal(err)
	}
	q, err := pd.NewQP(QPConfig{SendCQ: dev.NewCQ(4)})
	if err != nil {
		b.Fatal(err)
	}
	qp := q.drv.(*softQP)
	qp.link = &sinkLink{dst: make([]byte, n)}
	if atDelivery {
		qp.link = &copyingSinkLink{sinkLink{dst: make([]byte, n)}}
		qp.copyAtDelivery = true
	}
	b.SetBytes(int64(n))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		off := (i % (pages - n/4096)) * 4096
		h := link.Header{Kind: link.PacketReadRequest, Seq: uint32(i), Len: uint32(n), RKey: mr.RKey(), Addr: mr.Addr() + uint64(off)}
		qp.rs.expected = uint32(i)
		if err := qp.onReadRequest(&h, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkServeRead4KPinned(b *testing.B)              { benchServe(b, false, false, 4096) }
func BenchmarkServeRead4KUnpinned(b *testing.B)            { benchServe(b, true, false, 4096) }
func BenchmarkServeRead4KUnpinnedAtDelivery(b *testing.B)  { benchServe(b, true, true, 4096) }
func BenchmarkServeRead64KPinned(b *testing.B)             { benchServe(b, false, false, 64<<10) }
func BenchmarkServeRead64KUnpinned(b *testing.B)           { benchServe(b, true, false, 64<<10) }
func BenchmarkServeRead64KUnpinnedAtDelivery(b *testing.B) { benchServe(b, true, true, 64<<10) }

// BenchmarkFindMagicPages4K is the requester's check of a READ of one
// resident page: the no-fault path every NP READ pays.
func BenchmarkFindMagicPages4K(b *testing.B) {
	dev := NewDevice(nullProvider{}, WithPinning(false))
	buf := make([]byte, 4096)
	for i := range buf {
		buf[i] = byte(i)
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if len(dev.FindMagicPages(buf, 0x10000, 0x10000, 4096, 0x1122334455667788)) != 0 {
			b.Fatal("found a magic page")
		}
	}
}
