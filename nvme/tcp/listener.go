package tcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nprdma/nprdma/nvme"
)

// Defaults of the controller side (ListenOption).
const (
	// DefaultAdminQueueEntries is the largest admin queue accepted (Linux
	// asks for 32).
	DefaultAdminQueueEntries = 32
	// DefaultIOQueueEntries is the largest I/O queue accepted.
	DefaultIOQueueEntries = 128
	// DefaultInCapsuleData is the in-capsule data an I/O queue accepts
	// (advertised as IOCCSZ): two 4 KiB blocks, so that the common small
	// writes need no R2T.
	DefaultInCapsuleData = 8192
	// DefaultMaxH2CData is the MAXH2CDATA advertised: the most data of one
	// H2CData PDU.
	DefaultMaxH2CData = 128 << 10
	// DefaultMaxTransfer is the largest data transfer of one command.
	DefaultMaxTransfer = 1 << 20
	// DefaultMaxQueues bounds the connections a listener keeps at once.
	DefaultMaxQueues = 1024
	// DefaultHandshakeTimeout bounds the wait for a connection's ICReq and
	// its first command (the Linux host waits 10 s for the ICResp).
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultStallTimeout bounds a PDU that has begun arriving, and a
	// write to the host.
	DefaultStallTimeout = 30 * time.Second
)

// ListenOption configures a Listener.
type ListenOption func(*listenConfig)

type listenConfig struct {
	adminEntries int
	ioEntries    int
	icd          int
	maxH2CData   int
	maxTransfer  int
	maxQueues    int
	handshake    time.Duration
	stall        time.Duration
	log          *slog.Logger
}

// WithQueueEntries bounds the queue sizes accepted, admin and I/O (default
// DefaultAdminQueueEntries, DefaultIOQueueEntries): a Connect asking for
// more is refused by the controller (the queue's Entries is the bound).
func WithQueueEntries(admin, io int) ListenOption {
	return func(c *listenConfig) { c.adminEntries, c.ioEntries = admin, io }
}

// WithInCapsuleData sets the in-capsule data an I/O queue accepts, in bytes,
// a multiple of 16 (default DefaultInCapsuleData; advertise it with
// nvme.IOCCSZFor). The admin queue and Fabrics commands accept
// FabricsInCapsuleData whatever it is.
func WithInCapsuleData(n int) ListenOption { return func(c *listenConfig) { c.icd = n } }

// WithMaxH2CData sets the MAXH2CDATA advertised (default DefaultMaxH2CData):
// a multiple of 4, at least MinMaxH2CData.
func WithMaxH2CData(n int) ListenOption { return func(c *listenConfig) { c.maxH2CData = n } }

// WithMaxTransfer bounds the data of one command (default
// DefaultMaxTransfer): the controller's MDTS.
func WithMaxTransfer(n int) ListenOption { return func(c *listenConfig) { c.maxTransfer = n } }

// WithMaxQueues bounds the connections alive at once, initialized or not
// (default DefaultMaxQueues; 0 or less: no bound). A connection beyond is
// closed at once, logged and counted.
func WithMaxQueues(n int) ListenOption { return func(c *listenConfig) { c.maxQueues = n } }

// WithHandshakeTimeout bounds the wait for a connection's ICReq and its
// first command (default DefaultHandshakeTimeout).
func WithHandshakeTimeout(d time.Duration) ListenOption {
	return func(c *listenConfig) { c.handshake = d }
}

// WithStallTimeout bounds how long a PDU may take to arrive once it has
// begun, how long a write's data may take to follow its R2T, and how long a
// write to the host may block (default DefaultStallTimeout). A host that
// exceeds it has its connection closed; an idle connection is never timed
// out here (keep-alive is the controller's).
func WithStallTimeout(d time.Duration) ListenOption { return func(c *listenConfig) { c.stall = d } }

// WithLogger sets where refused connections and protocol errors are logged
// (default slog.Default()).
func WithLogger(l *slog.Logger) ListenOption { return func(c *listenConfig) { c.log = l } }

