// Package attach keeps the state of the attachments nprdma-initiator serves:
// one small JSON record per attachment in a runtime directory, so that
// `nprdma-initiator list` can show them and `nprdma-initiator detach` can
// find and stop the process serving one. It also chooses the attach mode the
// kernel supports best and cleans up after an attach process that died
// without tearing down.
//
// Layout of a run directory (default /run/nprdma, see DefaultRunDir):
//
//	attach/NAME.json   the record (written atomically; the attach process owns it)
//	attach/.NAME.outcome.PID-N  a detach (PID) waiting for the process's final record (Outcome)
//	NAME.sock          the NBD unix socket of an nbd attachment (unless --socket)
//	NAME.log           the output of an attach process started with --daemon
//	mnt/NAME/          the FUSE mount point of a fuse attachment
package attach

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Mode is how a namespace is exposed locally: the name of a Frontend.
type Mode string

// Attach modes.
const (
	ModeNBD       Mode = "nbd"        // an NBD server on a unix socket (and optionally loopback TCP)
	ModeFUSE      Mode = "fuse"       // a FUSE file with a loop device over it: /dev/loopN
	ModeUBLK      Mode = "ublk"       // a ublk block device served by this process: /dev/ublkbN
	ModeNBDKernel Mode = "nbd-kernel" // the kernel's NBD client over socket pairs to this process: /dev/nbdN
	ModeAuto      Mode = "auto"       // the best the kernel offers (ChooseMode)
)

// Record states.
const (
	StateStarting = "starting" // claimed, connecting and setting up
	StateAttached = "attached" // serving
	// StateLost: the controller is lost for good (the target stayed
	// unreachable past the controller-loss timeout, or refused the host on
	// reconnect); the process still serves, but its I/O fails with EIO.
	StateLost = "lost"
	// StateNamespaceChanged: the target no longer serves the namespace
	// attached (restarted on another backing under the same NSID: another
	// size or NGUID, or none); as in StateLost, the process still serves,
	// but its I/O fails with EIO.
	StateNamespaceChanged = "namespace-changed"
	// StateOrphaned is never recorded: list shows it for a record whose
	// attach process is gone but whose device waits for the next attach
	// process of the name to resume it (Resumable).
	StateOrphaned = "orphaned"
)

// Record describes one attachment. The attach process writes it; list and
// detach read it.
type Record struct {
	Name  string `json:"name"`
	State string `json:"state"`
	// PID and ProcStart identify the attach process; ProcStart (its start
	// time in clock ticks since boot, /proc/PID/stat field 22) guards
	// against signalling an unrelated process that reused the PID.
	PID       int       `json:"pid"`
	ProcStart uint64    `json:"proc_start"`
	Started   time.Time `json:"started"`

	Mode    Mode   `json:"mode"`
	Target  string `json:"target"`
	NQN     string `json:"nqn"`
	NSID    uint32 `json:"nsid"`
	Size    int64  `json:"size_bytes,omitempty"`
	HostNQN string `json:"host_nqn,omitempty"`

	// Device is the block device of the block-device modes: /dev/loopN
	// (fuse), /dev/ublkbN (ublk), /dev/nbdN (nbd-kernel).
	Device string `json:"device,omitempty"`
	// nbd mode.
	URI     string `json:"uri,omitempty"`
	Socket  string `json:"socket,omitempty"`
	TCPAddr string `json:"tcp_addr,omitempty"`
	TCPURI  string `json:"tcp_uri,omitempty"`
	// fuse mode.
	FUSEMount string `json:"fuse_mount,omitempty"`
	FUSEFile  string `json:"fuse_file,omitempty"`

	// ResumedFrom is the PID of the dead attach process whose device this
	// one resumed (Dir.Claim, Resumer).
	ResumedFrom int `json:"resumed_from,omitempty"`

	MetricsAddr string `json:"metrics_addr,omitempty"`
	LogFile     string `json:"log_file,omitempty"`

	// LostSince and LostReason say, in StateLost and StateNamespaceChanged
	// (see Dead), since when the attachment's I/O has failed for good and
	// why: when the controller was declared lost, or the namespace found
	// changed, and the error its I/O fails with.
	LostSince  time.Time `json:"lost_since,omitzero"`
	LostReason string    `json:"lost_reason,omitempty"`

	// PossiblyLost counts the writes, trims and write-zeroes (and their
	// bytes) the attachment had acknowledged and not flushed when the target
	// restarted without a clean shutdown, the latest at PossiblyLostSince:
	// they may be lost (initiator.Namespace.PossiblyLost). The attachment
	// goes on serving.
	PossiblyLost      int64     `json:"possibly_lost,omitempty"`
	PossiblyLostBytes int64     `json:"possibly_lost_bytes,omitempty"`
	PossiblyLostSince time.Time `json:"possibly_lost_since,omitzero"`

	// DetachAttempts counts teardown requests the process refused (e.g. the
	// loop device was mounted) and goes on serving; DetachError says why the
	// last one was refused, or why a teardown failed (the process then exits
	// without counting it: detach waits for the exit and reaps the record).
	DetachAttempts int    `json:"detach_attempts,omitempty"`
	DetachError    string `json:"detach_error,omitempty"`
}

