package target

import (
	"crypto/rand"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/swap"
	"github.com/prometheus/client_golang/prometheus"
)

// SubsystemConfig describes a subsystem.
type SubsystemConfig struct {
	// NQN names the subsystem (nvme.ValidateNQN).
	NQN string
	// AllowHosts lists the host NQNs that may connect. Hosts not listed
	// are refused at Connect (deny by default).
	AllowHosts []string
	// AllowAnyHost admits every host.
	AllowAnyHost bool

	managed bool // created through the management API (manage.go)
}

// Subsystem is an NVM subsystem: namespaces and the hosts allowed to use
// them.
type Subsystem struct {
	t      *Target
	nqn    string
	serial string

	recordMu sync.Mutex // orders changes of the record (AllowHost, Target.RemoveHost)
	// managed: created through the management API (CreateSubsystem), not by
	// the configuration; configHosts: the hosts the configuration allows.
	managed     bool
	configHosts map[string]bool

	mu       sync.Mutex
	hosts    map[string]bool
	keys     map[string]*hostKey // hosts with a key file of the management API (hostkeys.go)
	allowAny bool
	ns       map[uint32]*Namespace
	stopped  bool // the target is stopping: no command acquires a namespace

	// fenceMu guards the hosts' fencing states (fence.go); it is taken only
	// when queues fail, controllers come and go, and commands wait for a
	// failed queue's.
	fenceMu sync.Mutex
	fences  map[string]*hostFence // by host NQN
}

// AddSubsystem creates a subsystem. Its serial number and (when a data
// directory is used) its host list are kept in the metadata store; the
// hosts given here are added to those recorded.
func (t *Target) AddSubsystem(cfg SubsystemConfig) (*Subsystem, error) {
	if err := nvme.ValidateNQN(cfg.NQN); err != nil {
		return nil, fmt.Errorf("target: subsystem %q: %w", cfg.NQN, err)
	}
	if cfg.NQN == nvme.DiscoveryNQN {
		return nil, fmt.Errorf("target: subsystem %q: the discovery NQN is reserved", cfg.NQN)
	}
	for _, h := range cfg.AllowHosts {
		if err := nvme.ValidateNQN(h); err != nil {
			return nil, fmt.Errorf("target: subsystem %s: allowed host %q: %w", cfg.NQN, h, err)
		}
	}
	s := &Subsystem{t: t, nqn: cfg.NQN, hosts: map[string]bool{}, keys: map[string]*hostKey{}, allowAny: cfg.AllowAnyHost, ns: map[uint32]*Namespace{},
		fences: map[string]*hostFence{}, managed: cfg.managed, configHosts: map[string]bool{}}
	if !cfg.managed {
		for _, h := range cfg.AllowHosts {
			s.configHosts[h] = true
		}
	}
	rec := subsystemRecord{NQN: cfg.NQN, Created: time.Now().UTC()}
	if t.meta != nil {
		old, ok, err := t.meta.subsystem(cfg.NQN, cfg.managed)
		if err != nil {
			return nil, fmt.Errorf("target: subsystem %s: %w", cfg.NQN, err)
		}
		if ok {
			rec = old
		}
	}
	if rec.Serial == "" {
		rec.Serial = newSerial()
	}
	for _, h := range rec.Hosts {
		s.hosts[h] = true
	}
	s.restoreKeys(rec.hostKeyFiles())
	for _, h := range cfg.AllowHosts {
		if !s.hosts[h] {
			s.hosts[h] = true
			rec.Hosts = append(rec.Hosts, h)
		}
	}
	rec.AllowAnyHost = cfg.AllowAnyHost
	rec.Managed = cfg.managed
	s.serial = rec.Serial
	if t.meta != nil {
		if err := t.meta.putSubsystem(rec); err != nil {
			return nil, fmt.Errorf("target: subsystem %s: %w", cfg.NQN, err)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, dup := t.subs[cfg.NQN]; dup {
		return nil, fmt.Errorf("target: subsystem %s exists already", cfg.NQN)
	}
	t.subs[cfg.NQN] = s
	t.genCtr.Add(1)
	return s, nil
}

// newSerial draws a 20-character serial number (hex).
func newSerial() string {
	var b [10]byte
	rand.Read(b[:])
	return fmt.Sprintf("%x", b[:])
}

// NQN is the subsystem's name.
func (s *Subsystem) NQN() string { return s.nqn }

// Serial is the subsystem's serial number (Identify Controller SN).
func (s *Subsystem) Serial() string { return s.serial }

// Hosts lists the allowed host NQNs.
func (s *Subsystem) Hosts() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for h := range s.hosts {
		out = append(out, h)
	}
	sort.Strings(out)
	return out
}

// AllowsAnyHost reports whether every host is admitted.
func (s *Subsystem) AllowsAnyHost() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.allowAny
}

