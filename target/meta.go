package target

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/nprdma/nprdma/target/manage"
	"golang.org/x/sys/unix"
)

// metaStore keeps the target's durable metadata in badger under --data-dir:
// subsystem and namespace identity, host access lists and a clean-shutdown
// marker. It never holds page data: badger's value log reclaims space poorly
// under 4 KiB overwrites, and the backing device is the data's home anyway.
//
// Badger does not notice a directory that went away or turned read-only
// when it is written: with the directory removed its writes land in
// unlinked files and succeed, and a write that fails (read-only) has
// entered its memtable all the same; either way its memtable flush, and so
// its Close, then retries forever. So every write is preceded by a probe of
// the directory, the first failure latches the store as failed (logged
// once, counted, reported by Health), and a failed store is never written
// nor closed again: its files are left to process exit.
type metaStore struct {
	db         *badger.DB
	dir        string
	dirInfo    fs.FileInfo // the directory as opened: a replaced one is not it
	log        *slog.Logger
	probeEvery time.Duration
	stop       chan struct{}
	done       chan struct{}

	mu      sync.Mutex // orders writes, probes, the failure latch and close
	closed  bool       // guarded by mu
	failure atomic.Pointer[MetadataError]
	// writeErrors counts the writes that failed or were refused because
	// the store had failed, the probe that failed included; recorded and
	// recordsRefused the subsystem and namespace records (host lists,
	// identities) written and refused since the store was opened.
	writeErrors    atomic.Uint64
	recorded       atomic.Uint64
	recordsRefused atomic.Uint64
}

// ErrMetadataStore is what errors.Is finds in the error of an operation
// refused because the metadata store has failed.
var ErrMetadataStore = manage.ErrMetadataStore

// MetadataError says why and since when the metadata store is failed.
type MetadataError struct {
	Dir string
	At  time.Time
	// Removed: the directory is gone from its path, or another one is in
	// its place; the records it held are gone with it.
	Removed bool
	Err     error
}

func (e *MetadataError) Error() string {
	what := "failed"
	if e.Removed {
		what = "was removed or replaced"
	}
	return fmt.Sprintf("metadata store %s %s at %s: %v", e.Dir, what, e.At.Format(time.RFC3339), e.Err)
}

func (e *MetadataError) Unwrap() error { return e.Err }

// Is makes every MetadataError match ErrMetadataStore.
func (e *MetadataError) Is(target error) bool { return target == ErrMetadataStore }

// subsystemRecord is what survives a restart of a subsystem.
type subsystemRecord struct {
	NQN    string   `json:"nqn"`
	Serial string   `json:"serial"`
	Hosts  []string `json:"hosts,omitempty"`
	// HostKeys names the DH-HMAC-CHAP key file of each host added through
	// the management API with one (host NQN to path; never the secret),
	// HostCtrlKeys the controller's key file of those given one too.
	HostKeys     map[string]string `json:"host_keys,omitempty"`
	HostCtrlKeys map[string]string `json:"host_ctrl_keys,omitempty"`
	AllowAnyHost bool              `json:"allow_any_host"`
	Created      time.Time         `json:"created"`
	// Managed: created through the management API (kept under
	// managedPrefix); restored at start unless the configuration names it.
	Managed bool `json:"managed,omitempty"`
}

// namespaceRecord is a namespace's identity. It is keyed by subsystem and
// NSID and bound to its backing path and size: a different backing under the
// same NSID is a different namespace and gets a new identity.
type namespaceRecord struct {
	SubNQN  string    `json:"subnqn"`
	NSID    uint32    `json:"nsid"`
	Backing string    `json:"backing"`
	Size    int64     `json:"size"`
	NGUID   [16]byte  `json:"nguid"`
	UUID    [16]byte  `json:"uuid"`
	Created time.Time `json:"created"`
	// Set for a namespace created through the management API, which is
	// restored at start from this record (manage.go).
	Managed  bool   `json:"managed,omitempty"`
	Name     string `json:"name,omitempty"`
	Budget   int64  `json:"budget,omitempty"`
	MaxSize  int64  `json:"max_size,omitempty"`
	OwnsFile bool   `json:"owns_file,omitempty"` // the target created the backing file, and removes it with the namespace
}