// Dead reports whether the attachment's I/O fails for good, though its
// process still serves: StateLost or StateNamespaceChanged.
func (r Record) Dead() bool { return r.State == StateLost || r.State == StateNamespaceChanged }

// Process is the attach process of the record.
func (r Record) Process() Process { return Process{PID: r.PID, Start: r.ProcStart} }

// Use is what a user passes to their tools: the block device or the NBD URI.
func (r Record) Use() string {
	switch {
	case r.Device != "":
		return r.Device
	case r.URI != "":
		return r.URI
	}
	return ""
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// ValidName reports whether name can name an attachment (it becomes part of
// file names): letters, digits, '.', '_', '-', at most 64, not starting with
// a punctuation character.
func ValidName(name string) error {
	if !namePattern.MatchString(name) {
		return fmt.Errorf("attachment name %q: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	return nil
}

// DefaultName derives an attachment name from the subsystem NQN and the
// namespace: the part of the NQN after its last ':' (sanitised) and the
// NSID, e.g. "default-ns1" for nqn.2024-01.io.nprdma:default namespace 1.
func DefaultName(nqn string, nsid uint32) string {
	tail := nqn
	if i := strings.LastIndexByte(tail, ':'); i >= 0 {
		tail = tail[i+1:]
	}
	var b strings.Builder
	for _, c := range tail {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
			b.WriteRune(c)
		default:
			b.WriteByte('-')
		}
	}
	base := strings.TrimLeft(b.String(), "._-")
	if len(base) > 48 {
		base = base[:48]
	}
	if base == "" {
		base = "nprdma"
	}
	return base + "-ns" + strconv.FormatUint(uint64(nsid), 10)
}

// DefaultRunDir is where attachments keep their state unless told
// otherwise: /run/nprdma for root, else $XDG_RUNTIME_DIR/nprdma, else
// $TMPDIR/nprdma-UID.
func DefaultRunDir() string {
	if os.Geteuid() == 0 {
		return "/run/nprdma"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "nprdma")
	}
	return filepath.Join(os.TempDir(), "nprdma-"+strconv.Itoa(os.Geteuid()))
}

// Dir is a run directory.
type Dir struct {
	root string
}

// OpenDir opens (creating if needed) the run directory root: for attach,
// which writes there.
func OpenDir(root string) (*Dir, error) {
	d, err := DirAt(root)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(d.root, "attach"), 0o755); err != nil {
		return nil, fmt.Errorf("run directory: %w", err)
	}
	return d, nil
}

// DirAt is the run directory root, which need not exist: for list and
// detach, which must not create it. A missing directory holds no records.
func DirAt(root string) (*Dir, error) {
	if root == "" {
		return nil, errors.New("run directory: empty path")
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("run directory %s: %w", root, err)
	}
	return &Dir{root: abs}, nil
}

// Root is the directory's path.
func (d *Dir) Root() string { return d.root }

// SocketPath is the default NBD socket of attachment name.
func (d *Dir) SocketPath(name string) string { return filepath.Join(d.root, name+".sock") }

// LogPath is where a daemonised attach process of that name writes its output.
func (d *Dir) LogPath(name string) string { return filepath.Join(d.root, name+".log") }

