package initiator

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/nprdma/nprdma/nvme"
)

// DefaultStateFile is where the host ID lives unless WithStateFile says
// otherwise: $NPRDMA_STATE_DIR/hostid, else the user's config directory
// (~/.config/nprdma/hostid), else /var/lib/nprdma/hostid.
func DefaultStateFile() string {
	if d := os.Getenv("NPRDMA_STATE_DIR"); d != "" {
		return filepath.Join(d, "hostid")
	}
	if d, err := os.UserConfigDir(); err == nil {
		return filepath.Join(d, "nprdma", "hostid")
	}
	return "/var/lib/nprdma/hostid"
}

// LoadOrCreateHostID reads the host ID (a UUID, one line) from path, or
// draws one and writes it there, so that the host keeps its NQN across runs
// (targets allow hosts by NQN).
func LoadOrCreateHostID(path string) (nvme.UUID, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		id, perr := nvme.ParseUUID(strings.TrimSpace(string(b)))
		if perr != nil {
			return nvme.UUID{}, fmt.Errorf("initiator: host ID file %s: %w", path, perr)
		}
		return id, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nvme.UUID{}, fmt.Errorf("initiator: host ID file: %w", err)
	}
	id := nvme.NewUUID()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nvme.UUID{}, fmt.Errorf("initiator: host ID file: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(id.String()+"\n"), 0o644); err != nil {
		return nvme.UUID{}, fmt.Errorf("initiator: host ID file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nvme.UUID{}, fmt.Errorf("initiator: host ID file: %w", err)
	}
	return id, nil
}

// HostNQN is the host NQN Connect and Discover use with opts (creating the
// host ID file if needed).
func HostNQN(opts ...Option) (string, error) {
	cfg, err := newConfig(opts)
	return cfg.hostNQN, err
}
