package initiator

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nprdma/shm"
	"github.com/nprdma/nprdma/nprdma/tcp"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/fabric"
	"github.com/nprdma/nprdma/target"
)

const testSubNQN = "nqn.2026-11.io.nprdma:test"

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// fabricKind gives the two sides of a test their providers, and says
// whether the host reaches the target over NVMe/TCP instead of the nprdma
// fabric.
type fabricKind struct {
	name   string
	new    func() (srv, cli nprdma.Provider)
	listen string
	// nvmeTCP: the target also listens for NVMe/TCP, and the host connects
	// there (TCP transport: two-sided reads only).
	nvmeTCP bool
}

var kinds = []fabricKind{
	{"loop", func() (nprdma.Provider, nprdma.Provider) {
		f := loop.NewFabric()
		return loop.New(loop.WithFabric(f)), loop.New(loop.WithFabric(f))
	}, "ns-test", false},
	{"tcp", func() (nprdma.Provider, nprdma.Provider) { return tcp.New(), tcp.New() }, "127.0.0.1:0", false},
	// A socket of its own in the temporary directory, and shareable
	// regions the initiator reads in place.
	{"shm", func() (nprdma.Provider, nprdma.Provider) { return shm.New(), shm.New() }, shm.Scheme, false},
}

// nvmeTCPKind is the host over NVMe/TCP to the same in-process target.
var nvmeTCPKind = fabricKind{"nvme-tcp", func() (nprdma.Provider, nprdma.Provider) { return tcp.New(), tcp.New() }, "127.0.0.1:0", true}

// everyTransport is kinds and NVMe/TCP: for the tests that do not depend on
// one-sided reads, or check them only where there are some.
var everyTransport = append(kinds[:len(kinds):len(kinds)], nvmeTCPKind)

type targetSpec struct {
	prov       nprdma.Provider
	listen     string
	alsoListen []string // more nprdma fabric addresses (unix:PATH: shared memory)
	listenTCP  string   // NVMe/TCP too, at this address ("": not served)
	dir        string   // backing file and data dir live here
	size       int64
	budget     int64
	hosts      []string
	allowAny   bool
	kato       time.Duration
	targetOpts []target.Option
}

// startTarget runs an in-process target over a backing file in spec.dir.
func startTarget(t *testing.T, spec targetSpec) *target.Target {
	t.Helper()
	tg, err := startTargetE(t, spec)
	if err != nil {
		t.Fatal(err)
	}
	return tg
}

// startPinnedTarget starts a target with a pinned budget, skipping the test
// where this machine does not permit pinning.
func startPinnedTarget(t *testing.T, spec targetSpec, budget int64) *target.Target {
	t.Helper()
	spec.targetOpts = append(spec.targetOpts, target.WithPinnedBudget(budget))
	tg, err := startTargetE(t, spec)
	if err != nil {
		if strings.Contains(err.Error(), "mlock") {
			t.Skipf("pinning not permitted here: %v", err)
		}
		t.Fatal(err)
	}
	return tg
}

func startTargetE(t *testing.T, spec targetSpec) (*target.Target, error) {
	t.Helper()
	backing := filepath.Join(spec.dir, "backing.img")
	if _, err := os.Stat(backing); err != nil {
		if err := blockdev.Create(backing, spec.size); err != nil {
			return nil, err
		}
	}
	opts := append([]target.Option{target.WithProvider(spec.prov), target.WithListen(append([]string{spec.listen}, spec.alsoListen...)...),
		target.WithDataDir(filepath.Join(spec.dir, "meta")), target.WithLogger(quiet)}, spec.targetOpts...)
	if spec.kato > 0 {
		opts = append(opts, target.WithKeepAliveTimeout(spec.kato))
	}
	if spec.listenTCP != "" {
		opts = append(opts, target.WithListenNVMeTCP(spec.listenTCP))
	}
	tg, err := target.New(opts...)
	if err != nil {
		return nil, err
	}
	sub, err := tg.AddSubsystem(target.SubsystemConfig{NQN: testSubNQN, AllowHosts: spec.hosts, AllowAnyHost: spec.allowAny})
	if err != nil {
		tg.Close()
		return nil, err
	}
	dev, err := blockdev.Open(backing)
	if err != nil {
		tg.Close()
		return nil, err
	}
	if _, err := sub.AddNamespace(target.NamespaceConfig{NSID: 1, Backing: dev, Budget: spec.budget}); err != nil {
		dev.Close()
		tg.Close()
		return nil, err
	}
	if err := tg.Start(); err != nil {
		tg.Close()
		return nil, err
	}
	return tg, nil
}

type rig struct {
	kind             fabricKind
	srvProv, cliProv nprdma.Provider
	tg               *target.Target
	dev              *nprdma.Device
	spec             targetSpec
}

// transport is how the rig's hosts reach its target.
func (r *rig) transport() Transport {
	if r.kind.nvmeTCP {
		return TCP()
	}
	return NPRDMA(r.dev)
}

// addr is where the rig's hosts reach its target.
func (r *rig) addr() string {
	if r.kind.nvmeTCP {
		return r.tg.NVMeTCPAddr()
	}
	return r.tg.Addr()
}

