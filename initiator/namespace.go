package initiator

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nprdma/nprdma/initiator/blockio"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nvme"
)

// Namespace is a namespace of a connected controller, usable as a block
// device: it implements blockio.Backend. Offsets and lengths are multiples
// of BlockSize. Its methods survive reconnects: an operation interrupted by
// the loss of the connection is retried on the next one, and fails with
// ErrControllerLost only when the controller is lost for good (or with
// ErrNamespaceChanged once the target serves another namespace under its
// NSID: Changed).
type Namespace struct {
	c      *Controller
	nsid   uint32
	blocks atomic.Uint64 // grows when the target resizes the namespace (events.go)
	nguid  [16]byte
	uuid   nvme.UUID
	grown  chan struct{} // a value whenever blocks grows (buffered by one)

	changed     atomic.Pointer[namespaceChange] // set for good once the target serves another namespace under nsid
	changedDone chan struct{}                   // closed then
	verified    atomic.Pointer[session]         // the session in which the identity was last checked

	durability   durability
	lossReported chan struct{} // a value whenever PossiblyLost grows (buffered by one)
}

// Unflushed is what a namespace acknowledged that no successful Flush has
// covered yet: completed writes without FUA, trims and write-zeroes, which
// the target may hold in its volatile cache only.
type Unflushed struct {
	Commands int64 // writes, trims and write-zeroes
	Bytes    int64 // the bytes they changed
}

// durability counts the changes acknowledged and those a successful Flush
// covered. A Flush covers what completed before it was sent, so it takes
// its snapshot then; one that fails covers nothing. A target restart ends
// what is unflushed: the target flushed it at a clean shutdown, or it may
// be lost (counted in lost).
type durability struct {
	mu       sync.Mutex
	acked    Unflushed // cumulative
	flushed  Unflushed // the acked snapshot of the latest successful Flush
	lost     Unflushed // cumulative: unflushed when the target restarted uncleanly
	instance nvme.NPInstance
	gen      uint64 // the generation of the session instance was seen in
}

// changed counts a change acknowledged in the session of generation gen,
// by target instance by. A completion processed after a later session's
// instance was recorded, from a target process that has restarted since,
// was passed by that restart's settlement: it is settled here the same
// way, not counted as unflushed on the new process — lost if the restart
// may have lost it (returned true), else flushed by the clean shutdown.
func (d *durability) changed(bytes int64, gen uint64, by nvme.NPInstance) (lost bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if gen < d.gen {
		if restarted, mayHaveLost := d.instance.RestartedSince(by); restarted {
			if mayHaveLost {
				d.lost.Commands++
				d.lost.Bytes += bytes
			}
			return mayHaveLost
		}
	}
	d.acked.Commands++
	d.acked.Bytes += bytes
	return false
}

func (d *durability) snapshot() Unflushed {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.acked
}

func (d *durability) covered(upTo Unflushed) {
	d.mu.Lock()
	if upTo.Commands > d.flushed.Commands {
		d.flushed = upTo
	}
	d.mu.Unlock()
}

// sawInstance records the target instance of a new session, of generation
// gen. If the target restarted since the last one, what was unflushed stops
// being so: kept by a clean shutdown, or counted lost and returned. A
// session older than the last one recorded (a check that raced with a
// reconnect) changes nothing.
func (d *durability) sawInstance(gen uint64, now nvme.NPInstance) (restarted, mayHaveLost bool, unflushed Unflushed) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if gen < d.gen {
		return false, false, Unflushed{}
	}
	d.gen = gen
	restarted, mayHaveLost = now.RestartedSince(d.instance)
	if now.BootID != 0 {
		d.instance = now
	}
	if !restarted {
		return false, false, Unflushed{}
	}
	unflushed = Unflushed{Commands: d.acked.Commands - d.flushed.Commands, Bytes: d.acked.Bytes - d.flushed.Bytes}
	d.flushed = d.acked
	if mayHaveLost {
		d.lost.Commands += unflushed.Commands
		d.lost.Bytes += unflushed.Bytes
	}
	return restarted, mayHaveLost, unflushed
}