// MountDir is the FUSE mount point of attachment name.
func (d *Dir) MountDir(name string) string { return filepath.Join(d.root, "mnt", name) }

func (d *Dir) recordPath(name string) string { return filepath.Join(d.root, "attach", name+".json") }

// ExistsError is returned by Claim when a live process already owns the name.
type ExistsError struct{ Record Record }

func (e *ExistsError) Error() string {
	r := e.Record
	what := r.Use()
	if what == "" {
		what = r.State
	}
	return fmt.Sprintf("attachment %q already exists (%s mode, pid %d, %s); detach it or choose another --name", r.Name, r.Mode, r.PID, what)
}

// Claim creates the record of a new attachment, atomically: it fails with an
// *ExistsError if a live process holds the name. A record left behind by a
// dead process is replaced: if it is of the same mode and namespace, and
// its device outlived the process (Resumable), it is returned for the new
// process to resume (Config.Resume); otherwise what it left is cleaned up
// (Reap) first. The caller owns the record from then on: Save updates it,
// Remove deletes it.
func (d *Dir) Claim(rec Record) (resume *Record, err error) {
	if err := ValidName(rec.Name); err != nil {
		return nil, err
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	tmp, err := d.writeTemp(rec.Name, data)
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp)
	for attempt := 0; ; attempt++ {
		// link(2) fails if the name exists: an atomic create of a file that
		// already has its full content (an O_EXCL create would be seen
		// empty by a concurrent reader).
		err := os.Link(tmp, d.recordPath(rec.Name))
		if err == nil {
			return resume, nil
		}
		if !errors.Is(err, os.ErrExist) || attempt >= 3 {
			return nil, fmt.Errorf("claim attachment %q: %w", rec.Name, err)
		}
		old, lerr := d.Load(rec.Name)
		switch {
		case errors.Is(lerr, os.ErrNotExist):
			continue // removed meanwhile
		case lerr != nil:
			return nil, fmt.Errorf("claim attachment %q: %w", rec.Name, lerr)
		case old.Process().Alive():
			return nil, &ExistsError{Record: old}
		}
		if old.Mode == rec.Mode && old.Target == rec.Target && old.NQN == rec.NQN && old.NSID == rec.NSID && d.Resumable(old) {
			if err := d.Remove(rec.Name); err != nil {
				return nil, err
			}
			resume = &old
			continue
		}
		if _, err := d.Reap(old, false); err != nil {
			return nil, fmt.Errorf("claim attachment %q: cleaning up after its dead process %d: %w", rec.Name, old.PID, err)
		}
	}
}

// Resumable reports whether rec, whose attach process is gone, left a
// device that a new attach process can resume (Resumer).
func (d *Dir) Resumable(rec Record) bool {
	f, err := FrontendOf(rec.Mode)
	if err != nil {
		return false
	}
	r, ok := f.(Resumer)
	return ok && r.Resumable(d, rec)
}

// FreeName returns base, or base-2, base-3, ... : the first name no live
// attachment holds. It is a suggestion; Claim decides.
func (d *Dir) FreeName(base string) string {
	for i := 1; ; i++ {
		name := base
		if i > 1 {
			name = base + "-" + strconv.Itoa(i)
		}
		rec, err := d.Load(name)
		if err != nil || !rec.Process().Alive() {
			return name
		}
	}
}

// Save replaces the record of rec.Name atomically (the owner's update).
func (d *Dir) Save(rec Record) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	tmp, err := d.writeTemp(rec.Name, data)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, d.recordPath(rec.Name)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("save attachment %q: %w", rec.Name, err)
	}
	return nil
}

