// Package target is the nprdma storage target: subsystems (NQN) hold
// namespaces (NSID, a backing device, a swap.Region over it registered for
// remote reads without pinning), hosts connect controllers to them over
// the nvme/fabric binding, and the NVMe admin and I/O command sets are
// served on top. Initiators read namespaces one-sidedly through the region
// descriptor of the NP extension; everything else is a command.
//
// docs/target.md describes the model, the commands and the design choices.
package target

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/shm"
	"github.com/nprdma/nprdma/nprdma/tcp"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/fabric"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of the target's limits.
const (
	DefaultListen           = "127.0.0.1:4420"
	DefaultMaxControllers   = 64
	DefaultMaxIOQueues      = 64
	DefaultMaxConnections   = fabric.DefaultMaxQueues
	DefaultMaxNamespaces    = 1024
	DefaultQueueDepth       = 128
	DefaultMaxKeepAlive     = 5 * time.Minute
	DefaultInCapsuleData    = fabric.DefaultInCapsuleData
	DefaultMaxTransferBytes = fabric.MaxTransfer
	// DefaultFenceTimeout is longer than the 10 s a write may wait in a
	// namespace's region for memory before it fails by itself (swap's
	// reclaim timeout): a failed queue's command that will end is waited
	// for.
	DefaultFenceTimeout = 15 * time.Second
	// DefaultMetadataProbeInterval is how often the metadata store's
	// directory is probed while nothing is written to it: a store that
	// failed then shows within this long (docs/target.md §6).
	DefaultMetadataProbeInterval = 10 * time.Second
	// BlockSize is the LBA size of every namespace: the page size of the
	// region, so that one block is one page of residency.
	BlockSize = 4096
)

// Option configures a Target.
type Option func(*config)

type config struct {
	provider       nprdma.Provider
	device         *nprdma.Device
	frameMode      FrameMode
	frameShare     float64
	listen         []string
	listenTCP      string
	listenTCPDisc  string
	dataDir        string
	reg            prometheus.Registerer
	log            *slog.Logger
	maxKATO        time.Duration
	maxControllers int
	maxIOQueues    int
	maxConnections int
	maxNamespaces  int
	queueDepth     int
	maxTransfer    int
	icd            int
	qpTimeout      time.Duration
	pinnedBudget   int64
	busyPoll       time.Duration
	fenceTimeout   time.Duration
	keyring        Keyring
	authTimeout    time.Duration
	metaProbe      time.Duration
	manage         manageConfig // manage.go
}

// WithProvider sets the nprdma provider the target's software NIC runs on
// (default nprdma/tcp).
func WithProvider(p nprdma.Provider) Option { return func(c *config) { c.provider = p } }

// WithDevice makes the target serve on dev (hardware: nprdma/verbs) instead
// of a software NIC of its own (default: none, WithProvider's). The target
// closes it when it is closed.
func WithDevice(dev *nprdma.Device) Option { return func(c *config) { c.device = dev } }

// WithFrames says when namespaces are read one-sided through frames
// (frames.go; default FramesAuto: on devices that cannot read unpinned
// memory).
func WithFrames(m FrameMode) Option { return func(c *config) { c.frameMode = m } }

// WithFrameShare sets the share of each namespace's DRAM budget held as
// frames where frames are used, the rest staying the budget of its region
// (default DefaultFrameShare).
func WithFrameShare(f float64) Option { return func(c *config) { c.frameShare = f } }

// WithListen sets the addresses hosts connect to over the nprdma fabric
// (default DefaultListen); Addr is the first. An address "unix:PATH"
// (shm.Scheme) accepts initiators on this host over shared memory
// (nprdma/shm) on the unix socket PATH, whatever the provider of the
// others, and makes the namespaces' regions shareable, so that those
// initiators read them in place.
func WithListen(addrs ...string) Option { return func(c *config) { c.listen = addrs } }

// WithListenNVMeTCP also serves the subsystems to NVMe/TCP hosts (a stock
// Linux host's `nvme connect -t tcp`) at addr, host:port (default "": not
// served). Its port answers the discovery NQN too. Reads over NVMe/TCP are
// two-sided, through the namespaces' regions like every command.
func WithListenNVMeTCP(addr string) Option { return func(c *config) { c.listenTCP = addr } }

