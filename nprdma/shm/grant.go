package shm

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nprdma/nprdma/nprdma/link"
)

// Regions shared in place, both ways. The side that owns a region (the
// responder: its NIC engine served the peer's READ of it) passes the
// region's files on the socket (GRANT) with a fence slot; the requester
// maps them and from then on executes its READs of the region itself
// (ReadLocal), checking the fence after every copy. Revoking sets the
// fence, then tells the requester (REVOKE), which unmaps once no READ uses
// the mapping.

// grant is a region the peer shared with this side.
type grant struct {
	info  grantInfo
	slot  uint32
	fence *uint32 // in the ring file: 1 once revoked
	m     *mapping
	users atomic.Int64 // READs using m right now
	gone  atomic.Bool  // removed: no new READ may use it
}

func (g *grant) enter() bool {
	g.users.Add(1)
	if g.gone.Load() {
		g.users.Add(-1)
		return false
	}
	return true
}

func (g *grant) exit() { g.users.Add(-1) }

// retire stops new READs of g and waits for the ones using it (one copy
// each, never blocking).
func (g *grant) retire() {
	g.gone.Store(true)
	for g.users.Load() > 0 {
		time.Sleep(10 * time.Microsecond)
	}
}

// shares are a link's regions shared in place.
type shares struct {
	mu     sync.Mutex
	live   bool     // the ring file is mapped: fences may be used
	mine   []uint32 // fences of the regions this side shared (written here)
	theirs []uint32 // fences of the regions the peer shared (read here)
	next   uint32   // next slot of mine
	prov   *Provider
	bySlot map[uint32]*grant
	grants atomic.Pointer[map[uint32]*grant] // by rkey, copied on write
}

func (s *shares) init(p *Provider, file []byte, dialer bool) {
	s.live, s.prov = true, p
	s.mine, s.theirs = fences(file, dialer), fences(file, !dialer)
	s.bySlot = map[uint32]*grant{}
	empty := map[uint32]*grant{}
	s.grants.Store(&empty)
}

// ShareRegion implements link.RegionSharer.
func (l *shmLink) ShareRegion(r link.SharedRegion) (func(), bool) {
	s := &l.shares
	s.mu.Lock()
	if !s.live || s.next >= fenceSlots {
		s.mu.Unlock()
		return nil, false
	}
	slot := s.next
	s.next++
	atomic.StoreUint32(&s.mine[slot], 0)
	s.mu.Unlock()
	info := grantInfo{rkey: r.RKey, addr: r.Addr, length: uint64(r.Len), pageSize: r.PageSize, magic: r.Magic, bits: r.Bits}
	if err := sendMsg(l.conn, encodeGrant(slot, &info), r.Data, r.States, r.Access); err != nil {
		return nil, false
	}
	revoke := func() {
		s.mu.Lock()
		if s.live {
			atomic.StoreUint32(&s.mine[slot], 1)
		}
		s.mu.Unlock()
		sendMsg(l.conn, encodeRevoke(slot, r.RKey)) // the peer may be gone: the fence is what counts
	}
	return revoke, true
}

// accept installs a region the peer shared (GRANT); it takes files.
func (s *shares) accept(p *Provider, m message, files []*os.File) error {
	if p.inPlace == InPlaceOff {
		closeFiles(files)
		return nil
	}
	s.mu.Lock()
	_, used := s.bySlot[m.slot]
	_, known := (*s.grants.Load())[m.grant.rkey]
	live := s.live
	s.mu.Unlock()
	if used || known {
		closeFiles(files)
		return fmt.Errorf("%w: grant of slot %d, key %#x, given twice", errMessage, m.slot, m.grant.rkey)
	}
	if !live {
		closeFiles(files)
		return nil
	}
	mp, err := p.maps.get(files, m.grant.length, m.grant.pageSize)
	if err != nil {
		return err
	}
	g := &grant{info: m.grant, slot: m.slot, fence: &s.theirs[m.slot], m: mp}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.live {
		p.maps.put(mp)
		return nil
	}
	s.bySlot[m.slot] = g
	old := *s.grants.Load()
	tab := make(map[uint32]*grant, len(old)+1)
	for k, v := range old {
		tab[k] = v
	}
	tab[g.info.rkey] = g
	s.grants.Store(&tab)
	return nil
}

// revoked drops the region the peer revoked (REVOKE).
func (s *shares) revoked(slot, rkey uint32) {
	s.mu.Lock()
	g := s.bySlot[slot]
	if g == nil || g.info.rkey != rkey {
		s.mu.Unlock()
		return
	}
	s.removeLocked(g)
	s.mu.Unlock()
	g.retire()
	s.prov.maps.put(g.m)
}

func (s *shares) removeLocked(g *grant) {
	delete(s.bySlot, g.slot)
	old := *s.grants.Load()
	tab := make(map[uint32]*grant, len(old))
	for k, v := range old {
		if v != g {
			tab[k] = v
		}
	}
	s.grants.Store(&tab)
}

// close drops every region either way (the link is going away): fences are
// no longer written, mappings go once no READ uses them.
func (s *shares) close() {
	s.mu.Lock()
	s.live = false
	gs := make([]*grant, 0, len(s.bySlot))
	for _, g := range s.bySlot {
		gs = append(gs, g)
		s.removeLocked(g)
	}
	s.mu.Unlock()
	for _, g := range gs {
		g.retire()
		s.prov.maps.put(g.m)
	}
}

// ReadLocal implements link.LocalReader.
func (l *shmLink) ReadLocal(rkey uint32, addr uint64, dst [][]byte) (link.LocalRead, bool) {
	g := (*l.shares.grants.Load())[rkey]
	if g == nil {
		return link.LocalRead{}, false
	}
	n := uint64(totalLen(dst))
	if addr < g.info.addr || addr-g.info.addr > g.info.length || n > g.info.length-(addr-g.info.addr) {
		return link.LocalRead{}, false
	}
	if !g.enter() {
		return link.LocalRead{}, false
	}
	defer g.exit()
	if atomic.LoadUint32(g.fence) != 0 {
		return link.LocalRead{}, false
	}
	r := g.m.read(g, int(addr-g.info.addr), dst)
	// A READ that ends after the revocation did not happen here: the peer
	// refuses it.
	if atomic.LoadUint32(g.fence) != 0 {
		return link.LocalRead{}, false
	}
	return r, true
}