// Unflushed reports the changes the namespace acknowledged since the
// snapshot of its last successful Flush: what a lost controller may have
// lost. A FUA write is durable when acknowledged and is not counted.
func (n *Namespace) Unflushed() Unflushed {
	d := &n.durability
	d.mu.Lock()
	defer d.mu.Unlock()
	return Unflushed{Commands: d.acked.Commands - d.flushed.Commands, Bytes: d.acked.Bytes - d.flushed.Bytes}
}

// PossiblyLost reports the changes the namespace acknowledged that were
// still unflushed when the target restarted without a clean shutdown (or
// without a record of how it stopped): its volatile cache may have lost
// them. It only grows; a later Flush does not bring them back.
func (n *Namespace) PossiblyLost() Unflushed {
	d := &n.durability
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lost
}

// LossReported receives a value whenever PossiblyLost grows, so that
// whoever must know (attach's record, for list) need not poll. It is
// buffered by one: a reader that comes late reads the latest count.
func (n *Namespace) LossReported() <-chan struct{} { return n.lossReported }

// noteInstance checks the target instance of session s against the one
// the namespace last saw, and says what a restart did to the unflushed
// changes.
func (n *Namespace) noteInstance(s *session) {
	restarted, mayHaveLost, u := n.durability.sawInstance(s.gen, s.ident.NP)
	switch {
	case !restarted:
	case mayHaveLost && u.Commands > 0:
		n.reportLoss()
		n.c.cfg.log.Error("initiator: the target restarted without a clean shutdown; changes acknowledged since the last flush may be lost",
			"subsystem", n.c.subNQN, "nsid", n.nsid, "changes", u.Commands, "bytes", u.Bytes)
	default:
		n.c.cfg.log.Info("initiator: the target restarted; nothing unflushed was at risk",
			"subsystem", n.c.subNQN, "nsid", n.nsid, "clean", !mayHaveLost)
	}
}

func (n *Namespace) reportLoss() {
	select {
	case n.lossReported <- struct{}{}:
	default: // one is pending: its reader reads the latest count
	}
}

// acknowledged counts a write, trim or write-zeroes that session s
// completed (see durability.changed).
func (n *Namespace) acknowledged(s *session, bytes int64) {
	if !n.durability.changed(bytes, s.gen, s.ident.NP) {
		return
	}
	n.reportLoss()
	n.c.cfg.log.Error("initiator: a change acknowledged by the target before it restarted without a clean shutdown may be lost",
		"subsystem", n.c.subNQN, "nsid", n.nsid, "bytes", bytes)
}

var _ blockio.Backend = (*Namespace)(nil)

// Namespace identifies namespace nsid and fetches its region descriptor.
// While the target serves the same namespace under nsid, every call returns
// the same handle (checked against the target first); once it has changed,
// the next call returns a new handle for what nsid is now.
func (c *Controller) Namespace(ctx context.Context, nsid uint32) (*Namespace, error) {
	if n := c.openNamespace(nsid); n != nil {
		err := n.do(ctx, func(*session) error { return nil })
		if err == nil {
			return n, nil
		}
		if !errors.Is(err, ErrNamespaceChanged) {
			return nil, err
		}
	}
	n := &Namespace{c: c, nsid: nsid, changedDone: make(chan struct{}), lossReported: make(chan struct{}, 1), grown: make(chan struct{}, 1)}
	err := c.do(ctx, func(s *session) error {
		id, err := s.identifyNamespace(ctx, nsid)
		if err != nil {
			return err
		}
		n.blocks.Store(id.NSZE)
		n.nguid = id.NGUID
		n.durability.sawInstance(s.gen, s.ident.NP)
		n.verified.Store(s)
		ids := make([]byte, nvme.IdentifySize)
		if _, err := s.admin.Submit(ctx, nvme.IdentifyCommand(nvme.CNSNamespaceDescriptors, nsid, nvme.NullSGL()), ids); err == nil {
			var d nvme.NamespaceIDs
			if d.Unmarshal(ids) == nil {
				n.uuid = d.UUID
			}
		}
		_, err = s.region(ctx, nsid)
		return err
	})
	if err != nil {
		return nil, err
	}
	c.nsMu.Lock()
	// Handles that failed for good need no more checks: the list holds at
	// most one live handle per NSID, however often Namespace is called.
	c.namespaces = slices.DeleteFunc(c.namespaces, func(o *Namespace) bool { return o.changed.Load() != nil })
	if o := c.liveNamespaceLocked(nsid); o != nil {
		c.nsMu.Unlock()
		return o, nil // a concurrent call got there first
	}
	c.namespaces = append(c.namespaces, n)
	c.nsMu.Unlock()
	return n, nil
}