// Allows reports whether host may connect.
func (s *Subsystem) Allows(host string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.allowAny || s.hosts[host]
}

// AllowHost adds host to the allow-list. With a data directory the new list
// is recorded first: when that fails (the metadata store failed, an error
// wrapping ErrMetadataStore) the host is not added.
func (s *Subsystem) AllowHost(host string) error { return s.allowHost(host, nil) }

// allowHost adds host to the allow-list, with k its key files (nil:
// none). A host allowed already keeps its key files unless k names others,
// which replace them; k naming the same files takes the secrets just read.
func (s *Subsystem) allowHost(host string, k *hostKey) error {
	if err := nvme.ValidateNQN(host); err != nil {
		return fmt.Errorf("target: subsystem %s: host %q: %w", s.nqn, host, err)
	}
	s.recordMu.Lock()
	defer s.recordMu.Unlock()
	s.mu.Lock()
	listed, old, keys := s.hosts[host], s.keys[host], s.keyFilesLocked()
	same := k != nil && old != nil && old.files == k.files
	if listed && same {
		s.keys[host] = k
	}
	s.mu.Unlock()
	if listed && (k == nil || same) {
		return nil
	}
	hosts := s.Hosts()
	if !listed {
		hosts = append(hosts, host)
	}
	if k != nil {
		keys = withKey(keys, host, k)
	}
	if err := s.record(hosts, keys); err != nil {
		return fmt.Errorf("target: subsystem %s: allowing host %s: %w", s.nqn, host, err)
	}
	s.mu.Lock()
	s.hosts[host] = true
	if k != nil {
		s.keys[host] = k
	}
	s.mu.Unlock()
	s.t.genCtr.Add(1)
	return nil
}

// record writes the subsystem's record with hosts as its host list and keys
// as their key files (by host NQN).
func (s *Subsystem) record(hosts []string, keys map[string]keyFiles) error {
	if s.t.meta == nil {
		return nil
	}
	rec, ok, err := s.t.meta.subsystem(s.nqn, s.managed)
	if err != nil {
		return err
	}
	if !ok {
		rec = subsystemRecord{NQN: s.nqn, Serial: s.serial, Created: time.Now().UTC(), Managed: s.managed}
	}
	sort.Strings(hosts)
	rec.Hosts = hosts
	rec.setHostKeyFiles(keys)
	rec.AllowAnyHost = s.AllowsAnyHost()
	return s.t.meta.putSubsystem(rec)
}

// Namespaces lists the namespaces by NSID.
func (s *Subsystem) Namespaces() []*Namespace {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Namespace, 0, len(s.ns))
	for _, n := range s.ns {
		if n != nil { // nil: reserved while AddNamespace builds it
			out = append(out, n)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].nsid < out[j].nsid })
	return out
}

// Namespace returns namespace nsid, or nil.
func (s *Subsystem) Namespace(nsid uint32) *Namespace {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ns[nsid]
}

// acquire returns namespace nsid (or nil) held for one command: a
// RemoveNamespace waits for the commands holding it before closing it.
// Release it with n.users.Done().
func (s *Subsystem) acquire(nsid uint32) *Namespace {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	n := s.ns[nsid]
	if n != nil {
		n.users.Add(1)
	}
	return n
}

// acquireAll holds every namespace, as acquire does.
func (s *Subsystem) acquireAll() []*Namespace {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	out := make([]*Namespace, 0, len(s.ns))
	for _, n := range s.ns {
		if n != nil {
			n.users.Add(1)
			out = append(out, n)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].nsid < out[j].nsid })
	return out
}

// stopServing makes acquire find no namespace from now on, so that the
// target's stop may wait for each namespace's commands (users) and close
// it. Only a command that had not reached its namespace by then is
// affected, and its queue is closed already: its host never sees the
// completion.
func (s *Subsystem) stopServing() {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
}

