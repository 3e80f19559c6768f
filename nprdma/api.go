package nprdma

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/nprdma/nprdma/nprdma/link"
)

// Provider is a transport of the software NIC (nprdma/tcp, nprdma/loop,
// nprdma/shm), defined with everything else a provider implements in
// nprdma/link: the name here is for the applications that choose one.
type Provider = link.Provider

// Device is an RDMA device: the factory of protection domains, completion
// queues and listeners. It runs on a DeviceDriver: the software NIC of this
// package (NewDevice) or hardware (nprdma/verbs).
type Device struct {
	drv       DeviceDriver
	name      string
	caps      Caps
	prov      link.Provider // the software NIC's provider; nil on hardware
	suspected atomic.Uint64
}

// DeviceOption configures NewDevice and Open.
type DeviceOption func(*deviceConfig)

type deviceConfig struct {
	name string
	pin  bool
}

// WithName names the device in errors and metrics (default: the provider's
// or the driver's name).
func WithName(name string) DeviceOption { return func(c *deviceConfig) { c.name = name } }

// WithPinning chooses whether PD.Register of the software NIC pins memory
// with mlock (default true, as ibv_reg_mr does). Without pinning,
// registration needs no CAP_IPC_LOCK or RLIMIT_MEMLOCK, and the pages may
// be swapped out. Hardware always pins (it keeps the physical pages).
func WithPinning(pin bool) DeviceOption { return func(c *deviceConfig) { c.pin = pin } }

// NewDevice opens the software NIC on provider p.
func NewDevice(p link.Provider, opts ...DeviceOption) *Device {
	cfg := deviceConfig{name: p.Name(), pin: true}
	for _, o := range opts {
		o(&cfg)
	}
	d := &Device{drv: newSoftDevice(p, cfg.name, cfg.pin), name: cfg.name, prov: p}
	d.caps = d.drv.Caps()
	return d
}

// Open makes a Device of a driver (nprdma/verbs opens hardware this way).
func Open(drv DeviceDriver, opts ...DeviceOption) *Device {
	cfg := deviceConfig{name: drv.Name(), pin: true}
	for _, o := range opts {
		o(&cfg)
	}
	return &Device{drv: drv, name: cfg.name, caps: drv.Caps()}
}

// Name is the device's name.
func (d *Device) Name() string { return d.name }

// Caps says what the device offers where devices differ.
func (d *Device) Caps() Caps { return d.caps }

// Driver is the device's implementation.
func (d *Device) Driver() DeviceDriver { return d.drv }

// Provider is the transport the software NIC runs on (nil for hardware).
func (d *Device) Provider() link.Provider { return d.prov }

// Stats returns a snapshot of the device's counters.
func (d *Device) Stats() Stats {
	s := d.drv.Stats()
	s.SuspectedFaults = d.suspected.Load()
	return s
}

// Close closes the device's listeners and queue pairs (abruptly, like the
// end of the process) and deregisters its memory regions.
func (d *Device) Close() error { return d.drv.Close() }

// AllocPD allocates a protection domain. When the device cannot, the PD
// says why in the errors of everything done with it.
func (d *Device) AllocPD() *PD {
	drv, err := d.drv.AllocPD()
	return &PD{dev: d, drv: drv, err: err}
}

// CQOption configures a CQ.
type CQOption func(*cqConfig)

type cqConfig struct{ busyPoll time.Duration }

// WithBusyPoll makes Wait spin for up to d before parking the goroutine
// (default 0: no spin). Spinning trades a CPU for latency: waking a parked
// goroutine costs tens of microseconds when it has to wake another CPU.
func WithBusyPoll(d time.Duration) CQOption { return func(c *cqConfig) { c.busyPoll = d } }

// NewCQ creates a completion queue holding up to depth completions (at
// least 1). When the device cannot, the CQ's Wait and the queue pairs
// given it say why.
func (d *Device) NewCQ(depth int, opts ...CQOption) *CQ {
	var cfg cqConfig
	for _, o := range opts {
		o(&cfg)
	}
	depth = max(depth, 1)
	drv, err := d.drv.NewCQ(depth, cfg.busyPoll)
	cq := &CQ{dev: d, drv: drv, depth: depth, err: err}
	cq.soft, _ = drv.(*softCQ)
	return cq
}