// WithListenNVMeTCPDiscovery serves an NVMe/TCP discovery controller, and
// nothing else, at addr (default "": not served; 8009 is the port hosts try
// by convention). Its discovery log points at the WithListenNVMeTCP port.
func WithListenNVMeTCPDiscovery(addr string) Option {
	return func(c *config) { c.listenTCPDisc = addr }
}

// WithDataDir keeps the durable metadata (namespace identity, host lists,
// the clean-shutdown marker) in a badger store in dir. Without it identities
// are drawn afresh at every start.
func WithDataDir(dir string) Option { return func(c *config) { c.dataDir = dir } }

// WithMetrics registers the target's metrics (nprdma_target_*, the swap
// observers' nprdma_swap_* and the fabric's nprdma_fabric_*) on reg.
func WithMetrics(reg prometheus.Registerer) Option { return func(c *config) { c.reg = reg } }

// WithLogger sets where the target logs (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// WithKeepAliveTimeout caps the keep-alive timeout a host may ask for
// (default DefaultMaxKeepAlive); a controller that hears nothing for its
// timeout is torn down.
func WithKeepAliveTimeout(max time.Duration) Option { return func(c *config) { c.maxKATO = max } }

// WithMaxControllers bounds the controllers alive at once.
func WithMaxControllers(n int) Option { return func(c *config) { c.maxControllers = n } }

// WithMaxIOQueues bounds the I/O queues of one controller.
func WithMaxIOQueues(n int) Option { return func(c *config) { c.maxIOQueues = n } }

// WithMaxConnections bounds the queues (queue pairs) of all hosts together,
// connected to a controller or not yet (default DefaultMaxConnections): a
// connection request beyond it is refused with the REJECT status "no
// resources". Each queue holds its receive buffers (about 1 MiB at 128
// entries), so this bounds what peers that never send Connect can take.
func WithMaxConnections(n int) Option { return func(c *config) { c.maxConnections = n } }

// WithMaxNamespaces bounds the namespaces of one subsystem (default
// DefaultMaxNamespaces); AddNamespace refuses more.
func WithMaxNamespaces(n int) Option { return func(c *config) { c.maxNamespaces = n } }

// WithQueueDepth bounds the entries of an I/O queue (CAP.MQES+1).
func WithQueueDepth(n int) Option { return func(c *config) { c.queueDepth = n } }

// WithMaxTransfer sets the largest transfer of one command (MDTS), at most
// fabric.MaxTransfer.
func WithMaxTransfer(n int) Option { return func(c *config) { c.maxTransfer = n } }

// WithPinnedBudget selects the pinned baseline, a conventional RDMA target
// kept for comparisons only: New allocates budget bytes of DRAM and
// registers them pinned (mlock) before anything is served, which is the
// start-up cost the mode exists to show. A namespace that fits in what is
// left of that memory is loaded there wholly and read one-sided without the
// NP mechanism (no page states, no magic page); a larger one is served
// two-sided only, every command going to its backing device, and its NP Get
// Region Descriptor fails with Invalid Field so that hosts fall back to NVMe
// Read. Budget 0 (the default) is the normal, unpinned target.
func WithPinnedBudget(budget int64) Option { return func(c *config) { c.pinnedBudget = budget } }

// WithBusyPoll makes every queue's receive loop spin up to d for the next
// command before parking: it saves the wake-up of the loop per command (tens
// of microseconds across vCPUs here) and costs a CPU while commands flow.
func WithBusyPoll(d time.Duration) Option { return func(c *config) { c.busyPoll = d } }

// WithFenceTimeout sets how long a host's write, write-zeroes or
// deallocate waits while a command of one of the host's failed queues (its
// connection was lost; the host may have retried it since) is still
// changing the same blocks (default DefaultFenceTimeout). After that it
// fails with Namespace Not Ready, which hosts may retry: letting it through
// could let the old command overwrite it.
func WithFenceTimeout(d time.Duration) Option { return func(c *config) { c.fenceTimeout = d } }

// WithMetadataProbeInterval sets how often the metadata store's directory
// is probed (a small file rewritten and synced) while nothing is written to
// it (default DefaultMetadataProbeInterval; 0 turns the timer off, every
// write still probes first). Without a data directory it does nothing.
func WithMetadataProbeInterval(d time.Duration) Option { return func(c *config) { c.metaProbe = d } }

