// Package initiator connects to an nprdma target over the nprdma fabric, or
// to any NVMe/TCP target, and exposes its namespaces as block devices
// (Namespace implements initiator/blockio.Backend). Over the nprdma fabric
// reads go one-sided: an RDMA READ straight out of the target's unpinned
// region, a scan for the region's magic page, and an NVMe Read for just the
// pages that were not resident (the NP-RDMA scheme); over NVMe/TCP every
// read is an NVMe Read. Writes, flushes and trims are NVMe commands. The
// controller keeps itself alive, reconnects in the background when a queue
// is lost, and fails I/O with ErrControllerLost once the controller-loss
// timeout has passed, over either transport (transport.go).
//
// docs/initiator.md and docs/np-rdma.md describe it in full.
package initiator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nvme"
	"github.com/prometheus/client_golang/prometheus"
)

// Errors of the initiator. Test with errors.Is.
var (
	// ErrControllerLost: the controller could not be reconnected within the
	// controller-loss timeout; it stays lost.
	ErrControllerLost = errors.New("initiator: controller lost")
	// ErrHostNotAllowed: the target refused this host NQN at Connect.
	ErrHostNotAllowed = errors.New("initiator: host not allowed by the target")
	// ErrClosed: the controller was closed.
	ErrClosed = errors.New("initiator: controller closed")
	// ErrNamespaceChanged: after a reconnect the target serves another
	// namespace (another size or NGUID) under the NSID; the Namespace fails
	// for good.
	ErrNamespaceChanged = errors.New("initiator: namespace changed on the target")
)

// Defaults.
const (
	DefaultKeepAlive      = 5 * time.Second
	DefaultLossTimeout    = 30 * time.Second
	DefaultQueueDepth     = 128
	DefaultReconnectDelay = 100 * time.Millisecond
	maxReconnectDelay     = 2 * time.Second
	// MaxCommandSessions is how many sessions a command is tried on: the
	// connection lost under it that many times in a row fails it (with the
	// last cause) rather than retrying it for ever on a target that drops
	// every connection it is sent on.
	MaxCommandSessions = 3
	adminEntries       = 32
	// BlockSize is the block size the initiator supports (the target's).
	BlockSize = 4096
)

// Option configures Connect and Discover.
type Option func(*config)

type config struct {
	hostNQN        string
	hostID         nvme.UUID
	stateFile      string
	ioQueues       int
	queueDepth     int
	kato           time.Duration
	lossTimeout    time.Duration
	reconnectDelay time.Duration
	qpTimeout      time.Duration
	busyPoll       time.Duration
	oneSided       bool
	auth           hostAuth
	log            *slog.Logger
	reg            prometheus.Registerer
}

// WithHostNQN sets the host NQN (default: derived from the host ID, see
// WithStateFile).
func WithHostNQN(nqn string) Option { return func(c *config) { c.hostNQN = nqn } }

// WithHostID sets the 128-bit host identifier sent in Connect.
func WithHostID(id nvme.UUID) Option { return func(c *config) { c.hostID = id } }

// WithStateFile names the file holding the host ID (created on first use;
// default DefaultStateFile()). The default host NQN derives from it.
func WithStateFile(path string) Option { return func(c *config) { c.stateFile = path } }

// WithIOQueues sets the number of I/O queues (default runtime.NumCPU()).
func WithIOQueues(n int) Option { return func(c *config) { c.ioQueues = n } }

// WithQueueDepth sets the entries of each I/O queue (default 128; the
// target may grant fewer).
func WithQueueDepth(n int) Option { return func(c *config) { c.queueDepth = n } }

// WithKeepAlive sets the keep-alive timeout asked for (KATO; keep-alives
// go out every half of it; default 5 s).
func WithKeepAlive(d time.Duration) Option { return func(c *config) { c.kato = d } }

// WithControllerLossTimeout sets how long I/O waits for a reconnect before
// failing with ErrControllerLost (default 30 s).
func WithControllerLossTimeout(d time.Duration) Option { return func(c *config) { c.lossTimeout = d } }