// Listen accepts connection requests on addr ("127.0.0.1:0" for tcp, any
// name or "" for a generated one with loop, an address of the device's
// network interface for hardware).
func (d *Device) Listen(addr string) (*Listener, error) {
	drv, err := d.drv.Listen(addr)
	if err != nil {
		return nil, err
	}
	return &Listener{dev: d, drv: drv}, nil
}

// PD is a protection domain: regions and queue pairs of one PD can only be
// used together (a remote key is honoured only on queue pairs of its PD).
type PD struct {
	dev *Device
	drv PDDriver
	err error // why the device could not allocate it
}

// Device is the device the PD belongs to.
func (pd *PD) Device() *Device { return pd.dev }

// Close releases the PD. Like ibv_dealloc_pd it fails while regions or
// queue pairs still use it.
func (pd *PD) Close() error {
	if pd.err != nil {
		return nil
	}
	return pd.drv.Close()
}

// MROption configures a registration.
type MROption func(*mrConfig)

type mrConfig struct{ tag uint64 }

// WithAccessTag restricts remote access to the region to queue pairs whose
// access tag (QP.SetAccessTag) equals tag; 0 (the default) means every queue
// pair of the PD. A key presented on a queue pair with another tag is refused
// like an unknown key (a remote access error), so a key disclosed to one peer
// is useless on another peer's queue pairs even within one PD. Real RNICs get
// the same effect from a PD (or memory window) per peer; a tag keeps one PD
// and one registration of the pager per peer, which is O(1) here. Devices
// without Caps.AccessTags record the tag and do not enforce it.
func WithAccessTag(tag uint64) MROption { return func(c *mrConfig) { c.tag = tag } }

// Register registers buf with the given rights, pinning it (mlock on the
// software NIC, about 3 s per GiB here; ibv_reg_mr on hardware). buf must
// be memory outside the Go heap (AllocBuffer, an mmap): hardware keeps its
// address. It must stay valid until Deregister and until no queue pair can
// still access it.
func (pd *PD) Register(buf []byte, access Access, opts ...MROption) (*MR, error) {
	if pd.err != nil {
		return nil, fmt.Errorf("nprdma: register %d bytes: %w", len(buf), pd.err)
	}
	if len(buf) == 0 {
		return nil, fmt.Errorf("nprdma: register: empty buffer")
	}
	if access&^accessAll != 0 {
		return nil, fmt.Errorf("nprdma: register %d bytes: unknown access bits %#x", len(buf), uint32(access&^accessAll))
	}
	if access&AccessOnDemand != 0 && !pd.dev.caps.OnDemand {
		return nil, fmt.Errorf("nprdma: register %d bytes on demand: device %s has no on-demand paging", len(buf), pd.dev.name)
	}
	if access&AccessRemoteWrite != 0 && access&AccessLocalWrite == 0 {
		// As in verbs: remote write implies the NIC writes locally.
		return nil, fmt.Errorf("nprdma: register %d bytes: remote-write needs local-write", len(buf))
	}
	var cfg mrConfig
	for _, o := range opts {
		o(&cfg)
	}
	drv, err := pd.drv.Register(buf, access, cfg.tag)
	if err != nil {
		return nil, err
	}
	return newMR(pd, drv, buf, access, cfg.tag), nil
}

// RegisterUnpinned registers the pager's memory for remote reads without
// pinning or touching it: O(1) whatever its size (Caps.UnpinnedRegions;
// other devices refuse it). Only AccessRemoteRead may be granted: remote
// writes into the pager's memory are never allowed (writes are commands the
// owner validates), and the local NIC cannot use the region in SGEs. A READ
// is served page by page under the pager's seqlock; a page that is absent,
// busy or changed during the copy is delivered as the magic page (Magic()
// repeated).
func (pd *PD) RegisterUnpinned(p Pager, access Access, opts ...MROption) (*MR, error) {
	if pd.err != nil {
		return nil, fmt.Errorf("nprdma: register unpinned: %w", pd.err)
	}
	if !pd.dev.caps.UnpinnedRegions {
		return nil, fmt.Errorf("nprdma: register unpinned: device %s cannot read memory it has not pinned (docs/np-rdma.md: real devices)", pd.dev.name)
	}
	var cfg mrConfig
	for _, o := range opts {
		o(&cfg)
	}
	drv, err := pd.drv.RegisterUnpinned(p, access, cfg.tag)
	if err != nil {
		return nil, err
	}
	return newMR(pd, drv, p.Bytes(), access, cfg.tag), nil
}

