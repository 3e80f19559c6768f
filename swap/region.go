// Package swap is SSD-backed memory: a Region is a mapping as large as a
// namespace, several times larger than the DRAM it may use. Resident pages
// stay within a budget; cold pages are written back to the backing device
// (their durable home: page i lives at offset i*PageSize) and released. The
// explicit API (ReadAt, WriteAt, Trim, Flush, ...) is what the target's
// command paths use; a per-page state word table lets the NIC engine of
// nprdma read pages with a seqlock (ReadBegin/ReadEnd, the nprdma.Pager
// method set); userfaultfd keeps the raw []byte view correct for any other
// code that touches an absent page. See docs/swap.md.
package swap

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nprdma/nprdma/blockdev"
)

// PageSize is the granularity of the region, its state table and its I/O.
const PageSize = 4096

const (
	// maxRun bounds how many consecutive pages one backing read or write
	// covers (faults read ahead within a request, writeback coalesces).
	maxRun = 32
	// trimChunk is how many pages one discard of the backing covers.
	trimChunk = 16384
	// minBudget is the smallest budget in pages.
	minBudget = 16
)

// Region is SSD-backed memory over a blockdev.Device. All methods are safe for
// concurrent use. Bytes and States stay valid until Close.
type Region struct {
	dev    blockdev.Device
	path   string
	cfg    config
	log    *slog.Logger
	obs    Observer
	c      *cRegion
	mem    []byte   // the whole reservation (maxPages)
	states []uint64 // the whole reservation (maxPages)
	// npages is the region's size in pages; Grow raises it up to maxPages,
	// under growMu. Nothing reads a page at or beyond it.
	npages   atomic.Int64
	maxPages int64
	growMu   sync.Mutex
	holes    holeList

	budget   int64  // pages
	margin   int64  // pages the evictor keeps free once the region outgrows its budget (freeMargin)
	resident *int64 // shared with C: mapped pages + reservations

	dirtyLimit int64
	dirtyLow   int64
	dirty      dirtySet

	polMu sync.Mutex
	pol   evictionPolicy

	waiters waitTable
	bufs    bufferPools

	minorFaults, majorFaults, faultErrors      atomic.Uint64
	evictions, writebacks, writebackErrors     atomic.Uint64
	reclaimStalls, adviseDropped, adviseErrors atomic.Uint64

	closed   atomic.Bool
	inflight atomic.Int64
	closeMu  sync.RWMutex // orders Stats against the release of the C half
	stop     chan struct{}
	wg       sync.WaitGroup

	evictKick  chan struct{}
	fillNotify chan struct{}
	wbKick     []chan struct{}
	adviseQ    chan span
	notify     *os.File // eventfd the fault threads signal after a fill
	notifyDone chan struct{}
	shared     sharedFiles // WithShareable
}

type span struct{ off, length int64 }