// openNamespace returns the live handle for nsid, if there is one.
func (c *Controller) openNamespace(nsid uint32) *Namespace {
	c.nsMu.Lock()
	defer c.nsMu.Unlock()
	return c.liveNamespaceLocked(nsid)
}

func (c *Controller) liveNamespaceLocked(nsid uint32) *Namespace {
	for _, n := range c.namespaces {
		if n.nsid == nsid && n.changed.Load() == nil {
			return n
		}
	}
	return nil
}

// identifyNamespace reads Identify Namespace for nsid in session s and
// checks that it is active with 4 KiB blocks.
func (s *session) identifyNamespace(ctx context.Context, nsid uint32) (nvme.IdentifyNamespace, error) {
	var id nvme.IdentifyNamespace
	buf := make([]byte, nvme.IdentifySize)
	if _, err := s.admin.Submit(ctx, nvme.IdentifyCommand(nvme.CNSNamespace, nsid, nvme.NullSGL()), buf); err != nil {
		return id, fmt.Errorf("initiator: identify namespace %d of %s: %w", nsid, s.c.subNQN, err)
	}
	if err := id.Unmarshal(buf); err != nil {
		return id, err
	}
	if id.NSZE == 0 { // inactive: as the I/O commands would answer
		return id, fmt.Errorf("initiator: namespace %d of %s is not active: %w", nsid, s.c.subNQN, nvme.StatusInvalidNamespaceOrFormat)
	}
	bs, err := id.BlockSize()
	if err != nil {
		return id, err
	}
	if bs != BlockSize {
		return id, fmt.Errorf("initiator: namespace %d of %s has %d-byte blocks; only %d is supported", nsid, s.c.subNQN, bs, BlockSize)
	}
	return id, nil
}

// do runs fn on the live session, after checking once per session that the
// target still serves the namespace first identified under this NSID (same
// size and NGUID), as a Linux host does after a reconnect. A target
// restarted on another backing must not be read or written as this
// namespace: its reads would return the other disk's data, and a READ past
// its end fails the queue pair, which a reconnect would retry for ever. Once
// changed, the namespace fails every operation with ErrNamespaceChanged.
func (n *Namespace) do(ctx context.Context, fn func(s *session) error) error {
	if ch := n.changed.Load(); ch != nil {
		return ch.err
	}
	return n.c.do(ctx, func(s *session) error {
		if err := n.verify(ctx, s); err != nil {
			return err // a transport failure is retried by c.do; others fail this operation
		}
		return fn(s)
	})
}

// verify checks the namespace's identity in session s once per session,
// and settles what a target restart did to its unflushed changes.
func (n *Namespace) verify(ctx context.Context, s *session) error {
	if n.verified.Load() == s {
		return nil
	}
	if ch := n.changed.Load(); ch != nil {
		return ch.err
	}
	if err := n.identify(ctx, s); err != nil {
		return err
	}
	n.noteInstance(s)
	n.storeVerified(s)
	return nil
}

// storeVerified records s as the session the namespace was last checked
// in, unless a later one is already: a check that raced with a reconnect
// must not take the record back.
func (n *Namespace) storeVerified(s *session) {
	for {
		cur := n.verified.Load()
		if cur != nil && cur.gen > s.gen {
			return
		}
		if n.verified.CompareAndSwap(cur, s) {
			return
		}
	}
}

