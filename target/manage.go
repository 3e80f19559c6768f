package target

import (
	"fmt"
	"sort"
	"strings"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/target/manage"
)

// Management at run time: subsystems, hosts and namespaces created, grown and
// deleted while the target serves, each change recorded in the metadata store
// before it takes effect, so that a failed store refuses it and changes
// nothing, and a restart (RestoreManaged, manage_restore.go) serves the
// same. Namespaces are in manage_namespace.go. docs/target.md §11 has the
// rules: which of the configuration and the API wins, the DRAM budget of a
// new namespace, the capacity of the volume directory.

// Errors of the management operations, found with errors.Is (the kinds of
// package manage, which the management API carries to its clients). A
// refusal because the metadata store failed wraps ErrMetadataStore.
var (
	ErrExists     = manage.ErrExists
	ErrNotFound   = manage.ErrNotFound
	ErrInUse      = manage.ErrInUse
	ErrNoCapacity = manage.ErrNoCapacity
	ErrInvalid    = manage.ErrInvalid
	// ErrConfigured: the object comes from the target's configuration
	// (flags or config file), which would bring it back at the next start:
	// change it there.
	ErrConfigured = manage.ErrConfigured
)

// DefaultVolumeGrowth and DefaultVolumeReserve make DefaultMaxSize.
const (
	DefaultVolumeGrowth  = 4
	DefaultVolumeReserve = 64 << 30
	// maxRegionSize is the largest region swap makes: 2^32-1 pages.
	maxRegionSize = (1<<32 - 1) * BlockSize
)

// DefaultMaxSize is how large a namespace of size bytes may grow while it is
// served when nothing else is said: DefaultVolumeGrowth times its size, at
// least DefaultVolumeReserve. It costs address space only (a NORESERVE
// mapping and its page state table): 128 TiB of it per process on x86-64.
// Beyond it a resize is refused until a restart, which reserves anew.
func DefaultMaxSize(size int64) int64 {
	return min(max(DefaultVolumeGrowth*size, DefaultVolumeReserve, size), maxRegionSize)
}

// manageConfig is the target's configuration for the management operations.
type manageConfig struct {
	memory    int64
	volumeDir string
	open      func(path string) (blockdev.Device, error)
}

// WithMemory is the DRAM budget of all namespaces together (default 0: not
// accounted, and a namespace created at run time without a budget gets
// swap's default, a quarter of its size). A namespace created at run time
// draws its budget from what the others leave (NamespaceRequest.Budget).
func WithMemory(bytes int64) Option { return func(c *config) { c.manage.memory = bytes } }

// WithVolumeDir is where CreateNamespace creates the backing files of
// namespaces that name none (default "": such a request is refused).
func WithVolumeDir(dir string) Option { return func(c *config) { c.manage.volumeDir = dir } }

// WithBackingOpener opens the backing of a namespace that CreateNamespace
// or RestoreManaged adds (default blockdev.Open with the target's logger).
func WithBackingOpener(open func(path string) (blockdev.Device, error)) Option {
	return func(c *config) { c.manage.open = open }
}

// managedNamespace is what a namespace created through the management API
// carries beyond the configuration's.
type managedNamespace struct {
	name     string
	budget   int64
	maxSize  int64
	ownsFile bool
}

func (m *managedNamespace) fill(rec *namespaceRecord) {
	if m == nil {
		return
	}
	rec.Managed, rec.Name, rec.Budget, rec.MaxSize, rec.OwnsFile = true, m.name, m.budget, m.maxSize, m.ownsFile
}

// Name is the namespace's name (NamespaceRequest.Name), or "".
func (n *Namespace) Name() string {
	if n.managed == nil {
		return ""
	}
	return n.managed.name
}

// Managed reports whether the namespace was created through the management
// API (CreateNamespace) rather than by the configuration.
func (n *Namespace) Managed() bool { return n.managed != nil }

// Managed reports whether the subsystem was created through the management
// API (CreateSubsystem) rather than by the configuration.
func (s *Subsystem) Managed() bool { return s.managed }

// budget is the DRAM the namespace holds of the target's memory.
func (n *Namespace) budget() int64 {
	if n.region == nil {
		return 0
	}
	return int64(n.region.Budget()) * BlockSize
}

// refuseChange fails a change, before anything is touched, when the
// metadata store has failed or its directory fails the probe now.
func (t *Target) refuseChange() error {
	if t.meta == nil {
		return nil
	}
	return t.meta.check()
}