// New creates a region over dev. The region's size is dev.Size() rounded down
// to PageSize unless WithSize says otherwise; creation costs the same whatever
// the size (nothing proportional to the page count is touched). The caller
// keeps ownership of dev and closes it after Region.Close.
func New(dev blockdev.Device, opts ...Option) (*Region, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	path := dev.Path()
	fail := func(err error) (*Region, error) {
		return nil, &Error{Op: "create", Path: path, Err: err}
	}
	if bs := dev.BlockSize(); bs <= 0 || PageSize%bs != 0 {
		return fail(fmt.Errorf("device block size %d does not divide the page size %d", bs, PageSize))
	}
	size := dev.Size() - dev.Size()%PageSize
	if cfg.size != 0 {
		if cfg.size < 0 || cfg.size%PageSize != 0 {
			return fail(fmt.Errorf("size %d is not a positive multiple of %d", cfg.size, PageSize))
		}
		if cfg.size > size {
			return fail(fmt.Errorf("%w: size %d exceeds the device's %d bytes", ErrOutOfRange, cfg.size, size))
		}
		size = cfg.size
	}
	if size <= 0 {
		return fail(fmt.Errorf("%w: device holds %d bytes, less than one page", blockdev.ErrTooSmall, dev.Size()))
	}
	npages := size / PageSize
	maxPages := npages
	if cfg.maxSize != 0 {
		if cfg.maxSize%PageSize != 0 || cfg.maxSize < size {
			return fail(fmt.Errorf("maximum size %d is not a multiple of %d at least the size %d", cfg.maxSize, PageSize, size))
		}
		maxPages = cfg.maxSize / PageSize
	}
	if maxPages > 1<<32-1 {
		return fail(fmt.Errorf("%d pages exceed the limit of 2^32-1", maxPages))
	}
	budget := cfg.budget / PageSize
	if cfg.budget == 0 {
		budget = npages / 4
	}
	budget = min(max(budget, minBudget), maxPages)

	if cfg.policy != PolicyCLOCK && cfg.policy != PolicyS3FIFO {
		return fail(fmt.Errorf("unknown eviction policy %v", cfg.policy))
	}

	fd, _, haveFd := blockdev.FdOf(dev)
	if cfg.uffd && !haveFd {
		return fail(errors.New("userfaultfd needs a file descriptor under the device (use WithoutUserfaultfd for the explicit API only)"))
	}
	var holes holeList
	if cfg.zeroScan && haveFd {
		h, err := scanHoles(int(fd), size)
		if err != nil {
			return fail(fmt.Errorf("scan for holes: %w", err))
		}
		holes = h
	}

	r := &Region{
		dev:        dev,
		path:       path,
		cfg:        cfg,
		log:        cfg.logger.With("region", path),
		obs:        cfg.observer,
		maxPages:   maxPages,
		holes:      holes,
		budget:     budget,
		stop:       make(chan struct{}),
		evictKick:  make(chan struct{}, 1),
		fillNotify: make(chan struct{}, 1),
		adviseQ:    make(chan span, max(cfg.adviseQueue, 1)),
		notifyDone: make(chan struct{}),
	}
	if r.obs == nil {
		r.obs = nopObserver{}
	}
	r.margin = int64(cfg.freeMargin)
	if cfg.freeMargin < 0 {
		r.margin = min(max(budget/16, 1), 4096)
	}
	r.margin = min(r.margin, budget-1)
	r.npages.Store(npages)
	r.dirtyLimit = int64(cfg.dirtyLimit)
	if cfg.dirtyLimit <= 0 {
		r.dirtyLimit = max(budget/4, 1)
	}
	r.dirtyLow = r.dirtyLimit * 3 / 4
	r.dirty.init()
	r.waiters.init()
	r.bufs.init()
	r.pol = newPolicy(cfg.policy, int(budget))

	notifyFd := -1
	if cfg.uffd {
		efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			return fail(fmt.Errorf("eventfd: %w", err))
		}
		notifyFd = efd
		r.notify = os.NewFile(uintptr(efd), "swap-fill-notify")
	}
	backingFd := -1
	if haveFd {
		backingFd = int(fd)
	}
	if cfg.shareable {
		// The files cover the reservation (sparse until written): the
		// region maps them whole, and Grow only raises npages.
		if err := r.shared.open(maxPages); err != nil {
			r.shared.close()
			if r.notify != nil {
				r.notify.Close()
			}
			return fail(fmt.Errorf("shareable memory: %w", err))
		}
	}
	c, err := newCRegion(cRegionConfig{
		size:      maxPages * PageSize,
		uffd:      cfg.uffd,
		backingFd: backingFd,
		threads:   max(cfg.faultThreads, 1),
		queueCap:  int(min(max(budget, 4096), 1<<20)),
		holes:     holes,
		notifyFd:  notifyFd,
		dataFd:    fileFD(r.shared.data),
		statesFd:  fileFD(r.shared.states),
	})
	if err != nil {
		r.shared.close()
		if r.notify != nil {
			r.notify.Close()
		}
		return fail(err)
	}
	r.c, r.mem, r.states, r.resident = c, c.base, c.states, c.resident()

	r.wg.Add(1)
	go r.evictor()
	r.wbKick = make([]chan struct{}, max(cfg.writebackWorkers, 1))
	for i := range r.wbKick {
		r.wbKick[i] = make(chan struct{}, 1)
	}
	for i, ch := range r.wbKick {
		r.wg.Add(1)
		go r.writebackWorker(i, ch)
	}
	// Two advisers keep two prefetches in flight (the device serves
	// several reads at once).
	for range 2 {
		r.wg.Add(1)
		go r.adviser()
	}
	if r.notify != nil {
		go r.readNotifications()
	} else {
		close(r.notifyDone)
	}
	if a, ok := r.obs.(regionAttacher); ok {
		a.attach(r)
	}
	return r, nil
}