// WithReconnectDelay sets the first delay between reconnect attempts (it
// doubles up to 2 s).
func WithReconnectDelay(d time.Duration) Option { return func(c *config) { c.reconnectDelay = d } }

// WithQPTimeout sets the queue pairs' peer-silence timeout (default
// nprdma's 10 s): how long a silent target takes to be noticed.
func WithQPTimeout(d time.Duration) Option { return func(c *config) { c.qpTimeout = d } }

// WithBusyPoll makes waiters spin up to d for completions before parking.
func WithBusyPoll(d time.Duration) Option { return func(c *config) { c.busyPoll = d } }

// WithOneSidedReads enables (default) or disables one-sided reads; without
// them every read is an NVMe Read command (the baseline).
func WithOneSidedReads(on bool) Option { return func(c *config) { c.oneSided = on } }

// WithLogger sets where the controller logs (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// WithMetrics registers the controller's metrics (nprdma_initiator_*) on
// reg.
func WithMetrics(reg prometheus.Registerer) Option { return func(c *config) { c.reg = reg } }

func newConfig(opts []Option) (config, error) {
	cfg := config{
		ioQueues:       runtime.NumCPU(),
		queueDepth:     DefaultQueueDepth,
		kato:           DefaultKeepAlive,
		lossTimeout:    DefaultLossTimeout,
		reconnectDelay: DefaultReconnectDelay,
		oneSided:       true,
		log:            slog.Default(),
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.hostNQN == "" || cfg.hostID == (nvme.UUID{}) {
		path := cfg.stateFile
		if path == "" {
			path = DefaultStateFile()
		}
		id, err := LoadOrCreateHostID(path)
		if err != nil {
			return cfg, err
		}
		if cfg.hostID == (nvme.UUID{}) {
			cfg.hostID = id
		}
		if cfg.hostNQN == "" {
			cfg.hostNQN = nvme.HostNQNFromUUID(id)
		}
	}
	if err := nvme.ValidateNQN(cfg.hostNQN); err != nil {
		return cfg, fmt.Errorf("initiator: host NQN %q: %w", cfg.hostNQN, err)
	}
	if err := cfg.auth.check(); err != nil {
		return cfg, err
	}
	if cfg.ioQueues < 1 {
		cfg.ioQueues = 1
	}
	if cfg.queueDepth < 2 {
		cfg.queueDepth = 2
	}
	return cfg, nil
}

// Controller is a connection to one subsystem of a target: an admin queue,
// I/O queues, keep-alive, and the reconnect machinery.
type Controller struct {
	cfg    config
	addr   string
	subNQN string
	b      binding // the transport's: dials the queues
	ctr    counters
	prom   *promMetrics

	mu       sync.Mutex
	sess     *session        // nil while reconnecting or after loss
	instance nvme.NPInstance // the target process of the latest session
	changed  chan struct{}
	lostErr  error // set once lost or closed
	lossAt   time.Time
	lostAt   time.Time     // when the controller was declared lost for good
	lost     chan struct{} // closed then
	closed   bool
	bg       sync.WaitGroup
	rr       atomic.Uint32
	gens     atomic.Uint64 // session generations handed out
	stopOnce sync.Once
	stop     chan struct{}

	nsMu       sync.Mutex
	namespaces []*Namespace // the live handle of each NSID Namespace returned: checked at each reconnect
}

// session is one incarnation of the controller: what a reconnect replaces.
type session struct {
	c        *Controller
	admin    hostQueue
	io       []hostQueue
	cntlid   uint16
	gen      uint64 // the controller's sessions in order of creation
	ident    nvme.IdentifyController
	maxXfer  int
	failOnce sync.Once
	failed   chan struct{}
	failErr  error // why it failed; set before failed is closed
	notices  bool  // Namespace Attribute Changed notices enabled (events.go)

	mu      sync.Mutex
	regions map[uint32]*regionInfo
}

// regionInfo is a namespace's region descriptor in one session (nil
// descriptor: the target offers no one-sided reads for it).
type regionInfo struct {
	desc  *nvme.RegionDescriptor
	hints frameHints // a format 2 descriptor's frames, as last read
}

// Connect connects to subsystem subNQN of the target at addr over the
// nprdma fabric with device dev (the caller keeps it and closes it after
// the controller): ConnectOver with NPRDMA(dev).
func Connect(ctx context.Context, dev *nprdma.Device, addr, subNQN string, opts ...Option) (*Controller, error) {
	return ConnectOver(ctx, NPRDMA(dev), addr, subNQN, opts...)
}

// ConnectOver connects to subsystem subNQN of the target at addr over
// transport t.
func ConnectOver(ctx context.Context, t Transport, addr, subNQN string, opts ...Option) (*Controller, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	c, err := newController(t, addr, subNQN, cfg)
	if err != nil {
		return nil, err
	}
	s, err := c.connect(ctx, nil)
	if err != nil {
		c.b.close()
		return nil, err
	}
	if cfg.reg != nil {
		if c.prom, err = newPromMetrics(cfg.reg, c); err != nil {
			s.close(ctx, false)
			c.b.close()
			return nil, fmt.Errorf("initiator: metrics: %w", err)
		}
	}
	c.instance = s.ident.NP
	c.install(s)
	return c, nil
}

// newController binds a controller of subNQN at addr to transport t; the
// caller connects it.
func newController(t Transport, addr, subNQN string, cfg config) (*Controller, error) {
	if t.bind == nil {
		return nil, fmt.Errorf("initiator: no transport given (NPRDMA or TCP)")
	}
	b, err := t.bind(&cfg)
	if err != nil {
		return nil, err
	}
	return &Controller{cfg: cfg, addr: addr, subNQN: subNQN, b: b,
		changed: make(chan struct{}), lost: make(chan struct{}), stop: make(chan struct{})}, nil
}

// HostNQN is the host NQN the controller connects as.
func (c *Controller) HostNQN() string { return c.cfg.hostNQN }

// Addr is the target's address.
func (c *Controller) Addr() string { return c.addr }

// SubsystemNQN is the subsystem's NQN.
func (c *Controller) SubsystemNQN() string { return c.subNQN }

// CNTLID is the current controller ID (it changes on reconnect).
func (c *Controller) CNTLID() uint16 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess == nil {
		return 0
	}
	return c.sess.cntlid
}