// WithQPTimeout sets the queue pairs' peer-silence timeout.
func WithQPTimeout(d time.Duration) Option { return func(c *config) { c.qpTimeout = d } }

// Target serves subsystems over the nprdma fabric.
type Target struct {
	cfg  config
	log  *slog.Logger
	dev  *nprdma.Device
	pd   *nprdma.PD
	meta *metaStore
	met  *metrics
	pool *nprdma.BufferPool
	pins *pinnedArena // the baseline mode's pinned memory, else nil

	prevRun  PreviousRun
	instance nvme.NPInstance // what hosts see of this process (Identify Controller)
	accepted atomic.Bool     // a connection was accepted: this run may have changed data

	mu         sync.Mutex
	subs       map[string]*Subsystem
	ctrls      map[uint16]*controller
	nextCNTL   uint16
	queues     map[*queueConn]struct{}
	ports      []*port // the nprdma fabric's first
	started    bool
	stopping   bool // Shutdown or Close began
	closed     bool // the connections are closed
	acceptCtx  context.Context
	stopAccept context.CancelFunc
	acceptWG   sync.WaitGroup
	retiring   sync.WaitGroup // replaced controllers finishing their teardown

	draining atomic.Bool
	drainMu  sync.RWMutex   // orders draining against inflight.Add (handle)
	inflight sync.WaitGroup // commands executing (not parked AERs)
	tags     atomic.Uint64
	genCtr   atomic.Uint64 // discovery log generation

	manageMu sync.Mutex // orders the management operations (manage.go)
}