const (
	keyCleanShutdown = "state/clean-shutdown"
	keyUncleanStarts = "state/unclean-starts"
	valueLogGCEvery  = 10 * time.Minute
	// probeFile is rewritten and synced before every write and on the
	// probe timer: creating it fails in a removed directory, opening it for
	// writing on a read-only file system, syncing it on a failing disk.
	probeFile = "nprdma-probe"
)

// Records of subsystems and namespaces the management API created live
// apart from the configuration's, under managedPrefix: the configuration
// may take an NQN or an NSID for a while without overwriting them.
const managedPrefix = "api/"

func subsystemKey(nqn string, managed bool) []byte {
	return []byte(keyPrefix(managed) + "subsys/" + nqn)
}

func namespaceKey(nqn string, nsid uint32, managed bool) []byte {
	return []byte(fmt.Sprintf("%sns/%s/%08x", keyPrefix(managed), nqn, nsid))
}

func keyPrefix(managed bool) string {
	if managed {
		return managedPrefix
	}
	return ""
}

// openMeta opens (creating if needed) the metadata store in dir with small,
// bounded caches: the store holds kilobytes, not gigabytes. The directory
// is probed every probeEvery (never when 0) as well as before every write.
func openMeta(dir string, probeEvery time.Duration, log *slog.Logger) (*metaStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir %s: %w", dir, err)
	}
	info, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("data dir %s: %w", dir, err)
	}
	opts := badger.DefaultOptions(dir).
		WithLogger(nil).
		WithSyncWrites(true).
		WithNumVersionsToKeep(1).
		WithMemTableSize(4 << 20).
		WithValueThreshold(64 << 10).
		WithBlockCacheSize(4 << 20).
		WithIndexCacheSize(2 << 20).
		WithValueLogFileSize(16 << 20).
		WithNumCompactors(2).
		WithNumMemtables(2).
		WithNumLevelZeroTables(2).
		WithNumLevelZeroTablesStall(4)
	db, err := badger.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("metadata store in %s: %w", dir, err)
	}
	m := &metaStore{db: db, dir: dir, dirInfo: info, log: log, probeEvery: probeEvery,
		stop: make(chan struct{}), done: make(chan struct{})}
	go m.loop()
	return m, nil
}

// loop probes the directory on its timer, so that a failure shows while
// nothing is written, and runs badger's value-log GC until it has nothing
// to rewrite on another: badger never collects on its own.
func (m *metaStore) loop() {
	defer close(m.done)
	gc := time.NewTicker(valueLogGCEvery)
	defer gc.Stop()
	var probe <-chan time.Time
	if m.probeEvery > 0 {
		t := time.NewTicker(m.probeEvery)
		defer t.Stop()
		probe = t.C
	}
	for {
		select {
		case <-m.stop:
			return
		case <-probe:
			m.mu.Lock()
			m.healthy()
			m.mu.Unlock()
		case <-gc.C:
			m.mu.Lock()
			if m.healthy() {
				for m.db.RunValueLogGC(0.5) == nil {
				}
			}
			m.mu.Unlock()
		}
	}
}

