package nprdma

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
)

// Device is an RDMA device on top of a Provider: the factory of protection
// domains, completion queues and listeners, and the owner of the key tables
// its NIC engine validates remote access against.
type Device struct {
	prov Provider
	name string
	pin  bool

	ctr counters

	mu        sync.Mutex
	closed    bool
	pds       map[*PD]struct{}
	qps       map[*QP]struct{}
	cqs       map[*CQ]struct{}
	listeners map[*Listener]struct{}

	// Key tables, copied on write: lookups on the data path take no lock.
	lkeys    atomic.Pointer[[]*MR] // index lkey>>8
	rkeys    atomic.Pointer[map[uint32]*MR]
	freeIdx  []uint32
	lkeyGen  []uint8
	live     map[*MR]struct{}
	nextQPN  atomic.Uint32
	deviceID uint64
}

// DeviceOption configures a Device.
type DeviceOption func(*Device)

// WithName names the device in errors and metrics (default: the provider's
// name).
func WithName(name string) DeviceOption { return func(d *Device) { d.name = name } }

// WithPinning chooses whether PD.Register pins memory with mlock (default
// true, as ibv_reg_mr does). Without pinning, registration needs no
// CAP_IPC_LOCK or RLIMIT_MEMLOCK, and the pages may be swapped out.
func WithPinning(pin bool) DeviceOption { return func(d *Device) { d.pin = pin } }

var deviceIDs atomic.Uint64

// NewDevice opens a device on provider p.
func NewDevice(p Provider, opts ...DeviceOption) *Device {
	d := &Device{
		prov:      p,
		name:      p.Name(),
		pin:       true,
		pds:       map[*PD]struct{}{},
		qps:       map[*QP]struct{}{},
		cqs:       map[*CQ]struct{}{},
		listeners: map[*Listener]struct{}{},
		live:      map[*MR]struct{}{},
		lkeyGen:   []uint8{0},
		deviceID:  deviceIDs.Add(1),
	}
	for _, o := range opts {
		o(d)
	}
	empty := []*MR{nil} // index 0 is never a valid lkey
	d.lkeys.Store(&empty)
	m := map[uint32]*MR{}
	d.rkeys.Store(&m)
	return d
}

// Name is the device's name.
func (d *Device) Name() string { return d.name }

// Provider is the transport the device runs on.
func (d *Device) Provider() Provider { return d.prov }

// AllocPD allocates a protection domain.
func (d *Device) AllocPD() *PD {
	pd := &PD{dev: d, mrs: map[*MR]struct{}{}, qps: map[*QP]struct{}{}}
	d.mu.Lock()
	if d.closed {
		pd.closed = true
	} else {
		d.pds[pd] = struct{}{}
	}
	d.mu.Unlock()
	return pd
}

// Listen accepts connection requests on addr ("127.0.0.1:0" for tcp, any
// name or "" for a generated one with loop).
func (d *Device) Listen(addr string) (*Listener, error) {
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("nprdma: listen on %s: device %s: %w", addr, d.name, ErrClosed)
	}
	ll, err := d.prov.Listen(addr)
	if err != nil {
		return nil, fmt.Errorf("nprdma: listen on %q (device %s): %w", addr, d.name, err)
	}
	l := &Listener{dev: d, ll: ll}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		ll.Close()
		return nil, fmt.Errorf("nprdma: listen on %s: device %s: %w", addr, d.name, ErrClosed)
	}
	d.listeners[l] = struct{}{}
	d.mu.Unlock()
	return l, nil
}

// Close closes the device's listeners and queue pairs (abruptly, like the
// end of the process) and deregisters its memory regions.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	ls, qps, mrs := slices.Collect(maps.Keys(d.listeners)), slices.Collect(maps.Keys(d.qps)), slices.Collect(maps.Keys(d.live))
	d.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	for _, qp := range qps {
		qp.Close()
	}
	for _, mr := range mrs {
		mr.Deregister()
	}
	return nil
}

