package attach

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"

	"github.com/nprdma/nprdma/initiator/blockio"
	"github.com/prometheus/client_golang/prometheus"
)

// A Frontend is one way of exposing a backend locally: an attach mode. It
// starts over a blockio.Backend and returns an Exposure (which says what
// users use: a device or a URI, and takes it down again), and it cleans up
// what an attach process of its mode left behind when it died.
type Frontend interface {
	// Mode is the frontend's name (the --mode value).
	Mode() Mode
	// What says in a few words what users get ("a ublk block device").
	What() string
	// Start exposes b. What a frontend does not use of cfg it ignores.
	Start(ctx context.Context, b blockio.Backend, cfg Config) (Exposure, error)
	// Reap cleans up after rec, whose attach process is gone, and says
	// what it did. force goes further where the frontend would otherwise
	// refuse (a device still mounted); see Dir.Reap.
	Reap(d *Dir, rec Record, force bool) (notes []string, err error)
}

// A Resumer is a Frontend whose device outlives a crashed attach process,
// so that the next attach process of the same name resumes serving it (the
// file system above never sees the device go).
type Resumer interface {
	// Resumable reports whether the device of rec, whose attach process
	// is gone, can still be resumed.
	Resumable(d *Dir, rec Record) bool
}

// Config is what a frontend starts with. Each frontend reads the fields
// that concern it; zero values mean the defaults stated.
type Config struct {
	// Name is the attachment's name: the NBD export's name, file names.
	Name string
	// Description says what is exposed, for people (the NBD export's).
	Description string
	// Dir is the run directory: default socket path, FUSE mount point.
	Dir *Dir
	// Logger logs what the frontend does (default: nothing).
	Logger *slog.Logger
	// Registerer, when set, gets the frontend's own metrics (nbd's).
	Registerer prometheus.Registerer
	// Socket is the NBD unix socket (nbd; default Dir.SocketPath(Name)).
	Socket string
	// TCP, when set, is a loopback address nbd also serves on.
	TCP string
	// Queues is the number of hardware queues of a kernel block device
	// (ublk; the number of connections for nbd-kernel); 0: one per CPU.
	Queues int
	// QueueDepth is the depth of each queue (ublk, nbd-kernel; default 128).
	QueueDepth int
	// Resume is the record of a dead attach process of this name whose
	// device the frontend (a Resumer) is to serve again rather than
	// create a new one (Dir.Claim returns it).
	Resume *Record
}

func (c Config) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger
}

// An Exposure is a started frontend.
type Exposure interface {
	// Fill sets rec's fields that say what is exposed: the device, the
	// socket and URI, the FUSE mount.
	Fill(rec *Record)
	// Detach stops exposing the backend. It does not flush it: the
	// attachment's teardown does. Without force it refuses while the
	// device is mounted (or held open), returning a *RefusedError with
	// nothing changed; with force it unmounts first (lazily if busy).
	Detach(force bool) error
	// Failed yields an error if the exposure stops by itself (the NBD
	// server's listener failed); nil if it never does.
	Failed() <-chan error
}

// A Resizer is an Exposure that follows its backend when the backend grows
// (the target grew the namespace): Resize makes the device as large as the
// backend is now.
type Resizer interface {
	Resize() error
}

// RefusedError is returned by Exposure.Detach when it refused to detach and
// changed nothing (the device is mounted, or held open elsewhere).
type RefusedError struct{ Err error }

func (e *RefusedError) Error() string { return e.Err.Error() }
func (e *RefusedError) Unwrap() error { return e.Err }

// frontends is the registry of attach modes.
var frontends = map[Mode]Frontend{
	ModeNBD:       nbdFrontend{},
	ModeFUSE:      fuseFrontend{},
	ModeUBLK:      ublkFrontend{},
	ModeNBDKernel: nbdKernelFrontend{},
}

// FrontendOf returns the frontend of mode (not ModeAuto: see ChooseMode).
func FrontendOf(mode Mode) (Frontend, error) {
	if f, ok := frontends[mode]; ok {
		return f, nil
	}
	return nil, fmt.Errorf("mode %q: want %s", mode, modeList())
}

// Modes lists the attach modes, auto last.
func Modes() []Mode {
	var ms []Mode
	for m := range frontends {
		ms = append(ms, m)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i] < ms[j] })
	return append(ms, ModeAuto)
}

func modeList() string {
	var s []string
	for _, m := range Modes() {
		s = append(s, string(m))
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// ParseMode parses a --mode value.
func ParseMode(s string) (Mode, error) {
	if Mode(s) == ModeAuto {
		return ModeAuto, nil
	}
	if _, err := FrontendOf(Mode(s)); err != nil {
		return "", err
	}
	return Mode(s), nil
}