// Identify returns the Identify Controller data of the current session.
func (c *Controller) Identify(ctx context.Context) (nvme.IdentifyController, error) {
	var id nvme.IdentifyController
	err := c.do(ctx, func(s *session) error { id = s.ident; return nil })
	return id, err
}

// IOQueues is the number of I/O queues of the current session.
func (c *Controller) IOQueues() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess == nil {
		return 0
	}
	return len(c.sess.io)
}

// connect brings a new session up: admin queue, Connect, enable, Identify,
// Number of Queues, I/O queues. replaces is the session it takes over from
// (nil: none): its Connect names that session's controller, which the
// target then tears down and fences at once, even if it has not noticed
// the failure itself (nvme.NPControllerRef).
func (c *Controller) connect(ctx context.Context, replaces *session) (*session, error) {
	var ref nvme.NPControllerRef
	if replaces != nil {
		ref = nvme.NPControllerRef{Token: replaces.ident.NPToken, CNTLID: replaces.cntlid}
	}
	s, err := c.connectAdmin(ctx, c.subNQN, c.cfg.kato, ref)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*session, error) {
		s.close(ctx, false)
		return nil, err
	}
	if s.ident.CNTRLTYPE != nvme.ControllerTypeIO {
		return fail(fmt.Errorf("initiator: %s at %s is not an I/O controller (type %d)", c.subNQN, c.addr, s.ident.CNTRLTYPE))
	}
	nq, err := nvme.NumberOfQueues{Submission: c.cfg.ioQueues, Completion: c.cfg.ioQueues}.Encode()
	if err != nil {
		return fail(err)
	}
	cqe, err := s.admin.Submit(ctx, nvme.SetFeaturesCommand(nvme.FeatureNumberOfQueues, nq, false), nil)
	if err != nil {
		return fail(fmt.Errorf("initiator: set number of queues on %s: %w", c.subNQN, err))
	}
	granted, err := nvme.DecodeNumberOfQueues(cqe.DW0)
	if err != nil {
		return fail(err)
	}
	n := min(granted.IOQueues(), c.cfg.ioQueues)
	if n < 1 {
		return fail(fmt.Errorf("initiator: %s granted no I/O queue", c.subNQN))
	}
	s.notices = s.enableNotices(ctx)
	cap, err := s.propertyGet(ctx, nvme.PropCAP, 8)
	if err != nil {
		return fail(err)
	}
	entries := min(c.cfg.queueDepth, nvme.DecodeCAP(cap).MaxQueueEntries())
	if s.ident.MAXCMD > 0 {
		entries = min(entries, int(s.ident.MAXCMD))
	}
	icd := nvme.ICDLimit(s.ident.IOCCSZ)
	for qid := 1; qid <= n; qid++ {
		q, err := c.dialQueue(ctx, queueConfig{qid: uint16(qid), entries: entries, icd: icd, cntlid: s.cntlid})
		if err != nil {
			return fail(err)
		}
		s.io = append(s.io, q)
		if err := c.connectQueue(ctx, q, s.cntlid); err != nil {
			return fail(err)
		}
	}
	return s, nil
}

