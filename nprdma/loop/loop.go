// Package loop is the in-process nprdma provider: queue pairs of devices in
// one process connect through a Fabric by name, and packets move between
// them through in-memory queues, one delivery goroutine per endpoint. It has
// the same semantics as the tcp provider (it runs the same conformance
// suite) and serves tests and the measurement of costs without a network.
package loop

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/nprdma/nprdma/nprdma/link"
)

// Fabric is an in-process network: a namespace of listener names. Providers
// on the same fabric reach each other.
type Fabric struct {
	mu        sync.Mutex
	listeners map[string]*listener
	next      int
}

// NewFabric returns an empty fabric.
func NewFabric() *Fabric { return &Fabric{listeners: map[string]*listener{}} }

// Provider is an endpoint of a Fabric: a device's view of it. Its fault
// injection methods (Freeze, Thaw, Crash) act on every link it owns, as if on
// the process behind it.
type Provider struct {
	fabric *Fabric
	id     uint64

	mu        sync.Mutex
	endpoints map[*endpoint]struct{}
	listeners map[*listener]struct{}
	crashed   bool

	gate link.FreezeGate // Freeze and Thaw; synchronised on its own
}

// Option configures a Provider.
type Option func(*Provider)

// WithFabric attaches the provider to f (default: a fabric of its own, which
// every device opened on this provider shares).
func WithFabric(f *Fabric) Option { return func(p *Provider) { p.fabric = f } }

var providerIDs atomic.Uint64

// New returns a loop provider.
func New(opts ...Option) *Provider {
	p := &Provider{
		id:        providerIDs.Add(1),
		endpoints: map[*endpoint]struct{}{},
		listeners: map[*listener]struct{}{},
	}
	for _, o := range opts {
		o(p)
	}
	if p.fabric == nil {
		p.fabric = NewFabric()
	}
	return p
}

// Name implements link.Provider.
func (p *Provider) Name() string { return "loop" }

var (
	errCrashed   = errors.New("loop: provider crashed")
	errReset     = errors.New("loop: connection reset by peer")
	errAborted   = errors.New("loop: link aborted")
	errNoListen  = errors.New("connection refused")
	errLisClosed = errors.New("loop: listener closed")
)

// Listen implements link.Provider. An empty addr picks a fresh name.
func (p *Provider) Listen(addr string) (link.Listener, error) {
	p.mu.Lock()
	crashed := p.crashed
	p.mu.Unlock()
	if crashed {
		return nil, errCrashed
	}
	f := p.fabric
	f.mu.Lock()
	if addr == "" {
		for {
			f.next++
			addr = "loop-" + strconv.Itoa(f.next)
			if _, taken := f.listeners[addr]; !taken {
				break
			}
		}
	}
	if _, taken := f.listeners[addr]; taken {
		f.mu.Unlock()
		return nil, fmt.Errorf("loop: listen on %q: address already in use", addr)
	}
	l := &listener{prov: p, name: addr, reqs: make(chan *request, 128), closed: make(chan struct{})}
	f.listeners[addr] = l
	f.mu.Unlock()
	p.mu.Lock()
	p.listeners[l] = struct{}{}
	p.mu.Unlock()
	return l, nil
}

// Dial implements link.Provider.
func (p *Provider) Dial(ctx context.Context, addr string, hello link.Hello) (link.Link, link.Hello, error) {
	p.mu.Lock()
	crashed := p.crashed
	p.mu.Unlock()
	if crashed {
		return nil, link.Hello{}, errCrashed
	}
	p.fabric.mu.Lock()
	l := p.fabric.listeners[addr]
	p.fabric.mu.Unlock()
	if l == nil {
		return nil, link.Hello{}, fmt.Errorf("loop: dial %q: %w (no listener)", addr, errNoListen)
	}
	req := &request{
		hello:    link.Hello{QPNum: hello.QPNum, PrivateData: append([]byte(nil), hello.PrivateData...)},
		from:     "loop:" + strconv.FormatUint(p.id, 10),
		dialer:   p,
		answer:   make(chan answer, 1),
		listener: l,
	}
	select {
	case l.reqs <- req:
	case <-l.closed:
		return nil, link.Hello{}, fmt.Errorf("loop: dial %q: %w", addr, errNoListen)
	case <-ctx.Done():
		return nil, link.Hello{}, fmt.Errorf("loop: dial %q: %w", addr, ctx.Err())
	}
	select {
	case a := <-req.answer:
		return a.result()
	case <-ctx.Done():
		req.mu.Lock()
		req.abandoned = true
		req.mu.Unlock()
		select {
		case a := <-req.answer:
			if a.ep != nil {
				a.ep.Abort()
			}
		default:
		}
		return nil, link.Hello{}, fmt.Errorf("loop: dial %q: %w", addr, ctx.Err())
	}
}

