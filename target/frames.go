package target

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"math/bits"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nvme"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// Frame mirrors: one-sided reads on devices that cannot read a namespace's
// own memory (a hardware NIC reads only pinned memory, and pinning a region
// several times larger than DRAM is what the namespace region exists to
// avoid; docs/np-rdma.md §11). A namespace there keeps copies of the blocks
// hosts read in frames of a pool registered once, pinned, as large as a
// share of its DRAM budget, plus a hash table that says which frame holds
// which block (the wire format is nvme/frames.go). The namespace's store
// stays the home of its data: a Read by a host that reads frames copies the
// blocks it returns into frames, and every change of a block empties its
// frame before the change is acknowledged.
//
// Why a host never accepts a stale block: a change of block b (write,
// trim, write zeroes) first changes the store, then, under b's stripe lock,
// bumps the stripe's generation and empties b's frame, and only then is
// acknowledged. An install of b takes the stripe's generation before it
// reads the store and installs, under the same lock, only if the
// generation has not moved: a read of the store that may have seen the
// content before a change is never installed after that change emptied
// the frame. A host's READ that overlaps the emptying or an install sees
// an odd version or a checksum that does not match (nvme.CheckFrame).

// DefaultFrameShare is the share of a namespace's DRAM budget held as
// frames where frames are used (WithFrameShare).
const DefaultFrameShare = 0.5

// FrameMode says when namespaces are read one-sided through frames.
type FrameMode int

const (
	// FramesAuto: on devices without unpinned regions (hardware); the
	// software NIC reads the namespace's region itself (the default).
	FramesAuto FrameMode = iota
	// FramesAlways: on every device (to compare the two models on the
	// software NIC, and to test frames without hardware).
	FramesAlways
	// FramesNever: hosts read two-sided on devices without unpinned regions.
	FramesNever
)

// UsesFrames reports whether the target's namespaces are read one-sided
// through frames.
func (t *Target) UsesFrames() bool { return t.usesFrames() }

func (t *Target) usesFrames() bool {
	switch t.cfg.frameMode {
	case FramesAlways:
		return true
	case FramesNever:
		return false
	}
	return !t.dev.Caps().UnpinnedRegions
}

// mirrorStripes is the number of stripe locks and generations; a power of
// two larger than the blocks of one transfer, so that one read's blocks
// take distinct stripes.
const mirrorStripes = 1024

type frameMirror struct {
	mem     []byte // the frames, then the table; off the Go heap
	mr      *nprdma.MR
	frames  uint32
	buckets uint32
	seed    uint64
	tableAt int // offset of the table in mem
	regTime time.Duration

	stripes [mirrorStripes]struct {
		mu  sync.Mutex
		gen atomic.Uint64
	}

	mu    sync.Mutex // what follows
	at    map[uint64]uint32
	owner []uint64 // frame -> block+1, 0 when free
	busy  []bool   // being filled by an install (not a victim)
	hand  uint32

	installs, invalidations, evictions atomic.Uint64
}

const frameSize = nvme.FrameHeaderSize + BlockSize

// framesFor is how many frames and buckets mem bytes hold.
func framesFor(mem int64) (frames, buckets uint32) {
	n := mem / (frameSize + nvme.FrameBucketSize)
	n = max(min(n, nvme.MaxFrames), 16)
	frames = uint32(n)
	// A quarter of the table's entries used at most, so that a full
	// bucket (which costs a frame) is rare.
	buckets = 1 << bits.Len32(max(frames/2, 1)-1)
	return frames, max(buckets, 1)
}

// newFrameMirror allocates and registers (pinned, read-only for peers) the
// frames of mem bytes of a namespace of at most blocks blocks (its max
// size: it may grow while served).
func newFrameMirror(pd *nprdma.PD, mem int64, blocks uint64) (*frameMirror, error) {
	if blocks > nvme.MaxFrameBlock {
		return nil, fmt.Errorf("frames: %d blocks, a frame table names at most %d", blocks, uint64(nvme.MaxFrameBlock))
	}
	frames, buckets := framesFor(mem)
	m := &frameMirror{frames: frames, buckets: buckets, tableAt: int(frames) * frameSize,
		at: map[uint64]uint32{}, owner: make([]uint64, frames), busy: make([]bool, frames)}
	var seed [8]byte
	rand.Read(seed[:])
	m.seed = binary.LittleEndian.Uint64(seed[:])
	var err error
	if m.mem, err = nprdma.AllocBuffer(m.tableAt + int(buckets)*nvme.FrameBucketSize); err != nil {
		return nil, fmt.Errorf("frames: %w", err)
	}
	// Huge pages where the kernel has them: a NIC's translation of a large
	// pool read at random then misses less (docs/rdma.md). Advice only.
	unix.Madvise(m.mem[:cap(m.mem)], unix.MADV_HUGEPAGE)
	start := time.Now()
	if m.mr, err = pd.Register(m.mem, nprdma.AccessRemoteRead); err != nil {
		nprdma.FreeBuffer(m.mem)
		return nil, fmt.Errorf("frames: %w", err)
	}
	m.regTime = time.Since(start)
	return m, nil
}