// lookupLKey returns the live region with local key k, or nil.
func (d *Device) lookupLKey(k uint32) *MR {
	tab := *d.lkeys.Load()
	i := k >> 8
	if i == 0 || int(i) >= len(tab) {
		return nil
	}
	mr := tab[i]
	if mr == nil || mr.lkey != k {
		return nil
	}
	return mr
}

// lookupRKey returns the live region with remote key k, or nil.
func (d *Device) lookupRKey(k uint32) *MR {
	return (*d.rkeys.Load())[k]
}

func (d *Device) addQP(qp *QP) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("nprdma: create queue pair: device %s: %w", d.name, ErrClosed)
	}
	d.qps[qp] = struct{}{}
	d.ctr.qpsCreated.Add(1)
	d.ctr.qpsOpen.Add(1)
	return nil
}

func (d *Device) removeQP(qp *QP) {
	d.mu.Lock()
	if _, ok := d.qps[qp]; ok {
		delete(d.qps, qp)
		d.ctr.qpsOpen.Add(-1)
	}
	d.mu.Unlock()
}

// Listener accepts connection requests (rdma_listen).
type Listener struct {
	dev *Device
	ll  LinkListener
}

// Accept waits for the next connection request.
func (l *Listener) Accept(ctx context.Context) (*ConnRequest, error) {
	req, err := l.ll.Accept(ctx)
	if err != nil {
		return nil, fmt.Errorf("nprdma: accept on %s: %w", l.ll.Addr(), err)
	}
	return &ConnRequest{dev: l.dev, req: req}, nil
}

// Addr is the address peers connect to.
func (l *Listener) Addr() string { return l.ll.Addr() }

// Close stops listening. Established connections are not affected.
func (l *Listener) Close() error {
	l.dev.mu.Lock()
	delete(l.dev.listeners, l)
	l.dev.mu.Unlock()
	return l.ll.Close()
}

// ConnRequest is a connection request from a peer, answered by Accept or
// Reject.
type ConnRequest struct {
	dev      *Device
	req      LinkRequest
	answered atomic.Bool
}

// PrivateData is the private data the peer passed to Connect.
func (r *ConnRequest) PrivateData() []byte { return r.req.Hello().PrivateData }

// RemoteAddr is the peer's address.
func (r *ConnRequest) RemoteAddr() string { return r.req.RemoteAddr() }

// Accept connects qp (a fresh queue pair of the same device) to the peer and
// answers with privateData, which the peer's Connect returns.
func (r *ConnRequest) Accept(qp *QP, privateData []byte) error {
	if len(privateData) > MaxPrivateData {
		return fmt.Errorf("nprdma: accept: %d bytes of private data, at most %d", len(privateData), MaxPrivateData)
	}
	if qp.dev != r.dev {
		return fmt.Errorf("nprdma: accept: qp %d belongs to device %s, not %s", qp.num, qp.dev.name, r.dev.name)
	}
	if !r.answered.CompareAndSwap(false, true) {
		return fmt.Errorf("nprdma: accept: connection request from %s already answered", r.RemoteAddr())
	}
	if err := qp.beginConnect(); err != nil {
		r.req.Reject(nil)
		return err
	}
	link, err := r.req.Accept(Hello{QPNum: qp.num, PrivateData: privateData})
	if err != nil {
		qp.connectFailed()
		return fmt.Errorf("nprdma: accept connection from %s on qp %d: %w", r.RemoteAddr(), qp.num, err)
	}
	return qp.establish(link, r.req.Hello().QPNum)
}

// Reject refuses the request; the peer's Connect returns a *RejectError with
// privateData.
func (r *ConnRequest) Reject(privateData []byte) error {
	if len(privateData) > MaxPrivateData {
		return fmt.Errorf("nprdma: reject: %d bytes of private data, at most %d", len(privateData), MaxPrivateData)
	}
	if !r.answered.CompareAndSwap(false, true) {
		return fmt.Errorf("nprdma: reject: connection request from %s already answered", r.RemoteAddr())
	}
	if err := r.req.Reject(privateData); err != nil {
		return fmt.Errorf("nprdma: reject connection from %s: %w", r.RemoteAddr(), err)
	}
	return nil
}