// probe rewrites and syncs the probe file, and checks that the store's
// path still names the directory it opened.
func (m *metaStore) probe() error {
	info, err := os.Stat(m.dir)
	if err != nil {
		return &MetadataError{Removed: errors.Is(err, fs.ErrNotExist), Err: err}
	}
	if !os.SameFile(info, m.dirInfo) {
		return &MetadataError{Removed: true, Err: fmt.Errorf("%s is another directory than the store opened", m.dir)}
	}
	f, err := os.OpenFile(filepath.Join(m.dir, probeFile), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return &MetadataError{Removed: errors.Is(err, fs.ErrNotExist), Err: err}
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(time.Now().UnixNano()))
	_, err = f.Write(b[:])
	if err == nil {
		err = unix.Fdatasync(int(f.Fd()))
		if err != nil {
			err = &os.PathError{Op: "fdatasync", Path: f.Name(), Err: err}
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return &MetadataError{Err: err}
	}
	return nil
}

// fail latches the store as failed with the probe's or badger's error:
// logged here, once. The caller holds mu.
func (m *metaStore) fail(err error) *MetadataError {
	if f := m.failure.Load(); f != nil {
		return f
	}
	f := &MetadataError{}
	if !errors.As(err, &f) {
		f = &MetadataError{Err: err}
	}
	f.Dir, f.At = m.dir, time.Now()
	m.failure.Store(f)
	m.writeErrors.Add(1)
	m.log.Error("target: metadata store failed: host-list and namespace changes are refused and a clean shutdown cannot be recorded until a restart on a working data directory; block I/O is still served",
		"dir", m.dir, "removed", f.Removed, "err", f.Err)
	return f
}

// failed is the store's failure, or nil while it works.
func (m *metaStore) failed() *MetadataError { return m.failure.Load() }

// refuseRecord is the failure, counted as a refused record, for an
// operation that would record something; nil while the store works.
func (m *metaStore) refuseRecord() error {
	f := m.failure.Load()
	if f == nil {
		return nil
	}
	m.writeErrors.Add(1)
	m.recordsRefused.Add(1)
	return f
}

// healthy probes the directory of a store that is open and has not failed,
// latching a failure. The caller holds mu.
func (m *metaStore) healthy() bool {
	if m.closed || m.failure.Load() != nil {
		return false
	}
	if err := m.probe(); err != nil {
		m.fail(err)
		return false
	}
	return true
}

// writable probes the directory before a write, latching a failure; a
// store that failed before refuses at once. The caller holds mu.
func (m *metaStore) writable() error {
	if m.closed {
		return errors.New("metadata store closed")
	}
	if f := m.failure.Load(); f != nil {
		m.writeErrors.Add(1)
		return f
	}
	if err := m.probe(); err != nil {
		return m.fail(err)
	}
	return nil
}

// check probes the directory for an operation about to record something,
// latching a failure; a store that failed before refuses at once, counted
// as a refused record.
func (m *metaStore) check() error {
	if err := m.refuseRecord(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.writable(); err != nil {
		m.recordsRefused.Add(1)
		return err
	}
	return nil
}

// update runs fn in a badger transaction after probing the directory. A
// failure latches the store: badger may have taken fn's writes into its
// memtable although they failed, so nothing is written after it.
func (m *metaStore) update(fn func(*badger.Txn) error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.writable(); err != nil {
		return err
	}
	if err := m.db.Update(fn); err != nil {
		return m.fail(err)
	}
	return nil
}

func (m *metaStore) get(key []byte, v any) (bool, error) {
	err := m.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(key)
		if err != nil {
			return err
		}
		return item.Value(func(b []byte) error { return json.Unmarshal(b, v) })
	})
	if errors.Is(err, badger.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("metadata %s: %w", key, err)
	}
	return true, nil
}

func (m *metaStore) put(key []byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := m.update(func(txn *badger.Txn) error { return txn.Set(key, b) }); err != nil {
		return fmt.Errorf("metadata %s: %w", key, err)
	}
	return nil
}

// putRecord writes a subsystem or namespace record, counted in recorded.
func (m *metaStore) putRecord(key []byte, v any) error {
	if err := m.put(key, v); err != nil {
		m.recordsRefused.Add(1)
		return err
	}
	m.recorded.Add(1)
	return nil
}

func (m *metaStore) subsystem(nqn string, managed bool) (subsystemRecord, bool, error) {
	var r subsystemRecord
	ok, err := m.get(subsystemKey(nqn, managed), &r)
	return r, ok, err
}

func (m *metaStore) putSubsystem(r subsystemRecord) error {
	return m.putRecord(subsystemKey(r.NQN, r.Managed), r)
}