// close revokes the frames' key and frees them; hosts reading them then
// get a remote access error.
func (m *frameMirror) close() error {
	err := m.mr.Deregister()
	if ferr := nprdma.FreeBuffer(m.mem); err == nil {
		err = ferr
	}
	return err
}

// descriptor describes the frames to a host.
func (m *frameMirror) descriptor(length int64) nvme.RegionDescriptor {
	return nvme.RegionDescriptor{Format: nvme.RegionDescriptorFormat2, Flags: nvme.RegionRemoteRead | nvme.RegionAdvise,
		PageSize: BlockSize, Address: m.mr.Addr(), Length: uint64(length), RKey: m.mr.RKey(), LBASize: BlockSize,
		TableAddress: m.mr.Addr() + uint64(m.tableAt), Frames: m.frames, Buckets: m.buckets, Seed: m.seed, FrameSize: frameSize}
}

// PinnedBytes is the memory the frames and the table pin.
func (m *frameMirror) pinnedBytes() int64 { return int64(len(m.mem)) }

func (m *frameMirror) word(off int) *uint64 { return (*uint64)(unsafe.Pointer(&m.mem[off])) }

func (m *frameMirror) stripe(block uint64) int { return int(block % mirrorStripes) }

// gens records the stripe generations of n blocks from first, before
// their content is read from the store.
func (m *frameMirror) gens(first uint64, out []uint64) {
	for i := range out {
		out[i] = m.stripes[m.stripe(first+uint64(i))].gen.Load()
	}
}

// install copies the blocks of data, read from the store at block first
// after gens recorded their generations, into frames: each one whose
// stripe has not changed since.
func (m *frameMirror) install(first uint64, data []byte, gens []uint64) {
	for i := range gens {
		b := first + uint64(i)
		s := &m.stripes[m.stripe(b)]
		s.mu.Lock()
		if s.gen.Load() == gens[i] {
			m.put(b, data[i*BlockSize:(i+1)*BlockSize])
		}
		s.mu.Unlock()
	}
}

// put writes block b's content into a frame (its own or a free or evicted
// one) and publishes it in the table. The caller holds b's stripe lock.
func (m *frameMirror) put(b uint64, data []byte) {
	m.mu.Lock()
	if _, ok := m.at[b]; ok {
		// Its frame holds the current content: a change would have
		// emptied it, under the stripe lock the caller holds.
		m.mu.Unlock()
		return
	}
	f, ok := m.victimLocked()
	if !ok {
		m.mu.Unlock()
		return // every frame is being filled: this block stays two-sided
	}
	m.owner[f] = b + 1
	m.at[b] = f
	m.busy[f] = true
	m.mu.Unlock()

	base := int(f) * frameSize
	ver := m.word(base + nvme.FrameVersionOffset)
	v := atomic.LoadUint64(ver) | 1 // odd: a READ of the frame now is refused
	atomic.StoreUint64(ver, v)
	atomic.StoreUint64(m.word(base+nvme.FrameTagOffset), b+1)
	copy(m.mem[base+nvme.FrameHeaderSize:base+frameSize], data)
	atomic.StoreUint64(m.word(base+nvme.FrameSumOffset), nvme.FrameChecksum(m.seed, b, v+1, data))
	atomic.StoreUint64(ver, v+1)
	m.installs.Add(1)

	m.mu.Lock()
	m.busy[f] = false
	m.publishLocked(b, f)
	m.mu.Unlock()
}

