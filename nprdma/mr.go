package nprdma

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

var osPageSize = os.Getpagesize()

// PD is a protection domain: regions and queue pairs of one PD can only be
// used together (a remote key is honoured only on queue pairs of its PD).
type softPD struct {
	dev    *softDevice
	mu     sync.Mutex
	closed bool
	mrs    map[*softMR]struct{}
	qps    map[*softQP]struct{}
}

// Device is the device the PD belongs to.
func (pd *softPD) Device() *softDevice { return pd.dev }

// Close releases the PD. Like ibv_dealloc_pd it fails while regions or queue
// pairs still use it.
func (pd *softPD) Close() error {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.closed {
		return nil
	}
	if len(pd.mrs) > 0 || len(pd.qps) > 0 {
		return fmt.Errorf("nprdma: close protection domain: still used by %d memory regions and %d queue pairs", len(pd.mrs), len(pd.qps))
	}
	pd.closed = true
	pd.dev.mu.Lock()
	delete(pd.dev.pds, pd)
	pd.dev.mu.Unlock()
	return nil
}

// softMR is a registered memory region of the software NIC.
type softMR struct {
	pd       *softPD
	buf      []byte
	addr     uint64
	lkey     uint32
	rkey     uint32
	access   Access
	pinned   bool
	pager    Pager
	pageSize int
	magic    uint64
	tag      uint64 // access tag: 0 = any QP of the PD (see WithAccessTag)
	dead     atomic.Bool
	// serving counts READs being copied out of an unpinned region and
	// WRITEs being copied into the region right now; Deregister waits for
	// them so that the pager or the memory may go away after it.
	serving atomic.Int64
	shares  mrShares // links the region was shared with (share.go)
}

// LKey is the local key, for SGEs.
func (mr *softMR) LKey() uint32 { return mr.lkey }

// RKey is the remote key a peer names in READ and WRITE.
func (mr *softMR) RKey() uint32 { return mr.rkey }

// Pinned reports whether the region was pinned at registration.
func (mr *softMR) Pinned() bool { return mr.pinned }

// Magic is the unpinned region's magic value (0 for other regions): a page
// the NIC engine could not read is delivered as this value repeated.
func (mr *softMR) Magic() uint64 { return mr.magic }

// PageSize is the granularity of the region's pages (the pager's page size,
// or the OS page size).
func (mr *softMR) PageSize() int { return mr.pageSize }

// Register registers buf with the given rights, pinning it with mlock (the
// baseline: the cost grows with the size, about 3 s per GiB here). buf must
// stay valid until Deregister and until no queue pair can still access it.
func (pd *softPD) Register(buf []byte, access Access, tag uint64) (MRDriver, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("nprdma: register: empty buffer")
	}
	if access&^(accessAll&^AccessOnDemand) != 0 {
		return nil, fmt.Errorf("nprdma: register %d bytes: access %s not offered by the software NIC", len(buf), access)
	}
	if access&AccessRemoteWrite != 0 && access&AccessLocalWrite == 0 {
		// As in verbs: remote write implies the NIC writes locally.
		return nil, fmt.Errorf("nprdma: register %d bytes: remote-write needs local-write", len(buf))
	}
	mr := &softMR{
		pd:       pd,
		buf:      buf,
		addr:     uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))),
		access:   access,
		pinned:   pd.dev.pin,
		pageSize: osPageSize,
		tag:      tag,
	}
	if mr.pinned {
		if err := unix.Mlock(buf); err != nil {
			return nil, fmt.Errorf("nprdma: register %d bytes at %#x: mlock: %w (needs CAP_IPC_LOCK or a larger RLIMIT_MEMLOCK; or open the device WithPinning(false))", len(buf), mr.addr, err)
		}
	}
	if err := pd.add(mr); err != nil {
		if mr.pinned {
			unix.Munlock(buf)
		}
		return nil, err
	}
	pd.dev.ctr.registeredBytes.Add(int64(len(buf)))
	return mr, nil
}