func (s *Subsystem) activeNSIDs() []uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]uint32, 0, len(s.ns))
	for id, n := range s.ns {
		if n != nil {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

func (s *Subsystem) maxNSID() uint32 {
	var m uint32
	for _, id := range s.activeNSIDs() {
		m = max(m, id)
	}
	return m
}

// NamespaceConfig describes a namespace.
type NamespaceConfig struct {
	// NSID is the namespace ID (1..0xFFFFFFFE); 0 takes the next free one.
	NSID uint32
	// Backing is the device that holds the data; the target owns it from
	// here on and closes it.
	Backing blockdev.Device
	// Budget is the DRAM the namespace's region may keep resident, in bytes
	// (0: swap's default, a quarter of the namespace).
	Budget int64
	// Size is the namespace's size in bytes, at most the backing's (0: the
	// backing's size).
	Size int64
	// MaxSize is how large the namespace may grow while it is served
	// (ResizeNamespace): the address space its region reserves (0:
	// DefaultMaxSize of the size).
	MaxSize int64
	// SwapOptions are passed to swap.New after the target's own.
	SwapOptions []swap.Option

	managed *managedNamespace // created through the management API (manage.go)
}

// Namespace is a namespace of a subsystem: a region over a backing device.
type Namespace struct {
	sub     *Subsystem
	nsid    uint32
	dev     blockdev.Device
	store   store
	region  *swap.Region // nil in the pinned baseline
	mirror  *frameMirror // the frames hosts read one-sided, where frames are used
	pinned  *pinnedStore // baseline: held in the pinned memory
	direct  bool         // baseline: too large for the pinned memory, two-sided only
	nguid   [16]byte
	uuid    nvme.UUID
	created time.Time
	managed *managedNamespace // nil: from the configuration

	users   sync.WaitGroup // commands executing on it (Subsystem.acquire)
	removed atomic.Bool    // RemoveNamespace began: no new registrations

	closeOnce sync.Once
	closeErr  error
}

// AddNamespace creates a namespace over cfg.Backing. Its identity (NGUID,
// UUID) comes from the metadata store when the same backing (path and
// size) had it before under the same NSID; otherwise it is drawn afresh
// and recorded. Connected hosts get a Namespace Attribute Changed notice.
func (s *Subsystem) AddNamespace(cfg NamespaceConfig) (*Namespace, error) {
	t := s.t
	if cfg.Backing == nil {
		return nil, fmt.Errorf("target: subsystem %s: namespace without a backing device", s.nqn)
	}
	size := cfg.Backing.Size() / BlockSize * BlockSize
	if cfg.Size != 0 {
		if cfg.Size%BlockSize != 0 || cfg.Size > size {
			return nil, fmt.Errorf("target: subsystem %s: size %d is not a multiple of %d within the %d bytes of backing %s", s.nqn, cfg.Size, BlockSize, size, cfg.Backing.Path())
		}
		size = cfg.Size
	}
	if size < 16*BlockSize {
		return nil, fmt.Errorf("target: subsystem %s: backing %s of %d bytes is too small (at least %d)", s.nqn, cfg.Backing.Path(), cfg.Backing.Size(), 16*BlockSize)
	}
	s.mu.Lock()
	nsid := cfg.NSID
	if nsid == 0 {
		nsid = 1
		for {
			if _, taken := s.ns[nsid]; !taken {
				break
			}
			nsid++
		}
	}
	if nsid == 0 || nsid == nvme.BroadcastNSID {
		s.mu.Unlock()
		return nil, fmt.Errorf("target: subsystem %s: NSID %#x is not usable", s.nqn, nsid)
	}
	if _, taken := s.ns[nsid]; taken {
		s.mu.Unlock()
		return nil, fmt.Errorf("target: subsystem %s: namespace %d exists already", s.nqn, nsid)
	}
	if len(s.ns) >= t.cfg.maxNamespaces {
		s.mu.Unlock()
		return nil, fmt.Errorf("target: subsystem %s: namespace %d: %d namespaces, the limit (WithMaxNamespaces)", s.nqn, nsid, t.cfg.maxNamespaces)
	}
	s.ns[nsid] = nil // reserved while it is built
	s.mu.Unlock()
	fail := func(err error) (*Namespace, error) {
		s.mu.Lock()
		delete(s.ns, nsid)
		s.mu.Unlock()
		return nil, fmt.Errorf("target: subsystem %s namespace %d on %s: %w", s.nqn, nsid, cfg.Backing.Path(), err)
	}

	n := &Namespace{sub: s, nsid: nsid, dev: cfg.Backing, managed: cfg.managed}
	var rec namespaceRecord
	found := false
	if t.meta != nil {
		// A failed store may hold records its failed writes left in its
		// memory: nothing is taken from it any more.
		if err := t.meta.refuseRecord(); err != nil {
			return fail(err)
		}
		var err error
		if rec, found, err = t.meta.namespace(s.nqn, nsid, cfg.managed != nil); err != nil {
			return fail(err)
		}
		if found && (rec.Backing != cfg.Backing.Path() || rec.Size != size) {
			t.log.Warn("target: namespace backing changed: new identity", "subsystem", s.nqn, "nsid", nsid,
				"was", rec.Backing, "was_size", rec.Size, "now", cfg.Backing.Path(), "now_size", size)
			found = false
		}
	}
	if !found {
		rec = namespaceRecord{SubNQN: s.nqn, NSID: nsid, Backing: cfg.Backing.Path(), Size: size, Created: time.Now().UTC()}
		rand.Read(rec.NGUID[:])
		rec.UUID = nvme.NewUUID()
		cfg.managed.fill(&rec)
		if t.meta != nil {
			if err := t.meta.putNamespace(rec); err != nil {
				return fail(err)
			}
		}
	}
	n.nguid, n.uuid, n.created = rec.NGUID, nvme.UUID(rec.UUID), rec.Created

	if t.pins != nil {
		// The pinned baseline: the memory was registered (pinned) by New.
		if mem := t.pins.carve(size); mem != nil {
			ps, err := newPinnedStore(cfg.Backing, mem, size)
			if err != nil {
				t.pins.giveBack(mem)
				return fail(err)
			}
			n.pinned, n.store = ps, ps
		} else {
			t.log.Info("target: namespace larger than what is left of the pinned memory: served two-sided only",
				"subsystem", s.nqn, "nsid", nsid, "size", size)
			n.direct, n.store = true, &directStore{dev: cfg.Backing, size: size}
		}
		s.mu.Lock()
		s.ns[nsid] = n
		s.mu.Unlock()
		t.genCtr.Add(1)
		s.namespaceChanged(nsid)
		return n, nil
	}
	maxSize := cfg.MaxSize
	if maxSize == 0 {
		maxSize = DefaultMaxSize(size)
	}
	opts := []swap.Option{swap.WithSize(size), swap.WithMaxSize(max(maxSize, size)), swap.WithLogger(t.log)}
	if t.cfg.sharesMemory() {
		opts = append(opts, swap.WithShareable())
	}
	budget, frameMem := cfg.Budget, int64(0)
	if t.usesFrames() {
		if budget <= 0 {
			budget = size / 4 // swap's default
		}
		frameMem = int64(float64(budget) * t.cfg.frameShare)
		budget = max(budget-frameMem, 64*BlockSize)
	}
	if budget > 0 {
		opts = append(opts, swap.WithBudget(budget))
	}
	if t.cfg.reg != nil {
		obs, err := swap.NewPrometheusObserver(t.cfg.reg, prometheus.Labels{"subsystem": s.nqn, "nsid": strconv.FormatUint(uint64(nsid), 10)})
		if err != nil {
			return fail(err)
		}
		opts = append(opts, swap.WithObserver(obs))
	}
	opts = append(opts, cfg.SwapOptions...)
	region, err := swap.New(cfg.Backing, opts...)
	if err != nil {
		// The NIC engine reads the region only under the seqlock, never an
		// absent page, so userfaultfd is a backstop here, not a need: a
		// kernel or device without it still serves.
		var err2 error
		if region, err2 = swap.New(cfg.Backing, append(opts, swap.WithoutUserfaultfd())...); err2 != nil {
			return fail(err)
		}
		t.log.Warn("target: namespace region without userfaultfd", "subsystem", s.nqn, "nsid", nsid, "err", err)
	}
	n.region, n.store = region, region
	if frameMem > 0 {
		m, err := newFrameMirror(t.pd, frameMem, uint64(max(maxSize, size)/BlockSize))
		if err != nil {
			region.Close()
			return fail(err)
		}
		n.mirror, n.store = m, &mirroredStore{store: region, m: m}
		t.log.Info("target: frames registered", "subsystem", s.nqn, "nsid", nsid, "frames", m.frames,
			"bytes", m.pinnedBytes(), "took", m.regTime, "namespace", size)
	}
	s.mu.Lock()
	s.ns[nsid] = n
	s.mu.Unlock()
	t.genCtr.Add(1)
	s.namespaceChanged(nsid)
	return n, nil
}

// RemoveNamespace takes namespace nsid out of the subsystem while hosts may
// be connected: commands naming it fail with Invalid Namespace from then on,
// every controller's registration of its region is revoked (a host still
// holding the rkey gets a remote access error), the commands executing on
// it finish, and then its region is flushed and closed and its backing
// device closed. Its identity stays in the metadata store: the same backing
// added again under the same NSID keeps its NGUID. Connected hosts get a
// Namespace Attribute Changed notice. Namespaces of the pinned baseline
// cannot be removed.
func (s *Subsystem) RemoveNamespace(nsid uint32) error {
	s.mu.Lock()
	n := s.ns[nsid]
	if n == nil {
		s.mu.Unlock()
		return fmt.Errorf("target: subsystem %s: namespace %d does not exist", s.nqn, nsid)
	}
	if n.pinned != nil {
		// Pinned READs are sent straight from the namespace's memory after
		// the lookup (zero copy), so it could not be freed here safely.
		s.mu.Unlock()
		return fmt.Errorf("target: subsystem %s: namespace %d is pinned (baseline mode): it cannot be removed while the target runs", s.nqn, nsid)
	}
	delete(s.ns, nsid)
	s.mu.Unlock()
	n.removed.Store(true)
	s.t.genCtr.Add(1)
	for _, c := range s.t.controllers() {
		if c.sub == s {
			c.revokeRegion(nsid)
		}
	}
	s.namespaceChanged(nsid)
	n.users.Wait()
	err := n.close()
	s.t.log.Info("target: namespace removed", "subsystem", s.nqn, "nsid", nsid, "backing", n.dev.Path(), "err", err)
	return err
}

// NSID is the namespace ID.
func (n *Namespace) NSID() uint32 { return n.nsid }

// Size is the namespace size in bytes.
func (n *Namespace) Size() int64 { return n.store.Size() }

// Blocks is the namespace size in logical blocks.
func (n *Namespace) Blocks() uint64 { return uint64(n.store.Size()) / BlockSize }

// NGUID is the namespace's globally unique identifier.
func (n *Namespace) NGUID() [16]byte { return n.nguid }

// UUID is the namespace's UUID.
func (n *Namespace) UUID() nvme.UUID { return n.uuid }

// Backing names the backing device.
func (n *Namespace) Backing() string { return n.dev.Path() }

// Region is the namespace's memory region (nil in the pinned baseline).
func (n *Namespace) Region() *swap.Region { return n.region }

// Pinned reports whether the namespace is held wholly in pinned memory
// (the pinned baseline, WithPinnedBudget).
func (n *Namespace) Pinned() bool { return n.pinned != nil }

// OneSided reports whether hosts may read the namespace one-sided: false
// only for a namespace of the pinned baseline that did not fit in the
// pinned memory, which is served two-sided from its backing device.
func (n *Namespace) OneSided() bool { return !n.direct }

// register registers the region for remote reads, unpinned (O(1)), for
// the queue pairs carrying tag only.
func (n *Namespace) register(pd *nprdma.PD, tag uint64) (*nprdma.MR, error) {
	if n.direct {
		return nil, fmt.Errorf("namespace %d is served two-sided only", n.nsid)
	}
	if n.pinned != nil {
		// Already locked by the up-front registration: no new faulting.
		return pd.Register(n.pinned.mem, nprdma.AccessRemoteRead, nprdma.WithAccessTag(tag))
	}
	return pd.RegisterUnpinned(n.region, nprdma.AccessRemoteRead, nprdma.WithAccessTag(tag))
}

// close flushes and closes the region, then the backing device. Every
// region MR must be deregistered and the queue pairs closed before.
func (n *Namespace) close() error {
	n.closeOnce.Do(func() {
		err := n.store.Close()
		if n.mirror != nil {
			if merr := n.mirror.close(); err == nil {
				err = merr
			}
		}
		if cerr := n.dev.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			n.closeErr = fmt.Errorf("target: namespace %d of %s: %w", n.nsid, n.sub.nqn, err)
		}
	})
	return n.closeErr
}

// closeReporting closes n as close does; when its data did not all reach
// the backing device it also says which byte ranges may not have: the pages
// still dirty after a failed flush. Close retries that flush, and nothing
// writes to them any more, so the pages it leaves dirty are among these.
func (n *Namespace) closeReporting() ([]ByteRange, error) {
	var dirty []ByteRange
	if n.region != nil {
		if err := n.region.Flush(); err != nil {
			dirty = dirtyRanges(n.region.States())
		}
	}
	if err := n.close(); err != nil {
		return dirty, err
	}
	return nil, nil
}

// dirtyRanges coalesces the dirty pages of a region's states into byte
// ranges.
func dirtyRanges(states []uint64) []ByteRange {
	var out []ByteRange
	for p := range states {
		if atomic.LoadUint64(&states[p])&swap.StateDirty == 0 {
			continue
		}
		off := int64(p) * swap.PageSize
		if k := len(out) - 1; k >= 0 && out[k].Off+out[k].Len == off {
			out[k].Len += swap.PageSize
			continue
		}
		out = append(out, ByteRange{Off: off, Len: swap.PageSize})
	}
	return out
}

// Flush makes every completed write to the namespace durable.
func (n *Namespace) Flush() error { return n.store.Flush() }