// CreateSubsystem adds a subsystem through the management API: recorded
// (managed) and restored at start. An NQN in use is ErrExists.
func (t *Target) CreateSubsystem(cfg SubsystemConfig) (*Subsystem, error) {
	t.manageMu.Lock()
	defer t.manageMu.Unlock()
	if err := t.refuseChange(); err != nil {
		return nil, fmt.Errorf("target: subsystem %s: %w", cfg.NQN, err)
	}
	if t.Subsystem(cfg.NQN) != nil {
		return nil, fmt.Errorf("target: subsystem %s %w", cfg.NQN, ErrExists)
	}
	if cfg.AllowAnyHost && len(cfg.AllowHosts) > 0 {
		return nil, fmt.Errorf("target: subsystem %s: %w: allowed hosts and allow-any-host exclude each other", cfg.NQN, ErrInvalid)
	}
	if err := nvme.ValidateNQN(cfg.NQN); err != nil || cfg.NQN == nvme.DiscoveryNQN {
		return nil, fmt.Errorf("target: subsystem %q: %w: %v", cfg.NQN, ErrInvalid, errOr(err, "the discovery NQN is reserved"))
	}
	cfg.managed = true
	s, err := t.AddSubsystem(cfg)
	if err != nil {
		return nil, err
	}
	t.log.Info("target: subsystem created", "subsystem", cfg.NQN, "hosts", cfg.AllowHosts, "allow_any_host", cfg.AllowAnyHost)
	return s, nil
}

// detail is ": " and the formatted text, or nothing when there is none.
func detail(format string, args []any) string {
	if format == "" {
		return ""
	}
	return ": " + fmt.Sprintf(format, args...)
}

func errOr(err error, s string) string {
	if err != nil {
		return err.Error()
	}
	return s
}

// DeleteSubsystem removes a subsystem created through the management API.
// It must have no namespaces left (ErrInUse). Hosts connected to it are
// refused (ErrInUse, naming them) unless force, which disconnects them.
func (t *Target) DeleteSubsystem(nqn string, force bool) error {
	t.manageMu.Lock()
	defer t.manageMu.Unlock()
	if err := t.refuseChange(); err != nil {
		return fmt.Errorf("target: deleting subsystem %s: %w", nqn, err)
	}
	s := t.Subsystem(nqn)
	switch {
	case s == nil:
		return fmt.Errorf("target: subsystem %s %w", nqn, ErrNotFound)
	case !s.managed:
		return fmt.Errorf("target: subsystem %s is %w (flags or config file): remove it there", nqn, ErrConfigured)
	case len(s.Namespaces()) > 0:
		return fmt.Errorf("target: subsystem %s %w: it has %d namespaces; delete them first", nqn, ErrInUse, len(s.Namespaces()))
	}
	ctrls := s.connected("")
	if len(ctrls) > 0 && !force {
		return fmt.Errorf("target: subsystem %s %w: %s connected; disconnect them first, or force", nqn, ErrInUse, describe(ctrls))
	}
	if t.meta != nil {
		if err := t.meta.deleteRecord(subsystemKey(nqn, true)); err != nil {
			return fmt.Errorf("target: deleting subsystem %s: %w", nqn, err)
		}
	}
	t.mu.Lock()
	delete(t.subs, nqn)
	t.mu.Unlock()
	t.genCtr.Add(1)
	for _, c := range ctrls {
		c.teardown("its subsystem was deleted")
	}
	t.log.Info("target: subsystem deleted", "subsystem", nqn, "disconnected", len(ctrls))
	return nil
}