func (m *metaStore) namespace(nqn string, nsid uint32, managed bool) (namespaceRecord, bool, error) {
	var r namespaceRecord
	ok, err := m.get(namespaceKey(nqn, nsid, managed), &r)
	return r, ok, err
}

func (m *metaStore) putNamespace(r namespaceRecord) error {
	return m.putRecord(namespaceKey(r.SubNQN, r.NSID, r.Managed), r)
}

// deleteRecord removes a subsystem or namespace record, counted as a
// record written.
func (m *metaStore) deleteRecord(key []byte) error {
	if err := m.update(func(txn *badger.Txn) error { return txn.Delete(key) }); err != nil {
		m.recordsRefused.Add(1)
		return fmt.Errorf("metadata %s: %w", key, err)
	}
	m.recorded.Add(1)
	return nil
}

// records decodes every record whose key starts with prefix, in key order,
// into a new T each.
func records[T any](m *metaStore, prefix string) ([]T, error) {
	var out []T
	err := m.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefix), PrefetchValues: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			var v T
			if err := it.Item().Value(func(b []byte) error { return json.Unmarshal(b, &v) }); err != nil {
				return fmt.Errorf("metadata %s: %w", it.Item().Key(), err)
			}
			out = append(out, v)
		}
		return nil
	})
	return out, err
}

// managedSubsystems and managedNamespaces are the records of what the
// management API created.
func (m *metaStore) managedSubsystems() ([]subsystemRecord, error) {
	return records[subsystemRecord](m, managedPrefix+"subsys/")
}

func (m *metaStore) managedNamespaces() ([]namespaceRecord, error) {
	return records[namespaceRecord](m, managedPrefix+"ns/")
}

// markRunning removes the clean-shutdown marker and reports how the
// previous run ended: cleanly if it left the marker, not at all if the store
// is empty (nothing was ever recorded, so no run served), else uncleanly. It
// also returns how many starts followed an unclean run, this one included,
// over the life of the store (hosts compare it across reconnects: see
// nvme.NPInstance).
func (m *metaStore) markRunning() (PreviousRun, uint64, error) {
	var at time.Time
	clean, err := m.get([]byte(keyCleanShutdown), &at)
	if err != nil {
		return PreviousRunUnknown, 0, err
	}
	var unclean uint64
	if _, err := m.get([]byte(keyUncleanStarts), &unclean); err != nil {
		return PreviousRunUnknown, 0, err
	}
	empty := false
	if err := m.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{})
		defer it.Close()
		it.Rewind()
		empty = !it.Valid()
		return nil
	}); err != nil {
		return PreviousRunUnknown, 0, err
	}
	prev := PreviousRunUnclean
	switch {
	case clean:
		prev = PreviousRunClean
	case empty:
		prev = PreviousRunNone
	default:
		unclean++
	}
	b, err := json.Marshal(unclean)
	if err != nil {
		return PreviousRunUnknown, 0, err
	}
	err = m.update(func(txn *badger.Txn) error {
		if prev == PreviousRunUnclean {
			if err := txn.Set([]byte(keyUncleanStarts), b); err != nil {
				return err
			}
		}
		return txn.Delete([]byte(keyCleanShutdown))
	})
	if err != nil {
		return PreviousRunUnknown, 0, fmt.Errorf("metadata: recording the start: %w", err)
	}
	return prev, unclean, nil
}

// markClean records a clean shutdown: every dirty page was flushed.
func (m *metaStore) markClean() error { return m.put([]byte(keyCleanShutdown), time.Now().UTC()) }

// close stops the loop and closes badger. A failed store is not closed:
// badger's Close would flush its memtable into the failed directory and
// retry that forever. Its files and goroutines are left to process exit,
// and the error says so.
func (m *metaStore) close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	close(m.stop)
	<-m.done
	if m.failed() != nil {
		return errors.New("not closed, left to process exit (badger would retry flushing its memtable into the failed directory forever)")
	}
	return m.db.Close()
}
