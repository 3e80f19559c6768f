//go:build cgo && !noverbs

package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/nprdma/nprdma/nprdma"
	"golang.org/x/sys/unix"
)

// Info describes an RDMA device.
type Info struct {
	Name             string
	Ports            int
	MaxQPWR          int    // work requests per queue
	MaxSGE           int    // SGEs per work request
	MaxCQE           int    // completions per CQ
	MaxMRSize        uint64 // bytes per registration
	MaxQPRdAtom      int    // RDMA READs a QP serves at once (responder resources)
	MaxQPInitRdAtom  int    // RDMA READs a QP may have outstanding (initiator depth)
	ActiveMTU        int    // bytes, port 1
	LinkLayer        string // "Ethernet" (RoCE, rxe) or "InfiniBand"
	ODP              bool   // on-demand paging (IBV_ODP_SUPPORT)
	ODPImplicit      bool   // implicit on-demand paging (whole address space)
	ODPRCReadAndSend bool   // RC READ, SEND and RECV may fault (rc_odp_caps)
}

// Devices lists the RDMA devices of this machine, or an error wrapping
// ErrUnavailable that says what is missing.
func Devices() ([]Info, error) {
	if err := load(); err != nil {
		return nil, err
	}
	var n C.int
	list := C.np_get_devices(&n)
	if list == nil || n == 0 {
		if list != nil {
			C.np_free_devices(list)
		}
		return nil, fmt.Errorf("%w: no RDMA device (for Soft-RoCE over eth0: rdma link add rxe0 type rxe netdev eth0)", ErrUnavailable)
	}
	defer C.np_free_devices(list)
	ctxs := unsafe.Slice(list, int(n))
	out := make([]Info, 0, len(ctxs))
	for _, c := range ctxs {
		var di C.np_devinfo
		if rc := C.np_query(c, &di); rc != 0 {
			return nil, fmt.Errorf("verbs: query device: %w", errnoErr(rc))
		}
		out = append(out, infoOf(&di))
	}
	return out, nil
}

func infoOf(di *C.np_devinfo) Info {
	ll := "InfiniBand"
	if di.link_layer == C.IBV_LINK_LAYER_ETHERNET {
		ll = "Ethernet"
	}
	return Info{
		Name: C.GoString(&di.name[0]), Ports: int(di.ports), MaxQPWR: int(di.max_qp_wr), MaxSGE: int(di.max_sge),
		MaxCQE: int(di.max_cqe), MaxMRSize: uint64(di.max_mr_size), MaxQPRdAtom: int(di.max_qp_rd_atom),
		MaxQPInitRdAtom: int(di.max_qp_init_rd_atom), ActiveMTU: int(di.active_mtu), LinkLayer: ll,
		ODP:              di.odp_general&C.IBV_ODP_SUPPORT != 0,
		ODPImplicit:      di.odp_general&C.IBV_ODP_SUPPORT_IMPLICIT != 0,
		ODPRCReadAndSend: di.odp_rc&(C.IBV_ODP_SUPPORT_READ|C.IBV_ODP_SUPPORT_SEND|C.IBV_ODP_SUPPORT_RECV) == C.IBV_ODP_SUPPORT_READ|C.IBV_ODP_SUPPORT_SEND|C.IBV_ODP_SUPPORT_RECV,
	}
}

// Device is an open RDMA device. Its connection manager events arrive on
// an event channel of its own; the device context is shared with every
// other Device of the process on the same hardware (librdmacm keeps one per
// device, and a queue pair must be on the context rdma_cm resolves
// addresses to).
type Device struct {
	ctx  *C.struct_ibv_context
	list **C.struct_ibv_context
	info Info
	hw   *hwContext
	log  *slog.Logger

	cm     *C.struct_rdma_event_channel
	cmFile *os.File // a pollable duplicate of the channel's descriptor
	cmDone chan struct{}

	mu        sync.Mutex
	closed    bool
	ids       map[*C.struct_rdma_cm_id]cmHandler
	pds       map[*PD]struct{}
	cqs       map[*CQ]struct{}
	qps       map[*QP]struct{}
	listeners map[*Listener]struct{}

	ctr counters
	// inlineCap is the most inline data a queue pair was granted after the
	// device refused more (0: never refused): later queue pairs ask no more.
	inlineCap atomic.Int32
}

type counters struct {
	qpsCreated, registrations atomic.Uint64
	qpsOpen, registeredBytes  atomic.Int64
}

// Option configures Open.
type Option func(*Device)

// WithLogger sets where the device reports events nobody waits for (an
// asynchronous QP error, a connection request it had to refuse). Default:
// slog.Default().
func WithLogger(l *slog.Logger) Option { return func(d *Device) { d.log = l } }