// MR is a registered memory region.
type MR struct {
	pd       *PD
	drv      MRDriver
	buf      []byte
	addr     uint64
	lkey     uint32
	rkey     uint32
	access   Access
	pinned   bool
	magic    uint64
	pageSize int
	tag      uint64
}

func newMR(pd *PD, drv MRDriver, buf []byte, access Access, tag uint64) *MR {
	return &MR{pd: pd, drv: drv, buf: buf, addr: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))),
		lkey: drv.LKey(), rkey: drv.RKey(), access: access, pinned: drv.Pinned(), magic: drv.Magic(),
		pageSize: drv.PageSize(), tag: tag}
}

// Driver is the region's implementation.
func (mr *MR) Driver() MRDriver { return mr.drv }

// AccessTag is the region's access tag (0: any queue pair of the PD).
func (mr *MR) AccessTag() uint64 { return mr.tag }

// Addr is the virtual address of the region's first byte, the base of the
// addresses in SGEs and of remote addresses.
func (mr *MR) Addr() uint64 { return mr.addr }

// Len is the region's length in bytes.
func (mr *MR) Len() int { return len(mr.buf) }

// LKey is the local key, for SGEs.
func (mr *MR) LKey() uint32 { return mr.lkey }

// RKey is the remote key a peer names in READ and WRITE.
func (mr *MR) RKey() uint32 { return mr.rkey }

// Access is the set of rights granted.
func (mr *MR) Access() Access { return mr.access }

// Bytes is the registered memory. For an unpinned region it is the pager's
// memory, which may only be read under the pager's protocol.
func (mr *MR) Bytes() []byte { return mr.buf }

// Pinned reports whether the region was pinned at registration.
func (mr *MR) Pinned() bool { return mr.pinned }

// Magic is the unpinned region's magic value (0 for other regions): a page
// the NIC engine could not read is delivered as this value repeated.
func (mr *MR) Magic() uint64 { return mr.magic }

// PageSize is the granularity of the region's pages (the pager's page size,
// or the OS page size).
func (mr *MR) PageSize() int { return mr.pageSize }

// PD is the protection domain of the region.
func (mr *MR) PD() *PD { return mr.pd }

// SGE names n bytes at offset off of the region.
func (mr *MR) SGE(off, n int) SGE {
	return SGE{Addr: mr.addr + uint64(off), Length: uint32(n), LKey: mr.lkey}
}

// Deregister revokes the region's keys: no new local or remote access is
// accepted once it returns. Pinned memory is unpinned (on the software NIC
// unless another live region covers it). It also waits for the peers'
// WRITEs being copied into the region at that moment and, for an unpinned
// region, for the READs being copied out of the pager (one copy each; the
// engine never blocks there), so the pager may be closed once it returns
// even while queue pairs that used the region live on. On the software NIC
// a READ response of a pinned region may still be queued on the link: free
// its memory once the queue pairs that served it are closed.
func (mr *MR) Deregister() error { return mr.drv.Deregister() }

// CQ is a completion queue, shareable by many queue pairs.
//
// Overflow: the queue holds at most depth completions. On the software NIC
// a completion that finds it full is dropped, the queue becomes overflowed
// for good (as a verbs CQ in error) and takes no completion any more, and
// each queue pair whose completion is dropped moves to the error state
// (ErrCQOverflow). Poll still returns what the queue held; Wait returns
// ErrCQOverflow once it is empty, so a waiter never hangs on a completion
// that was lost. Hardware queues are sized with slack beyond depth.
type CQ struct {
	dev   *Device
	drv   CQDriver
	soft  *softCQ // drv, when it is the software NIC's (see QP.PostSend)
	depth int
	err   error // why the device could not create it
}

// Depth is the capacity of the queue.
func (cq *CQ) Depth() int { return cq.depth }

// Driver is the queue's implementation.
func (cq *CQ) Driver() CQDriver { return cq.drv }

// Poll moves up to len(wcs) completions into wcs without waiting and returns
// how many.
func (cq *CQ) Poll(wcs []WC) int {
	if cq.soft != nil {
		return cq.soft.Poll(wcs)
	}
	if cq.err != nil {
		return 0
	}
	n, _ := cq.viaBuffer(wcs, func(b []WC) (int, error) { return cq.drv.Poll(b), nil })
	return n
}