func newRig(t *testing.T, k fabricKind, spec targetSpec) *rig {
	t.Helper()
	sp, cp := k.new()
	spec.prov, spec.listen = sp, k.listen
	if k.nvmeTCP {
		spec.listenTCP = "127.0.0.1:0"
	}
	if spec.dir == "" {
		spec.dir = t.TempDir()
	}
	if spec.size == 0 {
		spec.size = 16 << 20
	}
	r := &rig{kind: k, srvProv: sp, cliProv: cp, spec: spec}
	r.tg = startTarget(t, spec)
	r.dev = nprdma.NewDevice(cp, nprdma.WithName("initiator"), nprdma.WithPinning(false))
	t.Cleanup(func() {
		r.tg.Close()
		r.dev.Close()
	})
	return r
}

func (r *rig) connect(t *testing.T, opts ...Option) *Controller {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	opts = append([]Option{WithStateFile(filepath.Join(t.TempDir(), "hostid")), WithLogger(quiet), WithIOQueues(2)}, opts...)
	c, err := ConnectOver(ctx, r.transport(), r.addr(), testSubNQN, opts...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func namespace(t *testing.T, c *Controller) *Namespace {
	t.Helper()
	n, err := c.Namespace(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// pattern fills p with the seeded content of the bytes at off.
func pattern(p []byte, off int64, seed uint64) {
	for i := 0; i < len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], (uint64(off+int64(i))/8+1)*0x9e3779b97f4a7c15^seed)
	}
}

func writePattern(t *testing.T, n *Namespace, seed uint64, chunk int) {
	t.Helper()
	buf := make([]byte, chunk)
	for off := int64(0); off < n.Size(); off += int64(chunk) {
		k := min(int64(chunk), n.Size()-off)
		pattern(buf[:k], off, seed)
		if _, err := n.WriteAt(buf[:k], off); err != nil {
			t.Fatalf("write [%d, +%d): %v", off, k, err)
		}
	}
}

func verifyRange(t *testing.T, n *Namespace, off, length int64, seed uint64) {
	t.Helper()
	got := make([]byte, length)
	if _, err := n.ReadAt(got, off); err != nil {
		t.Fatalf("read [%d, +%d): %v", off, length, err)
	}
	want := make([]byte, length)
	pattern(want, off, seed)
	if !bytes.Equal(got, want) {
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("read [%d, +%d): first difference at byte %d (page %d)", off, length, off+int64(i), (off+int64(i))/BlockSize)
			}
		}
	}
}

// TestEndToEnd is the acceptance test: a namespace four times the target's
// DRAM budget is written with a seeded pattern, flushed, read back whole;
// a hot set is then read almost entirely one-sided, and a cold phase
// resolves faults and still verifies. Over NVMe/TCP every read is an NVMe
// Read, and the target still reports the faults it resolved.
func TestEndToEnd(t *testing.T) {
	for _, k := range everyTransport {
		t.Run(k.name, func(t *testing.T) {
			const size, budget = 32 << 20, 8 << 20
			r := newRig(t, k, targetSpec{size: size, budget: budget, allowAny: true})
			c := r.connect(t)
			n := namespace(t, c)
			if n.Size() != size || n.BlockSize() != BlockSize {
				t.Fatalf("namespace size %d block %d", n.Size(), n.BlockSize())
			}
			const seed = 0x5eed
			writePattern(t, n, seed, 1<<20)
			if err := n.Flush(); err != nil {
				t.Fatal(err)
			}
			for off := int64(0); off < size; off += 1 << 20 {
				verifyRange(t, n, off, 1<<20, seed)
			}
			full := c.Stats()
			if (full.FallbackPages == 0 && !k.nvmeTCP) || full.MajorResolved == 0 {
				t.Fatalf("whole-namespace read over a quarter budget resolved no faults: %+v", full)
			}

			// Hot phase: a 2 MiB hot set, warmed once, then random reads.
			rng := rand.New(rand.NewPCG(1, 2))
			const hotOff, hotLen = 8 << 20, 2 << 20
			verifyRange(t, n, hotOff, hotLen, seed)
			before := c.Stats()
			for i := 0; i < 400; i++ {
				blocks := int64(1 + rng.IntN(8))
				off := hotOff + rng.Int64N(hotLen/BlockSize-blocks+1)*BlockSize
				verifyRange(t, n, off, blocks*BlockSize, seed)
			}
			hot := c.Stats()
			reads := hot.Reads - before.Reads
			oneSided := hot.ReadsOneSided - before.ReadsOneSided
			share := float64(oneSided) / float64(reads)
			t.Logf("hot phase: %d of %d reads one-sided (%.1f%%)", oneSided, reads, 100*share)
			switch {
			case k.nvmeTCP && (oneSided != 0 || hot.TwoSidedReads-before.TwoSidedReads != reads || hot.OneSidedReads != 0):
				t.Fatalf("hot phase over NVMe/TCP: not every read two-sided: %+v", hot)
			case !k.nvmeTCP && share < 0.95:
				t.Fatalf("hot phase: one-sided share %.3f < 0.95 (%+v)", share, hot)
			}
			if _, ok := r.cliProv.(*shm.Provider); ok && r.dev.Stats().LocalReads < uint64(oneSided) {
				t.Fatalf("hot phase over shm: %d READs in place, fewer than the %d one-sided reads", r.dev.Stats().LocalReads, oneSided)
			}

			// Cold phase: reads spread over the namespace fault pages in.
			before = c.Stats()
			for i := 0; i < 100; i++ {
				off := rng.Int64N(size/BlockSize-4) * BlockSize
				verifyRange(t, n, off, 4*BlockSize, seed)
			}
			cold := c.Stats()
			if !k.nvmeTCP && (cold.SuspectedPages == before.SuspectedPages || cold.FallbackReads == before.FallbackReads) {
				t.Fatalf("cold phase suspected no fault: %+v", cold)
			}
			if cold.MajorResolved+cold.MinorResolved == before.MajorResolved+before.MinorResolved {
				t.Fatalf("cold phase: the target reported no resolved fault: %+v", cold)
			}
			if cold.FalsePositives != 0 {
				t.Fatalf("false positives without magic content: %d", cold.FalsePositives)
			}
		})
	}
}