// namespaceChange is why and since when a namespace fails for good.
type namespaceChange struct {
	at  time.Time
	err error // wraps ErrNamespaceChanged
}

// markChanged fails the namespace for good with err, which wraps
// ErrNamespaceChanged, and returns it; the first call decides since when
// and why, and closes Changed.
func (n *Namespace) markChanged(err error) error {
	if n.changed.CompareAndSwap(nil, &namespaceChange{at: time.Now(), err: err}) {
		n.c.cfg.log.Error("initiator: the target no longer serves this namespace under its NSID; failing its I/O for good", "err", err)
		close(n.changedDone)
	}
	return err
}

// Changed is closed once the namespace fails for good with
// ErrNamespaceChanged: the target, on a new session, no longer serves the
// namespace first identified under this NSID (another size or NGUID, or
// none). The check runs before the namespace's first operation on each
// session, so the change is found by the first I/O after a reconnect.
func (n *Namespace) Changed() <-chan struct{} { return n.changedDone }

// Change says since when the namespace has failed for good with
// ErrNamespaceChanged and why (the error its I/O fails with, naming what
// changed); a zero time and nil while it has not.
func (n *Namespace) Change() (since time.Time, err error) {
	if ch := n.changed.Load(); ch != nil {
		return ch.at, ch.err
	}
	return time.Time{}, nil
}

// region returns the namespace's region descriptor in session s, fetching
// it on first use (nil: no one-sided reads for this namespace).
func (s *session) region(ctx context.Context, nsid uint32) (*nvme.RegionDescriptor, error) {
	if s.c.b.remote() == nil {
		return nil, nil // a transport without one-sided reads: nothing to ask for
	}
	s.mu.Lock()
	ri := s.regions[nsid]
	s.mu.Unlock()
	if ri != nil {
		return ri.desc, nil
	}
	ri = &regionInfo{}
	buf := make([]byte, nvme.RegionDescriptorSize)
	_, err := s.admin.Submit(ctx, nvme.NPGetRegionDescriptorCommand(nsid, nvme.NullSGL()), buf)
	switch {
	case err == nil:
		d, err := nvme.ParseRegionDescriptor(buf)
		if err != nil {
			return nil, fmt.Errorf("initiator: namespace %d: %w", nsid, err)
		}
		if d.Flags&nvme.RegionRemoteRead != 0 && d.PageSize == BlockSize && d.LBASize == BlockSize {
			ri.desc = &d
			ri.hints.max = 2 * int(d.Frames)
		}
	case errors.Is(err, nvme.StatusInvalidOpcode), errors.Is(err, nvme.StatusInvalidField):
		// A target without the NP extension (or not exporting this
		// namespace): two-sided reads only.
	default:
		return nil, fmt.Errorf("initiator: region descriptor of namespace %d: %w", nsid, err)
	}
	s.mu.Lock()
	s.regions[nsid] = ri
	s.mu.Unlock()
	return ri.desc, nil
}

// NSID is the namespace ID.
func (n *Namespace) NSID() uint32 { return n.nsid }

// NGUID is the namespace's globally unique identifier.
func (n *Namespace) NGUID() [16]byte { return n.nguid }

// UUID is the namespace's UUID (zero if the target reports none).
func (n *Namespace) UUID() nvme.UUID { return n.uuid }

// Size is the size in bytes.
func (n *Namespace) Size() int64 { return int64(n.blocks.Load()) * BlockSize }

// BlockSize is 4096.
func (n *Namespace) BlockSize() int { return BlockSize }

// Controller is the namespace's controller.
func (n *Namespace) Controller() *Controller { return n.c }

// RegionDescriptor is the namespace's region descriptor in the current
// session (nil without one-sided reads).
func (n *Namespace) RegionDescriptor(ctx context.Context) (*nvme.RegionDescriptor, error) {
	var d *nvme.RegionDescriptor
	err := n.do(ctx, func(s *session) error {
		var err error
		d, err = s.region(ctx, n.nsid)
		return err
	})
	return d, err
}