// victimLocked frees a frame for a new block: a free one, or the next
// one the clock hand reaches that no install is filling (the blocks a host
// reads one-sided are invisible here, so the order is first in, first out).
func (m *frameMirror) victimLocked() (uint32, bool) {
	for range m.frames {
		f := m.hand
		m.hand = (m.hand + 1) % m.frames
		if m.busy[f] {
			continue
		}
		if old := m.owner[f]; old != 0 {
			m.evictLocked(old-1, f)
			m.evictions.Add(1)
		}
		return f, true
	}
	return 0, false
}

// evictLocked empties frame f, which holds block b, and removes it from
// the table. A host holding the frame number in its cache then reads an
// empty or another block's frame and falls back.
func (m *frameMirror) evictLocked(b uint64, f uint32) {
	m.unpublishLocked(b, f)
	delete(m.at, b)
	m.owner[f] = 0
	base := int(f) * frameSize
	ver := m.word(base + nvme.FrameVersionOffset)
	v := atomic.LoadUint64(ver) | 1
	atomic.StoreUint64(ver, v)
	atomic.StoreUint64(m.word(base+nvme.FrameTagOffset), 0)
	atomic.StoreUint64(ver, v+1)
}

func (m *frameMirror) bucketOf(b uint64) int {
	return m.tableAt + int(nvme.FrameBucket(m.seed, b, m.buckets))*nvme.FrameBucketSize
}

// publishLocked puts (b, f) in b's bucket; in a full bucket it takes the
// place of an entry whose frame it evicts.
func (m *frameMirror) publishLocked(b uint64, f uint32) {
	at := m.bucketOf(b)
	e := nvme.FrameEntry(b, f)
	slot := -1
	for i := 0; i < nvme.FrameBucketEntries; i++ {
		cur := atomic.LoadUint64(m.word(at + 8*i))
		if cur == e {
			return
		}
		if cur == 0 && slot < 0 {
			slot = i
		}
	}
	if slot < 0 {
		slot = int(b % nvme.FrameBucketEntries)
		if ob, of, ok := nvme.ParseFrameEntry(atomic.LoadUint64(m.word(at + 8*slot))); ok && !m.busy[of] {
			m.evictLocked(ob, of)
			m.evictions.Add(1)
		}
	}
	atomic.StoreUint64(m.word(at+8*slot), e)
}

func (m *frameMirror) unpublishLocked(b uint64, f uint32) {
	at := m.bucketOf(b)
	e := nvme.FrameEntry(b, f)
	for i := 0; i < nvme.FrameBucketEntries; i++ {
		if atomic.LoadUint64(m.word(at+8*i)) == e {
			atomic.StoreUint64(m.word(at+8*i), 0)
		}
	}
}

// invalidate empties the frames of blocks [first, first+n) after their
// content changed in the store, before the change is acknowledged.
func (m *frameMirror) invalidate(first, n uint64) {
	if n > mirrorStripes {
		// A large trim: every stripe moves, and the frames are found by
		// scanning them rather than the blocks.
		for i := range m.stripes {
			m.stripes[i].mu.Lock()
			m.stripes[i].gen.Add(1)
		}
		m.mu.Lock()
		for f, owner := range m.owner {
			if b := owner - 1; owner != 0 && b >= first && b-first < n {
				m.evictLocked(b, uint32(f))
				m.invalidations.Add(1)
			}
		}
		m.mu.Unlock()
		for i := range m.stripes {
			m.stripes[i].mu.Unlock()
		}
		return
	}
	for b := first; b < first+n; b++ {
		s := &m.stripes[m.stripe(b)]
		s.mu.Lock()
		s.gen.Add(1)
		m.mu.Lock()
		if f, ok := m.at[b]; ok {
			m.evictLocked(b, f)
			m.invalidations.Add(1)
		}
		m.mu.Unlock()
		s.mu.Unlock()
	}
}

// mirroredStore is a namespace's store whose changes empty the frames of
// the blocks they change (see frameMirror).
type mirroredStore struct {
	store
	m *frameMirror
}

func blockSpan(off, n int64) (uint64, uint64) {
	return uint64(off / BlockSize), uint64((off%BlockSize + n + BlockSize - 1) / BlockSize)
}

func (s *mirroredStore) WriteAt(p []byte, off int64) (int, error) {
	n, err := s.store.WriteAt(p, off)
	s.m.invalidate(blockSpan(off, int64(len(p))))
	return n, err
}