func (d *Dir) writeTemp(name string, data []byte) (string, error) {
	f, err := os.CreateTemp(filepath.Join(d.root, "attach"), "."+name+".*.tmp")
	if err != nil {
		return "", fmt.Errorf("attachment %q: %w", name, err)
	}
	_, err = f.Write(append(data, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("attachment %q: %w", name, err)
	}
	return f.Name(), nil
}

// Remove deletes the record of name (absent is not an error).
func (d *Dir) Remove(name string) error {
	if err := os.Remove(d.recordPath(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove attachment %q: %w", name, err)
	}
	return nil
}

// Load reads the record of name; a missing one is an error wrapping
// os.ErrNotExist.
func (d *Dir) Load(name string) (Record, error) {
	data, err := os.ReadFile(d.recordPath(name))
	if err != nil {
		return Record{}, err
	}
	var rec Record
	if err := json.Unmarshal(data, &rec); err != nil {
		return Record{}, fmt.Errorf("attachment record %s: %w", d.recordPath(name), err)
	}
	if rec.Name != name {
		return Record{}, fmt.Errorf("attachment record %s: names %q", d.recordPath(name), rec.Name)
	}
	return rec, nil
}

// List returns every record, sorted by name. Records that cannot be read
// are reported in the error (the others are still returned). A run
// directory that does not exist has none.
func (d *Dir) List() ([]Record, error) {
	entries, err := os.ReadDir(filepath.Join(d.root, "attach"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("run directory: %w", err)
	}
	var out []Record
	var errs []error
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || strings.HasPrefix(e.Name(), ".") || e.IsDir() {
			continue
		}
		rec, err := d.Load(name)
		if errors.Is(err, os.ErrNotExist) {
			continue // removed while listing
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, rec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, errors.Join(errs...)
}

// Find returns the record an argument of detach names: an attachment name,
// its block device (/dev/loop3 or loop3, /dev/ublkb0, /dev/nbd0), its socket
// path or its NBD URI.
func (d *Dir) Find(arg string) (Record, error) {
	if ValidName(arg) == nil {
		if rec, err := d.Load(arg); err == nil {
			return rec, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return Record{}, err
		}
	}
	recs, err := d.List()
	if err != nil && len(recs) == 0 {
		return Record{}, err
	}
	dev := arg
	if !strings.HasPrefix(dev, "/") {
		dev = "/dev/" + dev
	}
	abs, _ := filepath.Abs(arg)
	for _, r := range recs {
		if (r.Device != "" && r.Device == dev) || (r.Socket != "" && r.Socket == abs) ||
			(r.URI != "" && r.URI == arg) || (r.TCPURI != "" && r.TCPURI == arg) {
			return r, nil
		}
	}
	return Record{}, fmt.Errorf("no attachment named %q, nor one using that device, socket or URI (see nprdma-initiator list; run directory %s)", arg, d.root)
}

// Process identifies a process by PID and start time.
type Process struct {
	PID   int
	Start uint64
}

// Self is the calling process.
func Self() (Process, error) {
	start, _, err := procStat(os.Getpid())
	if err != nil {
		return Process{}, err
	}
	return Process{PID: os.Getpid(), Start: start}, nil
}

// Alive reports whether the process still runs: the PID exists, started at
// the recorded time (it was not reused), and is not a zombie.
func (p Process) Alive() bool {
	if p.PID <= 0 {
		return false
	}
	start, state, err := procStat(p.PID)
	return err == nil && start == p.Start && state != 'Z' && state != 'X'
}

// ErrProcessGone is returned by Signal when the process no longer runs.
var ErrProcessGone = errors.New("process is gone")

// Signal sends sig to the process if it is still the one recorded.
func (p Process) Signal(sig syscall.Signal) error {
	if !p.Alive() {
		return fmt.Errorf("signal pid %d: %w", p.PID, ErrProcessGone)
	}
	if err := syscall.Kill(p.PID, sig); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("signal pid %d: %w", p.PID, ErrProcessGone)
		}
		return fmt.Errorf("signal pid %d: %w", p.PID, err)
	}
	return nil
}

// procStat reads a process's start time and state from /proc/PID/stat.
func procStat(pid int) (start uint64, state byte, err error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	return parseStat(data)
}

// parseStat parses the fields of /proc/PID/stat that identify a process.
// The command name (field 2) is in parentheses and may itself contain
// spaces and parentheses, so the fields are counted from the last ')'.
func parseStat(data []byte) (start uint64, state byte, err error) {
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("proc stat: no command name in %q", s)
	}
	fields := strings.Fields(s[i+1:])
	// fields[0] is field 3 (state); the start time is field 22.
	if len(fields) < 20 || len(fields[0]) != 1 {
		return 0, 0, fmt.Errorf("proc stat: %d fields after the command name", len(fields))
	}
	start, err = strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("proc stat: start time %q: %w", fields[19], err)
	}
	return start, fields[0][0], nil
}
