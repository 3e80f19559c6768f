package nprdma

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/nprdma/nprdma/nprdma/link"
)

// softDevice is the software NIC: a DeviceDriver on top of a Provider, the
// factory of protection domains, completion queues and listeners, and the
// owner of the key tables its NIC engine validates remote access against.
type softDevice struct {
	prov link.Provider
	name string
	pin  bool

	ctr counters

	mu        sync.Mutex
	closed    bool
	pds       map[*softPD]struct{}
	qps       map[*softQP]struct{}
	cqs       map[*softCQ]struct{}
	listeners map[*softListener]struct{}

	// Key tables, copied on write: lookups on the data path take no lock.
	lkeys    atomic.Pointer[[]*softMR] // index lkey>>8
	rkeys    atomic.Pointer[map[uint32]*softMR]
	freeIdx  []uint32
	lkeyGen  []uint8
	live     map[*softMR]struct{}
	nextQPN  atomic.Uint32
	deviceID uint64
}

var deviceIDs atomic.Uint64

// newSoftDevice opens the software NIC on provider p.
func newSoftDevice(p link.Provider, name string, pin bool) *softDevice {
	d := &softDevice{
		prov:      p,
		name:      name,
		pin:       pin,
		pds:       map[*softPD]struct{}{},
		qps:       map[*softQP]struct{}{},
		cqs:       map[*softCQ]struct{}{},
		listeners: map[*softListener]struct{}{},
		live:      map[*softMR]struct{}{},
		lkeyGen:   []uint8{0},
		deviceID:  deviceIDs.Add(1),
	}
	empty := []*softMR{nil} // index 0 is never a valid lkey
	d.lkeys.Store(&empty)
	m := map[uint32]*softMR{}
	d.rkeys.Store(&m)
	return d
}

// Name is the device's name.
func (d *softDevice) Name() string { return d.name }

// Caps implements DeviceDriver: the software NIC does everything the API
// describes.
func (d *softDevice) Caps() Caps {
	return Caps{UnpinnedRegions: true, AccessTags: true, ResponderStats: true, PeerErrorCauses: true, CQOverflow: true,
		OrderedLocalErrors: true, ExactErrorStatus: true,
		MaxConnectPrivateData: MaxPrivateData, MaxAcceptPrivateData: MaxPrivateData, MaxRejectPrivateData: MaxPrivateData}
}

// AllocPD implements DeviceDriver.
func (d *softDevice) AllocPD() (PDDriver, error) {
	pd := &softPD{dev: d, mrs: map[*softMR]struct{}{}, qps: map[*softQP]struct{}{}}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("nprdma: allocate protection domain: device %s: %w", d.name, ErrClosed)
	}
	d.pds[pd] = struct{}{}
	return pd, nil
}

// Listen implements DeviceDriver.
func (d *softDevice) Listen(addr string) (ListenerDriver, error) {
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
	l := &softListener{dev: d, ll: ll}
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
func (d *softDevice) Close() error {
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
func (d *softDevice) lookupLKey(k uint32) *softMR {
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
func (d *softDevice) lookupRKey(k uint32) *softMR {
	return (*d.rkeys.Load())[k]
}

func (d *softDevice) addQP(qp *softQP) error {
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

func (d *softDevice) removeQP(qp *softQP) {
	d.mu.Lock()
	if _, ok := d.qps[qp]; ok {
		delete(d.qps, qp)
		d.ctr.qpsOpen.Add(-1)
	}
	d.mu.Unlock()
}

// softListener accepts connection requests.
type softListener struct {
	dev *softDevice
	ll  link.Listener
}

// Accept waits for the next connection request.
func (l *softListener) Accept(ctx context.Context) (ConnRequestDriver, error) {
	req, err := l.ll.Accept(ctx)
	if err != nil {
		return nil, fmt.Errorf("nprdma: accept on %s: %w", l.ll.Addr(), err)
	}
	return &softConnRequest{dev: l.dev, req: req}, nil
}

// Addr is the address peers connect to.
func (l *softListener) Addr() string { return l.ll.Addr() }

// Close stops listening. Established connections are not affected.
func (l *softListener) Close() error {
	l.dev.mu.Lock()
	delete(l.dev.listeners, l)
	l.dev.mu.Unlock()
	return l.ll.Close()
}

// softConnRequest is a connection request from a peer, answered by Accept
// or Reject.
type softConnRequest struct {
	dev      *softDevice
	req      link.Request
	answered atomic.Bool
}

// PrivateData is the private data the peer passed to Connect.
func (r *softConnRequest) PrivateData() []byte { return r.req.Hello().PrivateData }

// RemoteAddr is the peer's address.
func (r *softConnRequest) RemoteAddr() string { return r.req.RemoteAddr() }

// Accept connects qp (a fresh queue pair of the same device) to the peer and
// answers with privateData, which the peer's Connect returns.
func (r *softConnRequest) Accept(q QPDriver, privateData []byte) error {
	qp, ok := q.(*softQP)
	if !ok {
		return fmt.Errorf("nprdma: accept: a queue pair of another kind of device")
	}
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
	lk, err := r.req.Accept(link.Hello{QPNum: qp.num, PrivateData: privateData})
	if err != nil {
		qp.connectFailed()
		return fmt.Errorf("nprdma: accept connection from %s on qp %d: %w", r.RemoteAddr(), qp.num, err)
	}
	return qp.establish(lk, r.req.Hello().QPNum)
}

// Reject refuses the request; the peer's Connect returns a *RejectError with
// privateData.
func (r *softConnRequest) Reject(privateData []byte) error {
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