// OpenDevice opens the RDMA device called name ("" for the first one) as
// an nprdma.Device. Without rdma-core or without a device the error wraps
// ErrUnavailable and says what is missing.
func OpenDevice(name string, opts ...nprdma.DeviceOption) (*nprdma.Device, error) {
	d, err := Open(name)
	if err != nil {
		return nil, err
	}
	return nprdma.Open(d, opts...), nil
}

// Open opens the RDMA device called name ("" for the first one): the
// nprdma.DeviceDriver of OpenDevice.
func Open(name string, opts ...Option) (*Device, error) {
	if err := load(); err != nil {
		return nil, err
	}
	d := &Device{log: slog.Default(), ids: map[*C.struct_rdma_cm_id]cmHandler{}, pds: map[*PD]struct{}{},
		cqs: map[*CQ]struct{}{}, qps: map[*QP]struct{}{}, listeners: map[*Listener]struct{}{}, cmDone: make(chan struct{})}
	for _, o := range opts {
		o(d)
	}
	var n C.int
	d.list = C.np_get_devices(&n)
	if d.list == nil || n == 0 {
		if d.list != nil {
			C.np_free_devices(d.list)
		}
		return nil, fmt.Errorf("%w: no RDMA device (for Soft-RoCE over eth0: rdma link add rxe0 type rxe netdev eth0)", ErrUnavailable)
	}
	var names []string
	for _, c := range unsafe.Slice(d.list, int(n)) {
		var di C.np_devinfo
		if rc := C.np_query(c, &di); rc != 0 {
			continue
		}
		info := infoOf(&di)
		names = append(names, info.Name)
		if d.ctx == nil && (name == "" || name == info.Name) {
			d.ctx, d.info = c, info
		}
	}
	if d.ctx == nil {
		C.np_free_devices(d.list)
		return nil, fmt.Errorf("%w: no RDMA device %q (devices: %v)", ErrUnavailable, name, names)
	}
	hw, err := attachContext(d.ctx, d.log)
	if err != nil {
		C.np_free_devices(d.list)
		return nil, err
	}
	d.hw = hw
	var e C.int
	d.cm = C.np_create_event_channel(&e)
	if d.cm == nil {
		hw.release()
		C.np_free_devices(d.list)
		return nil, fmt.Errorf("verbs: %s: create event channel: %w", d.info.Name, syscall.Errno(e))
	}
	d.cmFile, err = pollable(int(C.np_event_channel_fd(d.cm)), "rdma_cm")
	if err != nil {
		C.np_destroy_event_channel(d.cm)
		hw.release()
		C.np_free_devices(d.list)
		return nil, fmt.Errorf("verbs: %s: %w", d.info.Name, err)
	}
	go d.cmLoop()
	return d, nil
}

// Info describes the device.
func (d *Device) Info() Info { return d.info }

// Caps implements nprdma.DeviceDriver: what a hardware NIC does not (no
// unpinned regions, access tags or responder counters; a peer's failure
// arrives as a disconnect) and what it adds (SEND with invalidate).
func (d *Device) Caps() nprdma.Caps {
	return nprdma.Caps{SendWithInvalidate: true, PadsPrivateData: true, OnDemand: d.info.ODP,
		MaxConnectPrivateData: MaxConnectPrivateData, MaxAcceptPrivateData: MaxAcceptPrivateData,
		MaxRejectPrivateData: MaxRejectPrivateData}
}

// Stats implements nprdma.DeviceDriver: what the device's software sees
// (queue pairs, registrations); the NIC counts the rest itself.
func (d *Device) Stats() nprdma.Stats {
	return nprdma.Stats{QPs: d.ctr.qpsOpen.Load(), QPsCreated: d.ctr.qpsCreated.Load(),
		Registrations: d.ctr.registrations.Load(), RegisteredBytes: d.ctr.registeredBytes.Load()}
}

// Name is the device's name (rxe0, mlx5_0).
func (d *Device) Name() string { return d.info.Name }

// pollable makes fd non-blocking and returns a duplicate of it that Go's
// network poller waits on (closing the duplicate stops a wait without
// closing fd, which belongs to rdma-core).
func pollable(fd int, name string) (*os.File, error) {
	if rc := C.np_set_nonblock(C.int(fd)); rc != 0 {
		return nil, fmt.Errorf("%s: set non-blocking: %w", name, errnoErr(rc))
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: dup: %w", name, err)
	}
	if err := unix.SetNonblock(dup, true); err != nil {
		unix.Close(dup)
		return nil, fmt.Errorf("%s: set non-blocking: %w", name, err)
	}
	return os.NewFile(uintptr(dup), name), nil
}

