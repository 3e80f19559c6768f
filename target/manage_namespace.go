package target

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nvme"
)

// Namespaces created, grown and deleted at run time (manage.go has the
// rules shared with subsystems and hosts).

// NamespaceRequest asks CreateNamespace for a namespace.
type NamespaceRequest struct {
	// Subsystem is the NQN of an existing subsystem.
	Subsystem string
	// Name names the namespace, unique on the target (may be ""):
	// nameRule.
	Name string
	// NSID is the namespace ID; 0 takes the next free one.
	NSID uint32
	// Size in bytes, a multiple of 4096. Required for a backing the target
	// creates; for an existing Backing, 0 is its whole size and more than it
	// is refused.
	Size int64
	// Backing is an existing block device or file. "" makes the target
	// create a sparse file of Size in the volume directory (WithVolumeDir),
	// named after the namespace, and remove it with the namespace.
	Backing string
	// Budget is the namespace's DRAM budget in bytes. 0 takes a quarter of
	// Size from what the other namespaces leave of WithMemory, as much as is
	// left if less, at least 64 KiB.
	Budget int64
	// MaxSize is how large the namespace may grow while it is served (0:
	// DefaultMaxSize of Size).
	MaxSize int64
}

// nameRule is what a namespace name may be: it names its backing file too.
var nameRule = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// minBudget is the smallest DRAM budget of a namespace (swap's minimum).
const minBudget = 16 * BlockSize

// CreateNamespace adds a namespace through the management API, recorded
// (managed) and restored at start; connected hosts get a Namespace
// Attribute Changed notice. Nothing else is disturbed. On any refusal
// nothing is changed (a file created for it is removed again).
func (t *Target) CreateNamespace(req NamespaceRequest) (*Namespace, error) {
	t.manageMu.Lock()
	defer t.manageMu.Unlock()
	fail := func(kind error, format string, args ...any) (*Namespace, error) {
		return nil, fmt.Errorf("target: subsystem %s namespace %q: %w%s", req.Subsystem, req.Name, kind, detail(format, args))
	}
	if err := t.refuseChange(); err != nil {
		return fail(err, "")
	}
	s := t.Subsystem(req.Subsystem)
	if s == nil {
		return fail(ErrNotFound, "no such subsystem")
	}
	if req.Name != "" && !nameRule.MatchString(req.Name) {
		return fail(ErrInvalid, "a name is 1 to 128 letters, digits, '.', '_' or '-', not starting with '.', '_' or '-'")
	}
	if req.Size < 0 || req.Size%BlockSize != 0 || req.Budget < 0 || req.MaxSize < 0 || req.MaxSize%BlockSize != 0 {
		return fail(ErrInvalid, "size %d, budget %d and max size %d must be non-negative, size and max size multiples of %d", req.Size, req.Budget, req.MaxSize, BlockSize)
	}
	if req.NSID == nvme.BroadcastNSID {
		return fail(ErrInvalid, "NSID %#x is not usable", req.NSID)
	}
	if req.NSID != 0 && s.Namespace(req.NSID) != nil {
		return fail(ErrExists, "namespace %d exists already", req.NSID)
	}
	if req.Name != "" {
		if n := t.namespaceNamed(req.Name); n != nil {
			return fail(ErrExists, "the name is taken by namespace %d of %s", n.nsid, n.sub.nqn)
		}
	}
	if t.pins != nil {
		return fail(ErrInvalid, "the pinned baseline (--pin) places its namespaces at start only")
	}
	m := &managedNamespace{name: req.Name}
	var dev blockdev.Device
	if req.Backing == "" {
		if t.cfg.manage.volumeDir == "" {
			return fail(ErrInvalid, "no backing given and the target has no volume directory to create one in")
		}
		if req.Size == 0 {
			return fail(ErrInvalid, "a size is required for a backing file the target creates")
		}
		if avail, err := t.availableBytes(); err != nil {
			return fail(err, "volume directory")
		} else if req.Size > avail {
			return fail(ErrNoCapacity, "size %d is beyond the %d bytes the volume directory %s can still hold for new namespaces", req.Size, avail, t.cfg.manage.volumeDir)
		}
		path := filepath.Join(t.cfg.manage.volumeDir, t.volumeFileName(s, req))
		if _, err := os.Lstat(path); err == nil {
			return fail(ErrExists, "backing file %s exists already (not overwritten)", path)
		}
		if err := os.MkdirAll(t.cfg.manage.volumeDir, 0o700); err != nil {
			return fail(err, "volume directory")
		}
		if err := blockdev.Create(path, req.Size); err != nil {
			return fail(err, "")
		}
		d, err := t.openBacking(path)
		if err != nil {
			os.Remove(path)
			return fail(err, "")
		}
		dev, m.ownsFile = d, true
		req.Backing = path
	} else {
		d, err := t.openBacking(req.Backing)
		if err != nil {
			kind := ErrInvalid
			if errors.Is(err, blockdev.ErrInUse) {
				kind = ErrInUse
			}
			return fail(kind, "backing: %v", err)
		}
		if req.Size > d.Size() {
			d.Close()
			return fail(ErrInvalid, "size %d is beyond the %d bytes of backing %s", req.Size, d.Size(), req.Backing)
		}
		dev = d
	}
	size := req.Size
	if size == 0 {
		size = dev.Size() / BlockSize * BlockSize
	}
	undo := func() {
		dev.Close()
		if m.ownsFile {
			os.Remove(req.Backing)
		}
	}
	budget, err := t.budgetFor(size, req.Budget)
	if err != nil {
		undo()
		return fail(err, "")
	}
	m.budget, m.maxSize = budget, req.MaxSize
	if m.maxSize == 0 {
		m.maxSize = DefaultMaxSize(size)
	}
	if m.maxSize < size {
		undo()
		return fail(ErrInvalid, "max size %d is below the size %d", m.maxSize, size)
	}
	n, err := s.AddNamespace(NamespaceConfig{NSID: req.NSID, Backing: dev, Budget: budget, Size: size, MaxSize: m.maxSize, managed: m})
	if err != nil {
		undo()
		return nil, err
	}
	t.log.Info("target: namespace created", "subsystem", s.nqn, "nsid", n.nsid, "name", req.Name, "backing", req.Backing,
		"size", size, "budget", budget, "max_size", m.maxSize)
	return n, nil
}