// freeMargin is how many budget slots the evictor keeps free: none while
// every page of the region's present size fits in the budget (a margin would
// only keep part of a fully budgeted region out of memory, however far
// WithMaxSize lets it grow), r.margin once Grow made it larger than the
// budget.
func (r *Region) freeMargin() int64 {
	if r.budget >= r.npages.Load() {
		return 0
	}
	return r.margin
}

// Size is the region's size in bytes.
func (r *Region) Size() int64 { return r.npages.Load() * PageSize }

// MaxSize is the size the region may Grow to (WithMaxSize).
func (r *Region) MaxSize() int64 { return r.maxPages * PageSize }

// PageSize is the region's page size (4096).
func (r *Region) PageSize() int { return PageSize }

// NumPages is the number of pages in the region.
func (r *Region) NumPages() int { return int(r.npages.Load()) }

// Grow makes the region size bytes long: a multiple of PageSize, at least
// its size and at most MaxSize, and the device must hold that much already
// (blockdev.Grow). The pages added are absent and fault in from the device
// like any other (a grown file's new range is a hole: zeros). Bytes and
// States cover the new size from then on; a registration made before
// (nprdma.PD.RegisterUnpinned takes Bytes once) keeps its length. The budget
// does not change. Operations in flight are not disturbed: those admitted
// before the growth were checked against the old size, which stays valid.
func (r *Region) Grow(size int64) error {
	r.growMu.Lock()
	defer r.growMu.Unlock()
	fail := func(err error) error { return &Error{Op: "grow", Path: r.path, Err: err} }
	if !r.enter() {
		return fail(ErrClosed)
	}
	defer r.exit()
	cur := r.Size()
	switch {
	case size%PageSize != 0 || size < cur:
		return fail(fmt.Errorf("size %d is not a multiple of %d at least the region's %d bytes", size, PageSize, cur))
	case size > r.MaxSize():
		return fail(fmt.Errorf("%w: size %d is beyond the %d bytes reserved for the region (WithMaxSize)", ErrOutOfRange, size, r.MaxSize()))
	case size > r.dev.Size():
		return fail(fmt.Errorf("%w: size %d is beyond the device's %d bytes (grow the device first)", ErrOutOfRange, size, r.dev.Size()))
	}
	r.npages.Store(size / PageSize)
	return nil
}

// Path names the backing device.
func (r *Region) Path() string { return r.path }

// Bytes is the raw view of the whole region. With userfaultfd (the default),
// touching an absent page blocks until the fault threads have mapped its
// current content. Reads only: a write through the view is not tracked as
// dirty and may be lost; write with WriteAt. Unless WithoutUserfaultfd, a page
// whose backing read fails repeatedly raises SIGBUS in the toucher (see
// runtime/debug.SetPanicOnFault).
func (r *Region) Bytes() []byte {
	if r.mem == nil {
		return nil // closed
	}
	return r.mem[:r.Size()]
}

// States is the page state word table (see state.go). Callers must use atomic
// loads only and must not write it.
func (r *Region) States() []uint64 { return r.states[:r.npages.Load()] }

// Budget is the DRAM budget in pages.
func (r *Region) Budget() int { return int(r.budget) }