// viaBuffer calls a driver with a buffer of its own and copies what it got
// into wcs: a slice handed to an interface method escapes to the heap, and
// callers poll into arrays on their stacks.
func (cq *CQ) viaBuffer(wcs []WC, f func([]WC) (int, error)) (int, error) {
	bp, _ := wcBuffers.Get().(*[]WC)
	if bp == nil {
		bp = new([]WC)
	}
	if cap(*bp) < len(wcs) {
		*bp = make([]WC, len(wcs))
	}
	b := (*bp)[:len(wcs)]
	n, err := f(b)
	copy(wcs, b[:n])
	wcBuffers.Put(bp)
	return n, err
}

var wcBuffers sync.Pool

// Wait returns at least one completion, waiting until one arrives, ctx ends,
// or the queue overflows or is closed (then its error once the queue is
// empty).
//
// Direct completion (software NIC): when a single queue pair uses the CQ
// and its link allows it (nprdma/tcp does), the waiting goroutine receives
// the link's packets itself instead of being woken by the link's
// goroutine; see Driver. This does not change what Wait returns, only who
// runs the receive path. A busy-polling CQ's waiter then spins on the link
// itself (DriveWaiter.BusyPoll); when it cannot drive it spins on the
// queue.
func (cq *CQ) Wait(ctx context.Context, wcs []WC) (int, error) {
	if cq.soft != nil {
		return cq.soft.Wait(ctx, wcs)
	}
	if cq.err != nil {
		return 0, cq.err
	}
	if len(wcs) == 0 {
		return 0, fmt.Errorf("nprdma: cq wait: empty completion slice")
	}
	return cq.viaBuffer(wcs, func(b []WC) (int, error) { return cq.drv.Wait(ctx, b) })
}

// Overflowed reports whether a completion was ever dropped.
func (cq *CQ) Overflowed() bool { return cq.err == nil && cq.drv.Overflowed() }

// Close releases the queue. Like ibv_destroy_cq it fails while queue pairs
// that are not closed use it. Waiters return ErrClosed.
func (cq *CQ) Close() error {
	if cq.err != nil {
		return nil
	}
	return cq.drv.Close()
}

// QPConfig configures a queue pair. Zero fields take the defaults above.
type QPConfig struct {
	// SendCQ receives completions of send work requests; RecvCQ those of
	// receives (SendCQ when nil). Both must belong to the QP's device.
	SendCQ, RecvCQ *CQ
	// SendDepth and RecvDepth bound the work requests outstanding on each
	// queue; posting more fails with ErrQueueFull.
	SendDepth, RecvDepth int
	// MaxInline is the largest inline payload (at most MaxInlineLimit; a
	// hardware device may grant less: QP.MaxInline).
	MaxInline int
	// RNRRetry is how many times a SEND refused for lack of a posted receive
	// is retried before StatusRNRRetryExceeded (0: DefaultRNRRetry, negative:
	// no retry). Unlike verbs, 7 does not mean forever on the software NIC;
	// hardware takes 7 as "for ever" and caps larger counts to it.
	RNRRetry int
	// RNRTimeout is the wait before each RNR retry (on hardware: the delay
	// this queue pair asks its peer to wait, the RNR timer).
	RNRTimeout time.Duration
	// Timeout: when work is outstanding and nothing arrives from the peer
	// for this long, the QP fails with StatusRetryExceeded (negative:
	// never). Hardware applies the connection manager's transport timeout.
	Timeout time.Duration
}

// QP is a reliable-connected queue pair: work requests execute in order and
// exactly once, or complete with an error and move the QP to the error
// state, after which every outstanding and later work request completes
// with StatusWRFlushed.
type QP struct {
	pd   *PD
	drv  QPDriver
	soft *softQP // drv, when it is the software NIC's (see PostSend)
	tag  atomic.Uint64

	mu   sync.Mutex // the copies handed to drv
	wrs  []SendWR
	rwrs []RecvWR
	sges []SGE
	inl  []byte
}