func (t *Target) openBacking(path string) (blockdev.Device, error) {
	if t.cfg.manage.open != nil {
		return t.cfg.manage.open(path)
	}
	return blockdev.Open(path, blockdev.WithLogger(t.log))
}

// volumeFileName names the backing file of a namespace the target creates:
// its name, or its subsystem and NSID.
func (t *Target) volumeFileName(s *Subsystem, req NamespaceRequest) string {
	if req.Name != "" {
		return req.Name + ".img"
	}
	safe := strings.Map(func(r rune) rune {
		if r < 0x80 && (r == '.' || r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return r
		}
		return '_'
	}, s.nqn)
	id := req.NSID
	if id == 0 {
		id = s.nextFreeNSID()
	}
	return fmt.Sprintf("%s-%d.img", safe, id)
}

func (s *Subsystem) nextFreeNSID() uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := uint32(1)
	for s.ns[id] != nil {
		id++
	}
	return id
}

// namespaceNamed finds the namespace called name, on any subsystem.
func (t *Target) namespaceNamed(name string) *Namespace {
	for _, s := range t.Subsystems() {
		for _, n := range s.Namespaces() {
			if n.Name() == name {
				return n
			}
		}
	}
	return nil
}

// budgetFor is the DRAM budget of a new namespace of size bytes: asked, or
// a quarter of size; at most what the namespaces served leave of the
// target's memory (WithMemory), at least minBudget.
func (t *Target) budgetFor(size, asked int64) (int64, error) {
	want := asked
	if want == 0 {
		want = size / 4
	}
	want = max(want/BlockSize*BlockSize, minBudget)
	memory := t.cfg.manage.memory
	if memory == 0 {
		return want, nil
	}
	free := memory - t.budgeted()
	switch {
	case asked > 0 && want > free:
		return 0, fmt.Errorf("%w: a budget of %d bytes asked, %d of the target's memory (%d) left", ErrNoCapacity, want, free, memory)
	case free < minBudget:
		return 0, fmt.Errorf("%w: %d bytes of the target's memory (%d) left for a DRAM budget, at least %d needed", ErrNoCapacity, max(free, 0), memory, minBudget)
	}
	return min(want, free/BlockSize*BlockSize), nil
}

// budgeted is the DRAM the namespaces served hold.
func (t *Target) budgeted() int64 {
	var sum int64
	for _, s := range t.Subsystems() {
		for _, n := range s.Namespaces() {
			sum += n.budget()
		}
	}
	return sum
}

