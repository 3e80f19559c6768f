// Package tcp is the nprdma provider that runs RDMA in software over TCP:
// one TCP connection per queue pair, carrying the frames described in
// docs/nprdma.md. The responder side of one-sided READ and WRITE (the NIC
// engine, in package nprdma) runs on the connection's reader goroutine and
// answers without handing work to another goroutine.
package tcp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nprdma/nprdma/nprdma/link"

	"golang.org/x/sys/unix"
)

// Provider is the tcp provider. Its fault injection methods (Freeze, Thaw,
// Crash) act on every connection it owns, as if on the process behind it.
type Provider struct {
	handshakeTimeout time.Duration
	readBuffer       int
	linger           time.Duration // direct completion; 0: off
	// socketReceiveBuffer is each connection's SO_RCVBUF (0: the kernel's
	// autotuning).
	socketReceiveBuffer int
	// stalledFrame bounds how long an interrupted driver waits for the rest
	// of a frame (WithStalledFrameTimeout).
	stalledFrame time.Duration
	// congestion is each connection's TCP congestion control ("": the
	// system's; WithCongestionControl).
	congestion string

	mu        sync.Mutex
	links     map[*tcpLink]struct{}
	listeners map[*listener]struct{}
	crashed   bool

	gate link.FreezeGate // Freeze and Thaw; synchronised on its own
}

// Option configures a Provider.
type Option func(*Provider)

// WithHandshakeTimeout bounds the connection handshake (default 10 s; a
// Dial context with an earlier deadline wins).
func WithHandshakeTimeout(d time.Duration) Option {
	return func(p *Provider) { p.handshakeTimeout = d }
}

// DefaultSocketReceiveBuffer is each connection's SO_RCVBUF unless
// WithSocketReceiveBuffer says otherwise. Fixed rather than left to the
// kernel's autotuning because under BBR 128 KiB READs, WRITEs and SENDs
// streamed closer to a raw (autotuned) socket with it: in three
// alternating runs each, the worst of the three at its worst depth was
// 0.48–0.81× the raw stream autotuned and 0.79–0.87× fixed; under reno the
// two are alike (docs/nprdma.md §10.2). The kernel caps it at
// net.core.rmem_max and charges only what is queued.
const DefaultSocketReceiveBuffer = 4 << 20

// WithSocketReceiveBuffer sets each connection's socket receive buffer
// (SO_RCVBUF; default DefaultSocketReceiveBuffer); 0 leaves it to the
// kernel's autotuning.
func WithSocketReceiveBuffer(n int) Option {
	return func(p *Provider) { p.socketReceiveBuffer = max(n, 0) }
}

// WithReadBufferSize sets each connection's read buffer (default 64 KiB);
// payloads larger than 32 KiB bypass it.
func WithReadBufferSize(n int) Option {
	return func(p *Provider) { p.readBuffer = max(n, 2*maxHeaderLen+link.MaxPrivateData) }
}

// DefaultDirectLinger is how long a connection's receive side stays with
// the goroutines that wait for its completions after one of them last
// received (see WithDirectCompletion).
const DefaultDirectLinger = 200 * time.Microsecond

// WithDirectCompletion sets how long a connection waits for a goroutine
// waiting on a completion queue to come back and receive for itself before
// the connection's reader goroutine takes over again (default
// DefaultDirectLinger; 0 turns direct completion off: every packet is then
// received by the reader goroutine and completions are handed over). This
// bounds how long an inbound request or acknowledgement may wait while the
// application is busy elsewhere: the linger once the receive side goes
// free, up to 32 times the linger after waiters have kept coming back
// (the checks back off then). See docs/nprdma.md.
func WithDirectCompletion(linger time.Duration) Option {
	return func(p *Provider) { p.linger = max(linger, 0) }
}

// DefaultStalledFrameTimeout is how long a receiver that was interrupted in
// the middle of a frame waits for the rest of it (WithStalledFrameTimeout).
const DefaultStalledFrameTimeout = 10 * time.Second

// WithStalledFrameTimeout sets how long a goroutine receiving for itself
// (direct completion) whose context ended in the middle of a frame waits
// for the rest of that frame; it cannot stop halfway without losing the
// stream. A peer that sends nothing more for that long is taken for dead
// and the link fails; without a bound, a peer that stopped halfway through
// a frame would hold that goroutine — and a queue closing behind it — for
// ever. Default DefaultStalledFrameTimeout.
func WithStalledFrameTimeout(d time.Duration) Option {
	return func(p *Provider) {
		if d > 0 {
			p.stalledFrame = d
		}
	}
}