func (n *Namespace) check(op string, off, length int64) error {
	if !blockio.CheckRange(off, length, n.Size()) {
		return fmt.Errorf("initiator: %s namespace %d [%d, +%d): %w (size %d)", op, n.nsid, off, length, blockio.ErrOutOfRange, n.Size())
	}
	if off%BlockSize != 0 || length%BlockSize != 0 {
		return fmt.Errorf("initiator: %s namespace %d [%d, +%d): %w", op, n.nsid, off, length, blockio.ErrUnaligned)
	}
	return nil
}

// ReadAt reads len(p) bytes at off: one-sided where the pages are
// resident, NVMe Read for the rest.
func (n *Namespace) ReadAt(p []byte, off int64) (int, error) {
	return n.ReadAtContext(context.Background(), p, off)
}

// ReadAtContext is ReadAt bounded by ctx.
func (n *Namespace) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if err := n.check("read", off, int64(len(p))); err != nil {
		return 0, err
	}
	done := 0
	for done < len(p) {
		var k int
		err := n.do(ctx, func(s *session) error {
			k = min(len(p)-done, s.maxXfer)
			return n.readChunk(ctx, s, p[done:done+k], off+int64(done))
		})
		if err != nil {
			return done, err
		}
		done += k
	}
	return done, nil
}

// readChunk reads one transfer. With a region descriptor on a transport
// that reads one-sided: READ into a pool buffer, find the magic pages,
// re-read those with NVMe Read into the same buffer, copy out. Otherwise
// one NVMe Read.
func (n *Namespace) readChunk(ctx context.Context, s *session, p []byte, off int64) error {
	c := n.c
	start := time.Now()
	q := s.ioQueue(c)
	desc, err := s.region(ctx, n.nsid)
	if err != nil {
		return err
	}
	rq, oneSided := q.(remoteReader)
	rr := c.b.remote()
	// A range beyond the descriptor (the namespace grew since it was
	// fetched: events.go) is read two-sided: the registration covers no more.
	covered := desc != nil && uint64(off)+uint64(len(p)) <= desc.Length
	if covered && c.cfg.oneSided && oneSided && rr != nil && desc.Format == nvme.RegionDescriptorFormat2 {
		s.mu.Lock()
		ri := s.regions[n.nsid]
		s.mu.Unlock()
		return n.readFrames(ctx, q, rq, rr, ri, p, off, start)
	}
	if !covered || !c.cfg.oneSided || !oneSided || rr == nil {
		if err := n.readTwoSided(ctx, q, p, off); err != nil {
			return err
		}
		c.ctr.twoSidedReads.Add(1)
		c.observeRead(pathTwoSided, time.Since(start))
		return nil
	}
	buf, err := rr.pool.Get(len(p))
	if err != nil {
		return fmt.Errorf("initiator: read buffer: %w", err)
	}
	defer buf.Release()
	raddr := desc.Address + uint64(off)
	if err := rq.ReadRemote(ctx, buf, 0, len(p), raddr, desc.RKey); err != nil {
		return err
	}
	data := buf.Bytes()[:len(p)]
	pages := uint64(len(p) / BlockSize)
	c.ctr.oneSidedReads.Add(1)
	c.ctr.oneSidedPages.Add(pages)
	c.ctr.oneSidedBytes.Add(uint64(len(p)))
	var suspects []nprdma.PageRange
	if desc.Flags&nvme.RegionUnpinned != 0 {
		suspects = rr.dev.FindMagicPages(data, raddr, desc.Address, int(desc.PageSize), desc.Magic)
	}
	if len(suspects) == 0 {
		c.ctr.readsOneSided.Add(1)
		copy(p, data)
		c.observeRead(pathOneSided, time.Since(start))
		return nil
	}
	for _, r := range suspects {
		c.ctr.suspectedPages.Add(uint64(r.Len / BlockSize))
		cmd, err := n.readCmd(r.Len, off+int64(r.Off))
		if err != nil {
			return err
		}
		cqe, err := rq.SubmitBuffer(ctx, cmd, buf, r.Off, r.Len)
		if err := n.readDone(cqe, err, r.Len, off+int64(r.Off)); err != nil {
			return err
		}
		c.ctr.fallbackReads.Add(1)
		c.ctr.fallbackPages.Add(uint64(r.Len / BlockSize))
		// A page that still holds the magic pattern after the two-sided
		// read really holds it: a false positive, and the data is right.
		for pg := r.Off; pg < r.Off+r.Len; pg += BlockSize {
			if isMagicPage(data[pg:pg+BlockSize], desc.Magic) {
				c.ctr.falsePositives.Add(1)
			}
		}
	}
	copy(p, data)
	c.observeRead(pathFallback, time.Since(start))
	return nil
}