func (c *Controller) dialQueue(ctx context.Context, qc queueConfig) (hostQueue, error) {
	q, err := c.b.dial(ctx, c.addr, qc)
	if err != nil {
		return nil, fmt.Errorf("initiator: %s at %s: %w", c.subNQN, c.addr, err)
	}
	return q, nil
}

// connectQueue sends Fabrics Connect for I/O queue q of controller cntlid.
func (c *Controller) connectQueue(ctx context.Context, q hostQueue, cntlid uint16) error {
	return connectQueue(ctx, q, c.connectData(c.subNQN, cntlid), 0, nil, c.cfg.auth)
}

func (c *Controller) connectData(subNQN string, cntlid uint16) nvme.ConnectData {
	return nvme.ConnectData{HostID: c.cfg.hostID, CNTLID: cntlid, SubNQN: subNQN, HostNQN: c.cfg.hostNQN}
}

// connectQueue sends Fabrics Connect on q for data and authenticates the
// queue with auth when the controller asks (or auth must make it prove
// itself).
func connectQueue(ctx context.Context, q hostQueue, data nvme.ConnectData, kato time.Duration, gotCNTLID *uint16, auth hostAuth) error {
	subNQN, hostNQN := data.SubNQN, data.HostNQN
	raw, err := data.Marshal()
	if err != nil {
		return fmt.Errorf("initiator: connect data: %w", err)
	}
	cmd := nvme.ConnectCommand(nvme.ConnectParams{QID: q.QID(), SQSIZE: uint16(q.Entries() - 1), KATO: nvme.KeepAliveTimeoutValue(kato)}, nvme.NullSGL())
	cqe, err := q.Submit(ctx, cmd, raw)
	if err != nil {
		if errors.Is(err, nvme.StatusConnectInvalidHost) {
			return fmt.Errorf("%w: %s may not access %s: %w", ErrHostNotAllowed, hostNQN, subNQN, err)
		}
		var se *nvme.StatusError
		if errors.As(err, &se) && errors.Is(err, nvme.StatusConnectInvalidParameters) {
			// The completion says which field it refused (IATTR/IPO).
			if p := nvme.DecodeInvalidParameter(se.Result); p.InData && p.Offset == nvme.ConnectDataOffsetSubNQN {
				return fmt.Errorf("initiator: the target does not serve subsystem %s (a Discover lists those it does): %w", subNQN, err)
			}
		}
		return fmt.Errorf("initiator: connect queue %d to %s: %w", q.QID(), subNQN, err)
	}
	resp := nvme.DecodeConnectResponse(cqe.DW0)
	if gotCNTLID != nil {
		*gotCNTLID = resp.CNTLID
	}
	return auth.authenticate(ctx, q, data, resp.AuthRequired)
}