// RegisterUnpinned registers the pager's memory for remote reads without
// pinning or touching it: O(1) whatever its size. Only AccessRemoteRead may be
// granted: remote writes into the pager's memory are never allowed (writes
// are commands the owner validates), and the local NIC cannot use the region
// in SGEs. A READ is served page by page under the pager's seqlock; a page
// that is absent, busy or changed during the copy is delivered as the magic
// page (Magic() repeated).
func (pd *softPD) RegisterUnpinned(p Pager, access Access, tag uint64) (MRDriver, error) {
	buf := p.Bytes()
	ps := p.PageSize()
	if len(buf) == 0 {
		return nil, fmt.Errorf("nprdma: register unpinned: pager has no memory")
	}
	if ps <= 0 || ps%8 != 0 {
		return nil, fmt.Errorf("nprdma: register unpinned %d bytes: page size %d is not a positive multiple of 8", len(buf), ps)
	}
	if access != AccessRemoteRead {
		return nil, fmt.Errorf("nprdma: register unpinned %d bytes: access %s refused: an unpinned region grants remote-read only", len(buf), access)
	}
	mr := &softMR{
		pd:       pd,
		buf:      buf,
		addr:     uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))),
		access:   access,
		pager:    p,
		pageSize: ps,
		tag:      tag,
	}
	for mr.magic == 0 {
		mr.magic = randomUint64()
	}
	if err := pd.add(mr); err != nil {
		return nil, err
	}
	pd.dev.ctr.unpinnedBytes.Add(int64(len(buf)))
	return mr, nil
}

func randomUint64() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("nprdma: crypto/rand: " + err.Error())
	}
	return binary.LittleEndian.Uint64(b[:])
}

// add assigns keys and publishes mr in the device's tables.
func (pd *softPD) add(mr *softMR) error {
	d := pd.dev
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.closed {
		return fmt.Errorf("nprdma: register %d bytes: protection domain %w", len(mr.buf), ErrClosed)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("nprdma: register %d bytes: device %s %w", len(mr.buf), d.name, ErrClosed)
	}
	// Local key: a table slot plus a generation, so a stale key does not
	// name the slot's next tenant.
	old := *d.lkeys.Load()
	var idx uint32
	if n := len(d.freeIdx); n > 0 {
		idx = d.freeIdx[n-1]
		d.freeIdx = d.freeIdx[:n-1]
	} else {
		idx = uint32(len(old))
		if idx >= 1<<24 {
			return fmt.Errorf("nprdma: register %d bytes: too many memory regions", len(mr.buf))
		}
		d.lkeyGen = append(d.lkeyGen, 0)
	}
	d.lkeyGen[idx]++
	mr.lkey = idx<<8 | uint32(d.lkeyGen[idx])
	tab := make([]*softMR, max(len(old), int(idx)+1))
	copy(tab, old)
	tab[idx] = mr
	d.lkeys.Store(&tab)

	// Remote key: random, so that it cannot be guessed by a peer that was
	// never told it.
	oldR := *d.rkeys.Load()
	for {
		k := uint32(randomUint64())
		if _, taken := oldR[k]; k != 0 && !taken {
			mr.rkey = k
			break
		}
	}
	rt := make(map[uint32]*softMR, len(oldR)+1)
	for k, v := range oldR {
		rt[k] = v
	}
	rt[mr.rkey] = mr
	d.rkeys.Store(&rt)

	pd.mrs[mr] = struct{}{}
	d.live[mr] = struct{}{}
	d.ctr.registrations.Add(1)
	return nil
}

// Deregister revokes the region's keys: no new local or remote access is
// accepted once it returns. Pinned memory is unlocked unless another live
// region covers it. For an unpinned region it also waits for the READs
// being copied out of the pager at that moment (one copy each; the engine
// never blocks there), so the pager may be closed once it returns even
// while queue pairs that used the region live on; and it revokes the
// region from every peer it was shared with (RegionSharer): no READ a peer
// executes in place succeeds after it returns.
func (mr *softMR) Deregister() error {
	if !mr.dead.CompareAndSwap(false, true) {
		return nil
	}
	pd, d := mr.pd, mr.pd.dev
	pd.mu.Lock()
	delete(pd.mrs, mr)
	pd.mu.Unlock()
	d.mu.Lock()
	old := *d.lkeys.Load()
	tab := make([]*softMR, len(old))
	copy(tab, old)
	idx := mr.lkey >> 8
	tab[idx] = nil
	d.lkeys.Store(&tab)
	d.freeIdx = append(d.freeIdx, idx)
	oldR := *d.rkeys.Load()
	rt := make(map[uint32]*softMR, len(oldR))
	for k, v := range oldR {
		if k != mr.rkey {
			rt[k] = v
		}
	}
	d.rkeys.Store(&rt)
	delete(d.live, mr)
	var err error
	if mr.pinned {
		err = d.munlockUncoveredLocked(mr)
	}
	if mr.pager != nil {
		d.ctr.unpinnedBytes.Add(-int64(len(mr.buf)))
	} else {
		d.ctr.registeredBytes.Add(-int64(len(mr.buf)))
	}
	d.mu.Unlock()
	mr.revokeShares()
	for mr.serving.Load() > 0 {
		time.Sleep(10 * time.Microsecond)
	}
	return err
}