// Stats is a snapshot of a region's counters. Page counts are in pages.
type Stats struct {
	Policy          string
	Pages           int64 // pages in the region
	Budget          int64 // DRAM budget
	Resident        int64 // resident pages (plus in-flight fault reservations)
	Dirty           int64 // pages newer than the backing device
	MinorFaults     uint64
	MajorFaults     uint64
	FaultErrors     uint64 // fault-ins that failed (backing read error, no memory)
	Evictions       uint64
	Writebacks      uint64 // pages written back (background, eviction, flush, FUA)
	WritebackErrors uint64 // pages whose writeback failed (they stay dirty)
	ReclaimStalls   uint64 // operations that had to evict before they could proceed
	UffdFaults      uint64 // faults on the raw view served by the fault threads
	UffdMinorFaults uint64
	UffdMajorFaults uint64
	UffdShared      uint64 // raw faults on a page another fault thread was filling (no second read)
	UffdFillErrors  uint64 // failed backing reads in the fault threads
	UffdPoisoned    uint64 // pages poisoned (SIGBUS) after repeated read failures
	UffdUntracked   uint64 // filled pages the evictor was not told about (queue full)
	AdviseDropped   uint64 // Advise requests dropped because the queue was full
	AdviseErrors    uint64 // prefetches queued by Advise that failed
}

// Stats returns the region's counters.
func (r *Region) Stats() Stats {
	st := Stats{
		Policy:          r.cfg.policy.String(),
		Pages:           r.npages.Load(),
		Budget:          r.budget,
		Dirty:           r.dirty.count.Load(),
		MinorFaults:     r.minorFaults.Load(),
		MajorFaults:     r.majorFaults.Load(),
		FaultErrors:     r.faultErrors.Load(),
		Evictions:       r.evictions.Load(),
		Writebacks:      r.writebacks.Load(),
		WritebackErrors: r.writebackErrors.Load(),
		ReclaimStalls:   r.reclaimStalls.Load(),
		AdviseDropped:   r.adviseDropped.Load(),
		AdviseErrors:    r.adviseErrors.Load(),
	}
	r.closeMu.RLock()
	defer r.closeMu.RUnlock()
	if r.c == nil {
		return st
	}
	st.Resident = atomic.LoadInt64(r.resident)
	k := r.c.counters()
	st.UffdFaults, st.UffdMinorFaults, st.UffdMajorFaults, st.UffdShared = k.faults, k.minor, k.major, k.shared
	st.UffdFillErrors, st.UffdPoisoned, st.UffdUntracked = k.errors, k.poisoned, k.overflows
	return st
}

// enter admits an operation unless the region is closing; exit ends it.
func (r *Region) enter() bool {
	r.inflight.Add(1)
	if r.closed.Load() {
		r.inflight.Add(-1)
		return false
	}
	return true
}

func (r *Region) exit() { r.inflight.Add(-1) }

func (r *Region) checkRange(op string, off, n int64) error {
	if off < 0 || n < 0 || off > r.Size() || n > r.Size()-off {
		return &Error{Op: op, Path: r.path, Err: fmt.Errorf("%w: [%d, +%d) in a region of %d bytes", ErrOutOfRange, off, n, r.Size())}
	}
	return nil
}

// Close writes back every dirty page, flushes the device, stops the workers
// and the fault threads and unmaps the region. It waits for operations in
// progress. The NIC engine must have stopped reading (ReadBegin) before; Bytes
// and States must not be used afterwards. The device stays open. A flush error
// is returned, but the region is released anyway.
func (r *Region) Close() error {
	if !r.closed.CompareAndSwap(false, true) {
		return nil
	}
	for r.inflight.Load() > 0 {
		time.Sleep(100 * time.Microsecond)
	}
	close(r.stop)
	r.wg.Wait()
	err := r.flush()
	if a, ok := r.obs.(regionAttacher); ok {
		a.detach(r)
	}
	// The fault threads stop before the eventfd they write to is closed.
	r.closeMu.Lock()
	r.c.destroy()
	r.c = nil
	r.shared.close()
	r.closeMu.Unlock()
	if r.notify != nil {
		r.notify.Close()
	}
	<-r.notifyDone
	r.mem, r.states = nil, nil
	return err
}