// TestMagicContentIsAFalsePositive writes a page whose content is the
// region's magic page and reads it: the data is right and the false
// positive is counted.
func TestMagicContentIsAFalsePositive(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			r := newRig(t, k, targetSpec{allowAny: true})
			c := r.connect(t)
			n := namespace(t, c)
			d, err := n.RegionDescriptor(context.Background())
			if err != nil || d == nil {
				t.Fatalf("region descriptor: %v %v", d, err)
			}
			page := make([]byte, BlockSize)
			for i := 0; i < BlockSize; i += 8 {
				binary.LittleEndian.PutUint64(page[i:], d.Magic)
			}
			// Neighbours with ordinary content, to see the page is placed.
			buf := make([]byte, 3*BlockSize)
			pattern(buf, 40*BlockSize, 1)
			copy(buf[BlockSize:], page)
			if _, err := n.WriteAt(buf, 40*BlockSize); err != nil {
				t.Fatal(err)
			}
			before := c.Stats()
			got := make([]byte, len(buf))
			if _, err := n.ReadAt(got, 40*BlockSize); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, buf) {
				t.Fatal("a page holding the magic pattern read back wrong")
			}
			after := c.Stats()
			if fp := after.FalsePositives - before.FalsePositives; fp != 1 {
				t.Fatalf("false positives %d, want 1 (%+v)", fp, after)
			}
			if sp := after.SuspectedPages - before.SuspectedPages; sp != 1 {
				t.Fatalf("suspected pages %d, want 1", sp)
			}
		})
	}
}

func TestHostNotAllowedIsRefusedAtConnect(t *testing.T) {
	for _, k := range everyTransport {
		t.Run(k.name, func(t *testing.T) {
			allowed := "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555"
			r := newRig(t, k, targetSpec{hosts: []string{allowed}})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := ConnectOver(ctx, r.transport(), r.addr(), testSubNQN, WithLogger(quiet),
				WithHostNQN("nqn.2014-08.org.nvmexpress:uuid:99999999-2222-3333-4444-555555555555"),
				WithStateFile(filepath.Join(t.TempDir(), "hostid")))
			if !errors.Is(err, ErrHostNotAllowed) || !errors.Is(err, nvme.StatusConnectInvalidHost) {
				t.Fatalf("connect of a host not allowed: %v, want ErrHostNotAllowed (Connect Invalid Host)", err)
			}
			if got := r.tg.Controllers(); got != 0 {
				t.Fatalf("%d controllers after a refused connect", got)
			}
			// A subsystem the target does not serve: the error says so
			// (decoded from the field the target blamed), not just "invalid
			// parameters".
			const unknown = "nqn.2026-11.io.nprdma:no-such-subsystem"
			_, err = ConnectOver(ctx, r.transport(), r.addr(), unknown, WithLogger(quiet), WithHostNQN(allowed),
				WithStateFile(filepath.Join(t.TempDir(), "hostid")))
			if !errors.Is(err, nvme.StatusConnectInvalidParameters) || !strings.Contains(err.Error(), "does not serve subsystem "+unknown) {
				t.Fatalf("connect to an unknown subsystem: %v", err)
			}
			// The allowed host gets in; its discovery log lists the
			// subsystem, the refused host's lists nothing.
			c := r.connect(t, WithHostNQN(allowed))
			namespace(t, c)
			l, err := DiscoverOver(ctx, r.transport(), r.addr(), WithHostNQN(allowed), WithLogger(quiet), WithStateFile(filepath.Join(t.TempDir(), "hostid")))
			if err != nil || len(l.Entries) != 1 || l.Entries[0].SubNQN != testSubNQN {
				t.Fatalf("discovery for the allowed host: %+v %v", l, err)
			}
			l, err = DiscoverOver(ctx, r.transport(), r.addr(), WithHostNQN("nqn.2014-08.org.nvmexpress:uuid:99999999-2222-3333-4444-555555555555"),
				WithLogger(quiet), WithStateFile(filepath.Join(t.TempDir(), "hostid")))
			if err != nil || len(l.Entries) != 0 {
				t.Fatalf("discovery for a host not allowed: %+v %v", l, err)
			}
		})
	}
}

