package reliability_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nprdma/tcp"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/target"
	"github.com/prometheus/client_golang/prometheus"
)

const (
	blockSize = 4096
	subNQN    = "nqn.2026-01.io.nprdma:reliability"
)

// hostNQN names a test host.
func hostNQN(name string) string { return "nqn.2026-01.io.nprdma:host-" + name }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// longRun selects the long versions of the tests (NPRDMA_LONG=1).
func longRun() bool { return os.Getenv("NPRDMA_LONG") == "1" }

// fabricKind is the nprdma provider a test runs over, or NVMe/TCP: the
// target then also listens for NVMe/TCP, where the test's hosts connect.
type fabricKind struct {
	name    string
	loop    bool
	nvmeTCP bool
}

var (
	loopFabric    = fabricKind{"loop", true, false}
	tcpFabric     = fabricKind{"tcp", false, false}
	nvmeTCPFabric = fabricKind{"nvme-tcp", false, true}
)

// nsSpec describes a namespace of an in-process target: a sparse backing
// file, optionally behind blockdev.Faulty.
type nsSpec struct {
	NSID   uint32
	Size   int64
	Budget int64
	Faulty bool
}

// subSpec describes a subsystem of an in-process target.
type subSpec struct {
	NQN      string
	Hosts    []string
	AllowAny bool
	NS       []nsSpec
}

// targetRig is an in-process target over sparse files in dir.
type targetRig struct {
	kind   fabricKind
	lf     *loop.Fabric // loop: the fabric hosts join
	dir    string
	subs   []subSpec
	opts   []target.Option
	tg     *target.Target
	reg    *prometheus.Registry
	faulty map[uint32]*blockdev.Faulty // by NSID (first subsystem's)
	// tcpAddr is the NVMe/TCP port's address (nvmeTCP kinds), kept across
	// restarts.
	tcpAddr string
}

// newTarget starts an in-process target; it is closed when the test ends.
func newTarget(t testing.TB, kind fabricKind, subs []subSpec, opts ...target.Option) *targetRig {
	t.Helper()
	r := &targetRig{kind: kind, dir: t.TempDir(), subs: subs, opts: opts}
	if kind.loop {
		r.lf = loop.NewFabric()
	}
	if err := r.start(""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.tg.Close() })
	return r
}

// start (re)starts the target over the same files; listen "" takes a fresh
// address.
func (r *targetRig) start(listen string) error {
	var prov nprdma.Provider
	if r.kind.loop {
		prov = loop.New(loop.WithFabric(r.lf))
	} else {
		prov = tcp.New()
		if listen == "" {
			listen = "127.0.0.1:0"
		}
	}
	r.reg = prometheus.NewRegistry()
	opts := append([]target.Option{target.WithProvider(prov), target.WithListen(listen), target.WithLogger(quiet),
		target.WithDataDir(filepath.Join(r.dir, "meta")), target.WithMetrics(r.reg)}, r.opts...)
	if r.kind.nvmeTCP {
		tcpListen := r.tcpAddr
		if tcpListen == "" {
			tcpListen = "127.0.0.1:0"
		}
		opts = append(opts, target.WithListenNVMeTCP(tcpListen))
	}
	tg, err := target.New(opts...)
	if err != nil {
		return err
	}
	r.faulty = map[uint32]*blockdev.Faulty{}
	for i, s := range r.subs {
		sub, err := tg.AddSubsystem(target.SubsystemConfig{NQN: s.NQN, AllowHosts: s.Hosts, AllowAnyHost: s.AllowAny})
		if err != nil {
			tg.Close()
			return err
		}
		for _, ns := range s.NS {
			path := filepath.Join(r.dir, fmt.Sprintf("sub%d-ns%d.img", i, ns.NSID))
			if _, err := os.Stat(path); err != nil {
				if err := blockdev.Create(path, ns.Size); err != nil {
					tg.Close()
					return err
				}
			}
			file, err := blockdev.Open(path, blockdev.WithLogger(quiet))
			if err != nil {
				tg.Close()
				return err
			}
			var dev blockdev.Device = file
			if ns.Faulty {
				f := blockdev.NewFaulty(file)
				if i == 0 {
					r.faulty[ns.NSID] = f
				}
				dev = f
			}
			if _, err := sub.AddNamespace(target.NamespaceConfig{NSID: ns.NSID, Backing: dev, Budget: ns.Budget}); err != nil {
				file.Close()
				tg.Close()
				return err
			}
		}
	}
	if err := tg.Start(); err != nil {
		tg.Close()
		return err
	}
	r.tg = tg
	r.tcpAddr = tg.NVMeTCPAddr()
	return nil
}

// backingPath is the file behind namespace nsid of subsystem sub.
func (r *targetRig) backingPath(sub int, nsid uint32) string {
	return filepath.Join(r.dir, fmt.Sprintf("sub%d-ns%d.img", sub, nsid))
}