// beginServe holds the region for one READ's or WRITE's copy (see
// Deregister); it fails once the region is deregistered. endServe releases
// it.
func (mr *softMR) beginServe() bool {
	mr.serving.Add(1)
	if mr.dead.Load() {
		mr.serving.Add(-1)
		return false
	}
	return true
}

func (mr *softMR) endServe() { mr.serving.Add(-1) }

// munlockUncoveredLocked unlocks mr's pages except those another live pinned
// region still covers (mlock does not nest).
func (d *softDevice) munlockUncoveredLocked(mr *softMR) error {
	ps := uint64(osPageSize)
	start := mr.addr &^ (ps - 1)
	end := (mr.addr + uint64(len(mr.buf)) + ps - 1) &^ (ps - 1)
	type span struct{ a, b uint64 }
	var keep []span
	for o := range d.live {
		if !o.pinned {
			continue
		}
		oa := o.addr &^ (ps - 1)
		ob := (o.addr + uint64(len(o.buf)) + ps - 1) &^ (ps - 1)
		if oa < end && ob > start {
			keep = append(keep, span{max(oa, start), min(ob, end)})
		}
	}
	sort.Slice(keep, func(i, j int) bool { return keep[i].a < keep[j].a })
	cur := start
	var err error
	unlock := func(a, b uint64) {
		if b > a {
			base := mr.addr
			// Both bounds lie within mr's pages; unlock through mr.buf so no
			// raw address is ever turned into a pointer.
			lo := int(max(a, base) - base)
			hi := int(min(b, base+uint64(len(mr.buf))) - base)
			if hi > lo {
				if e := unix.Munlock(mr.buf[lo:hi]); e != nil && err == nil {
					err = fmt.Errorf("nprdma: deregister: munlock: %w", e)
				}
			}
		}
	}
	for _, s := range keep {
		if s.a > cur {
			unlock(cur, s.a)
		}
		cur = max(cur, s.b)
	}
	unlock(cur, end)
	return err
}

// localSlice resolves an SGE against its region for a local access that
// needs the given rights; status says why it cannot.
func (pd *softPD) localSlice(s SGE, needWrite bool) ([]byte, Status) {
	mr := pd.dev.lookupLKey(s.LKey)
	if mr == nil || mr.pd != pd || mr.dead.Load() || mr.pager != nil {
		return nil, StatusLocalProtection
	}
	if needWrite && mr.access&AccessLocalWrite == 0 {
		return nil, StatusLocalProtection
	}
	if s.Addr < mr.addr {
		return nil, StatusLocalProtection
	}
	off := s.Addr - mr.addr
	if off > uint64(len(mr.buf)) || uint64(s.Length) > uint64(len(mr.buf))-off {
		return nil, StatusLocalProtection
	}
	return mr.buf[off : off+uint64(s.Length) : off+uint64(s.Length)], StatusSuccess
}

// remoteRegion is the NIC engine's check of a remote access, done before any
// byte is copied: the key must name a live region of this PD that grants
// the right and contains [addr, addr+n).
func (pd *softPD) remoteRegion(rkey uint32, addr uint64, n uint32, need Access) (*softMR, int, bool) {
	mr := pd.dev.lookupRKey(rkey)
	if mr == nil || mr.pd != pd || mr.dead.Load() || mr.access&need != need {
		return nil, 0, false
	}
	if addr < mr.addr {
		return nil, 0, false
	}
	off := addr - mr.addr
	if off > uint64(len(mr.buf)) || uint64(n) > uint64(len(mr.buf))-off {
		return nil, 0, false
	}
	return mr, int(off), true
}

// remoteRegion is PD.remoteRegion plus the access tag: a tagged region
// serves only queue pairs carrying the same tag.
func (qp *softQP) remoteRegion(rkey uint32, addr uint64, n uint32, need Access) (*softMR, int, bool) {
	mr, off, ok := qp.pd.remoteRegion(rkey, addr, n, need)
	if !ok || (mr.tag != 0 && mr.tag != qp.accessTag.Load()) {
		return nil, 0, false
	}
	return mr, off, true
}