// Freeze stops delivering inbound packets on every link of the provider, as
// if its process were stopped (SIGSTOP): peers see silence, not an error.
func (p *Provider) Freeze() { p.gate.Freeze() }

// Thaw undoes Freeze.
func (p *Provider) Thaw() { p.gate.Thaw() }

// Crash breaks every link and listener of the provider at once, as the death
// of its process would: peers see their connections reset.
func (p *Provider) Crash() {
	p.mu.Lock()
	p.crashed = true
	eps, ls := slices.Collect(maps.Keys(p.endpoints)), slices.Collect(maps.Keys(p.listeners))
	p.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	for _, e := range eps {
		e.breakBoth(errCrashed)
	}
	p.Thaw()
}

type listener struct {
	prov      *Provider
	name      string
	reqs      chan *request
	closed    chan struct{}
	closeOnce sync.Once
}

func (l *listener) Accept(ctx context.Context) (link.Request, error) {
	select {
	case r := <-l.reqs:
		return r, nil
	case <-l.closed:
		return nil, errLisClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *listener) Addr() string { return l.name }

func (l *listener) Close() error {
	l.closeOnce.Do(func() {
		f := l.prov.fabric
		f.mu.Lock()
		if f.listeners[l.name] == l {
			delete(f.listeners, l.name)
		}
		f.mu.Unlock()
		l.prov.mu.Lock()
		delete(l.prov.listeners, l)
		l.prov.mu.Unlock()
		close(l.closed)
		for {
			select {
			case r := <-l.reqs:
				r.answerWith(answer{err: errNoListen})
			default:
				return
			}
		}
	})
	return nil
}

type request struct {
	hello     link.Hello
	from      string
	dialer    *Provider
	answer    chan answer
	mu        sync.Mutex
	abandoned bool
	done      bool
	listener  *listener
}

type answer struct {
	ep       *endpoint
	hello    link.Hello
	rejected bool
	err      error
}

func (a answer) result() (link.Link, link.Hello, error) {
	switch {
	case a.err != nil:
		return nil, link.Hello{}, a.err
	case a.rejected:
		return nil, link.Hello{}, &link.RejectError{PrivateData: a.hello.PrivateData}
	}
	return a.ep, a.hello, nil
}

func (r *request) answerWith(a answer) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.abandoned || r.done {
		return false
	}
	r.done = true
	r.answer <- a
	return true
}

func (r *request) Hello() link.Hello  { return r.hello }
func (r *request) RemoteAddr() string { return r.from }

func (r *request) Accept(hello link.Hello) (link.Link, error) {
	srv, cli := newPair(r.listenerProvider(), r.dialer)
	if !r.answerWith(answer{ep: cli, hello: link.Hello{QPNum: hello.QPNum, PrivateData: append([]byte(nil), hello.PrivateData...)}}) {
		srv.breakBoth(errAborted)
		return nil, errors.New("loop: the peer gave up connecting")
	}
	return srv, nil
}

func (r *request) Reject(privateData []byte) error {
	r.answerWith(answer{rejected: true, hello: link.Hello{PrivateData: append([]byte(nil), privateData...)}})
	return nil
}

func (r *request) listenerProvider() *Provider { return r.listener.prov }