// New creates a target. Add subsystems and namespaces, then Start it.
func New(opts ...Option) (*Target, error) {
	cfg := config{
		listen:         []string{DefaultListen},
		log:            slog.Default(),
		maxKATO:        DefaultMaxKeepAlive,
		maxControllers: DefaultMaxControllers,
		maxIOQueues:    DefaultMaxIOQueues,
		maxConnections: DefaultMaxConnections,
		maxNamespaces:  DefaultMaxNamespaces,
		queueDepth:     DefaultQueueDepth,
		maxTransfer:    DefaultMaxTransferBytes,
		icd:            DefaultInCapsuleData,
		fenceTimeout:   DefaultFenceTimeout,
		authTimeout:    DefaultAuthTimeout,
		metaProbe:      DefaultMetadataProbeInterval,
		frameShare:     DefaultFrameShare,
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.provider == nil {
		cfg.provider = tcp.New()
	}
	if len(cfg.listen) == 0 {
		return nil, fmt.Errorf("target: no listen address")
	}
	if cfg.sharesMemory() {
		if cfg.device != nil {
			return nil, fmt.Errorf("target: shared-memory listeners (%s) need the software NIC, not device %s", shm.Scheme, cfg.device.Name())
		}
		if _, ok := cfg.provider.(*shm.Provider); !ok {
			cfg.provider = nprdma.NewSchemes(cfg.provider, map[string]nprdma.Provider{strings.TrimSuffix(shm.Scheme, ":"): shm.New()})
		}
	}
	if cfg.maxTransfer < 2*BlockSize || cfg.maxTransfer > fabric.MaxTransfer {
		return nil, fmt.Errorf("target: max transfer %d outside [%d, %d]", cfg.maxTransfer, 2*BlockSize, fabric.MaxTransfer)
	}
	if cfg.queueDepth < 2 || cfg.queueDepth > 4096 {
		return nil, fmt.Errorf("target: queue depth %d outside [2, 4096]", cfg.queueDepth)
	}
	if cfg.fenceTimeout <= 0 {
		return nil, fmt.Errorf("target: fence timeout %v must be positive", cfg.fenceTimeout)
	}
	if cfg.metaProbe < 0 {
		return nil, fmt.Errorf("target: metadata probe interval %v is negative", cfg.metaProbe)
	}
	if cfg.pinnedBudget < 0 {
		return nil, fmt.Errorf("target: pinned budget %d is negative", cfg.pinnedBudget)
	}
	if cfg.frameShare <= 0 || cfg.frameShare >= 1 {
		return nil, fmt.Errorf("target: frame share %g outside (0, 1)", cfg.frameShare)
	}
	t := &Target{cfg: cfg, log: cfg.log, subs: map[string]*Subsystem{}, ctrls: map[uint16]*controller{},
		queues: map[*queueConn]struct{}{}, nextCNTL: 1}
	t.instance.BootID = newBootID()
	// The namespace regions are registered unpinned; only the baseline
	// mode pins (its namespaces and the data pool).
	pinned := cfg.pinnedBudget > 0
	t.dev = cfg.device
	if t.dev == nil {
		t.dev = nprdma.NewDevice(cfg.provider, nprdma.WithName("target"), nprdma.WithPinning(pinned))
	}
	t.pd = t.dev.AllocPD()
	fail := func(err error) (*Target, error) {
		t.closeMetaUnserved()
		if t.pins != nil {
			t.pins.release()
		}
		t.dev.Close()
		return nil, fmt.Errorf("target: %w", err)
	}
	pool, err := nprdma.NewBufferPool(t.pd, nprdma.AccessLocalWrite)
	if err != nil {
		return fail(err)
	}
	t.pool = pool
	if pinned {
		if t.pins, err = newPinnedArena(t.pd, cfg.pinnedBudget); err != nil {
			return fail(err)
		}
	}
	if cfg.dataDir != "" {
		if t.meta, err = openMeta(cfg.dataDir, cfg.metaProbe, t.log); err != nil {
			return fail(err)
		}
		if t.prevRun, t.instance.UncleanStarts, err = t.meta.markRunning(); err != nil {
			return fail(err)
		}
		t.instance.Flags |= nvme.NPInstanceTracked
	}
	if cfg.reg != nil {
		if t.met, err = newMetrics(cfg.reg, t); err != nil {
			return fail(fmt.Errorf("metrics: %w", err))
		}
	}
	return t, nil
}

// sharesMemory reports whether some listen address is a shared-memory one:
// the namespaces' regions are then made shareable.
func (c *config) sharesMemory() bool {
	for _, a := range c.listen {
		if strings.HasPrefix(a, shm.Scheme) {
			return true
		}
	}
	return false
}

// newBootID returns a random, non-zero identifier of this process.
func newBootID() uint64 {
	for {
		if id := rand.Uint64(); id != 0 {
			return id
		}
	}
}

// PreviousRun is how the previous run with the same data directory ended.
type PreviousRun int

const (
	// PreviousRunUnknown: the target has no data directory.
	PreviousRunUnknown PreviousRun = iota
	// PreviousRunNone: the first start with this data directory.
	PreviousRunNone
	// PreviousRunClean: a clean shutdown, every dirty page flushed.
	PreviousRunClean
	// PreviousRunUnclean: a crash or a kill; writes acknowledged but not
	// flushed before it may be lost, everything flushed is kept.
	PreviousRunUnclean
)

func (p PreviousRun) String() string {
	switch p {
	case PreviousRunNone:
		return "none (first start with this data directory)"
	case PreviousRunClean:
		return "shut down cleanly"
	case PreviousRunUnclean:
		return "did not shut down cleanly (crash or kill: only flushed writes are kept)"
	}
	return "unknown (no data directory)"
}

// PreviousRun reports how the previous run with the same data directory
// ended.
func (t *Target) PreviousRun() PreviousRun { return t.prevRun }

// Instance is what hosts see of this process in Identify Controller: a
// random boot ID and, with a data directory, how many starts followed an
// unclean run.
func (t *Target) Instance() nvme.NPInstance { return t.instance }

// Device is the target's nprdma device.
func (t *Target) Device() *nprdma.Device { return t.dev }

// Start listens and serves in the background.
func (t *Target) Start() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.started || t.stopping {
		return fmt.Errorf("target: already started or closed")
	}
	if t.cfg.listenTCPDisc != "" && t.cfg.listenTCP == "" {
		return fmt.Errorf("target: an NVMe/TCP discovery port without an NVMe/TCP port to point hosts at")
	}
	ports := make([]*port, 0, len(t.cfg.listen)+2)
	fail := func(err error) error {
		for _, p := range ports {
			p.ln.Close()
			if p.release != nil {
				p.release()
			}
		}
		return fmt.Errorf("target: %w", err)
	}
	for _, addr := range t.cfg.listen {
		p, err := t.listenFabric(addr)
		if err != nil {
			return fail(err)
		}
		ports = append(ports, p)
	}
	for _, l := range []struct {
		addr string
		disc bool
	}{{t.cfg.listenTCP, false}, {t.cfg.listenTCPDisc, true}} {
		if l.addr == "" {
			continue
		}
		p, err := t.listenTCP(l.addr, l.disc)
		if err != nil {
			return fail(err)
		}
		ports = append(ports, p)
	}
	t.started = true
	t.acceptCtx, t.stopAccept = context.WithCancel(context.Background())
	for _, p := range ports {
		t.addPortLocked(p)
	}
	return nil
}