// TestRKeyOfAnotherControllerIsRefused: a host that presents another
// controller's rkey (guessed, or stale) on its own queue pair gets a remote
// access error, and nothing is read.
func TestRKeyOfAnotherControllerIsRefused(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			r := newRig(t, k, targetSpec{allowAny: true})
			a := r.connect(t)
			b := r.connect(t, WithControllerLossTimeout(100*time.Millisecond))
			na, nb := namespace(t, a), namespace(t, b)
			da, err := na.RegionDescriptor(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			db, err := nb.RegionDescriptor(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if da.RKey == db.RKey {
				t.Fatal("two controllers share an rkey")
			}
			b.mu.Lock()
			q := b.sess.io[0].(remoteReader)
			b.mu.Unlock()
			buf, err := b.b.remote().pool.Get(BlockSize)
			if err != nil {
				t.Fatal(err)
			}
			defer buf.Release()
			before := r.tg.Device().Stats().RemoteAccessErrors
			err = q.ReadRemote(context.Background(), buf, 0, BlockSize, da.Address, da.RKey)
			if !errors.Is(err, nprdma.ErrRemoteAccess) {
				t.Fatalf("READ with another controller's rkey: %v, want a remote access error", err)
			}
			if got := r.tg.Device().Stats().RemoteAccessErrors - before; got != 1 {
				t.Fatalf("target counted %d remote access errors, want 1", got)
			}
			// Controller a is not affected.
			if _, err := na.ReadAt(make([]byte, BlockSize), 0); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestBadInputGetsTheRightStatus sends bad commands on a real I/O queue:
// each gets its status and the next good command on the same queue works.
func TestBadInputGetsTheRightStatus(t *testing.T) {
	for _, k := range everyTransport {
		t.Run(k.name, func(t *testing.T) {
			r := newRig(t, k, targetSpec{allowAny: true})
			c := r.connect(t)
			n := namespace(t, c)
			c.mu.Lock()
			q := c.sess.io[0]
			c.mu.Unlock()
			ctx := context.Background()
			blocks := uint64(n.Size() / BlockSize)
			cmd := func(b nvme.Command, err error) nvme.Command {
				if err != nil {
					t.Fatal(err)
				}
				return b
			}
			cases := []struct {
				name string
				cmd  nvme.Command
				data []byte
				want nvme.Status
			}{
				{"ReadBeyondEnd", cmd(nvme.ReadCommand(1, blocks, 1, 0, nvme.NullSGL())), make([]byte, BlockSize), nvme.StatusLBAOutOfRange},
				{"WriteBeyondEnd", cmd(nvme.WriteCommand(1, blocks-1, 2, 0, nvme.NullSGL())), make([]byte, 2*BlockSize), nvme.StatusLBAOutOfRange},
				{"ZeroLength", cmd(nvme.ReadCommand(1, 0, 1, 0, nvme.NullSGL())), nil, nvme.StatusDataSGLLengthInvalid},
				{"Oversized", cmd(nvme.ReadCommand(1, 0, 512, 0, nvme.NullSGL())), make([]byte, fabric.MaxTransfer), nvme.StatusInvalidField},
				{"UnknownOpcode", nvme.Command{Opcode: 0x7d, Flags: nvme.FlagsSGL, NSID: 1, DPTR: nvme.NullSGL()}, nil, nvme.StatusInvalidOpcode},
				{"UnknownNamespace", cmd(nvme.ReadCommand(9, 0, 1, 0, nvme.NullSGL())), make([]byte, BlockSize), nvme.StatusInvalidNamespaceOrFormat},
				{"TrimBeyondEnd", cmd(nvme.DeallocateCommand(1, 1, nvme.NullSGL())), dsm(t, blocks, 8), nvme.StatusLBAOutOfRange},
				{"WriteZeroesBeyondEnd", cmd(nvme.WriteZeroesCommand(1, blocks, 1, 0)), nil, nvme.StatusLBAOutOfRange},
			}
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					_, err := q.Submit(ctx, tc.cmd, tc.data)
					if !errors.Is(err, tc.want) {
						t.Fatalf("%v, want %s", err, tc.want)
					}
					var se *nvme.StatusError
					if !errors.As(err, &se) || !se.Status.DNR() {
						t.Fatalf("%v: want DNR", err)
					}
					if _, err := q.Submit(ctx, cmd(nvme.ReadCommand(1, 0, 1, 0, nvme.NullSGL())), make([]byte, BlockSize)); err != nil {
						t.Fatalf("good command after %s: %v", tc.name, err)
					}
				})
			}
		})
	}
}