// readNotifications turns the fault threads' eventfd into a channel signal for
// the evictor, which then starts tracking the pages they filled.
func (r *Region) readNotifications() {
	defer close(r.notifyDone)
	var b [8]byte
	for {
		if _, err := r.notify.Read(b[:]); err != nil {
			return
		}
		select {
		case r.fillNotify <- struct{}{}:
		default:
		}
	}
}

// track gives a present, untracked page an entry in the eviction policy.
func (r *Region) track(page int) {
	w := &r.states[page]
	for {
		s := atomic.LoadUint64(w)
		if s&StateTracked != 0 || s&StatePresent == 0 {
			return
		}
		if atomic.CompareAndSwapUint64(w, s, s|StateTracked) {
			break
		}
	}
	r.insert(page)
}

func (r *Region) insert(page int) {
	r.polMu.Lock()
	r.pol.insert(uint32(page))
	r.polMu.Unlock()
}

// drainFills tracks the pages the fault threads filled and heals the ones
// they poisoned.
func (r *Region) drainFills() {
	if r.c == nil || !r.c.uffd {
		return
	}
	var buf [256]uint64
	for {
		n := r.c.drainFills(buf[:])
		for _, p := range buf[:n] {
			if p&fillPoisoned != 0 {
				// The toucher has had its SIGBUS (or will fault
				// again and retry the read): let the next touch try
				// the device again.
				r.c.heal(int(p &^ fillPoisoned))
				continue
			}
			r.track(int(p))
		}
		if n < len(buf) {
			return
		}
	}
}

// bufferPools recycles page-aligned I/O buffers (O_DIRECT needs alignment).
type bufferPools struct {
	page, run sync.Pool
}

func (b *bufferPools) init() {
	b.page.New = func() any { p := blockdev.AlignedBuffer(PageSize); return &p }
	b.run.New = func() any { p := blockdev.AlignedBuffer(maxRun * PageSize); return &p }
}

func (b *bufferPools) get(pages int) *[]byte {
	if pages <= 1 {
		return b.page.Get().(*[]byte)
	}
	return b.run.Get().(*[]byte)
}

func (b *bufferPools) put(p *[]byte) {
	if len(*p) == PageSize {
		b.page.Put(p)
	} else {
		b.run.Put(p)
	}
}

// holeList holds page ranges [start, end) (pairs, sorted) that were holes in
// the backing file at New.
type holeList []int64

func (h holeList) contains(page int) bool {
	n := len(h) / 2
	lo, hi := 0, n
	for lo < hi {
		mid := (lo + hi) / 2
		if h[2*mid+1] <= int64(page) {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo < n && h[2*lo] <= int64(page)
}

// scanHoles finds the pages wholly inside holes of a regular file, in
// O(extents) with SEEK_HOLE/SEEK_DATA. Block devices and file systems without
// hole reporting yield none.
func scanHoles(fd int, size int64) (holeList, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, nil
	}
	var holes holeList
	for off := int64(0); off < size; {
		hole, err := unix.Seek(fd, off, unix.SEEK_HOLE)
		if err != nil {
			if errors.Is(err, unix.ENXIO) {
				break
			}
			if errors.Is(err, unix.EINVAL) {
				return nil, nil // no hole reporting here
			}
			return nil, err
		}
		if hole >= size {
			break
		}
		data, err := unix.Seek(fd, hole, unix.SEEK_DATA)
		if err != nil {
			if !errors.Is(err, unix.ENXIO) {
				return nil, err
			}
			data = size
		}
		data = min(data, size)
		start, end := (hole+PageSize-1)/PageSize, data/PageSize
		if end > start {
			holes = append(holes, start, end)
		}
		off = data
	}
	return holes, nil
}