// connectAdmin dials and connects an admin queue to subNQN, enables the
// controller and reads Identify Controller. replaces names the controller
// the new one replaces (zero: none).
func (c *Controller) connectAdmin(ctx context.Context, subNQN string, kato time.Duration, replaces nvme.NPControllerRef) (*session, error) {
	q, err := c.dialQueue(ctx, queueConfig{qid: 0, entries: adminEntries, cntlid: nvme.DynamicControllerID})
	if err != nil {
		return nil, err
	}
	s := &session{c: c, admin: q, gen: c.gens.Add(1), failed: make(chan struct{}), regions: map[uint32]*regionInfo{}}
	data := c.connectData(subNQN, nvme.DynamicControllerID)
	data.Replaces = replaces
	if err := connectQueue(ctx, q, data, kato, &s.cntlid, c.cfg.auth); err != nil {
		q.Close()
		return nil, err
	}
	if err := s.enable(ctx); err != nil {
		q.Close()
		return nil, err
	}
	buf := make([]byte, nvme.IdentifySize)
	if _, err := q.Submit(ctx, nvme.IdentifyCommand(nvme.CNSController, 0, nvme.NullSGL()), buf); err != nil {
		q.Close()
		return nil, fmt.Errorf("initiator: identify controller of %s: %w", subNQN, err)
	}
	if err := s.ident.Unmarshal(buf); err != nil {
		q.Close()
		return nil, fmt.Errorf("initiator: identify controller of %s: %w", subNQN, err)
	}
	if s.ident.CNTLID != s.cntlid {
		q.Close()
		return nil, fmt.Errorf("initiator: %s: Identify says controller %d, Connect said %d", subNQN, s.ident.CNTLID, s.cntlid)
	}
	s.maxXfer = c.b.maxTransfer()
	if m := s.ident.MaxTransfer(BlockSize); m > 0 && m < int64(s.maxXfer) {
		s.maxXfer = int(m)
	}
	return s, nil
}

func (s *session) propertyGet(ctx context.Context, off uint32, size int) (uint64, error) {
	cmd, err := nvme.PropertyGetCommand(off, size)
	if err != nil {
		return 0, err
	}
	cqe, err := s.admin.Submit(ctx, cmd, nil)
	if err != nil {
		return 0, fmt.Errorf("initiator: property get %#x: %w", off, err)
	}
	return cqe.Result64(), nil
}

func (s *session) propertySet(ctx context.Context, off uint32, v uint32) error {
	cmd, err := nvme.PropertySetCommand(off, 4, uint64(v))
	if err != nil {
		return err
	}
	if _, err := s.admin.Submit(ctx, cmd, nil); err != nil {
		return fmt.Errorf("initiator: property set %#x: %w", off, err)
	}
	return nil
}