// Listener accepts NVMe/TCP connections: for each, it answers the ICReq,
// reads the first command to learn the queue's ID (a Connect names it), and
// hands the queue to Accept.
type Listener struct {
	ln   net.Listener
	cfg  listenConfig
	pool bufferPool

	ready    chan *ControllerQueue
	closed   chan struct{}
	once     sync.Once
	wg       sync.WaitGroup
	rejected atomic.Uint64
	live     atomic.Int64
}

// Listen starts accepting NVMe/TCP connections on addr.
func Listen(addr string, opts ...ListenOption) (*Listener, error) {
	cfg := listenConfig{
		adminEntries: DefaultAdminQueueEntries,
		ioEntries:    DefaultIOQueueEntries,
		icd:          DefaultInCapsuleData,
		maxH2CData:   DefaultMaxH2CData,
		maxTransfer:  DefaultMaxTransfer,
		maxQueues:    DefaultMaxQueues,
		handshake:    DefaultHandshakeTimeout,
		stall:        DefaultStallTimeout,
		log:          slog.Default(),
	}
	for _, o := range opts {
		o(&cfg)
	}
	switch {
	case cfg.icd < 0 || cfg.icd%16 != 0:
		return nil, fmt.Errorf("nvme/tcp: listen on %s: in-capsule data size %d is not a non-negative multiple of 16", addr, cfg.icd)
	case cfg.maxH2CData < MinMaxH2CData || cfg.maxH2CData%4 != 0:
		return nil, fmt.Errorf("nvme/tcp: listen on %s: MAXH2CDATA %d is not a multiple of 4 of at least %d", addr, cfg.maxH2CData, MinMaxH2CData)
	case cfg.adminEntries < 2 || cfg.ioEntries < 2 || cfg.adminEntries > 1<<16 || cfg.ioEntries > 1<<16:
		return nil, fmt.Errorf("nvme/tcp: listen on %s: queue entries %d/%d outside [2, 65536]", addr, cfg.adminEntries, cfg.ioEntries)
	case cfg.maxTransfer < 4096 || cfg.maxTransfer > 1<<maxBufferShift:
		return nil, fmt.Errorf("nvme/tcp: listen on %s: max transfer %d outside [4096, %d]", addr, cfg.maxTransfer, 1<<maxBufferShift)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("nvme/tcp: %w", err)
	}
	l := &Listener{ln: ln, cfg: cfg, ready: make(chan *ControllerQueue), closed: make(chan struct{})}
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// Addr is the address hosts connect to.
func (l *Listener) Addr() string { return l.ln.Addr().String() }

// InCapsuleData is the in-capsule data limit of the I/O queues.
func (l *Listener) InCapsuleData() int { return l.cfg.icd }

// Rejected counts the connections refused so far (beyond the limit, or a
// failed initialization).
func (l *Listener) Rejected() uint64 { return l.rejected.Load() }

// Queues is the number of connections accepted and not yet torn down.
func (l *Listener) Queues() int { return int(l.live.Load()) }

// Close stops accepting and closes the connections still initializing;
// queues already handed out are not affected.
func (l *Listener) Close() error {
	var err error
	l.once.Do(func() {
		close(l.closed)
		err = l.ln.Close()
	})
	l.wg.Wait()
	return err
}

// Accept waits for the next queue, initialized and with its first command
// read. Start it with ControllerQueue.Start.
func (l *Listener) Accept(ctx context.Context) (*ControllerQueue, error) {
	select {
	case q := <-l.ready:
		return q, nil
	case <-l.closed:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	for {
		conn, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			l.cfg.log.Warn("nvme/tcp: accept", "addr", l.Addr(), "err", err)
			select {
			case <-l.closed:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		if n := l.live.Add(1); l.cfg.maxQueues > 0 && n > int64(l.cfg.maxQueues) {
			l.live.Add(-1)
			l.rejected.Add(1)
			l.cfg.log.Warn("nvme/tcp: connection refused", "from", conn.RemoteAddr().String(),
				"err", fmt.Sprintf("%d queues connected, the limit", l.cfg.maxQueues))
			conn.Close()
			continue
		}
		l.wg.Add(1)
		go l.initialize(conn)
	}
}

// initialize answers the connection's ICReq and reads its first command,
// then hands the queue to Accept. A connection that fails is closed (after
// a C2HTermReq for a protocol error), logged and counted.
func (l *Listener) initialize(conn net.Conn) {
	defer l.wg.Done()
	q, err := l.handshake(conn)
	if err != nil {
		l.live.Add(-1)
		l.rejected.Add(1)
		l.cfg.log.Warn("nvme/tcp: connection refused", "from", conn.RemoteAddr().String(), "err", err)
		conn.Close()
		return
	}
	select {
	case l.ready <- q:
	case <-l.closed:
		q.Close()
	}
}

func (l *Listener) handshake(conn net.Conn) (*ControllerQueue, error) {
	done := make(chan struct{})
	defer close(done)
	go func() {
		// A listener closed meanwhile ends the wait.
		select {
		case <-l.closed:
			conn.Close()
		case <-done:
		}
	}()
	_ = conn.SetDeadline(time.Now().Add(l.cfg.handshake))
	rd := NewReader(conn, RoleController, WithPDUTimeout(l.cfg.stall))
	w := NewWriter(conn)
	refuse := func(err error) error {
		var pe *ProtocolError
		if errors.As(err, &pe) && pe.Type != TypeH2CTermReq {
			tr := pe.TermReq(TypeC2HTermReq)
			w.TermReq(&tr)
			_ = w.Flush()
		}
		return err
	}
	h, err := rd.Next()
	if err != nil {
		return nil, refuse(err)
	}
	if h.Type != TypeICReq {
		return nil, fmt.Errorf("%s before ICReq", h.Type)
	}
	var req ICReq
	_ = req.Unmarshal(h.Bytes())
	if err := req.Check(h.Bytes()); err != nil {
		return nil, refuse(err)
	}
	resp := ICResp{PFV: PFV10, CPDA: 0, Digests: req.Digests, MAXH2CDATA: uint32(l.cfg.maxH2CData)}
	w.ICResp(&resp)
	if err := w.Flush(); err != nil {
		return nil, err
	}
	rd.Negotiated(req.Digests, resp.CPDA, Limits{InCapsuleData: FabricsInCapsuleData, MaxH2CData: l.cfg.maxH2CData})
	h, err = rd.Next()
	if err != nil {
		return nil, refuse(err)
	}
	switch h.Type {
	case TypeCapsuleCmd:
	case TypeH2CTermReq:
		return nil, fmt.Errorf("the host terminated the connection before its first command")
	default:
		return nil, refuse(protocolErrorf(FESInvalidHeaderField, offDataTTAG, h.Type, h.Bytes(), "TTAG names no R2T outstanding"))
	}
	cmd, _ := ParseCapsuleCmd(h.Bytes())
	q := l.newQueue(conn, rd, req, cmd)
	r, err := q.onCapsule(h)
	if err != nil {
		return nil, refuse(err)
	}
	q.first = r
	_ = conn.SetDeadline(time.Time{})
	l.cfg.log.Debug("nvme/tcp: connection initialized", "from", q.remote, "qid", q.qid, "entries", q.entries,
		"digests", req.Digests.String(), "hpda", req.HPDA)
	return q, nil
}

// newQueue builds the queue of conn, whose first command is cmd: a Connect
// names the queue's ID and size.
func (l *Listener) newQueue(conn net.Conn, rd *Reader, req ICReq, cmd nvme.Command) *ControllerQueue {
	var qid uint16
	entries := l.cfg.adminEntries
	if cmd.IsFabrics() && cmd.FabricsType() == nvme.FabricsConnect {
		p := cmd.Connect()
		qid = p.QID
		if qid > 0 {
			entries = l.cfg.ioEntries
		}
		if p.SQSIZE > 0 && p.QueueEntries() < entries {
			entries = p.QueueEntries()
		}
	}
	q := &ControllerQueue{l: l, conn: conn, rd: rd, qid: qid, entries: entries, remote: conn.RemoteAddr().String(),
		log: l.cfg.log, wtimeout: l.cfg.stall, lost: make(chan struct{}), loopDone: make(chan struct{})}
	newBatch := func() *batch {
		w := NewWriter(conn)
		w.Negotiated(req.Digests, req.HPDA)
		return &batch{w: w}
	}
	q.out, q.spare = newBatch(), newBatch()
	q.written = sync.NewCond(&q.smu)
	rd.SetLimits(Limits{InCapsuleData: q.icdLimit(), MaxH2CData: l.cfg.maxH2CData})
	return q
}
