//go:build cgo && !noverbs

package verbs

/*
#include "shim.h"
#include <sys/socket.h>
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	"github.com/nprdma/nprdma/nprdma"
)

// Private data limits of the RDMA connection manager over IB CM (RoCE,
// InfiniBand) for the port space RDMA_PS_TCP: what a REQ, REP and REJ can
// carry. A peer receives the data padded with zeros to these sizes.
const (
	MaxConnectPrivateData = 56
	MaxAcceptPrivateData  = 196
	MaxRejectPrivateData  = 148
)

// Reject reasons of IB CM (the status of RDMA_CM_EVENT_REJECTED).
const (
	rejConsumer         = 28 // the application rejected: private data is its answer
	rejInvalidServiceID = 8  // nobody listens there
)

// resolveTimeout bounds address and route resolution (milliseconds).
const resolveTimeout = 5000

// establishTimeout bounds how long an accepted connection waits for the
// peer's confirmation (the connection manager reports its own timeout
// sooner).
const establishTimeout = 30 * time.Second

type cmEvent struct {
	kind         int
	status       int
	pdata        []byte
	initDepth    uint8
	respRes      uint8
	remoteQPN    uint32
	listenerGone bool
}

// cmHandler receives the events of one rdma_cm id.
type cmHandler interface{ cmEvent(ev cmEvent) }

func (d *Device) register(id *C.struct_rdma_cm_id, h cmHandler) {
	d.mu.Lock()
	d.ids[id] = h
	d.mu.Unlock()
}

func (d *Device) forget(id *C.struct_rdma_cm_id) {
	d.mu.Lock()
	delete(d.ids, id)
	d.mu.Unlock()
}

// cmLoop takes the connection manager's events and hands each to the
// owner of its id; a connection request goes to its listener.
func (d *Device) cmLoop() {
	defer close(d.cmDone)
	var raw C.np_cm_event
	waitReadable(d.cmFile, func() bool {
		for {
			rc := C.np_get_cm_event(d.cm, &raw)
			if rc == -C.EAGAIN {
				return false
			}
			if rc != 0 {
				d.log.Warn("verbs: reading connection manager events", "device", d.info.Name, "err", errnoErr(rc))
				return true
			}
			ev := cmEvent{kind: int(raw.event), status: int(raw.status),
				initDepth: uint8(raw.initiator_depth), respRes: uint8(raw.responder_resources), remoteQPN: uint32(raw.qp_num)}
			if raw.pdata_len > 0 {
				ev.pdata = C.GoBytes(unsafe.Pointer(&raw.pdata[0]), raw.pdata_len)
			}
			id := raw.id
			if ev.kind == C.RDMA_CM_EVENT_CONNECT_REQUEST {
				id = raw.listen_id
			}
			d.mu.Lock()
			h := d.ids[id]
			d.mu.Unlock()
			switch {
			case ev.kind == C.RDMA_CM_EVENT_CONNECT_REQUEST:
				child := raw.id
				l, _ := h.(*Listener)
				if l == nil || !l.offer(child, ev) {
					C.np_reject(child, nil, 0)
					C.np_destroy_id(child)
				}
			case h != nil:
				h.cmEvent(ev)
			}
		}
	})
}

func eventName(kind int) string { return C.GoString(C.np_event_str(C.int(kind))) }

// parseAddr turns "host:port" into the shim's address.
func parseAddr(addr string) (C.np_addr, error) {
	var a C.np_addr
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return a, err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return a, fmt.Errorf("port %q: %w", port, err)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		if host == "" {
			ip = netip.IPv4Unspecified()
		} else {
			ips, lerr := net.DefaultResolver.LookupNetIP(context.Background(), "ip", host)
			if lerr != nil || len(ips) == 0 {
				return a, fmt.Errorf("host %q: %w", host, errors.Join(err, lerr))
			}
			ip = ips[0]
		}
	}
	ip = ip.Unmap()
	a.port = C.uint16_t(p)
	if ip.Is4() {
		a.family = C.AF_INET
		b := ip.As4()
		C.memcpy(unsafe.Pointer(&a.addr[0]), unsafe.Pointer(&b[0]), 4)
	} else {
		a.family = C.AF_INET6
		b := ip.As16()
		C.memcpy(unsafe.Pointer(&a.addr[0]), unsafe.Pointer(&b[0]), 16)
	}
	return a, nil
}

func formatAddr(a *C.np_addr) string {
	var ip netip.Addr
	switch a.family {
	case C.AF_INET:
		ip = netip.AddrFrom4([4]byte(C.GoBytes(unsafe.Pointer(&a.addr[0]), 4)))
	case C.AF_INET6:
		ip = netip.AddrFrom16([16]byte(C.GoBytes(unsafe.Pointer(&a.addr[0]), 16)))
	default:
		return "?"
	}
	return netip.AddrPortFrom(ip, uint16(a.port)).String()
}

func idAddr(id *C.struct_rdma_cm_id, peer bool) string {
	var a C.np_addr
	p := C.int(0)
	if peer {
		p = 1
	}
	C.np_id_addr(id, p, &a)
	return formatAddr(&a)
}

// Listener accepts connection requests (rdma_listen).
type Listener struct {
	dev  *Device
	id   *C.struct_rdma_cm_id
	addr string
	reqs chan *ConnRequest
	done chan struct{}
}

// Listen implements nprdma.DeviceDriver: it accepts connection requests on
// addr ("10.0.2.15:4420"; port 0 picks one; Addr says which).
func (d *Device) Listen(addr string) (nprdma.ListenerDriver, error) {
	a, err := parseAddr(addr)
	if err != nil {
		return nil, fmt.Errorf("verbs: listen on %q: %w", addr, err)
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, fmt.Errorf("verbs: listen on %s: device %s: %w", addr, d.info.Name, nprdma.ErrClosed)
	}
	d.mu.Unlock()
	var e C.int
	id := C.np_create_id(d.cm, &e)
	if id == nil {
		return nil, fmt.Errorf("verbs: listen on %s: create id: %w", addr, syscall.Errno(e))
	}
	l := &Listener{dev: d, id: id, reqs: make(chan *ConnRequest, 128), done: make(chan struct{})}
	d.register(id, l)
	if rc := C.np_bind_listen(id, &a, 128); rc != 0 {
		d.forget(id)
		C.np_destroy_id(id)
		return nil, fmt.Errorf("verbs: listen on %s: %w", addr, errnoErr(rc))
	}
	if v := C.np_id_verbs(id); v != nil && v != d.ctx {
		d.forget(id)
		C.np_destroy_id(id)
		return nil, fmt.Errorf("verbs: listen on %s: the address belongs to another RDMA device than %s", addr, d.info.Name)
	}
	l.addr = idAddr(id, false)
	d.mu.Lock()
	d.listeners[l] = struct{}{}
	d.mu.Unlock()
	return l, nil
}

// Addr is the address peers connect to.
func (l *Listener) Addr() string { return l.addr }

func (l *Listener) cmEvent(cmEvent) {}

// offer queues a connection request; false when the listener is closed or
// its queue is full (the request is then refused).
func (l *Listener) offer(child *C.struct_rdma_cm_id, ev cmEvent) bool {
	r := &ConnRequest{dev: l.dev, id: child, pdata: ev.pdata, initDepth: ev.initDepth, respRes: ev.respRes,
		remoteQPN: ev.remoteQPN, events: make(chan cmEvent, 8)}
	r.remote = idAddr(child, true)
	l.dev.register(child, r)
	select {
	case <-l.done:
	case l.reqs <- r:
		return true
	default:
		l.dev.log.Warn("verbs: connection request refused: the listener's queue is full", "listener", l.addr, "from", r.remote)
	}
	l.dev.forget(child)
	return false
}

// Accept waits for the next connection request.
func (l *Listener) Accept(ctx context.Context) (nprdma.ConnRequestDriver, error) {
	select {
	case r := <-l.reqs:
		return r, nil
	case <-l.done:
		return nil, fmt.Errorf("verbs: accept on %s: %w", l.addr, nprdma.ErrClosed)
	case <-ctx.Done():
		return nil, fmt.Errorf("verbs: accept on %s: %w", l.addr, ctx.Err())
	}
}

// Close stops listening; requests not yet accepted are refused.
func (l *Listener) Close() error {
	select {
	case <-l.done:
		return nil
	default:
	}
	close(l.done)
	l.dev.mu.Lock()
	delete(l.dev.listeners, l)
	l.dev.mu.Unlock()
	l.dev.forget(l.id)
	C.np_destroy_id(l.id)
	for {
		select {
		case r := <-l.reqs:
			r.Reject(nil)
		default:
			return nil
		}
	}
}

// ConnRequest is a connection request, answered by Accept or Reject.
type ConnRequest struct {
	dev       *Device
	id        *C.struct_rdma_cm_id
	pdata     []byte
	remote    string
	initDepth uint8
	respRes   uint8
	remoteQPN uint32
	events    chan cmEvent
	answered  bool
}

func (r *ConnRequest) cmEvent(ev cmEvent) {
	select {
	case r.events <- ev:
	default:
	}
}

// PrivateData is the private data of the request, padded with zeros to
// MaxConnectPrivateData bytes by the connection manager.
func (r *ConnRequest) PrivateData() []byte { return r.pdata }

// RemoteAddr is the peer's address.
func (r *ConnRequest) RemoteAddr() string { return r.remote }

// Accept connects qp (a fresh queue pair of the same device) to the peer,
// answering with privateData, and returns once the connection is
// established.
func (r *ConnRequest) Accept(q nprdma.QPDriver, privateData []byte) error {
	qp, ok := q.(*QP)
	if !ok {
		return fmt.Errorf("verbs: accept: a queue pair of another kind of device")
	}
	if len(privateData) > MaxAcceptPrivateData {
		return fmt.Errorf("verbs: accept: %d bytes of private data, at most %d", len(privateData), MaxAcceptPrivateData)
	}
	if r.answered {
		return fmt.Errorf("verbs: accept: connection request from %s already answered", r.remote)
	}
	if qp.dev != r.dev {
		return fmt.Errorf("verbs: accept: qp %d belongs to another device", qp.num)
	}
	r.answered = true
	if err := qp.beginConnect(); err != nil {
		r.reject(nil)
		return err
	}
	fail := func(err error) error {
		qp.connectFailed(nil)
		r.dev.forget(r.id)
		C.np_destroy_id(r.id)
		return fmt.Errorf("verbs: accept connection from %s on qp %d: %w", r.remote, qp.num, err)
	}
	if v := C.np_id_verbs(r.id); v != r.dev.ctx {
		r.reject(nil)
		qp.connectFailed(nil)
		return fmt.Errorf("verbs: accept connection from %s: it arrived on another RDMA device than %s", r.remote, r.dev.info.Name)
	}
	initDepth := min(int(r.initDepth), r.dev.info.MaxQPInitRdAtom)
	respRes := min(int(r.respRes), r.dev.info.MaxQPRdAtom)
	if rc := C.np_modify_cm(r.id, qp.qp, C.IBV_QPS_INIT, 0, -1); rc != 0 {
		return fail(fmt.Errorf("queue pair to init: %w", errnoErr(rc)))
	}
	if rc := C.np_modify_cm(r.id, qp.qp, C.IBV_QPS_RTR, C.int(respRes), C.int(qp.rnrTimer)); rc != 0 {
		return fail(fmt.Errorf("queue pair to RTR: %w", errnoErr(rc)))
	}
	if rc := C.np_modify_cm(r.id, qp.qp, C.IBV_QPS_RTS, C.int(initDepth), C.int(qp.rnrRetry)); rc != 0 {
		return fail(fmt.Errorf("queue pair to RTS: %w", errnoErr(rc)))
	}
	// Events of the id go to the queue pair from now on.
	qp.ctl.Lock()
	qp.id = r.id
	qp.remoteNum = r.remoteQPN
	qp.ctl.Unlock()
	r.dev.register(r.id, qp)
drain:
	for {
		select {
		case ev := <-r.events: // arrived before the hand-over
			qp.cmEvent(ev)
		default:
			break drain
		}
	}
	var pd *C.uint8_t
	if len(privateData) > 0 {
		pd = (*C.uint8_t)(unsafe.Pointer(&privateData[0]))
	}
	if rc := C.np_accept(r.id, C.uint32_t(qp.num), pd, C.int(len(privateData)), C.int(respRes), C.int(initDepth), C.int(qp.rnrRetry)); rc != 0 {
		qp.ctl.Lock()
		qp.id = nil
		qp.ctl.Unlock()
		return fail(errnoErr(rc))
	}
	// The queue pair is ready to send now; ESTABLISHED confirms the
	// peer heard the answer.
	ctx, cancel := context.WithTimeout(context.Background(), establishTimeout)
	defer cancel()
	if _, err := qp.awaitEvent(ctx, C.RDMA_CM_EVENT_ESTABLISHED); err != nil {
		qp.connectFailed(err)
		return fmt.Errorf("verbs: accept connection from %s on qp %d: %w", r.remote, qp.num, err)
	}
	return qp.established()
}

// Reject refuses the request; the peer's Connect returns a
// *nprdma.RejectError with privateData (padded with zeros).
func (r *ConnRequest) Reject(privateData []byte) error {
	if len(privateData) > MaxRejectPrivateData {
		return fmt.Errorf("verbs: reject: %d bytes of private data, at most %d", len(privateData), MaxRejectPrivateData)
	}
	if r.answered {
		return fmt.Errorf("verbs: reject: connection request from %s already answered", r.remote)
	}
	r.answered = true
	return r.reject(privateData)
}

func (r *ConnRequest) reject(privateData []byte) error {
	var pd *C.uint8_t
	if len(privateData) > 0 {
		pd = (*C.uint8_t)(unsafe.Pointer(&privateData[0]))
	}
	rc := C.np_reject(r.id, pd, C.int(len(privateData)))
	r.dev.forget(r.id)
	C.np_destroy_id(r.id)
	if rc != 0 {
		return fmt.Errorf("verbs: reject connection from %s: %w", r.remote, errnoErr(rc))
	}
	return nil
}

// cmEvent receives the events of the queue pair's connection.
func (qp *QP) cmEvent(ev cmEvent) {
	switch ev.kind {
	case C.RDMA_CM_EVENT_DISCONNECTED:
		qp.ctl.Lock()
		st, dropped := qp.State(), qp.dropped
		qp.ctl.Unlock()
		if st == nprdma.QPStateRTS && !dropped {
			qp.fail(nprdma.ErrPeerDisconnected)
		}
	case C.RDMA_CM_EVENT_DEVICE_REMOVAL:
		qp.fail(fmt.Errorf("%w: the RDMA device was removed", nprdma.ErrPeerLost))
	}
	select {
	case qp.cmEvents <- ev:
	default:
	}
}

// awaitEvent waits for the next connection event of kind want; any other
// event that ends a connection attempt is an error.
func (qp *QP) awaitEvent(ctx context.Context, want int) (cmEvent, error) {
	for {
		select {
		case ev := <-qp.cmEvents:
			if ev.kind == want {
				return ev, nil
			}
			switch ev.kind {
			case C.RDMA_CM_EVENT_REJECTED:
				if ev.status == rejConsumer {
					return ev, &nprdma.RejectError{PrivateData: ev.pdata}
				}
				if ev.status == rejInvalidServiceID {
					return ev, fmt.Errorf("nobody listens there (the peer's connection manager rejected the request: invalid service ID)")
				}
				return ev, fmt.Errorf("rejected by the peer's connection manager (reason %d)", ev.status)
			case C.RDMA_CM_EVENT_ADDR_ERROR, C.RDMA_CM_EVENT_ROUTE_ERROR, C.RDMA_CM_EVENT_UNREACHABLE,
				C.RDMA_CM_EVENT_CONNECT_ERROR, C.RDMA_CM_EVENT_DISCONNECTED, C.RDMA_CM_EVENT_DEVICE_REMOVAL:
				return ev, fmt.Errorf("%s (status %d: %v)", eventName(ev.kind), ev.status, syscall.Errno(-min(ev.status, 0)))
			}
		case <-ctx.Done():
			return cmEvent{}, ctx.Err()
		}
	}
}

func (qp *QP) beginConnect() error {
	qp.ctl.Lock()
	defer qp.ctl.Unlock()
	if st := qp.State(); st != nprdma.QPStateInit {
		return fmt.Errorf("verbs: connect qp %d: state is %s, not init", qp.num, st)
	}
	qp.state.Store(int32(nprdma.QPStateConnecting))
	return nil
}

// connectFailed moves a queue pair whose connection failed to the error
// state (the receives posted in advance are flushed).
func (qp *QP) connectFailed(cause error) {
	if cause == nil {
		cause = nprdma.ErrNotConnected
	}
	qp.ctl.Lock()
	if qp.State() == nprdma.QPStateConnecting {
		qp.setErrorLocked(fmt.Errorf("%w: %w", nprdma.ErrNotConnected, cause))
	}
	id := qp.id
	qp.id = nil
	if qp.State() != nprdma.QPStateClosed { // under ctl, as in errorAndDisconnectLocked
		C.np_qp_error(qp.qp)
	}
	qp.ctl.Unlock()
	if id != nil {
		qp.dev.forget(id)
		C.np_destroy_id(id)
	}
}

func (qp *QP) established() error {
	qp.ctl.Lock()
	defer qp.ctl.Unlock()
	if qp.State() != nprdma.QPStateConnecting {
		return fmt.Errorf("verbs: qp %d became %s while connecting: %w", qp.num, qp.State(), nprdma.ErrClosed)
	}
	qp.state.Store(int32(nprdma.QPStateRTS))
	return nil
}

// Connect connects the queue pair to the listener at addr ("ip:port"),
// sending privateData (at most MaxConnectPrivateData bytes), and returns
// the private data the peer accepted with (padded with zeros to
// MaxAcceptPrivateData). A rejection by the peer's application is a
// *nprdma.RejectError.
func (qp *QP) Connect(ctx context.Context, addr string, privateData []byte) ([]byte, error) {
	if len(privateData) > MaxConnectPrivateData {
		return nil, fmt.Errorf("verbs: connect qp %d to %s: %d bytes of private data, at most %d", qp.num, addr, len(privateData), MaxConnectPrivateData)
	}
	dst, err := parseAddr(addr)
	if err != nil {
		return nil, fmt.Errorf("verbs: connect qp %d to %q: %w", qp.num, addr, err)
	}
	if err := qp.beginConnect(); err != nil {
		return nil, err
	}
	d := qp.dev
	var e C.int
	id := C.np_create_id(d.cm, &e)
	if id == nil {
		qp.connectFailed(nil)
		return nil, fmt.Errorf("verbs: connect qp %d to %s: create id: %w", qp.num, addr, syscall.Errno(e))
	}
	qp.ctl.Lock()
	qp.id = id
	qp.ctl.Unlock()
	d.register(id, qp)
	fail := func(err error) ([]byte, error) {
		qp.connectFailed(err)
		var rej *nprdma.RejectError
		if errors.As(err, &rej) {
			return nil, rej
		}
		return nil, fmt.Errorf("verbs: connect qp %d to %s: %w", qp.num, addr, err)
	}
	if rc := C.np_resolve_addr(id, &dst, resolveTimeout); rc != 0 {
		return fail(fmt.Errorf("resolve address: %w", errnoErr(rc)))
	}
	if _, err := qp.awaitEvent(ctx, C.RDMA_CM_EVENT_ADDR_RESOLVED); err != nil {
		return fail(fmt.Errorf("resolve address: %w", err))
	}
	if rc := C.np_resolve_route(id, resolveTimeout); rc != 0 {
		return fail(fmt.Errorf("resolve route: %w", errnoErr(rc)))
	}
	if _, err := qp.awaitEvent(ctx, C.RDMA_CM_EVENT_ROUTE_RESOLVED); err != nil {
		return fail(fmt.Errorf("resolve route: %w", err))
	}
	if v := C.np_id_verbs(id); v != d.ctx {
		return fail(fmt.Errorf("the address is reached through another RDMA device than %s", d.info.Name))
	}
	if rc := C.np_modify_cm(id, qp.qp, C.IBV_QPS_INIT, 0, -1); rc != 0 {
		return fail(fmt.Errorf("queue pair to init: %w", errnoErr(rc)))
	}
	var pd *C.uint8_t
	if len(privateData) > 0 {
		pd = (*C.uint8_t)(unsafe.Pointer(&privateData[0]))
	}
	if rc := C.np_connect(id, C.uint32_t(qp.num), pd, C.int(len(privateData)),
		C.int(d.info.MaxQPRdAtom), C.int(d.info.MaxQPInitRdAtom), C.int(qp.rnrRetry)); rc != 0 {
		return fail(errnoErr(rc))
	}
	ev, err := qp.awaitEvent(ctx, C.RDMA_CM_EVENT_CONNECT_RESPONSE)
	if err != nil {
		return fail(err)
	}
	// Init again: the access rights the connection manager computes depend
	// on the responder resources, which are known only now (librdmacm does
	// the same for the queue pairs it creates).
	if rc := C.np_modify_cm(id, qp.qp, C.IBV_QPS_INIT, 0, -1); rc != 0 {
		return fail(fmt.Errorf("queue pair to init: %w", errnoErr(rc)))
	}
	if rc := C.np_modify_cm(id, qp.qp, C.IBV_QPS_RTR, C.int(d.info.MaxQPRdAtom), C.int(qp.rnrTimer)); rc != 0 {
		return fail(fmt.Errorf("queue pair to RTR: %w", errnoErr(rc)))
	}
	if rc := C.np_modify_cm(id, qp.qp, C.IBV_QPS_RTS, 0, C.int(qp.rnrRetry)); rc != 0 {
		return fail(fmt.Errorf("queue pair to RTS: %w", errnoErr(rc)))
	}
	if rc := C.np_establish(id); rc != 0 {
		return fail(fmt.Errorf("establish: %w", errnoErr(rc)))
	}
	qp.ctl.Lock()
	qp.remoteNum = ev.remoteQPN
	qp.ctl.Unlock()
	if err := qp.established(); err != nil {
		return nil, err
	}
	return ev.pdata, nil
}