// isMagicPage reports whether a page (aligned to the region's pages) is
// the magic value repeated.
func isMagicPage(pg []byte, magic uint64) bool {
	if binary.LittleEndian.Uint64(pg) != magic {
		return false
	}
	for i := 8; i+8 <= len(pg); i += 8 {
		if binary.LittleEndian.Uint64(pg[i:]) != magic {
			return false
		}
	}
	return true
}

// readTwoSided reads p at off with one NVMe Read.
func (n *Namespace) readTwoSided(ctx context.Context, q hostQueue, p []byte, off int64) error {
	cmd, err := n.readCmd(len(p), off)
	if err != nil {
		return err
	}
	cqe, err := q.Submit(ctx, cmd, p)
	return n.readDone(cqe, err, len(p), off)
}

// readCmd is the NVMe Read of length bytes at off.
func (n *Namespace) readCmd(length int, off int64) (nvme.Command, error) {
	return nvme.ReadCommand(n.nsid, uint64(off)/BlockSize, uint32(length/BlockSize), 0, nvme.NullSGL())
}

// readDone takes the outcome of an NVMe Read of length bytes at off: its
// completion reports the faults the target resolved.
func (n *Namespace) readDone(cqe nvme.Completion, err error, length int, off int64) error {
	if err != nil {
		return fmt.Errorf("initiator: read namespace %d [%d, +%d): %w", n.nsid, off, length, err)
	}
	minor, major := faultReport(cqe.DW0)
	n.c.ctr.minorResolved.Add(uint64(minor))
	n.c.ctr.majorResolved.Add(uint64(major))
	return nil
}

// faultReport decodes the fault counts an nprdma target puts in DW0 of a
// Read completion (minor in bits 15:0, major in bits 31:16; 0 from other
// targets).
func faultReport(dw0 uint32) (minor, major int) { return int(dw0 & 0xffff), int(dw0 >> 16) }

// WriteAt writes p at off (into the target's volatile cache).
func (n *Namespace) WriteAt(p []byte, off int64) (int, error) { return n.write(p, off, 0) }

// WriteAtFUA writes p at off and returns once it is durable.
func (n *Namespace) WriteAtFUA(p []byte, off int64) (int, error) { return n.write(p, off, nvme.FUA) }

func (n *Namespace) write(p []byte, off int64, flags nvme.IOFlag) (int, error) {
	if err := n.check("write", off, int64(len(p))); err != nil {
		return 0, err
	}
	ctx := context.Background()
	done := 0
	for done < len(p) {
		var k int
		err := n.do(ctx, func(s *session) error {
			k = min(len(p)-done, s.maxXfer)
			start := time.Now()
			cmd, err := nvme.WriteCommand(n.nsid, uint64(off+int64(done))/BlockSize, uint32(k/BlockSize), flags, nvme.NullSGL())
			if err != nil {
				return err
			}
			if _, err := s.ioQueue(n.c).Submit(ctx, cmd, p[done:done+k]); err != nil {
				return fmt.Errorf("initiator: write namespace %d [%d, +%d): %w", n.nsid, off+int64(done), k, err)
			}
			n.c.ctr.writes.Add(1)
			if flags&nvme.FUA == 0 {
				n.acknowledged(s, int64(k))
			}
			n.c.observe(opWrite, time.Since(start))
			return nil
		})
		if err != nil {
			return done, err
		}
		done += k
	}
	return done, nil
}