// NewQP creates a queue pair in the init state. Post receives, then Connect
// or accept a ConnRequest with it.
func (pd *PD) NewQP(cfg QPConfig) (*QP, error) {
	if pd.err != nil {
		return nil, fmt.Errorf("nprdma: create queue pair: %w", pd.err)
	}
	if cfg.SendCQ == nil {
		return nil, fmt.Errorf("nprdma: create queue pair: no send completion queue")
	}
	if cfg.RecvCQ == nil {
		cfg.RecvCQ = cfg.SendCQ
	}
	if cfg.SendCQ.dev != pd.dev || cfg.RecvCQ.dev != pd.dev {
		return nil, fmt.Errorf("nprdma: create queue pair: completion queue of another device")
	}
	for _, cq := range []*CQ{cfg.SendCQ, cfg.RecvCQ} {
		if cq.err != nil {
			return nil, fmt.Errorf("nprdma: create queue pair: %w", cq.err)
		}
	}
	if cfg.MaxInline > MaxInlineLimit {
		return nil, fmt.Errorf("nprdma: create queue pair: max inline %d beyond %d", cfg.MaxInline, MaxInlineLimit)
	}
	drv, err := pd.drv.NewQP(QPDriverConfig{SendCQ: cfg.SendCQ.drv, RecvCQ: cfg.RecvCQ.drv,
		SendDepth: cfg.SendDepth, RecvDepth: cfg.RecvDepth, MaxInline: cfg.MaxInline,
		RNRRetry: cfg.RNRRetry, RNRTimeout: cfg.RNRTimeout, Timeout: cfg.Timeout})
	if err != nil {
		return nil, err
	}
	qp := &QP{pd: pd, drv: drv}
	qp.soft, _ = drv.(*softQP)
	return qp, nil
}

// Driver is the queue pair's implementation.
func (qp *QP) Driver() QPDriver { return qp.drv }

// Num is the queue pair number, reported in completions.
func (qp *QP) Num() uint32 { return qp.drv.Num() }

// RemoteNum is the peer's queue pair number (once connected).
func (qp *QP) RemoteNum() uint32 { return qp.drv.RemoteNum() }

// State is the current state.
func (qp *QP) State() QPState { return qp.drv.State() }

// MaxInline is the largest inline payload the queue pair takes: what
// QPConfig asked, or less when the device grants less.
func (qp *QP) MaxInline() int { return qp.drv.MaxInline() }

// SetAccessTag sets the tag the NIC engine compares with a tagged region's
// (WithAccessTag) when a peer names its rkey on this queue pair. It may be
// changed at any time; requests already validated are not affected.
func (qp *QP) SetAccessTag(tag uint64) {
	qp.tag.Store(tag)
	qp.drv.SetAccessTag(tag)
}

// AccessTag is the queue pair's access tag (0 unless set).
func (qp *QP) AccessTag() uint64 { return qp.tag.Load() }

// PD is the queue pair's protection domain.
func (qp *QP) PD() *PD { return qp.pd }

// Done is closed when the QP enters the error or closed state.
func (qp *QP) Done() <-chan struct{} { return qp.drv.Done() }

// Err says why the QP left the ready-to-send state (nil before). It wraps
// one of ErrDisconnected, ErrPeerDisconnected, ErrPeerLost, ErrTimeout,
// ErrRemoteAccess, ErrRemoteRequest, ErrRemoteOperation, ErrRNRRetryExceeded,
// ErrLocalProtection, ErrLocalLength, ErrProtocol, ErrCQOverflow, ErrClosed.
func (qp *QP) Err() error { return qp.drv.Err() }

// Connect connects the QP to the listener at addr, sending privateData, and
// returns the private data the peer accepted with. A rejection is returned
// as *RejectError. A QP connects at most once; after a failed Connect it is
// in the error state.
func (qp *QP) Connect(ctx context.Context, addr string, privateData []byte) ([]byte, error) {
	return qp.drv.Connect(ctx, addr, privateData)
}

// PostSend posts work requests to the send queue. It never waits for the
// network. A malformed request or a full queue fails the whole call and
// posts nothing; errors found while executing (keys, bounds, the peer)
// complete the request with an error status.
//
// The software NIC is called directly: work requests passed to an
// interface method escape to the heap, and the data path posts requests
// built on the stack without allocating. Other drivers get a copy.
func (qp *QP) PostSend(wrs ...SendWR) error {
	if qp.soft != nil {
		return qp.soft.PostSend(wrs...)
	}
	qp.mu.Lock()
	defer qp.mu.Unlock()
	qp.wrs, qp.sges, qp.inl = qp.wrs[:0], qp.sges[:0], qp.inl[:0]
	for i := range wrs {
		o := &wrs[i]
		w := SendWR{ID: o.ID, Op: o.Op, SG: qp.copySGEs(o.SG), Imm: o.Imm, RemoteAddr: o.RemoteAddr, RKey: o.RKey,
			Signaled: o.Signaled, Inline: o.Inline, InvalidateRKey: o.InvalidateRKey}
		if o.InlineData != nil {
			n := len(qp.inl)
			qp.inl = append(qp.inl, o.InlineData...)
			w.InlineData = qp.inl[n:len(qp.inl):len(qp.inl)]
		}
		qp.wrs = append(qp.wrs, w)
	}
	// Appends may have moved earlier copies: point them at the final ones.
	nsge, ninl := 0, 0
	for i := range qp.wrs {
		w := &qp.wrs[i]
		if n := len(w.SG); n > 0 {
			w.SG = qp.sges[nsge : nsge+n : nsge+n]
			nsge += n
		}
		if w.InlineData != nil {
			n := len(w.InlineData)
			w.InlineData = qp.inl[ninl : ninl+n : ninl+n]
			ninl += n
		}
	}
	err := qp.drv.PostSend(qp.wrs...)
	clear(qp.wrs)
	return err
}