// WithCongestionControl sets each connection's TCP congestion control
// (TCP_CONGESTION), dialed or accepted, e.g. "cubic" or "reno"; default "":
// the system's (net.ipv4.tcp_congestion_control). A host whose default is
// BBR paces every connection at the bandwidth BBR estimates for it, and on
// loopback that estimate settles per connection: 128 KiB READs at QD8 on one
// CPU ran at 4.4 GB/s on some connections and at 2.8 GB/s, held back by
// pacing timers, on others (about half); with reno every connection ran at
// 4.4 (docs/nprdma.md §10.2). A name the host does not allow
// (net.ipv4.tcp_allowed_congestion_control, for processes without
// CAP_NET_ADMIN) fails Dial and Listen with an error that lists the allowed
// ones.
func WithCongestionControl(name string) Option {
	return func(p *Provider) { p.congestion = name }
}

// CongestionControl is a net.Dialer or net.ListenConfig Control that sets a
// socket's TCP congestion control to name ("": leaves the system's), as
// WithCongestionControl does for the provider's connections; for a plain
// socket to be compared with them.
func CongestionControl(name string) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		if name == "" {
			return nil
		}
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, name)
		}); err != nil {
			return err
		}
		if serr != nil {
			allowed, _ := os.ReadFile("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
			return fmt.Errorf("tcp: congestion control %q: %w (this host allows %s without CAP_NET_ADMIN)", name, serr, strings.TrimSpace(string(allowed)))
		}
		return nil
	}
}

// New returns a tcp provider.
func New(opts ...Option) *Provider {
	p := &Provider{
		handshakeTimeout:    10 * time.Second,
		readBuffer:          64 << 10,
		linger:              DefaultDirectLinger,
		socketReceiveBuffer: DefaultSocketReceiveBuffer,
		stalledFrame:        DefaultStalledFrameTimeout,
		links:               map[*tcpLink]struct{}{},
		listeners:           map[*listener]struct{}{},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// Name implements link.Provider.
func (p *Provider) Name() string { return "tcp" }

func (p *Provider) addLink(l *tcpLink) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.crashed {
		return false
	}
	p.links[l] = struct{}{}
	return true
}

func (p *Provider) removeLink(l *tcpLink) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// Freeze stops reading on every connection of the provider, as if its
// process were stopped (SIGSTOP): peers see silence, not an error.
func (p *Provider) Freeze() { p.gate.Freeze() }

// Thaw undoes Freeze.
func (p *Provider) Thaw() { p.gate.Thaw() }

// Crash resets every connection and closes every listener of the provider
// at once, as the death of its process would.
func (p *Provider) Crash() {
	p.mu.Lock()
	p.crashed = true
	links, ls := slices.Collect(maps.Keys(p.links)), slices.Collect(maps.Keys(p.listeners))
	p.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	for _, l := range links {
		l.abort(errCrashed)
	}
	p.Thaw()
}

func (p *Provider) waitThawed(l *tcpLink) error {
	select {
	case <-p.gate.Thawed():
		return nil
	case <-l.abortCh:
		return errAborted
	}
}

// handshakeDeadline applies the handshake timeout and ctx to nc, and returns
// a function that lifts them.
func (p *Provider) handshakeDeadline(ctx context.Context, nc net.Conn) (stop func() bool) {
	deadline := time.Now().Add(p.handshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	nc.SetDeadline(deadline)
	cancel := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	return func() bool {
		ok := cancel()
		nc.SetDeadline(time.Time{})
		return ok
	}
}

// readCM reads one handshake frame of the wanted types.
func readCM(rd *reader, want ...byte) (cmFrame, error) {
	for {
		f, n, err := parseCM(rd.peek(), want...)
		if err == nil {
			rd.consume(n)
			return f, nil
		}
		if !errors.Is(err, errShort) {
			return cmFrame{}, err
		}
		if err := rd.fill(rd.buffered() + 1); err != nil {
			return cmFrame{}, err
		}
	}
}

// Dial implements link.Provider.
func (p *Provider) Dial(ctx context.Context, addr string, hello link.Hello) (link.Link, link.Hello, error) {
	d := net.Dialer{Control: CongestionControl(p.congestion)}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, link.Hello{}, err
	}
	nc := c.(*net.TCPConn)
	nc.SetNoDelay(true)
	stop := p.handshakeDeadline(ctx, nc)
	fail := func(err error) (link.Link, link.Hello, error) {
		stop()
		nc.Close()
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, link.Hello{}, fmt.Errorf("tcp: handshake with %s: %w", addr, err)
	}
	if _, err := nc.Write(appendCM(nil, cmFrame{typ: frameConnect, qpn: hello.QPNum, privateData: hello.PrivateData})); err != nil {
		return fail(err)
	}
	rd := newReader(nc, p.readBuffer)
	f, err := readCM(rd, frameAccept, frameReject)
	if err != nil {
		return fail(err)
	}
	if !stop() {
		nc.Close()
		return nil, link.Hello{}, fmt.Errorf("tcp: handshake with %s: %w", addr, ctx.Err())
	}
	if f.typ == frameReject {
		nc.Close()
		return nil, link.Hello{}, &link.RejectError{PrivateData: f.privateData}
	}
	l, err := newLink(p, nc, rd)
	if err != nil {
		return nil, link.Hello{}, err
	}
	return l, link.Hello{QPNum: f.qpn, PrivateData: f.privateData}, nil
}

// Listen implements link.Provider.
func (p *Provider) Listen(addr string) (link.Listener, error) {
	// Accepted connections inherit the listener's congestion control.
	lc := net.ListenConfig{Control: CongestionControl(p.congestion)}
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, err
	}
	l := &listener{prov: p, ln: ln.(*net.TCPListener), reqs: make(chan *request, 64), done: make(chan struct{}), pending: map[*request]struct{}{}}
	p.mu.Lock()
	if p.crashed {
		p.mu.Unlock()
		ln.Close()
		return nil, errCrashed
	}
	p.listeners[l] = struct{}{}
	p.mu.Unlock()
	go l.acceptLoop()
	return l, nil
}

