// Package shm is the nprdma provider for peers on the same host: a queue
// pair's packets travel through rings in a memory file both processes map,
// with eventfd doorbells and spinning waits, and a region its owner
// registered unpinned is shared with the peer, which then executes its
// READs of it itself: it checks each page's state word, copies the page out
// of a read-only mapping of the owner's memory and checks the word again,
// with no thread of the owner taking part. A page that was absent, busy or
// changed is the magic page, exactly as the NIC engine of the other
// providers delivers it. Connections are set up over a unix socket, which
// also carries the sharing of regions and tells each side when the other
// is gone.
//
// Addresses are paths of unix sockets, written "unix:/run/nprdma/t.sock" or
// "/run/nprdma/t.sock" (Listen makes the directory if it is missing);
// Listen("") picks a fresh path in the temporary directory. docs/nprdma.md (§8.3) and docs/np-rdma.md (§10) describe the
// provider and the reader's protocol.
package shm

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nprdma/nprdma/nprdma/link"

	"golang.org/x/sys/unix"
)

// Scheme prefixes an address of this provider.
const Scheme = "unix:"

// Provider is the shm provider. Its fault injection methods (Freeze, Thaw,
// Crash) act on every link it owns, as if on the process behind it.
type Provider struct {
	ringSize         int
	spin             time.Duration
	handshakeTimeout time.Duration
	socketMode       os.FileMode
	inPlace          InPlaceMode

	mu        sync.Mutex
	links     map[*shmLink]struct{}
	listeners map[*listener]struct{}
	crashed   bool

	gate link.FreezeGate
	maps mappings
}

// Option configures a Provider.
type Option func(*Provider)

// WithRingSize sets the bytes of each direction's ring (a power of two
// from 64 KiB to 64 MiB; default DefaultRingSize). Larger packets stream
// through it.
func WithRingSize(n int) Option { return func(p *Provider) { p.ringSize = n } }

// DefaultSpin is the longest a side waiting for its peer spins before it
// sleeps on the doorbell (WithSpin).
const DefaultSpin = 50 * time.Microsecond

// WithSpin sets the longest a waiting side polls the ring before it sleeps
// on its doorbell (default DefaultSpin; 0: it sleeps at once). A peer that
// answers within the spin is seen within a microsecond and needs no
// wake-up, which on this VM costs 40–60 µs across vCPUs; the price is a
// CPU kept busy meanwhile, and on a machine without a spare one the peer
// delayed. Each waiter adapts its spin between 0 and d to what spinning
// achieved (see spinner); docs/nprdma.md §8.3 has the measurements.
func WithSpin(d time.Duration) Option { return func(p *Provider) { p.spin = max(d, 0) } }

// WithHandshakeTimeout bounds the connection handshake (default 10 s; a
// Dial context with an earlier deadline wins).
func WithHandshakeTimeout(d time.Duration) Option {
	return func(p *Provider) { p.handshakeTimeout = d }
}

// WithSocketMode sets the permissions of the sockets Listen creates
// (default 0600: processes of the listener's user, and root, may connect).
func WithSocketMode(m os.FileMode) Option { return func(p *Provider) { p.socketMode = m } }

// WithInPlaceReads sets how READs of regions the peer shares are executed
// (default InPlaceMapped).
func WithInPlaceReads(m InPlaceMode) Option { return func(p *Provider) { p.inPlace = m } }

// New returns an shm provider.
func New(opts ...Option) *Provider {
	p := &Provider{
		ringSize:         DefaultRingSize,
		spin:             DefaultSpin,
		handshakeTimeout: 10 * time.Second,
		socketMode:       0o600,
		links:            map[*shmLink]struct{}{},
		listeners:        map[*listener]struct{}{},
	}
	for _, o := range opts {
		o(p)
	}
	p.maps.mode = p.inPlace
	return p
}

// Name implements link.Provider.
func (p *Provider) Name() string { return "shm" }