func (qp *QP) copySGEs(sg []SGE) []SGE {
	if len(sg) == 0 {
		return nil
	}
	n := len(qp.sges)
	qp.sges = append(qp.sges, sg...)
	return qp.sges[n:]
}

// PostRecv posts receive work requests. They may be posted before the QP
// connects (and should be, or the first SENDs meet RNR NAKs).
// As PostSend, it calls the software NIC directly and gives other drivers
// a copy.
func (qp *QP) PostRecv(wrs ...RecvWR) error {
	if qp.soft != nil {
		return qp.soft.PostRecv(wrs...)
	}
	qp.mu.Lock()
	defer qp.mu.Unlock()
	qp.rwrs, qp.sges = qp.rwrs[:0], qp.sges[:0]
	for i := range wrs {
		qp.rwrs = append(qp.rwrs, RecvWR{ID: wrs[i].ID, SG: qp.copySGEs(wrs[i].SG)})
	}
	nsge := 0
	for i := range qp.rwrs {
		if n := len(qp.rwrs[i].SG); n > 0 {
			qp.rwrs[i].SG = qp.sges[nsge : nsge+n : nsge+n]
			nsge += n
		}
	}
	err := qp.drv.PostRecv(qp.rwrs...)
	clear(qp.rwrs)
	return err
}

// Disconnect tells the peer the connection is over (its QP enters the error
// state with ErrPeerDisconnected) and moves this QP to the error state;
// every outstanding work request on both sides completes with
// StatusWRFlushed.
func (qp *QP) Disconnect() error { return qp.drv.Disconnect() }

// Close destroys the QP. A connected QP's link is cut at once (the peer sees
// a lost peer, as when a process dies; on hardware a disconnect);
// outstanding work requests complete with StatusWRFlushed before Close
// returns, and no completion follows.
func (qp *QP) Close() error { return qp.drv.Close() }

// Listener accepts connection requests (rdma_listen).
type Listener struct {
	dev *Device
	drv ListenerDriver
}

// Accept waits for the next connection request.
func (l *Listener) Accept(ctx context.Context) (*ConnRequest, error) {
	drv, err := l.drv.Accept(ctx)
	if err != nil {
		return nil, err
	}
	return &ConnRequest{dev: l.dev, drv: drv}, nil
}

// Addr is the address peers connect to.
func (l *Listener) Addr() string { return l.drv.Addr() }

// Close stops listening. Established connections are not affected.
func (l *Listener) Close() error { return l.drv.Close() }

// ConnRequest is a connection request from a peer, answered by Accept or
// Reject.
type ConnRequest struct {
	dev *Device
	drv ConnRequestDriver
}

// PrivateData is the private data the peer passed to Connect (padded with
// zeros on devices with Caps.PadsPrivateData).
func (r *ConnRequest) PrivateData() []byte { return r.drv.PrivateData() }

// RemoteAddr is the peer's address.
func (r *ConnRequest) RemoteAddr() string { return r.drv.RemoteAddr() }

// Accept connects qp (a fresh queue pair of the same device) to the peer and
// answers with privateData, which the peer's Connect returns.
func (r *ConnRequest) Accept(qp *QP, privateData []byte) error {
	if qp.pd.dev != r.dev {
		return fmt.Errorf("nprdma: accept: qp %d belongs to device %s, not %s", qp.Num(), qp.pd.dev.name, r.dev.name)
	}
	return r.drv.Accept(qp.drv, privateData)
}

// Reject refuses the request; the peer's Connect returns a *RejectError with
// privateData.
func (r *ConnRequest) Reject(privateData []byte) error { return r.drv.Reject(privateData) }