// namespace is the target's namespace nsid of the first subsystem.
func (r *targetRig) namespace(t testing.TB, nsid uint32) *target.Namespace {
	t.Helper()
	n := r.tg.Subsystem(r.subs[0].NQN).Namespace(nsid)
	if n == nil {
		t.Fatalf("target has no namespace %d", nsid)
	}
	return n
}

// hostDevice is a host's nprdma device, closed when the test ends. The
// provider comes back too, for tests that crash it.
func (r *targetRig) hostDevice(t testing.TB) (*nprdma.Device, nprdma.Provider) {
	t.Helper()
	var prov nprdma.Provider
	if r.kind.loop {
		prov = loop.New(loop.WithFabric(r.lf))
	} else {
		prov = tcp.New()
	}
	dev := nprdma.NewDevice(prov, nprdma.WithName("host"), nprdma.WithPinning(false))
	t.Cleanup(func() { dev.Close() })
	return dev, prov
}

// hostOptions are the options every test host uses, with its NQN (given
// with a host ID, so no state file is read or written).
func hostOptions(host string, opts ...initiator.Option) []initiator.Option {
	return append([]initiator.Option{initiator.WithHostNQN(hostNQN(host)), initiator.WithHostID(nvme.NewUUID()),
		initiator.WithLogger(quiet), initiator.WithIOQueues(2)}, opts...)
}

// connect connects host to subsystem nqn of the rig's target with dev; the
// controller is closed when the test ends.
func (r *targetRig) connect(t testing.TB, dev *nprdma.Device, nqn, host string, opts ...initiator.Option) *initiator.Controller {
	t.Helper()
	c, err := r.connectE(dev, nqn, hostOptions(host, opts...)...)
	if err != nil {
		t.Fatalf("connect %s to %s: %v", host, nqn, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (r *targetRig) connectE(dev *nprdma.Device, nqn string, opts ...initiator.Option) (*initiator.Controller, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return initiator.Connect(ctx, dev, r.tg.Addr(), nqn, opts...)
}

// connectTCP connects host to subsystem nqn over NVMe/TCP at addr (the
// rig's NVMe/TCP port, or a proxy of it); the controller is closed when
// the test ends.
func (r *targetRig) connectTCP(t testing.TB, addr, nqn, host string, opts ...initiator.Option) *initiator.Controller {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := initiator.ConnectOver(ctx, initiator.TCP(), addr, nqn, hostOptions(host, opts...)...)
	if err != nil {
		t.Fatalf("connect %s to %s over NVMe/TCP: %v", host, nqn, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func openNamespace(t testing.TB, c *initiator.Controller, nsid uint32) *initiator.Namespace {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := c.Namespace(ctx, nsid)
	if err != nil {
		t.Fatalf("namespace %d: %v", nsid, err)
	}
	return n
}

// fillPattern fills p with the seeded content of the bytes at off.
func fillPattern(p []byte, off int64, seed uint64) {
	for i := 0; i+8 <= len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], (uint64(off+int64(i))/8+1)*0x9e3779b97f4a7c15^seed)
	}
}

// checkPattern reports the first byte of p that differs from the pattern.
func checkPattern(p []byte, off int64, seed uint64) error {
	want := make([]byte, len(p))
	fillPattern(want, off, seed)
	if bytes.Equal(p, want) {
		return nil
	}
	for i := range p {
		if p[i] != want[i] {
			return fmt.Errorf("byte %d (block %d) is %#x, want %#x", off+int64(i), (off+int64(i))/blockSize, p[i], want[i])
		}
	}
	return nil
}

// eventually polls cond until it holds or d has passed.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// statusOf is the NVMe status an error carries (nil: none).
func statusOf(err error) *nvme.StatusError {
	var se *nvme.StatusError
	if errors.As(err, &se) {
		return se
	}
	return nil
}

// percentile returns the p-th percentile (0..100) of the samples by the
// bench's nearest-rank rule.
func percentile(samples []time.Duration, p float64) time.Duration {
	s := slices.Clone(samples)
	slices.Sort(s)
	return bench.Percentile(s, p)
}

// resources is what a leak check compares: this process's goroutines, file
// descriptors and resident memory.
type resources struct {
	goroutines int
	fds        int
	rss        int64
}

func (r resources) String() string {
	return fmt.Sprintf("%d goroutines, %d fds, RSS %.1f MiB", r.goroutines, r.fds, float64(r.rss)/(1<<20))
}

// measure settles the process (GC, memory returned to the OS) and reads
// its resources.
func measure(t testing.TB) resources {
	t.Helper()
	runtime.GC()
	debug.FreeOSMemory()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return resources{goroutines: runtime.NumGoroutine(), fds: len(fds), rss: vmRSS(t)}
}

func vmRSS(t testing.TB) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// goroutineDump is every goroutine's stack, for a leak report.
func goroutineDump() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}
