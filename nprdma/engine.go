package nprdma

import (
	"encoding/binary"
	"math/bits"
	"sync"

	"github.com/nprdma/nprdma/nprdma/link"
)

// This file is the NIC engine's data side: serving a READ the responder has
// already validated (see PD.remoteRegion), from a pinned region straight out
// of its memory, from an unpinned one page by page under the pager's
// seqlock.

const (
	// stageChunk bounds the staging memory one unpinned READ holds at a time.
	stageChunk = 256 << 10
	// flushAfter: a response this large is written at once rather than at
	// the end of the inbound batch.
	flushAfter = 64 << 10
)

// stageBuf holds bytes copied out of an unpinned region until the link has
// sent them.
type stageBuf struct {
	b    []byte
	pool *sync.Pool
}

func (s *stageBuf) Release() { s.pool.Put(s) }

var (
	stageSmall = sync.Pool{}
	stageLarge = sync.Pool{}
)

func getStage(n int) *stageBuf {
	pool, size := &stageSmall, 16<<10
	if n > size {
		pool, size = &stageLarge, stageChunk
	}
	if s, ok := pool.Get().(*stageBuf); ok {
		return s
	}
	return &stageBuf{b: make([]byte, size), pool: pool}
}

// readRun is a stretch of a READ response that is either data (copied into
// stg) or the magic pattern.
type readRun struct {
	a, b int // offsets in the region
	good bool
	stg  *stageBuf
	base int // region offset of stg.b[0]
}

func (qp *softQP) serveRead(seq uint32, mr *softMR, off, n int) {
	ctr := &qp.dev.ctr
	ctr.readsServed.Add(1)
	ctr.readBytesServed.Add(uint64(n))
	if n == 0 || mr.pager == nil {
		rs := &qp.rs
		var data [][]byte
		if n > 0 {
			rs.refs = append(rs.refs[:0], mr.buf[off:off+n])
			data = rs.refs[:1]
		}
		qp.respond(link.Packet{Header: link.Header{Kind: link.PacketReadResponse, Seq: seq, Len: uint32(n), Last: true}, Data: data})
		clear(rs.refs)
		if n >= flushAfter {
			qp.link.Flush()
		}
		return
	}
	qp.serveUnpinnedRead(seq, mr, off, n)
}

// serveUnpinnedRead copies each page touched between ReadBegin and ReadEnd;
// a page that is absent, busy, or changed during the copy becomes the magic
// page. It never blocks and never touches a page outside ReadBegin..ReadEnd.
// On a link that copies payloads when the peer consumes them, that copy goes
// straight into the requester's buffer (see unpinnedSource); otherwise the
// pages are copied into staging buffers the link sends from.
func (qp *softQP) serveUnpinnedRead(seq uint32, mr *softMR, off, n int) {
	// Every page the READ touches, counted once from its range whichever
	// way it is copied (a page split between staging chunks is one page).
	ps := mr.pageSize
	qp.dev.ctr.unpinnedPagesRead.Add(uint64((off+n-1)/ps - off/ps + 1))
	if qp.copyAtDelivery {
		src := getUnpinnedSource(qp.dev, mr, off, n)
		p := link.Packet{Header: link.Header{Kind: link.PacketReadResponse, Seq: seq, Len: uint32(n), Last: true}, Src: src, Buf: src}
		qp.respond(p)
		if n >= flushAfter {
			qp.link.Flush()
		}
		return
	}
	rs := &qp.rs
	pager := mr.pager
	runs := rs.runs[:0]
	var magic uint64
	for pos, end := off, off+n; pos < end; {
		chunkEnd := min(end, pos+stageChunk)
		stg := getStage(chunkEnd - pos)
		base := pos
		for pos < chunkEnd {
			page := pos / ps
			pe := min((page+1)*ps, chunkEnd)
			good := false
			if v, zero, ok := pager.ReadBegin(page); ok {
				copyOrClear(stg.b[pos-base:pe-base], mr.buf[pos:pe], zero)
				good = pager.ReadEnd(page, v)
			}
			if !good {
				magic++
			}
			if k := len(runs) - 1; k >= 0 && runs[k].stg == stg && runs[k].good == good {
				runs[k].b = pe
			} else {
				runs = append(runs, readRun{a: pos, b: pe, good: good, stg: stg, base: base})
			}
			pos = pe
		}
	}
	qp.dev.ctr.magicPagesServed.Add(magic)

	pkts := rs.pkts[:0]
	refs := rs.refs[:0]
	for range runs {
		refs = append(refs, nil)
	}
	for i, r := range runs {
		h := link.Header{Kind: link.PacketReadResponse, Seq: seq, Offset: uint32(r.a - off), Len: uint32(r.b - r.a)}
		p := link.Packet{Header: h}
		if r.good {
			refs[i] = r.stg.b[r.a-r.base : r.b-r.base]
			p.Data = refs[i : i+1 : i+1]
		} else {
			p.Fill = true
			p.Pattern = bits.RotateLeft64(mr.magic, -8*(r.a%8))
		}
		if i == len(runs)-1 || runs[i+1].stg != r.stg {
			p.Buf = r.stg // released once every packet using it is sent
		}
		pkts = append(pkts, p)
	}
	pkts[len(pkts)-1].Last = true
	qp.link.Send(pkts)
	clear(pkts)
	clear(refs)
	clear(runs)
	rs.pkts, rs.refs, rs.runs = pkts[:0], refs[:0], runs[:0]
	if n >= flushAfter {
		qp.link.Flush()
	}
}

