package target

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// metaStore keeps the target's durable metadata in badger under --data-dir:
// subsystem and namespace identity, host access lists and a clean-shutdown
// marker. It never holds page data: badger's value log reclaims space poorly
// under 4 KiB overwrites, and the backing device is the data's home anyway.
type metaStore struct {
	db   *badger.DB
	log  *slog.Logger
	stop chan struct{}
	done chan struct{}
}

// subsystemRecord is what survives a restart of a subsystem.
type subsystemRecord struct {
	NQN          string    `json:"nqn"`
	Serial       string    `json:"serial"`
	Hosts        []string  `json:"hosts,omitempty"`
	AllowAnyHost bool      `json:"allow_any_host"`
	Created      time.Time `json:"created"`
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
}

const (
	keyCleanShutdown = "state/clean-shutdown"
	keyUncleanStarts = "state/unclean-starts"
	valueLogGCEvery  = 10 * time.Minute
)

func subsystemKey(nqn string) []byte { return []byte("subsys/" + nqn) }
func namespaceKey(nqn string, nsid uint32) []byte {
	return []byte(fmt.Sprintf("ns/%s/%08x", nqn, nsid))
}

// openMeta opens (creating if needed) the metadata store in dir with small,
// bounded caches: the store holds kilobytes, not gigabytes.
func openMeta(dir string, log *slog.Logger) (*metaStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
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
	m := &metaStore{db: db, log: log, stop: make(chan struct{}), done: make(chan struct{})}
	go m.gcLoop()
	return m, nil
}

// gcLoop runs badger's value-log GC until it has nothing to rewrite, on a
// timer: badger never collects on its own.
func (m *metaStore) gcLoop() {
	defer close(m.done)
	t := time.NewTicker(valueLogGCEvery)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			for m.db.RunValueLogGC(0.5) == nil {
			}
		}
	}
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
	if err := m.db.Update(func(txn *badger.Txn) error { return txn.Set(key, b) }); err != nil {
		return fmt.Errorf("metadata %s: %w", key, err)
	}
	return nil
}

func (m *metaStore) subsystem(nqn string) (subsystemRecord, bool, error) {
	var r subsystemRecord
	ok, err := m.get(subsystemKey(nqn), &r)
	return r, ok, err
}

func (m *metaStore) putSubsystem(r subsystemRecord) error { return m.put(subsystemKey(r.NQN), r) }

func (m *metaStore) namespace(nqn string, nsid uint32) (namespaceRecord, bool, error) {
	var r namespaceRecord
	ok, err := m.get(namespaceKey(nqn, nsid), &r)
	return r, ok, err
}

func (m *metaStore) putNamespace(r namespaceRecord) error {
	return m.put(namespaceKey(r.SubNQN, r.NSID), r)
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
	err = m.db.Update(func(txn *badger.Txn) error {
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

func (m *metaStore) close() error {
	close(m.stop)
	<-m.done
	return m.db.Close()
}