// enable sets CC.EN and waits for CSTS.RDY within CAP.TO.
func (s *session) enable(ctx context.Context) error {
	capv, err := s.propertyGet(ctx, nvme.PropCAP, 8)
	if err != nil {
		return err
	}
	cc := nvme.CC{EN: true, IOSQES: 6, IOCQES: 4}
	if err := s.propertySet(ctx, nvme.PropCC, cc.Encode()); err != nil {
		return err
	}
	timeout := time.Duration(nvme.DecodeCAP(capv).TO+1) * 500 * time.Millisecond
	deadline := time.Now().Add(timeout)
	for {
		v, err := s.propertyGet(ctx, nvme.PropCSTS, 4)
		if err != nil {
			return err
		}
		csts := nvme.DecodeCSTS(uint32(v))
		if csts.CFS {
			return fmt.Errorf("initiator: controller %d reports a fatal status after enable", s.cntlid)
		}
		if csts.RDY {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("initiator: controller %d not ready after %v", s.cntlid, timeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// install makes s the current session and starts its keep-alive and
// watchers.
func (c *Controller) install(s *session) {
	c.mu.Lock()
	c.sess = s
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		c.supervise(s)
	}()
	if s.notices {
		c.bg.Add(1)
		go func() {
			defer c.bg.Done()
			c.watchNotices(s)
		}()
	}
}

// supervise keeps s alive and notices its loss: keep-alives every half
// KATO; any queue failing fails the session.
func (c *Controller) supervise(s *session) {
	queues := append([]hostQueue{s.admin}, s.io...)
	for _, q := range queues {
		go func() {
			select {
			case <-q.Done():
				s.fail(q.Err())
			case <-s.failed:
			}
		}()
	}
	var tick <-chan time.Time
	if c.cfg.kato > 0 {
		t := time.NewTicker(c.cfg.kato / 2)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-c.stop:
			return
		case <-s.failed:
			c.reconnect(s)
			return
		case <-tick:
			ctx, cancel := context.WithTimeout(context.Background(), c.cfg.kato)
			_, err := s.admin.Submit(ctx, nvme.KeepAliveCommand(), nil)
			cancel()
			if err != nil {
				s.fail(fmt.Errorf("keep-alive: %w", err))
			}
		}
	}
}

// fail marks the session lost (once); supervise starts the reconnect.
func (s *session) fail(err error) {
	s.failOnce.Do(func() {
		s.c.mu.Lock()
		closed := s.c.closed
		s.c.mu.Unlock()
		if !closed {
			s.c.cfg.log.Warn("initiator: controller connection lost", "subsystem", s.c.subNQN, "addr", s.c.addr, "cntlid", s.cntlid, "err", err)
		}
		s.failErr = err
		close(s.failed)
	})
}

// close closes the session's queues; with shutdown it first asks the
// controller for a normal shutdown (flush) and waits for it briefly.
func (s *session) close(ctx context.Context, shutdown bool) {
	if shutdown {
		cc := nvme.CC{EN: true, IOSQES: 6, IOCQES: 4, SHN: nvme.ShutdownNormal}
		if s.propertySet(ctx, nvme.PropCC, cc.Encode()) == nil {
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) {
				v, err := s.propertyGet(ctx, nvme.PropCSTS, 4)
				if err != nil || nvme.DecodeCSTS(uint32(v)).SHST == nvme.ShutdownStatusComplete {
					break
				}
				time.Sleep(time.Millisecond)
			}
		}
	}
	for _, q := range s.io {
		q.Close()
	}
	s.admin.Close()
}

// reconnect replaces a lost session, retrying with backoff until the
// controller-loss timeout, after which the controller is lost for good.
func (c *Controller) reconnect(old *session) {
	c.mu.Lock()
	if c.sess == old {
		c.sess = nil
		c.lossAt = time.Now().Add(c.cfg.lossTimeout)
	}
	deadline := c.lossAt
	c.mu.Unlock()
	old.close(context.Background(), false)
	delay := c.cfg.reconnectDelay
	var lastErr error
	for attempt := 1; ; attempt++ {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), left)
		go func() {
			select {
			case <-c.stop: // Close must not wait for an attempt in progress
				cancel()
			case <-ctx.Done():
			}
		}()
		s, err := c.connect(ctx, old)
		cancel()
		if err == nil {
			c.ctr.reconnects.Add(1)
			c.mu.Lock()
			closed := c.closed
			restarted, unclean := s.ident.NP.RestartedSince(c.instance)
			if s.ident.NP.BootID != 0 {
				c.instance = s.ident.NP
			}
			c.mu.Unlock()
			if restarted {
				c.ctr.targetRestarts.Add(1)
				if unclean {
					c.ctr.targetRestartsUnclean.Add(1)
				}
			}
			// Warn, as the loss was: a log kept at warn shows the recovery too.
			c.cfg.log.Warn("initiator: controller reconnected", "subsystem", c.subNQN, "addr", c.addr, "cntlid", s.cntlid, "attempt", attempt,
				"target_restarted", restarted, "unclean", unclean)
			if closed {
				s.close(context.Background(), false)
				return
			}
			c.install(s)
			c.checkNamespaces(s)
			return
		}
		lastErr = err
		c.cfg.log.Debug("initiator: reconnect failed", "subsystem", c.subNQN, "attempt", attempt, "err", err)
		if errors.Is(err, ErrHostNotAllowed) || authFailure(err) {
			break // access was revoked or the secrets do not match: retrying cannot help
		}
		select {
		case <-c.stop:
			return
		case <-time.After(min(delay, time.Until(deadline))):
		}
		delay = min(2*delay, maxReconnectDelay)
	}
	// The causes are text, not wrapped: a lost controller's error must not
	// match nvme.ErrQueueFailed, which callers retry.
	why := fmt.Sprintf("not reconnected within %v", c.cfg.lossTimeout)
	switch {
	case errors.Is(lastErr, ErrHostNotAllowed):
		why = "the target refused this host on reconnect"
	case authFailure(lastErr):
		why = "authentication failed on reconnect"
	}
	if old.failErr != nil {
		why += fmt.Sprintf("; the connection was lost: %v", old.failErr)
	}
	if lastErr != nil {
		why += fmt.Sprintf("; last reconnect attempt: %v", lastErr)
	}
	c.mu.Lock()
	declared := false
	if c.lostErr == nil {
		c.lostErr = fmt.Errorf("%w: %s at %s: %s", ErrControllerLost, c.subNQN, c.addr, why)
		c.lostAt = time.Now()
		close(c.lost)
		declared = true
	}
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
	if declared {
		c.cfg.log.Error("initiator: controller lost", "subsystem", c.subNQN, "addr", c.addr, "timeout", c.cfg.lossTimeout, "why", why)
	}
}