// volumeSpace is the volume directory's file system: its size and the
// bytes still free to an unprivileged writer.
func (t *Target) volumeSpace() (size, free int64, err error) {
	dir := t.cfg.manage.volumeDir
	for dir != "" {
		var st syscall.Statfs_t
		err = syscall.Statfs(dir, &st)
		if err == nil {
			return int64(st.Blocks) * st.Bsize, int64(st.Bavail) * st.Bsize, nil
		}
		if !errors.Is(err, os.ErrNotExist) || filepath.Dir(dir) == dir {
			return 0, 0, err
		}
		dir = filepath.Dir(dir) // not made yet: its parent's file system
	}
	return 0, 0, nil
}

// availableBytes is what new namespaces and the growth of the files the
// target created may still take of the volume directory: its free space
// less what those files, sparse, may still claim as they are written. So a
// file the target created can always be written whole.
func (t *Target) availableBytes() (int64, error) {
	_, free, err := t.volumeSpace()
	if err != nil {
		return 0, err
	}
	for _, s := range t.Subsystems() {
		for _, n := range s.Namespaces() {
			if n.managed != nil && n.managed.ownsFile {
				free -= max(n.Size()-allocatedBytes(n.Backing()), 0)
			}
		}
	}
	return max(free, 0), nil
}

// allocatedBytes is what a file takes on its file system (a block device:
// 0, it is not in the volume directory).
func allocatedBytes(path string) int64 {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return 0
	}
	return st.Blocks * 512
}

// ResizeNamespace grows namespace nsid of subsystem nqn to size bytes while
// it is served: the record first, then the backing (a file the target
// created is extended; a device must have grown already, else ErrInvalid),
// then the region. Hosts connected get a Namespace Attribute Changed notice
// and see the new size in Identify Namespace; their registrations of the
// region keep working for the old range, and the next region descriptor
// they ask for covers the new one. The same size again succeeds and changes
// nothing; a smaller one is refused (ErrInvalid), as is one beyond the
// region's reservation (MaxSize: until a restart) or, for a file the target
// created, beyond the volume directory's capacity (ErrNoCapacity).
func (t *Target) ResizeNamespace(nqn string, nsid uint32, size int64) (*Namespace, error) {
	t.manageMu.Lock()
	defer t.manageMu.Unlock()
	fail := func(kind error, format string, args ...any) (*Namespace, error) {
		return nil, fmt.Errorf("target: subsystem %s namespace %d: %w%s", nqn, nsid, kind, detail(format, args))
	}
	if err := t.refuseChange(); err != nil {
		return fail(err, "")
	}
	s := t.Subsystem(nqn)
	if s == nil {
		return fail(ErrNotFound, "no such subsystem")
	}
	n := s.Namespace(nsid)
	switch {
	case n == nil:
		return fail(ErrNotFound, "no such namespace")
	case n.region == nil:
		return fail(ErrInvalid, "a namespace of the pinned baseline (--pin) cannot be resized")
	case size <= 0 || size%BlockSize != 0:
		return fail(ErrInvalid, "size %d is not a positive multiple of %d", size, BlockSize)
	case size < n.Size():
		return fail(ErrInvalid, "size %d is below the namespace's %d bytes: namespaces only grow", size, n.Size())
	case size == n.Size():
		return n, nil
	case size > n.region.MaxSize():
		return fail(ErrInvalid, "size %d is beyond the %d bytes the namespace may grow to while it is served (its max size; a restart reserves more)", size, n.region.MaxSize())
	}
	if n.managed != nil && n.managed.ownsFile {
		avail, err := t.availableBytes()
		if err != nil {
			return fail(err, "volume directory")
		}
		if grow := size - n.Size(); grow > avail {
			return fail(ErrNoCapacity, "growing by %d bytes is beyond the %d bytes the volume directory can still hold", grow, avail)
		}
	} else if isBlockDevice(n.dev) {
		// Only read its size again: the device itself must have grown.
		if err := blockdev.Grow(n.dev, n.dev.Size()); err != nil || n.dev.Size() < size {
			return fail(ErrInvalid, "size %d is beyond the %d bytes of block device %s: grow the device first (%v)", size, n.dev.Size(), n.Backing(), err)
		}
	}
	old := n.Size()
	if t.meta != nil {
		if err := n.rerecord(size); err != nil {
			return fail(err, "")
		}
	}
	err := blockdev.Grow(n.dev, size)
	if err == nil {
		err = n.region.Grow(size)
	}
	if err != nil {
		if t.meta != nil {
			if rerr := n.rerecord(old); rerr != nil {
				t.log.Error("target: a failed resize left its record at the new size", "subsystem", nqn, "nsid", nsid, "size", size, "err", rerr)
			}
		}
		return fail(ErrInvalid, "%v", err)
	}
	for _, c := range s.connected("") {
		c.retireRegion(nsid)
	}
	s.namespaceChanged(nsid)
	t.log.Info("target: namespace resized", "subsystem", nqn, "nsid", nsid, "from", old, "to", size)
	return n, nil
}