// Addr is the address hosts connect to over the nprdma fabric (after
// Start): the first listen address.
func (t *Target) Addr() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.ports) == 0 {
		return ""
	}
	return t.ports[0].ln.Addr()
}

// Addrs are all the addresses hosts connect to over the nprdma fabric
// (after Start), in the order of WithListen.
func (t *Target) Addrs() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for _, p := range t.ports {
		if p.transport == "nprdma" {
			out = append(out, p.ln.Addr())
		}
	}
	return out
}

// NVMeTCPAddr is the address of the NVMe/TCP port, "" when not served.
func (t *Target) NVMeTCPAddr() string { return t.tcpAddr(false) }

// NVMeTCPDiscoveryAddr is the address of the NVMe/TCP discovery port, ""
// when not served.
func (t *Target) NVMeTCPDiscoveryAddr() string { return t.tcpAddr(true) }

func (t *Target) tcpAddr(discoveryOnly bool) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.ports {
		if p.transport == "tcp" && p.discoveryOnly == discoveryOnly {
			return p.ln.Addr()
		}
	}
	return ""
}

// Subsystems lists the subsystems by NQN.
func (t *Target) Subsystems() []*Subsystem {
	t.mu.Lock()
	defer t.mu.Unlock()
	subs := make([]*Subsystem, 0, len(t.subs))
	for _, s := range t.subs {
		subs = append(subs, s)
	}
	sort.Slice(subs, func(i, j int) bool { return subs[i].nqn < subs[j].nqn })
	return subs
}

// Subsystem returns the subsystem nqn, or nil.
func (t *Target) Subsystem(nqn string) *Subsystem {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.subs[nqn]
}

func (t *Target) controllers() []*controller {
	t.mu.Lock()
	defer t.mu.Unlock()
	cs := make([]*controller, 0, len(t.ctrls))
	for _, c := range t.ctrls {
		cs = append(cs, c)
	}
	return cs
}

// Controllers is the number of live controllers (I/O and discovery).
func (t *Target) Controllers() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.ctrls)
}

// ControllerInfo describes a live controller.
type ControllerInfo struct {
	CNTLID    uint16
	Subsystem string
	HostNQN   string
	IOQueues  int
}

// ControllerList describes the live controllers.
func (t *Target) ControllerList() []ControllerInfo {
	var out []ControllerInfo
	for _, c := range t.controllers() {
		c.mu.Lock()
		out = append(out, ControllerInfo{CNTLID: c.id, Subsystem: c.subNQN(), HostNQN: c.hostNQN, IOQueues: len(c.ioQueues)})
		c.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CNTLID < out[j].CNTLID })
	return out
}

// allocController registers a new controller with a fresh CNTLID.
func (t *Target) allocController(c *controller) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.draining.Load() {
		return nvme.Errorf(nvme.StatusControllerBusy, "target shutting down")
	}
	if len(t.ctrls) >= t.cfg.maxControllers {
		return nvme.Errorf(nvme.StatusControllerBusy, "%d controllers alive, the limit", len(t.ctrls))
	}
	for i := 0; i < 0xffef; i++ {
		id := t.nextCNTL
		t.nextCNTL++
		if t.nextCNTL == 0 || t.nextCNTL >= 0xfff0 {
			t.nextCNTL = 1
		}
		if _, used := t.ctrls[id]; !used {
			c.id = id
			t.ctrls[id] = c
			if t.met != nil {
				t.met.controllers.Inc()
			}
			return nil
		}
	}
	return nvme.Errorf(nvme.StatusControllerBusy, "no controller ID free")
}

func (t *Target) removeController(c *controller) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ctrls[c.id] == c {
		delete(t.ctrls, c.id)
		if t.met != nil {
			t.met.controllers.Dec()
		}
	}
}

// splitHostPort splits a listen address for the discovery log; a loop
// provider's name has no port.
func splitHostPort(addr string) (host, port string) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return addr, ""
	}
	return h, p
}