// Lost is closed once the controller is lost for good: not reconnected
// within the controller-loss timeout, or refused by the target on
// reconnect. Its I/O fails with ErrControllerLost from then on. Closing the
// controller does not close it.
func (c *Controller) Lost() <-chan struct{} { return c.lost }

// Loss says since when the controller has been lost for good and why (the
// error its I/O fails with); a zero time and nil while it is not lost.
func (c *Controller) Loss() (since time.Time, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lostAt.IsZero() {
		return time.Time{}, nil
	}
	return c.lostAt, c.lostErr
}

// current returns the live session, waiting while a reconnect is under way
// (bounded by the loss timeout and ctx).
func (c *Controller) current(ctx context.Context) (*session, error) {
	for {
		c.mu.Lock()
		s, lost, ch, at := c.sess, c.lostErr, c.changed, c.lossAt
		c.mu.Unlock()
		if lost != nil {
			return nil, lost
		}
		if s != nil {
			return s, nil
		}
		// Never longer than the loss deadline (plus a margin for the
		// reconnect loop to declare the loss).
		wait := time.Until(at) + time.Second
		if wait <= 0 {
			wait = time.Second
		}
		t := time.NewTimer(wait)
		select {
		case <-ch:
			t.Stop()
		case <-t.C:
			return nil, fmt.Errorf("%w: %s at %s: not reconnected within %v", ErrControllerLost, c.subNQN, c.addr, c.cfg.lossTimeout)
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
}

// do runs fn on the live session; a failure a new session cures
// (nextSessionCures) fails the session and fn runs again on the next one, on
// at most MaxCommandSessions sessions, once per session: a lost attempt may
// have been executed, which block commands tolerate (they are idempotent).
// Any other error, or ctx ending, is returned as is.
func (c *Controller) do(ctx context.Context, fn func(s *session) error) error {
	for sessions := 1; ; sessions++ {
		s, err := c.current(ctx)
		if err != nil {
			return err
		}
		err = fn(s)
		if err == nil || !nextSessionCures(err) {
			return err
		}
		s.fail(err)
		if sessions >= MaxCommandSessions {
			return fmt.Errorf("initiator: %s at %s: giving up: the connection was lost under the command on %d sessions in a row; the last time: %w",
				c.subNQN, c.addr, sessions, err)
		}
		// Wait until supervise has taken the session down, then retry.
		c.waitReplaced(ctx, s)
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// nextSessionCures reports whether err means the command did not complete on
// its session for a reason a new session cures: the queue failed under it (a
// transport failure; the command may have run), or the target deleted the
// queue without running it (Command Aborted due to SQ Deletion without Do Not
// Retry: a controller being torn down, replaced by this host's reconnect, or
// fenced after its connection failed — possibly before the host noticed).
func nextSessionCures(err error) bool {
	if errors.Is(err, nvme.ErrQueueFailed) {
		return true
	}
	return errors.Is(err, nvme.StatusAbortedSQDeleted) && !nvme.StatusOf(err).DNR()
}

// checkNamespaces verifies every namespace against the new session s at
// once rather than at its next operation: a namespace an idle user holds is
// then found changed (Changed, and attach's list) and a target restart's
// effect on its unflushed changes is reported when the reconnect happens. A
// failure is left to the next operation, which checks again.
func (c *Controller) checkNamespaces(s *session) {
	c.nsMu.Lock()
	ns := slices.Clone(c.namespaces)
	c.nsMu.Unlock()
	if len(ns) == 0 {
		return
	}
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-c.stop:
				cancel()
			case <-s.failed:
				cancel()
			case <-ctx.Done():
			}
		}()
		for _, n := range ns {
			if err := n.verify(ctx, s); err != nil && !errors.Is(err, ErrNamespaceChanged) {
				c.cfg.log.Debug("initiator: checking a namespace after the reconnect", "nsid", n.nsid, "err", err)
			}
		}
	}()
}

func (c *Controller) waitReplaced(ctx context.Context, s *session) {
	for {
		c.mu.Lock()
		cur, ch, lost := c.sess, c.changed, c.lostErr
		c.mu.Unlock()
		if cur != s || lost != nil {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// ioQueue picks an I/O queue round-robin.
func (s *session) ioQueue(c *Controller) hostQueue {
	return s.io[int(c.rr.Add(1))%len(s.io)]
}

// Close shuts the controller down (a normal shutdown: the target flushes)
// and closes its queues. Namespaces fail with ErrClosed afterwards.
func (c *Controller) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	s := c.sess
	c.sess = nil
	if c.lostErr == nil {
		c.lostErr = fmt.Errorf("%w: %s at %s", ErrClosed, c.subNQN, c.addr)
	}
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
	c.stopOnce.Do(func() { close(c.stop) })
	if s != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s.close(ctx, true)
		cancel()
		s.fail(ErrClosed)
	}
	c.bg.Wait()
	if c.prom != nil {
		c.prom.unregister()
	}
	return c.b.close()
}

// NamespaceIDs lists the active namespaces.
func (c *Controller) NamespaceIDs(ctx context.Context) ([]uint32, error) {
	var ids []uint32
	err := c.do(ctx, func(s *session) error {
		ids = ids[:0]
		var after uint32
		for {
			buf := make([]byte, nvme.IdentifySize)
			if _, err := s.admin.Submit(ctx, nvme.IdentifyCommand(nvme.CNSActiveNamespaces, after, nvme.NullSGL()), buf); err != nil {
				return fmt.Errorf("initiator: namespace list of %s: %w", c.subNQN, err)
			}
			page, err := nvme.ParseNamespaceList(buf)
			if err != nil {
				return err
			}
			ids = append(ids, page...)
			if len(page) < nvme.MaxNamespaceListEntries {
				return nil
			}
			after = page[len(page)-1]
		}
	})
	return ids, err
}