// InPlaceReads reports how READs of shared regions are executed: the mode
// asked for, or pread where mapped reads are not possible here
// (userfaultfd refused), with the reason.
func (p *Provider) InPlaceReads() (InPlaceMode, error) {
	p.maps.mu.Lock()
	defer p.maps.mu.Unlock()
	if p.inPlace == InPlaceMapped && p.maps.uffd == nil && p.maps.uffdErr == nil {
		p.maps.uffd, p.maps.uffdErr = openSigbusUffd()
	}
	if p.inPlace == InPlaceMapped && p.maps.uffdErr != nil {
		return InPlacePread, p.maps.uffdErr
	}
	return p.inPlace, nil
}

// Stats are a provider's counters.
type Stats struct {
	Links    int // links alive
	Mappings int // peers' regions mapped here
	// InPlaceFaults counts copies of a region read in place that found the
	// page gone — its owner released it between the state check and the
	// copy — and delivered the magic page instead.
	InPlaceFaults uint64
}

// Stats returns the provider's counters.
func (p *Provider) Stats() Stats {
	p.mu.Lock()
	links := len(p.links)
	p.mu.Unlock()
	return Stats{Links: links, Mappings: p.maps.count(), InPlaceFaults: p.maps.faults.Load()}
}

// Path is the socket path of an address of this provider.
func Path(addr string) string { return strings.TrimPrefix(addr, Scheme) }

var (
	errLisClosed = errors.New("shm: listener closed")
	listenSeq    atomic.Uint64
)