type listener struct {
	prov      *Provider
	ln        *net.TCPListener
	reqs      chan *request
	done      chan struct{}
	closeOnce sync.Once
	mu        sync.Mutex
	pending   map[*request]struct{} // handshakes not answered yet
}

func (l *listener) acceptLoop() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			l.Close()
			return
		}
		go l.handshake(c.(*net.TCPConn))
	}
}

func (l *listener) handshake(nc *net.TCPConn) {
	nc.SetNoDelay(true)
	nc.SetDeadline(time.Now().Add(l.prov.handshakeTimeout))
	rd := newReader(nc, l.prov.readBuffer)
	f, err := readCM(rd, frameConnect)
	if err != nil {
		nc.Close()
		return
	}
	nc.SetDeadline(time.Time{})
	r := &request{l: l, nc: nc, rd: rd, hello: link.Hello{QPNum: f.qpn, PrivateData: f.privateData}}
	l.mu.Lock()
	l.pending[r] = struct{}{}
	l.mu.Unlock()
	select {
	case l.reqs <- r:
	case <-l.done:
		r.drop()
	}
}

func (l *listener) Accept(ctx context.Context) (link.Request, error) {
	select {
	case r := <-l.reqs:
		return r, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *listener) Addr() string { return l.ln.Addr().String() }

// Close stops listening and drops handshakes not answered yet.
func (l *listener) Close() error {
	l.closeOnce.Do(func() {
		close(l.done)
		l.ln.Close()
		l.prov.mu.Lock()
		delete(l.prov.listeners, l)
		l.prov.mu.Unlock()
		l.mu.Lock()
		rs := make([]*request, 0, len(l.pending))
		for r := range l.pending {
			rs = append(rs, r)
		}
		l.mu.Unlock()
		for _, r := range rs {
			r.drop()
		}
	})
	return nil
}

type request struct {
	l     *listener
	nc    *net.TCPConn
	rd    *reader
	hello link.Hello
	once  sync.Once
}

func (r *request) Hello() link.Hello  { return r.hello }
func (r *request) RemoteAddr() string { return r.nc.RemoteAddr().String() }

// take marks the request answered; false if it was answered or dropped.
func (r *request) take() bool {
	taken := false
	r.once.Do(func() { taken = true })
	if taken {
		r.l.mu.Lock()
		delete(r.l.pending, r)
		r.l.mu.Unlock()
	}
	return taken
}

func (r *request) drop() {
	if r.take() {
		r.nc.Close()
	}
}

func (r *request) Accept(hello link.Hello) (link.Link, error) {
	if !r.take() {
		return nil, errors.New("tcp: connection request already answered or dropped")
	}
	r.nc.SetWriteDeadline(time.Now().Add(r.l.prov.handshakeTimeout))
	if _, err := r.nc.Write(appendCM(nil, cmFrame{typ: frameAccept, qpn: hello.QPNum, privateData: hello.PrivateData})); err != nil {
		r.nc.Close()
		return nil, err
	}
	r.nc.SetWriteDeadline(time.Time{})
	return newLink(r.l.prov, r.nc, r.rd)
}

func (r *request) Reject(privateData []byte) error {
	if !r.take() {
		return errors.New("tcp: connection request already answered or dropped")
	}
	defer r.nc.Close()
	r.nc.SetWriteDeadline(time.Now().Add(r.l.prov.handshakeTimeout))
	_, err := r.nc.Write(appendCM(nil, cmFrame{typ: frameReject, privateData: privateData}))
	return err
}