func (s *mirroredStore) WriteAtFUA(p []byte, off int64) (int, error) {
	n, err := s.store.WriteAtFUA(p, off)
	s.m.invalidate(blockSpan(off, int64(len(p))))
	return n, err
}

func (s *mirroredStore) Trim(off, length int64) error {
	err := s.store.Trim(off, length)
	s.m.invalidate(blockSpan(off, length))
	return err
}

func (s *mirroredStore) WriteZeroes(off, length int64) error {
	err := s.store.WriteZeroes(off, length)
	s.m.invalidate(blockSpan(off, length))
	return err
}

// readInstalling reads p at off (block aligned, at most a transfer) and
// copies the blocks into frames, for a host that reads frames.
func (s *mirroredStore) readInstalling(p []byte, off int64) (int, error) {
	var gens [DefaultMaxTransferBytes / BlockSize]uint64
	nb := len(p) / BlockSize
	if nb > len(gens) || off%BlockSize != 0 || len(p)%BlockSize != 0 {
		return s.store.ReadAt(p, off)
	}
	first := uint64(off / BlockSize)
	s.m.gens(first, gens[:nb])
	n, err := s.store.ReadAt(p, off)
	if err == nil {
		s.m.install(first, p, gens[:nb])
	}
	return n, err
}

// FrameStats are a namespace's frame counters (all zero where frames are
// not used).
type FrameStats struct {
	Frames        int   // frames of the pool
	PinnedBytes   int64 // the frames and the table, registered pinned
	Installs      uint64
	Invalidations uint64 // frames emptied because their block changed
	Evictions     uint64 // frames taken for another block
	// RegisterTime is how long registering the frames and the table took
	// (pinning them, on a hardware NIC), once, when the namespace was added.
	RegisterTime time.Duration
}

// FrameStats returns the namespace's frame counters.
func (n *Namespace) FrameStats() FrameStats {
	m := n.mirror
	if m == nil {
		return FrameStats{}
	}
	return FrameStats{Frames: int(m.frames), PinnedBytes: m.pinnedBytes(), Installs: m.installs.Load(),
		Invalidations: m.invalidations.Load(), Evictions: m.evictions.Load(), RegisterTime: m.regTime}
}

// frameCollector exports the namespaces' frame counters at scrape time:
// nprdma_target_frames, _frame_pinned_bytes, _frame_installs_total,
// _frame_invalidations_total, _frame_evictions_total, by subsystem and
// namespace.
type frameCollector struct {
	t                                           *Target
	frames, pinned, installs, invalidated, evic *prometheus.Desc
}

func newFrameCollector(t *Target) *frameCollector {
	l := []string{"subsystem", "nsid"}
	return &frameCollector{t: t,
		frames:      prometheus.NewDesc("nprdma_target_frames", "Frames of a namespace's pool, read one-sided by hosts on RDMA NICs.", l, nil),
		pinned:      prometheus.NewDesc("nprdma_target_frame_pinned_bytes", "Memory the frames and their table pin.", l, nil),
		installs:    prometheus.NewDesc("nprdma_target_frame_installs_total", "Blocks copied into frames after a host read them two-sided.", l, nil),
		invalidated: prometheus.NewDesc("nprdma_target_frame_invalidations_total", "Frames emptied because their block changed.", l, nil),
		evic:        prometheus.NewDesc("nprdma_target_frame_evictions_total", "Frames taken for another block.", l, nil),
	}
}

func (c *frameCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.frames, c.pinned, c.installs, c.invalidated, c.evic} {
		ch <- d
	}
}

func (c *frameCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.t.Subsystems() {
		for _, n := range s.Namespaces() {
			if n.mirror == nil {
				continue
			}
			fs := n.FrameStats()
			l := []string{s.NQN(), strconv.FormatUint(uint64(n.nsid), 10)}
			ch <- prometheus.MustNewConstMetric(c.frames, prometheus.GaugeValue, float64(fs.Frames), l...)
			ch <- prometheus.MustNewConstMetric(c.pinned, prometheus.GaugeValue, float64(fs.PinnedBytes), l...)
			ch <- prometheus.MustNewConstMetric(c.installs, prometheus.CounterValue, float64(fs.Installs), l...)
			ch <- prometheus.MustNewConstMetric(c.invalidated, prometheus.CounterValue, float64(fs.Invalidations), l...)
			ch <- prometheus.MustNewConstMetric(c.evic, prometheus.CounterValue, float64(fs.Evictions), l...)
		}
	}
}