// Listen implements link.Provider.
func (p *Provider) Listen(addr string) (link.Listener, error) {
	if err := p.checkRingSize(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	crashed := p.crashed
	p.mu.Unlock()
	if crashed {
		return nil, errCrashed
	}
	path := Path(addr)
	if path == "" {
		path = filepath.Join(os.TempDir(), fmt.Sprintf("nprdma-shm-%d-%d.sock", os.Getpid(), listenSeq.Add(1)))
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	removeStale(path)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, p.socketMode); err != nil {
		ln.Close()
		return nil, err
	}
	l := &listener{prov: p, ln: ln, path: path, reqs: make(chan *request, 128), closed: make(chan struct{})}
	p.mu.Lock()
	p.listeners[l] = struct{}{}
	p.mu.Unlock()
	go l.acceptLoop()
	return l, nil
}

func (p *Provider) checkRingSize() error {
	n := p.ringSize
	if n < minRingSize || n > maxRingSize || n&(n-1) != 0 {
		return fmt.Errorf("shm: ring size %d is not a power of two in [%d, %d]", n, minRingSize, maxRingSize)
	}
	return nil
}

// removeStale removes a socket file nobody listens on any more (a
// listener that died without removing it), so that Listen can take the
// path.
func removeStale(path string) {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&os.ModeSocket == 0 {
		return
	}
	c, err := net.DialTimeout("unixpacket", path, time.Second)
	if err == nil {
		c.Close()
		return
	}
	if errors.Is(err, unix.ECONNREFUSED) {
		os.Remove(path)
	}
}

// Dial implements link.Provider.
func (p *Provider) Dial(ctx context.Context, addr string, hello link.Hello) (link.Link, link.Hello, error) {
	p.mu.Lock()
	crashed := p.crashed
	p.mu.Unlock()
	if crashed {
		return nil, link.Hello{}, errCrashed
	}
	path := Path(addr)
	ctx, cancel := context.WithTimeout(ctx, p.handshakeTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unixpacket", path)
	if err != nil {
		return nil, link.Hello{}, err
	}
	conn := c.(*net.UnixConn)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	fail := func(err error) (link.Link, link.Hello, error) {
		conn.Close()
		if ctx.Err() != nil {
			err = fmt.Errorf("shm: dial %s: %w", path, ctx.Err())
		}
		return nil, link.Hello{}, err
	}
	if err := sendMsg(conn, encodeConnect(hello.QPNum, hello.PrivateData)); err != nil {
		return fail(err)
	}
	b, files, err := recvMsg(conn, make([]byte, maxMessage+1), acceptFDs)
	if err != nil {
		return fail(fmt.Errorf("shm: dial %s: handshake: %w", path, err))
	}
	m, err := decodeMessage(b, len(files))
	if err == nil && m.typ != msgAccept && m.typ != msgReject {
		err = fmt.Errorf("%w: type %d in answer to CONNECT", errMessage, m.typ)
	}
	if err != nil {
		closeFiles(files)
		return fail(fmt.Errorf("shm: dial %s: handshake: %w", path, err))
	}
	if m.typ == msgReject {
		conn.Close()
		return nil, link.Hello{}, &link.RejectError{PrivateData: m.privateData}
	}
	l, err := p.dialerLink(conn, m.ringSize, files)
	if err != nil {
		return fail(fmt.Errorf("shm: dial %s: %w", path, err))
	}
	if !stop() || ctx.Err() != nil {
		l.Abort()
		return fail(ctx.Err())
	}
	conn.SetDeadline(time.Time{})
	return l, link.Hello{QPNum: m.qpn, PrivateData: m.privateData}, nil
}

// dialerLink maps the ring file the listener sent and makes the link; it
// takes files (ring file, then the four doorbells).
func (p *Provider) dialerLink(conn *net.UnixConn, size int, files []*os.File) (*shmLink, error) {
	ringFile := files[0]
	defer ringFile.Close()
	var bells [4]bell
	for i := range bells {
		bells[i] = bell{files[1+i]}
	}
	fail := func(err error) (*shmLink, error) {
		for _, b := range bells {
			b.close()
		}
		return nil, err
	}
	fd, err := rawFD(ringFile)
	if err != nil {
		return fail(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fail(os.NewSyscallError("fstat", err))
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&(unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL) != unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL {
		return fail(fmt.Errorf("%w: the ring file is not sealed against shrinking", errMessage))
	}
	if st.Size != int64(ringFileSize(size)) {
		return fail(fmt.Errorf("%w: ring file of %d bytes for rings of %d", errMessage, st.Size, size))
	}
	mem, err := unix.Mmap(fd, 0, ringFileSize(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(os.NewSyscallError("mmap ring file", err))
	}
	l := newLink(p, conn, true, mem, size, bells)
	if !p.addLink(l) {
		l.Abort()
		return nil, errCrashed
	}
	return l, nil
}

// listenerLink creates, seals and maps a ring file and its doorbells, and
// makes the listener's end of the link; files are what the dialer gets.
func (p *Provider) listenerLink(conn *net.UnixConn) (*shmLink, []*os.File, error) {
	size := p.ringSize
	fd, err := unix.MemfdCreate("nprdma-shm-ring", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, nil, os.NewSyscallError("memfd_create", err)
	}
	ringFile := os.NewFile(uintptr(fd), "nprdma-shm-ring")
	files := []*os.File{ringFile}
	fail := func(err error) (*shmLink, []*os.File, error) {
		closeFiles(files)
		return nil, nil, err
	}
	if err := unix.Ftruncate(fd, int64(ringFileSize(size))); err != nil {
		return fail(os.NewSyscallError("ftruncate", err))
	}
	// Neither side can change the file's size, so neither can make the
	// other's accesses fault.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fail(os.NewSyscallError("F_ADD_SEALS", err))
	}
	var bells [4]bell
	for i := range bells {
		if bells[i], err = newBell(); err != nil {
			return fail(err)
		}
		files = append(files, bells[i].f)
	}
	mem, err := unix.Mmap(fd, 0, ringFileSize(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(os.NewSyscallError("mmap ring file", err))
	}
	return newLink(p, conn, false, mem, size, bells), files, nil
}

func (p *Provider) addLink(l *shmLink) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.crashed {
		return false
	}
	p.links[l] = struct{}{}
	return true
}

func (p *Provider) removeLink(l *shmLink) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// Freeze stops delivering inbound packets on every link, as if the process
// were stopped (SIGSTOP): peers see silence. Regions shared in place stay
// readable, as they would.
func (p *Provider) Freeze() { p.gate.Freeze() }

// Thaw undoes Freeze.
func (p *Provider) Thaw() { p.gate.Thaw() }

// Crash breaks every link and listener at once, as the death of the
// process would: peers see their sockets close without a FIN.
func (p *Provider) Crash() {
	p.mu.Lock()
	p.crashed = true
	ls, lns := slices.Collect(maps.Keys(p.links)), slices.Collect(maps.Keys(p.listeners))
	p.mu.Unlock()
	for _, ln := range lns {
		ln.Close()
	}
	for _, l := range ls {
		l.breakWith(errCrashed)
	}
	p.Thaw()
}

type listener struct {
	prov      *Provider
	ln        *net.UnixListener
	path      string
	reqs      chan *request
	closed    chan struct{}
	closeOnce sync.Once
}

func (l *listener) acceptLoop() {
	for {
		c, err := l.ln.AcceptUnix()
		if err != nil {
			select {
			case <-l.closed:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			time.Sleep(10 * time.Millisecond) // out of descriptors, say: try again
			continue
		}
		go l.handshake(c)
	}
}

// handshake reads a dialer's CONNECT (within the handshake timeout) and
// queues its request; anything else drops the connection.
func (l *listener) handshake(c *net.UnixConn) {
	c.SetDeadline(time.Now().Add(l.prov.handshakeTimeout))
	b, files, err := recvMsg(c, make([]byte, maxMessage+1), 0)
	if err != nil {
		c.Close()
		return
	}
	m, err := decodeMessage(b, len(files))
	closeFiles(files)
	if err != nil || m.typ != msgConnect {
		c.Close()
		return
	}
	c.SetDeadline(time.Time{})
	r := &request{lis: l, conn: c, hello: link.Hello{QPNum: m.qpn, PrivateData: m.privateData}}
	select {
	case l.reqs <- r:
	case <-l.closed:
		c.Close()
	}
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

func (l *listener) Addr() string { return Scheme + l.path }

func (l *listener) Close() error {
	l.closeOnce.Do(func() {
		close(l.closed)
		l.ln.Close() // removes the socket file
		l.prov.mu.Lock()
		delete(l.prov.listeners, l)
		l.prov.mu.Unlock()
		for {
			select {
			case r := <-l.reqs:
				r.conn.Close()
			default:
				return
			}
		}
	})
	return nil
}

// request is a dialer's CONNECT, answered once.
type request struct {
	lis   *listener
	conn  *net.UnixConn
	hello link.Hello
	once  sync.Once
}

func (r *request) Hello() link.Hello { return r.hello }

// RemoteAddr names the dialing process by its credentials.
func (r *request) RemoteAddr() string {
	raw, err := r.conn.SyscallConn()
	if err != nil {
		return Scheme + r.lis.path
	}
	var cred *unix.Ucred
	raw.Control(func(fd uintptr) { cred, _ = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if cred == nil {
		return Scheme + r.lis.path
	}
	return "shm:pid=" + strconv.Itoa(int(cred.Pid)) + ",uid=" + strconv.Itoa(int(cred.Uid))
}

func (r *request) Accept(hello link.Hello) (link.Link, error) {
	var out link.Link
	err := errors.New("shm: connection request answered twice")
	r.once.Do(func() {
		p := r.lis.prov
		l, files, lerr := p.listenerLink(r.conn)
		if lerr != nil {
			r.conn.Close()
			err = lerr
			return
		}
		serr := sendMsg(r.conn, encodeAccept(hello.QPNum, hello.PrivateData, p.ringSize), files...)
		closeFiles(files[:1]) // the ring file is mapped; the doorbells stay with the link
		if serr != nil {
			l.Abort()
			err = fmt.Errorf("shm: the peer gave up connecting: %w", serr)
			return
		}
		if !p.addLink(l) {
			l.Abort()
			err = errCrashed
			return
		}
		out, err = l, nil
	})
	return out, err
}

func (r *request) Reject(privateData []byte) error {
	r.once.Do(func() {
		sendMsg(r.conn, encodeReject(privateData))
		r.conn.Close()
	})
	return nil
}