// unpinnedSource is the payload of a READ response from an unpinned
// region on a link that copies at delivery: the requester's goroutine
// copies each page straight into its buffer between ReadBegin and ReadEnd,
// and writes the magic page instead where that fails — what a NIC does
// when it may write the destination and correct it before the completion.
// Each page part is copied under one ReadBegin..ReadEnd even when the
// destination is split inside it (the part then goes through spill), so a
// page never mixes versions or data with magic.
type unpinnedSource struct {
	dev      *softDevice
	mr       *softMR
	pos, end int  // region offsets: next byte to produce, end of the READ
	serving  int8 // 0: not yet asked, 1: the region is held (beginServe), -1: deregistered
	finished bool // counted and released
	spill    []byte
	spillAt  int // region offset of spill[0]
	spillLen int
	magic    uint64
}

var sourcePool = sync.Pool{New: func() any { return new(unpinnedSource) }}

func getUnpinnedSource(dev *softDevice, mr *softMR, off, n int) *unpinnedSource {
	s := sourcePool.Get().(*unpinnedSource)
	s.dev, s.mr, s.pos, s.end = dev, mr, off, off+n
	return s
}

// Read implements PayloadSource.
func (s *unpinnedSource) Read(dst []byte) {
	if s.serving == 0 {
		// Deregister waits for reads under way; a region deregistered
		// since the request was validated reads as magic pages.
		s.serving = -1
		if s.mr.beginServe() {
			s.serving = 1
		}
	}
	ps := s.mr.pageSize
	for len(dst) > 0 {
		if s.spillLen > 0 {
			k := copy(dst, s.spill[s.pos-s.spillAt:s.spillLen])
			dst, s.pos = dst[k:], s.pos+k
			if s.pos == s.spillAt+s.spillLen {
				s.spillLen = 0
			}
			continue
		}
		pe := min((s.pos/ps+1)*ps, s.end)
		if pe-s.pos <= len(dst) {
			s.copyPage(dst[:pe-s.pos], s.pos)
			dst, s.pos = dst[pe-s.pos:], pe
			continue
		}
		if len(s.spill) < ps {
			s.spill = make([]byte, ps)
		}
		s.copyPage(s.spill[:pe-s.pos], s.pos)
		s.spillAt, s.spillLen = s.pos, pe-s.pos
	}
	if s.pos == s.end {
		s.finish()
	}
}

// finish releases the region and counts the magic pages once the last byte is
// produced: before the requester's completion, which follows the payload.
func (s *unpinnedSource) finish() {
	if s.finished {
		return
	}
	s.finished = true
	if s.serving > 0 {
		s.mr.endServe()
	}
	if s.magic > 0 {
		s.dev.ctr.magicPagesServed.Add(s.magic)
	}
}

// copyPage copies the part of a page that starts at region offset at into
// dst under the seqlock, or writes the magic page there.
func (s *unpinnedSource) copyPage(dst []byte, at int) {
	mr := s.mr
	page := at / mr.pageSize
	good := false
	if s.serving > 0 {
		if v, zero, ok := mr.pager.ReadBegin(page); ok {
			copyOrClear(dst, mr.buf[at:at+len(dst)], zero)
			good = mr.pager.ReadEnd(page, v)
		}
	}
	if !good {
		s.magic++
		fillPhase(dst, mr.magic, at%8)
	}
}

// Discard implements PayloadSource: skipped bytes are not read.
func (s *unpinnedSource) Discard(n int) {
	if s.spillLen > 0 {
		k := min(n, s.spillAt+s.spillLen-s.pos)
		s.pos, n = s.pos+k, n-k
		if s.pos == s.spillAt+s.spillLen {
			s.spillLen = 0
		}
	}
	s.pos += n
	if s.pos == s.end {
		s.finish()
	}
}

// Release implements Releaser: the link is done with the packet (consumed,
// or dropped with the link).
func (s *unpinnedSource) Release() {
	s.finish()
	spill := s.spill
	*s = unpinnedSource{spill: spill}
	sourcePool.Put(s)
}

// copyOrClear copies a page part, or writes zeros where the pager said the
// page holds only zeros: its memory is then not read at all (on a virtual
// machine the first touch of a newly mapped page can cost microseconds).
func copyOrClear(dst, src []byte, zero bool) {
	if zero {
		clear(dst)
		return
	}
	copy(dst, src)
}

// fillPhase fills dst with pattern's bytes starting at phase j: dst[i] is
// byte (j+i)%8 of pattern in little-endian order.
func fillPhase(dst []byte, pattern uint64, j int) { link.FillMagic(dst, pattern, j) }

// matchPhase reports whether b equals the pattern filled from phase j.
func matchPhase(b []byte, pattern uint64, j int) bool {
	p := bits.RotateLeft64(pattern, -8*(j%8))
	i := 0
	for ; i+8 <= len(b); i += 8 {
		if binary.LittleEndian.Uint64(b[i:]) != p {
			return false
		}
	}
	for k := 0; i < len(b); i, k = i+1, k+1 {
		if b[i] != byte(p>>(8*k)) {
			return false
		}
	}
	return true
}