// connected lists the live controllers of the subsystem, of host only
// unless host is "".
func (s *Subsystem) connected(host string) []*controller {
	var out []*controller
	for _, c := range s.t.controllers() {
		c.mu.Lock()
		live := !c.gone
		c.mu.Unlock()
		if c.sub == s && live && (host == "" || c.hostNQN == host) {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

func describe(ctrls []*controller) string {
	var parts []string
	for _, c := range ctrls {
		parts = append(parts, fmt.Sprintf("host %s (controller %d)", c.hostNQN, c.id))
	}
	return strings.Join(parts, ", ")
}

// HostConfig is a host added to a subsystem's allow-list.
type HostConfig struct {
	// NQN is the host's NQN.
	NQN string
	// DHCHAPKeyFile names a file holding the host's DH-HMAC-CHAP secret
	// (default "": none): the host must then authenticate on every queue
	// with it. An absolute path the target reads (owner-only, as for
	// --dhchap-secret-file), recorded with the host; the secret itself is
	// never recorded. A host the configuration gives a secret is refused
	// one here (ErrConfigured).
	DHCHAPKeyFile string
	// DHCHAPCtrlKeyFile names a file holding the controller's secret for
	// the host (default "": none), with which the target proves itself
	// when the host asks (bidirectional authentication); without it a host
	// that asks fails to authenticate. It needs DHCHAPKeyFile (ErrInvalid
	// without), and follows the same rules.
	DHCHAPCtrlKeyFile string
}

// AddHost allows a host on a subsystem, recorded before it takes effect.
// Allowing a host allowed already succeeds and changes nothing, unless it
// names other key files, which replace the host's.
func (t *Target) AddHost(nqn string, h HostConfig) error {
	t.manageMu.Lock()
	defer t.manageMu.Unlock()
	if err := t.refuseChange(); err != nil {
		return fmt.Errorf("target: subsystem %s: allowing host %s: %w", nqn, h.NQN, err)
	}
	s := t.Subsystem(nqn)
	if s == nil {
		return fmt.Errorf("target: subsystem %s %w", nqn, ErrNotFound)
	}
	if err := nvme.ValidateNQN(h.NQN); err != nil {
		return fmt.Errorf("target: subsystem %s: host %q: %w: %v", nqn, h.NQN, ErrInvalid, err)
	}
	if h.DHCHAPCtrlKeyFile != "" && h.DHCHAPKeyFile == "" {
		return fmt.Errorf("target: subsystem %s: host %s: %w: a DH-HMAC-CHAP controller key file needs the host's key file too (the host authenticates first)",
			nqn, h.NQN, ErrInvalid)
	}
	var key *hostKey
	if h.DHCHAPKeyFile != "" {
		if t.cfg.keyring != nil {
			if _, ok := t.cfg.keyring.DHCHAP(nqn, h.NQN); ok {
				return fmt.Errorf("target: subsystem %s: host %s has a DH-HMAC-CHAP secret in the target's configuration (%w): change it there", nqn, h.NQN, ErrConfigured)
			}
		}
		k, err := readHostKey(keyFiles{host: h.DHCHAPKeyFile, ctrl: h.DHCHAPCtrlKeyFile})
		if err != nil {
			return fmt.Errorf("target: subsystem %s: host %s: %w: DH-HMAC-CHAP %v", nqn, h.NQN, ErrInvalid, err)
		}
		key = k
	}
	if err := s.allowHost(h.NQN, key); err != nil {
		return err
	}
	t.log.Info("target: host allowed", "subsystem", nqn, "host", h.NQN, "dhchap", key != nil, "dhchap_ctrl", key != nil && key.ctrl != nil)
	return nil
}

// RemoveHost takes a host off a subsystem's allow-list (recorded first) and
// disconnects its controllers on the subsystem: their queues are fenced and
// their region registrations revoked, so nothing it held keeps working. A
// host not on the list is ErrNotFound; one the configuration allows is
// ErrConfigured.
func (t *Target) RemoveHost(nqn, host string) error {
	t.manageMu.Lock()
	defer t.manageMu.Unlock()
	if err := t.refuseChange(); err != nil {
		return fmt.Errorf("target: subsystem %s: removing host %s: %w", nqn, host, err)
	}
	s := t.Subsystem(nqn)
	if s == nil {
		return fmt.Errorf("target: subsystem %s %w", nqn, ErrNotFound)
	}
	if s.configHosts[host] {
		return fmt.Errorf("target: subsystem %s: host %s is allowed by the target's configuration (%w: --allow-host or the config file): remove it there", nqn, host, ErrConfigured)
	}
	s.recordMu.Lock()
	s.mu.Lock()
	listed, keys := s.hosts[host], s.keyFilesLocked()
	s.mu.Unlock()
	if !listed {
		s.recordMu.Unlock()
		return fmt.Errorf("target: subsystem %s: host %s %w on its allow-list", nqn, host, ErrNotFound)
	}
	var rest []string
	for _, h := range s.Hosts() {
		if h != host {
			rest = append(rest, h)
		}
	}
	if err := s.record(rest, withKey(keys, host, nil)); err != nil {
		s.recordMu.Unlock()
		return fmt.Errorf("target: subsystem %s: removing host %s: %w", nqn, host, err)
	}
	s.mu.Lock()
	delete(s.hosts, host)
	delete(s.keys, host)
	s.mu.Unlock()
	s.recordMu.Unlock()
	t.genCtr.Add(1)
	ctrls := s.connected(host)
	for _, c := range ctrls {
		c.teardown("its host was removed from the subsystem")
	}
	t.log.Info("target: host removed", "subsystem", nqn, "host", host, "disconnected", len(ctrls))
	return nil
}
