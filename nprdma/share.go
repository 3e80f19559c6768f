package nprdma

import (
	"sync"

	"github.com/nprdma/nprdma/nprdma/link"
)

// This file is what the protocol does for links that share memory with the
// peer (nprdma/shm): the requester executes READs of regions the peer
// shared with it (LocalReader), and the responder offers its unpinned
// regions to the link once the peer has shown it may read them
// (RegionSharer), and revokes them when they are deregistered.

// dstPool holds the destination lists of local READs: an interface call
// would move one on the stack to the heap.
var dstPool = sync.Pool{New: func() any { return new([MaxSGE][]byte) }}

// readLocal executes a posted READ through the link (LocalReader), if the
// link can: its SGEs resolve, it is not empty, and the peer shared the
// region. Anything else goes to the peer as usual, which decides.
func (qp *softQP) readLocal(wr *SendWR) bool {
	segs := dstPool.Get().(*[MaxSGE][]byte)
	defer func() { clear(segs[:]); dstPool.Put(segs) }()
	dst := segs[:0]
	var total uint64
	for _, s := range wr.SG {
		b, st := qp.pd.localSlice(s, true)
		if st != StatusSuccess {
			return false
		}
		if len(b) > 0 {
			dst = append(dst, b)
			total += uint64(len(b))
		}
	}
	if total == 0 || total > MaxMessageSize {
		return false
	}
	r, ok := qp.localReader.ReadLocal(wr.RKey, wr.RemoteAddr, dst)
	if !ok {
		return false
	}
	c := &qp.dev.ctr
	c.localReads.Add(1)
	c.localPagesRead.Add(uint64(r.Pages))
	if r.Magic > 0 {
		c.localMagicPages.Add(uint64(r.Magic))
	}
	return true
}

// regionShares are the regions a queue pair offered its link.
type regionShares struct {
	mu      sync.Mutex
	offered map[*softMR]struct{}
	closed  bool
}

// offerRegion offers mr to the link once per queue pair, after a READ of it
// passed the NIC engine's checks here: the peer may read it, so it may read
// it in place. Called on the delivering goroutine.
func (qp *softQP) offerRegion(mr *softMR) {
	sh := &qp.shares
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.closed {
		return
	}
	if _, done := sh.offered[mr]; done {
		return
	}
	if sh.offered == nil {
		sh.offered = map[*softMR]struct{}{}
	}
	sh.offered[mr] = struct{}{} // declined or not, offered once
	sp, ok := mr.pager.(SharedPager)
	if !ok {
		return
	}
	data, states, access, ok := sp.ShareFiles()
	if !ok {
		return
	}
	present, busy, zero, shift := sp.StateBits()
	revoke, ok := qp.sharer.ShareRegion(link.SharedRegion{
		RKey: mr.rkey, Addr: mr.addr, Len: len(mr.buf), PageSize: mr.pageSize, Magic: mr.magic,
		Data: data, States: states, Access: access,
		Bits: link.StateBits{Present: present, Busy: busy, Zero: zero, VersionShift: shift},
	})
	if !ok {
		return
	}
	if !mr.addShare(qp, revoke) {
		revoke() // deregistered meanwhile
	}
}

// forgetShares drops the queue pair's entries in its regions' share lists
// (its link is down: there is nothing left to revoke).
func (qp *softQP) forgetShares() {
	sh := &qp.shares
	sh.mu.Lock()
	offered := sh.offered
	sh.offered, sh.closed = nil, true
	sh.mu.Unlock()
	for mr := range offered {
		mr.removeShare(qp)
	}
}

// mrShares are the links a region was shared with, and how to revoke each.
type mrShares struct {
	mu      sync.Mutex
	revokes map[*softQP]func()
	closed  bool
}

func (mr *softMR) addShare(qp *softQP, revoke func()) bool {
	s := &mr.shares
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || mr.dead.Load() {
		return false
	}
	if s.revokes == nil {
		s.revokes = map[*softQP]func(){}
	}
	s.revokes[qp] = revoke
	return true
}

func (mr *softMR) removeShare(qp *softQP) {
	s := &mr.shares
	s.mu.Lock()
	delete(s.revokes, qp)
	s.mu.Unlock()
}

// revokeShares fences every peer the region was shared with: once it
// returns no READ a peer executes in place completes successfully.
func (mr *softMR) revokeShares() {
	s := &mr.shares
	s.mu.Lock()
	revokes := s.revokes
	s.revokes, s.closed = nil, true
	s.mu.Unlock()
	for _, revoke := range revokes {
		revoke()
	}
}