// isBlockDevice reports whether a backing is a block device (not a file).
func isBlockDevice(dev blockdev.Device) bool {
	for dev != nil {
		if f, ok := dev.(*blockdev.File); ok {
			return f.IsBlockDevice()
		}
		w, ok := dev.(blockdev.Wrapper)
		if !ok {
			return false
		}
		dev = w.Unwrap()
	}
	return false
}

// rerecord writes the namespace's record with its size set to size: its
// identity stays bound to the backing at that size (AddNamespace).
func (n *Namespace) rerecord(size int64) error {
	m := n.sub.t.meta
	rec, ok, err := m.namespace(n.sub.nqn, n.nsid, n.managed != nil)
	if err != nil {
		return err
	}
	if !ok {
		rec = namespaceRecord{SubNQN: n.sub.nqn, NSID: n.nsid, Backing: n.Backing(), NGUID: n.nguid, UUID: n.uuid, Created: n.created}
		n.managed.fill(&rec)
	}
	rec.Size = size
	return m.putNamespace(rec)
}

// retireRegion makes the controller's next region descriptor of nsid a new
// registration, which covers the namespace's size now; the one before keeps
// serving its range until the controller or the namespace goes.
func (c *controller) retireRegion(nsid uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	mr := c.mrs[nsid]
	if mr == nil {
		return
	}
	delete(c.mrs, nsid)
	if c.retired == nil {
		c.retired = map[uint32][]*nprdma.MR{}
	}
	c.retired[nsid] = append(c.retired[nsid], mr)
}

// takeRegionsLocked empties the controller's registrations, current and
// retired, and returns them to be deregistered. The caller holds c.mu.
func (c *controller) takeRegionsLocked() []*nprdma.MR {
	var out []*nprdma.MR
	for _, mr := range c.mrs {
		out = append(out, mr)
	}
	for _, mrs := range c.retired {
		out = append(out, mrs...)
	}
	c.mrs, c.retired = map[uint32]*nprdma.MR{}, nil
	return out
}

// DeleteNamespace removes a namespace created through the management API:
// its record first, then the namespace as RemoveNamespace does (its region
// registrations revoked at once, commands naming it failing with Invalid
// Namespace, those executing finished, flushed and closed), then its backing
// file if the target created it. Hosts connected to the subsystem are
// refused (ErrInUse, naming them) unless force, which fences them off the
// namespace that way and leaves them connected to the rest; they get a
// Namespace Attribute Changed notice.
func (t *Target) DeleteNamespace(nqn string, nsid uint32, force bool) error {
	t.manageMu.Lock()
	defer t.manageMu.Unlock()
	if err := t.refuseChange(); err != nil {
		return fmt.Errorf("target: deleting namespace %d of %s: %w", nsid, nqn, err)
	}
	s := t.Subsystem(nqn)
	if s == nil {
		return fmt.Errorf("target: subsystem %s %w", nqn, ErrNotFound)
	}
	n := s.Namespace(nsid)
	switch {
	case n == nil:
		return fmt.Errorf("target: subsystem %s: namespace %d %w", nqn, nsid, ErrNotFound)
	case n.managed == nil:
		return fmt.Errorf("target: subsystem %s: namespace %d is %w (flags or config file): remove it there", nqn, nsid, ErrConfigured)
	}
	if ctrls := s.connected(""); len(ctrls) > 0 && !force {
		return fmt.Errorf("target: subsystem %s: namespace %d %w: %s connected to its subsystem; disconnect them first, or force", nqn, nsid, ErrInUse, describe(ctrls))
	}
	if t.meta != nil {
		if err := t.meta.deleteRecord(namespaceKey(nqn, nsid, true)); err != nil {
			return fmt.Errorf("target: deleting namespace %d of %s: %w", nsid, nqn, err)
		}
	}
	err := s.RemoveNamespace(nsid)
	if n.managed.ownsFile {
		if rerr := os.Remove(n.Backing()); rerr != nil && err == nil {
			err = fmt.Errorf("target: namespace %d of %s deleted, its backing file not: %w", nsid, nqn, rerr)
		}
	}
	return err
}