// waitReadable calls try whenever f may be readable until try reports
// true; an error when f is closed.
func waitReadable(f *os.File, try func() bool) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Read(func(uintptr) bool { return try() })
}

// Close closes the device: its listeners and queue pairs (abruptly, as the
// end of the process would), completion queues, memory regions and
// protection domains.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	ls, qps := slices.Collect(maps.Keys(d.listeners)), slices.Collect(maps.Keys(d.qps))
	d.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	for _, qp := range qps {
		qp.Close()
	}
	d.mu.Lock()
	cqs, pds := slices.Collect(maps.Keys(d.cqs)), slices.Collect(maps.Keys(d.pds))
	d.mu.Unlock()
	for _, cq := range cqs {
		cq.Close()
	}
	var errs []error
	for _, pd := range pds {
		pd.closeAll()
		if err := pd.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	d.cmFile.Close()
	<-d.cmDone
	d.mu.Lock()
	var orphans []*C.struct_rdma_cm_id
	for id := range d.ids {
		orphans = append(orphans, id)
	}
	d.ids = map[*C.struct_rdma_cm_id]cmHandler{}
	d.mu.Unlock()
	for _, id := range orphans {
		C.np_destroy_id(id)
	}
	C.np_destroy_event_channel(d.cm)
	d.hw.release()
	C.np_free_devices(d.list)
	return errors.Join(errs...)
}

// hwContext is the state of one device context shared by every Device of
// the process on it: the asynchronous events (a queue pair that failed at
// the responder, a CQ overrun) arrive on the context, so one goroutine
// reads them and hands each to the queue pair it names.
type hwContext struct {
	ctx   *C.struct_ibv_context
	refs  int
	async *os.File
	done  chan struct{}
	qps   map[uint32]*QP
	log   *slog.Logger
}

var (
	hwMu   sync.Mutex
	hwCtxs = map[*C.struct_ibv_context]*hwContext{}
)

func attachContext(ctx *C.struct_ibv_context, log *slog.Logger) (*hwContext, error) {
	hwMu.Lock()
	defer hwMu.Unlock()
	if h := hwCtxs[ctx]; h != nil {
		h.refs++
		return h, nil
	}
	f, err := pollable(int(ctx.async_fd), "async events")
	if err != nil {
		return nil, fmt.Errorf("verbs: %w", err)
	}
	h := &hwContext{ctx: ctx, refs: 1, async: f, done: make(chan struct{}), qps: map[uint32]*QP{}, log: log}
	hwCtxs[ctx] = h
	go h.loop()
	return h, nil
}

func (h *hwContext) release() {
	hwMu.Lock()
	h.refs--
	last := h.refs == 0
	if last {
		delete(hwCtxs, h.ctx)
	}
	hwMu.Unlock()
	if last {
		h.async.Close()
		<-h.done
	}
}

func (h *hwContext) addQP(qp *QP) {
	hwMu.Lock()
	h.qps[qp.num] = qp
	hwMu.Unlock()
}

func (h *hwContext) removeQP(qp *QP) {
	hwMu.Lock()
	if h.qps[qp.num] == qp {
		delete(h.qps, qp.num)
	}
	hwMu.Unlock()
}

func (h *hwContext) loop() {
	defer close(h.done)
	var ev C.np_async_event
	waitReadable(h.async, func() bool {
		for {
			rc := C.np_get_async_event(h.ctx, &ev)
			if rc == -C.EAGAIN {
				return false
			}
			if rc != 0 {
				h.log.Warn("verbs: reading asynchronous events", "err", errnoErr(rc))
				return true
			}
			h.event(&ev)
		}
	})
}

func (h *hwContext) event(ev *C.np_async_event) {
	var cause error
	switch ev.event {
	case C.IBV_EVENT_QP_ACCESS_ERR:
		cause = fmt.Errorf("%w (detected as responder)", errRemoteAccess)
	case C.IBV_EVENT_QP_REQ_ERR:
		cause = fmt.Errorf("%w (detected as responder)", errRemoteRequest)
	case C.IBV_EVENT_QP_FATAL:
		cause = errQPFatal
	case C.IBV_EVENT_CQ_ERR:
		h.log.Warn("verbs: completion queue overrun: its queue pairs fail")
		return
	default:
		return
	}
	hwMu.Lock()
	qp := h.qps[uint32(ev.qp_num)]
	hwMu.Unlock()
	if qp != nil {
		qp.fail(cause)
	}
}