func dsm(t *testing.T, slba uint64, blocks uint32) []byte {
	b, err := nvme.MarshalDSMRanges([]nvme.DSMRange{{SLBA: slba, Blocks: blocks}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestWritesTrimsAndZeroes covers FUA writes, trims and write-zeroes
// through the namespace API.
func TestWritesTrimsAndZeroes(t *testing.T) {
	for _, k := range []fabricKind{kinds[0], nvmeTCPKind} {
		t.Run(k.name, func(t *testing.T) { writesTrimsAndZeroes(t, k) })
	}
}

func writesTrimsAndZeroes(t *testing.T, k fabricKind) {
	r := newRig(t, k, targetSpec{allowAny: true})
	c := r.connect(t)
	n := namespace(t, c)
	buf := make([]byte, 64*BlockSize)
	pattern(buf, 0, 3)
	if _, err := n.WriteAtFUA(buf, 0); err != nil {
		t.Fatal(err)
	}
	verifyRange(t, n, 0, int64(len(buf)), 3)
	if err := n.Trim(4*BlockSize, 8*BlockSize); err != nil {
		t.Fatal(err)
	}
	if err := n.WriteZeroes(20*BlockSize, 4*BlockSize); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(buf))
	if _, err := n.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	clear(buf[4*BlockSize : 12*BlockSize])
	clear(buf[20*BlockSize : 24*BlockSize])
	if !bytes.Equal(got, buf) {
		t.Fatal("trimmed or zeroed range does not read zeros (or neighbours changed)")
	}
	if _, err := n.ReadAt(make([]byte, 10), 0); err == nil {
		t.Fatal("unaligned read accepted")
	}
	if err := n.Advise(context.Background(), 0, 16*BlockSize); err != nil {
		t.Fatal(err)
	}
	s := c.Stats()
	if s.Trims != 1 || s.WriteZeroes != 1 || s.Writes == 0 {
		t.Fatalf("counters: %+v", s)
	}
}

// TestKeepAliveTimeoutTearsControllerDown connects an admin queue that
// never sends Keep Alive: the target tears the controller down after KATO
// and the host's queue fails.
func TestKeepAliveTimeoutTearsControllerDown(t *testing.T) {
	for _, k := range []fabricKind{kinds[1], nvmeTCPKind} {
		t.Run(k.name, func(t *testing.T) { keepAliveTimeoutTearsControllerDown(t, k) })
	}
}

func keepAliveTimeoutTearsControllerDown(t *testing.T, k fabricKind) {
	r := newRig(t, k, targetSpec{allowAny: true})
	cfg, err := newConfig([]Option{WithStateFile(filepath.Join(t.TempDir(), "hostid")), WithLogger(quiet)})
	if err != nil {
		t.Fatal(err)
	}
	c, err := newController(r.transport(), r.addr(), testSubNQN, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.b.close()
	ctx := context.Background()
	s, err := c.connectAdmin(ctx, testSubNQN, 300*time.Millisecond, nvme.NPControllerRef{})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.tg.Controllers(); got != 1 {
		t.Fatalf("%d controllers, want 1", got)
	}
	// The queue pair notices the teardown by itself; an idle NVMe/TCP
	// connection only when it is next used (below).
	if !k.nvmeTCP {
		select {
		case <-s.admin.Done():
		case <-time.After(15 * time.Second):
			t.Fatal("admin queue still up long after the keep-alive timeout")
		}
	}
	deadline := time.Now().Add(15 * time.Second)
	for r.tg.Controllers() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d controllers after the keep-alive timeout", r.tg.Controllers())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := s.admin.Submit(ctx, nvme.KeepAliveCommand(), nil); !errors.Is(err, nvme.ErrQueueFailed) {
		t.Fatalf("keep-alive after teardown: %v", err)
	}
	select {
	case <-s.admin.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("admin queue not done after a keep-alive failed on it")
	}
}

// TestReconnectAfterTargetRestart restarts the target on the same address,
// backing and data directory while I/O is waiting: the controller
// reconnects (fresh region descriptor), the I/O completes and the data is
// there. Then the target goes away for good: I/O fails with
// ErrControllerLost within the loss timeout.
// restartable starts a 16 MiB tcp target on fixed addresses (the nprdma
// fabric's, and NVMe/TCP's with k.nvmeTCP), so that a test can restart it
// there, and connects to it over k's transport with a 20 s loss timeout.
// addr is where the host connects.
func restartable(t *testing.T, k fabricKind, opts ...Option) (spec targetSpec, tg *target.Target, tr Transport, addr string, c *Controller) {
	t.Helper()
	dir := t.TempDir()
	spec = targetSpec{dir: dir, size: 16 << 20, allowAny: true, prov: tcp.New(), listen: "127.0.0.1:0"}
	if k.nvmeTCP {
		spec.listenTCP = "127.0.0.1:0"
	}
	tg = startTarget(t, spec)
	spec.listen, spec.listenTCP, addr = tg.Addr(), tg.NVMeTCPAddr(), tg.Addr()
	tr = TCP()
	if k.nvmeTCP {
		addr = spec.listenTCP
	} else {
		dev := nprdma.NewDevice(tcp.New(), nprdma.WithPinning(false))
		t.Cleanup(func() { dev.Close() })
		tr = NPRDMA(dev)
	}
	opts = append([]Option{WithLogger(quiet), WithStateFile(filepath.Join(dir, "hostid")), WithControllerLossTimeout(20 * time.Second),
		WithQPTimeout(2 * time.Second), WithReconnectDelay(20 * time.Millisecond)}, opts...)
	c, err := ConnectOver(context.Background(), tr, addr, testSubNQN, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return spec, tg, tr, addr, c
}

// restartKinds are the transports of the restart tests.
var restartKinds = []fabricKind{kinds[1], nvmeTCPKind}

func TestReconnectAfterTargetRestart(t *testing.T) {
	for _, k := range restartKinds {
		t.Run(k.name, func(t *testing.T) { reconnectAfterTargetRestart(t, k) })
	}
}

func reconnectAfterTargetRestart(t *testing.T, k fabricKind) {
	spec, tg, tr, addr, c := restartable(t, k, WithIOQueues(2), WithKeepAlive(time.Second))
	dir := spec.dir
	ctx := context.Background()
	n := namespace(t, c)
	buf := make([]byte, 256*BlockSize)
	pattern(buf, 0, 11)
	if _, err := n.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if err := n.Flush(); err != nil {
		t.Fatal(err)
	}
	d1, _ := n.RegionDescriptor(ctx)
	if err := tg.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	// I/O issued while the target is down waits for the reconnect.
	done := make(chan error, 1)
	go func() {
		got := make([]byte, len(buf))
		if _, err := n.ReadAt(got, 0); err != nil {
			done <- err
			return
		}
		if !bytes.Equal(got, buf) {
			done <- fmt.Errorf("data differs after the restart")
			return
		}
		done <- nil
	}()
	time.Sleep(300 * time.Millisecond)
	spec.prov = tcp.New() // the same address, backing and data directory
	tg2 := startTarget(t, spec)
	defer tg2.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("read did not complete after the target came back")
	}
	if s := c.Stats(); s.Reconnects < 1 {
		t.Fatalf("reconnects %d", s.Reconnects)
	}
	d2, err := n.RegionDescriptor(ctx)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case k.nvmeTCP && (d1 != nil || d2 != nil):
		t.Fatalf("region descriptors over NVMe/TCP: %+v %+v", d1, d2)
	case !k.nvmeTCP && d1.RKey == d2.RKey && d1.Magic == d2.Magic:
		t.Fatal("region descriptor not refreshed after the restart")
	}

	// Now the target goes for good: a short loss timeout bounds the wait.
	c2, err := ConnectOver(ctx, tr, addr, testSubNQN, WithLogger(quiet), WithIOQueues(1),
		WithStateFile(filepath.Join(dir, "hostid")), WithControllerLossTimeout(time.Second),
		WithQPTimeout(500*time.Millisecond), WithReconnectDelay(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	n2 := namespace(t, c2)
	tg2.Close()
	start := time.Now()
	_, err = n2.ReadAt(make([]byte, BlockSize), 0)
	if !errors.Is(err, ErrControllerLost) {
		t.Fatalf("read with the target gone: %v, want ErrControllerLost", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("ErrControllerLost took %v", el)
	}
	if _, err := n2.WriteAt(make([]byte, BlockSize), 0); !errors.Is(err, ErrControllerLost) {
		t.Fatalf("write after the loss: %v", err)
	}
}

// TestNamespaceChangedAcrossRestart: a target restarted on the same address
// with another backing (another size and NGUID under the same NSID) is
// detected by the reconnect, without I/O: Changed is closed and Change says
// since when and what changed; I/O then fails with ErrNamespaceChanged at
// once, for good, and returns none of the other disk's data. Before, a READ
// past the smaller region's end failed the queue pair and the reconnect
// retried it for ever; and until session 8 only I/O found the change.
func TestNamespaceChangedAcrossRestart(t *testing.T) {
	for _, k := range restartKinds {
		t.Run(k.name, func(t *testing.T) { namespaceChangedAcrossRestart(t, k) })
	}
}

func namespaceChangedAcrossRestart(t *testing.T, k fabricKind) {
	spec, tg, _, _, c := restartable(t, k, WithIOQueues(1))
	n := namespace(t, c)
	if again := namespace(t, c); again != n {
		t.Fatal("a second call for the same namespace gave another handle")
	}
	if err := tg.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	other := targetSpec{dir: t.TempDir(), size: 8 << 20, allowAny: true, prov: tcp.New(), listen: spec.listen, listenTCP: spec.listenTCP}
	start := time.Now()
	tg2 := startTarget(t, other)
	defer tg2.Close()
	// The reconnect checks the namespace at once: whoever waits on Changed
	// learns it without I/O, and Change says since when and why (what
	// changed).
	select {
	case <-n.Changed():
	case <-time.After(10 * time.Second):
		t.Fatal("Changed not closed 10 s after the target came back on another backing")
	}
	since, cerr := n.Change()
	if since.Before(start) || time.Since(since) > 10*time.Second || !errors.Is(cerr, ErrNamespaceChanged) ||
		!strings.Contains(cerr.Error(), "is now 2048 blocks") {
		t.Fatalf("Change: %v %v", since, cerr)
	}
	_, err := n.ReadAt(make([]byte, 4*BlockSize), 12<<20) // beyond the new namespace's end
	if !errors.Is(err, ErrNamespaceChanged) || err.Error() != cerr.Error() {
		t.Fatalf("read after the restart on another backing: %v, want %v", err, cerr)
	}
	if _, err := n.ReadAt(make([]byte, BlockSize), 0); !errors.Is(err, ErrNamespaceChanged) {
		t.Fatalf("read inside both namespaces afterwards: %v, want ErrNamespaceChanged", err)
	}
	if _, err := n.WriteAt(make([]byte, BlockSize), 0); !errors.Is(err, ErrNamespaceChanged) {
		t.Fatalf("write afterwards: %v, want ErrNamespaceChanged", err)
	}
	if r := c.Stats().Reconnects; r < 1 || r > 3 {
		t.Fatalf("%d reconnects, want 1 (no reconnect storm)", r)
	}
	// Asking for NSID 1 again gives a handle for what it is now, and the
	// old one is no longer kept for the reconnect checks.
	n2 := namespace(t, c)
	if n2 == n || n2.Size() != 8<<20 {
		t.Fatalf("namespace after the change: same handle %v, size %d", n2 == n, n2.Size())
	}
	if _, err := n2.WriteAt(make([]byte, BlockSize), 0); err != nil {
		t.Fatalf("write to the new namespace: %v", err)
	}
	if n3 := namespace(t, c); n3 != n2 {
		t.Fatal("a second call for the new namespace gave another handle")
	}
	c.nsMu.Lock()
	kept := slices.Clone(c.namespaces)
	c.nsMu.Unlock()
	if len(kept) != 1 || kept[0] != n2 {
		t.Fatalf("controller keeps %d namespace handles, want only the new one", len(kept))
	}
	// The same namespace after a restart is accepted (TestReconnectAfterTargetRestart).
}

// TestPinnedBaseline serves a namespace in the pinned baseline mode with a
// pinned budget it fits in: the region descriptor says pages are always
// there, every read is one-sided with no magic scan, and data round-trips.
func TestPinnedBaseline(t *testing.T) {
	k := kinds[0]
	sp, cp := k.new()
	dir := t.TempDir()
	const budget = 12 << 20
	tg := startPinnedTarget(t, targetSpec{prov: sp, listen: k.listen, dir: dir, size: 8 << 20, allowAny: true}, budget)
	defer tg.Close()
	dev := nprdma.NewDevice(cp, nprdma.WithPinning(false))
	defer dev.Close()
	r := &rig{srvProv: sp, cliProv: cp, tg: tg, dev: dev}
	c := r.connect(t)
	n := namespace(t, c)
	d, err := n.RegionDescriptor(context.Background())
	if err != nil || d == nil || d.Flags&nvme.RegionUnpinned != 0 {
		t.Fatalf("pinned region descriptor %+v %v", d, err)
	}
	writePattern(t, n, 5, 1<<20)
	for off := int64(0); off < n.Size(); off += 1 << 20 {
		verifyRange(t, n, off, 1<<20, 5)
	}
	s := c.Stats()
	if s.SuspectedPages != 0 || s.ReadsOneSided != s.Reads || s.Reads == 0 {
		t.Fatalf("pinned reads: %+v", s)
	}
	if ns := tg.Subsystem(testSubNQN).Namespace(1); !ns.Pinned() || !ns.OneSided() {
		t.Fatalf("namespace pinned %v, one-sided %v", ns.Pinned(), ns.OneSided())
	}
	// The whole budget was registered pinned at start, whatever the
	// namespace uses of it.
	if got := tg.Device().Stats().RegisteredBytes; got < budget {
		t.Fatalf("target registered %d bytes, want at least the %d-byte pinned budget", got, budget)
	}
}

// TestPinnedBaselineLargerThanBudget: in the pinned baseline a namespace
// larger than the pinned budget is served two-sided only. The target
// refuses its region descriptor with Invalid Field, the initiator takes that
// for "no one-sided reads" and reads with NVMe Read, and every command goes
// straight to the backing file.
func TestPinnedBaselineLargerThanBudget(t *testing.T) {
	k := kinds[1]
	sp, cp := k.new()
	dir := t.TempDir()
	const size, budget = 16 << 20, 4 << 20
	tg := startPinnedTarget(t, targetSpec{prov: sp, listen: k.listen, dir: dir, size: size, allowAny: true}, budget)
	defer tg.Close()
	ns := tg.Subsystem(testSubNQN).Namespace(1)
	if ns.Pinned() || ns.OneSided() || ns.Region() != nil {
		t.Fatalf("namespace larger than the pinned budget: pinned %v, one-sided %v, region %v", ns.Pinned(), ns.OneSided(), ns.Region())
	}
	dev := nprdma.NewDevice(cp, nprdma.WithPinning(false))
	defer dev.Close()
	r := &rig{srvProv: sp, cliProv: cp, tg: tg, dev: dev}
	c := r.connect(t)
	n := namespace(t, c)
	d, err := n.RegionDescriptor(context.Background())
	if err != nil || d != nil {
		t.Fatalf("region descriptor of a two-sided-only namespace: %+v, %v; want none and no error", d, err)
	}
	// The status behind it, on the admin queue as the initiator sees it.
	err = c.do(context.Background(), func(s *session) error {
		_, err := s.admin.Submit(context.Background(), nvme.NPGetRegionDescriptorCommand(1, nvme.NullSGL()), make([]byte, nvme.RegionDescriptorSize))
		return err
	})
	if !errors.Is(err, nvme.StatusInvalidField) {
		t.Fatalf("NP Get Region Descriptor: %v, want Invalid Field", err)
	}
	writePattern(t, n, 9, 1<<20)
	if err := n.Flush(); err != nil {
		t.Fatal(err)
	}
	for off := int64(0); off < n.Size(); off += 1 << 20 {
		verifyRange(t, n, off, 1<<20, 9)
	}
	// Unaligned in-capsule writes (a single 4 KiB page) take the bounce
	// path to the O_DIRECT backing.
	page := make([]byte, BlockSize)
	pattern(page, 3*BlockSize, 10)
	if _, err := n.WriteAt(page, 3*BlockSize); err != nil {
		t.Fatal(err)
	}
	verifyRange(t, n, 3*BlockSize, BlockSize, 10)
	if err := n.Flush(); err != nil {
		t.Fatal(err)
	}
	s := c.Stats()
	if s.Reads == 0 || s.TwoSidedReads != s.Reads || s.OneSidedReads != 0 || s.SuspectedPages != 0 {
		t.Fatalf("reads of a two-sided-only namespace: %+v", s)
	}
	// No cache of the target's own: the data is on the backing file.
	f, err := os.ReadFile(filepath.Join(dir, "backing.img"))
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 1<<20)
	pattern(want, 5<<20, 9)
	if !bytes.Equal(f[5<<20:6<<20], want) {
		t.Fatal("backing file does not hold what was written to the two-sided-only namespace")
	}
	pattern(page, 3*BlockSize, 10)
	if !bytes.Equal(f[3*BlockSize:4*BlockSize], page) {
		t.Fatal("backing file does not hold the single-page write")
	}
}

// TestConcurrentIOUnderEviction: goroutines write and read disjoint parts of
// a namespace eight times the budget, each checking every read against its
// own model of its part, so one-sided reads, fallbacks, eviction and
// writeback all race with each other.
func TestConcurrentIOUnderEviction(t *testing.T) {
	for _, k := range []fabricKind{kinds[1], nvmeTCPKind} {
		t.Run(k.name, func(t *testing.T) { concurrentIOUnderEviction(t, k) })
	}
}

func concurrentIOUnderEviction(t *testing.T, k fabricKind) {
	r := newRig(t, k, targetSpec{size: 16 << 20, budget: 2 << 20, allowAny: true})
	c := r.connect(t, WithIOQueues(2), WithQueueDepth(16))
	n := namespace(t, c)
	const workers, part = 8, 2 << 20
	rounds := 60
	if testing.Short() {
		rounds = 20
	}
	errc := make(chan error, workers)
	for w := 0; w < workers; w++ {
		go func() {
			rng := rand.New(rand.NewPCG(uint64(w), 77))
			base := int64(w) * part
			model := make([]byte, part)
			for i := 0; i < rounds; i++ {
				blocks := 1 + rng.IntN(16)
				off := rng.Int64N(part/BlockSize-int64(blocks)+1) * BlockSize
				p := make([]byte, blocks*BlockSize)
				if rng.IntN(2) == 0 {
					for j := range p {
						p[j] = byte(rng.Uint32())
					}
					if _, err := n.WriteAt(p, base+off); err != nil {
						errc <- err
						return
					}
					copy(model[off:], p)
					continue
				}
				if _, err := n.ReadAt(p, base+off); err != nil {
					errc <- err
					return
				}
				if !bytes.Equal(p, model[off:off+int64(len(p))]) {
					errc <- fmt.Errorf("worker %d: read [%d, +%d) differs from what it wrote", w, base+off, len(p))
					return
				}
			}
			errc <- nil
		}()
	}
	for w := 0; w < workers; w++ {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	if s := c.Stats(); s.Reads == 0 || s.Writes == 0 {
		t.Fatalf("no I/O counted: %+v", s)
	}
}

// TestNoTornPageUnderConcurrentWrites: one goroutine rewrites a page over
// and over (every 8-byte word of version v is v) while readers read it; a
// read that mixed two versions would show two different words. Reads go
// one-sided and, when they catch the page busy or changed, fall back (over
// NVMe/TCP they are NVMe Reads).
func TestNoTornPageUnderConcurrentWrites(t *testing.T) {
	for _, k := range everyTransport {
		t.Run(k.name, func(t *testing.T) {
			r := newRig(t, k, targetSpec{allowAny: true})
			c := r.connect(t)
			n := namespace(t, c)
			const off = 5 * BlockSize
			stop := make(chan struct{})
			werr := make(chan error, 1)
			go func() {
				page := make([]byte, 2*BlockSize) // two pages: a READ across the boundary too
				for v := uint64(1); ; v++ {
					select {
					case <-stop:
						werr <- nil
						return
					default:
					}
					for i := 0; i < len(page); i += 8 {
						binary.LittleEndian.PutUint64(page[i:], v)
					}
					if _, err := n.WriteAt(page, off); err != nil {
						werr <- err
						return
					}
				}
			}()
			got := make([]byte, BlockSize)
			for i := 0; i < 500; i++ {
				if _, err := n.ReadAt(got, off+int64(i%2)*BlockSize); err != nil {
					t.Fatal(err)
				}
				first := binary.LittleEndian.Uint64(got)
				for j := 8; j < len(got); j += 8 {
					if w := binary.LittleEndian.Uint64(got[j:]); w != first {
						t.Fatalf("read %d: torn page: word 0 is %d, word %d is %d", i, first, j/8, w)
					}
				}
			}
			close(stop)
			if err := <-werr; err != nil {
				t.Fatal(err)
			}
			s := c.Stats()
			t.Logf("%d reads: %d completed one-sided, %d suspected pages", s.Reads, s.ReadsOneSided, s.SuspectedPages)
		})
	}
}