// Flush makes every completed write durable.
func (n *Namespace) Flush() error {
	ctx := context.Background()
	return n.do(ctx, func(s *session) error {
		start := time.Now()
		upTo := n.durability.snapshot()
		if _, err := s.ioQueue(n.c).Submit(ctx, nvme.FlushCommand(n.nsid), nil); err != nil {
			return fmt.Errorf("initiator: flush namespace %d: %w", n.nsid, err)
		}
		n.durability.covered(upTo)
		n.c.ctr.flushes.Add(1)
		n.c.observe(opFlush, time.Since(start))
		return nil
	})
}

// Trim deallocates [off, off+length) with Dataset Management; the range
// reads zeros afterwards.
func (n *Namespace) Trim(off, length int64) error {
	if err := n.check("trim", off, length); err != nil {
		return err
	}
	const maxRangeBlocks = 1 << 31 // keep each range well inside 32 bits
	var ranges []nvme.DSMRange
	for b, end := uint64(off/BlockSize), uint64((off+length)/BlockSize); b < end; {
		k := min(end-b, maxRangeBlocks)
		ranges = append(ranges, nvme.DSMRange{SLBA: b, Blocks: uint32(k)})
		b += k
	}
	ctx := context.Background()
	for len(ranges) > 0 {
		batch := ranges[:min(len(ranges), nvme.MaxDSMRanges)]
		ranges = ranges[len(batch):]
		data, err := nvme.MarshalDSMRanges(batch)
		if err != nil {
			return err
		}
		err = n.do(ctx, func(s *session) error {
			start := time.Now()
			cmd, err := nvme.DeallocateCommand(n.nsid, len(batch), nvme.NullSGL())
			if err != nil {
				return err
			}
			if _, err := s.ioQueue(n.c).Submit(ctx, cmd, data); err != nil {
				return fmt.Errorf("initiator: trim namespace %d: %w", n.nsid, err)
			}
			n.c.ctr.trims.Add(1)
			n.acknowledged(s, batchBytes(batch))
			n.c.observe(opTrim, time.Since(start))
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func batchBytes(ranges []nvme.DSMRange) int64 {
	var b int64
	for _, r := range ranges {
		b += int64(r.Blocks) * BlockSize
	}
	return b
}

// WriteZeroes makes [off, off+length) read zeros (Write Zeroes with
// deallocate).
func (n *Namespace) WriteZeroes(off, length int64) error {
	if err := n.check("write zeroes", off, length); err != nil {
		return err
	}
	ctx := context.Background()
	for b, end := uint64(off/BlockSize), uint64((off+length)/BlockSize); b < end; {
		k := min(end-b, nvme.MaxBlocksPerCommand)
		err := n.do(ctx, func(s *session) error {
			start := time.Now()
			cmd, err := nvme.WriteZeroesCommand(n.nsid, b, uint32(k), nvme.Deallocate)
			if err != nil {
				return err
			}
			if _, err := s.ioQueue(n.c).Submit(ctx, cmd, nil); err != nil {
				return fmt.Errorf("initiator: write zeroes namespace %d: %w", n.nsid, err)
			}
			n.c.ctr.writeZeroes.Add(1)
			n.acknowledged(s, int64(k)*BlockSize)
			n.c.observe(opWriteZeroes, time.Since(start))
			return nil
		})
		if err != nil {
			return err
		}
		b += k
	}
	return nil
}

// Advise asks the target to prefetch [off, off+length) (NP Advise).
func (n *Namespace) Advise(ctx context.Context, off, length int64) error {
	if err := n.check("advise", off, length); err != nil {
		return err
	}
	return n.do(ctx, func(s *session) error {
		cmd, err := nvme.NPAdviseCommand(n.nsid, uint64(off/BlockSize), uint64(length/BlockSize))
		if err != nil {
			return err
		}
		_, err = s.ioQueue(n.c).Submit(ctx, cmd, nil)
		return err
	})
}
