package target_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/fabric"
	"github.com/nprdma/nprdma/target"
)

// manageRig is a target with a data directory, a volume directory, 64 MiB
// of memory and the configuration's subsystem subNQN holding namespace 3
// (8 MiB, on a file outside the volume directory).
type manageRig struct {
	*adminRig
	dataDir, volDir, configFile string
}

func newManageRig(t testing.TB) *manageRig {
	t.Helper()
	dir := t.TempDir()
	r := &manageRig{dataDir: filepath.Join(dir, "meta"), volDir: filepath.Join(dir, "volumes"), configFile: filepath.Join(dir, "ns3.img")}
	if err := blockdev.Create(r.configFile, 8<<20); err != nil {
		t.Fatal(err)
	}
	r.adminRig = r.start(t, nil)
	return r
}

// restart shuts the rig's target down and starts it again (start, without
// extra namespaces).
func (r *manageRig) restart(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.tg.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	r.adminRig = r.start(t, nil)
}

// start starts a target on the rig's directories with the configuration's
// namespace 3 and those of extra (NSID: path), then restores what the
// management API created before.
func (r *manageRig) start(t testing.TB, extra map[uint32]string) *adminRig {
	t.Helper()
	f := loop.NewFabric()
	tg, err := target.New(target.WithProvider(loop.New(loop.WithFabric(f))), target.WithListen("manage-test"),
		target.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), target.WithDataDir(r.dataDir),
		target.WithVolumeDir(r.volDir), target.WithMemory(64<<20), target.WithMetadataProbeInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	sub, err := tg.AddSubsystem(target.SubsystemConfig{NQN: subNQN, AllowHosts: []string{hostNQN}})
	if err != nil {
		t.Fatal(err)
	}
	config := map[uint32]string{3: r.configFile}
	for id, p := range extra {
		config[id] = p
	}
	for id, p := range config {
		dev, err := blockdev.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sub.AddNamespace(target.NamespaceConfig{NSID: id, Backing: dev, Budget: 1 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tg.RestoreManaged(); err != nil {
		t.Fatal(err)
	}
	if err := tg.Start(); err != nil {
		t.Fatal(err)
	}
	cdev := nprdma.NewDevice(loop.New(loop.WithFabric(f)), nprdma.WithPinning(false))
	t.Cleanup(func() {
		tg.Close()
		cdev.Close()
	})
	return &adminRig{tg: tg, pd: cdev.AllocPD()}
}

// host is a raw host controller of subNQN: its admin queue (notices
// enabled) and one I/O queue.
type host struct {
	t     testing.TB
	admin *fabric.HostQueue
	io    *fabric.HostQueue
	aer   chan nvme.Completion
}

func (r *adminRig) host(t testing.TB) *host {
	t.Helper()
	admin, cntlid := r.adminController(t)
	nq, _ := nvme.NumberOfQueues{Submission: 1, Completion: 1}.Encode()
	if _, err := admin.Submit(context.Background(), nvme.SetFeaturesCommand(nvme.FeatureNumberOfQueues, nq, false), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Submit(context.Background(), nvme.SetFeaturesCommand(nvme.FeatureAsyncEventConfig, uint32(nvme.AECNamespaceAttribute), false), nil); err != nil {
		t.Fatal(err)
	}
	q := r.dial(t, 1, 8192)
	if _, err := connectCmd(t, q, subNQN, cntlid); err != nil {
		t.Fatal(err)
	}
	h := &host{t: t, admin: admin, io: q, aer: make(chan nvme.Completion, 1)}
	h.postAER()
	return h
}

func (h *host) postAER() {
	go func() {
		cqe, _ := h.admin.Submit(context.Background(), nvme.AsyncEventRequestCommand(), nil)
		h.aer <- cqe
	}()
}

// notice waits for the parked AER to complete with a Namespace Attribute
// Changed notice, reads the Changed Namespace List and posts the next AER.
func (h *host) notice() []uint32 {
	h.t.Helper()
	select {
	case cqe := <-h.aer:
		if e := nvme.DecodeAsyncEvent(cqe.DW0); e.Type != nvme.AsyncEventNotice || e.Info != nvme.NoticeNamespaceAttributeChanged || e.Log != nvme.LogChangedNamespaces {
			h.t.Fatalf("AER completed with %+v (status %v), want a namespace attribute notice", e, cqe.Err())
		}
	case <-time.After(10 * time.Second):
		h.t.Fatal("no namespace attribute notice")
	}
	ids := h.changedLog()
	h.postAER()
	return ids
}

func (h *host) changedLog() []uint32 {
	h.t.Helper()
	b := make([]byte, nvme.ChangedNamespaceListSize)
	if _, err := h.admin.Submit(context.Background(), mc(h.t)(nvme.GetLogPageCommand(nvme.LogChangedNamespaces, nvme.BroadcastNSID, 0, uint32(len(b)), nvme.NullSGL())), b); err != nil {
		h.t.Fatal(err)
	}
	ids, _, err := nvme.ParseChangedNamespaceList(b)
	if err != nil {
		h.t.Fatal(err)
	}
	return ids
}

// size is the namespace's size in Identify Namespace (0: inactive).
func (h *host) size(nsid uint32) int64 {
	h.t.Helper()
	b := make([]byte, nvme.IdentifySize)
	if _, err := h.admin.Submit(context.Background(), nvme.IdentifyCommand(nvme.CNSNamespace, nsid, nvme.NullSGL()), b); err != nil {
		h.t.Fatal(err)
	}
	var ns nvme.IdentifyNamespace
	if err := ns.Unmarshal(b); err != nil {
		h.t.Fatal(err)
	}
	return int64(ns.NSZE) * target.BlockSize
}

func (h *host) region(nsid uint32) nvme.RegionDescriptor {
	h.t.Helper()
	b := make([]byte, nvme.RegionDescriptorSize)
	if _, err := h.admin.Submit(context.Background(), nvme.NPGetRegionDescriptorCommand(nsid, nvme.NullSGL()), b); err != nil {
		h.t.Fatal(err)
	}
	d, err := nvme.ParseRegionDescriptor(b)
	if err != nil {
		h.t.Fatal(err)
	}
	return d
}

// block is the content written to block lba of nsid in round.
func block(nsid uint32, lba uint64, round int) []byte {
	b := make([]byte, target.BlockSize)
	for i := 0; i < len(b); i += 16 {
		binary.LittleEndian.PutUint64(b[i:], uint64(nsid)<<48|lba)
		binary.LittleEndian.PutUint64(b[i+8:], uint64(round))
	}
	return b
}

func (h *host) write(nsid uint32, lba uint64, p []byte) error {
	cmd, _ := nvme.WriteCommand(nsid, lba, uint32(len(p)/target.BlockSize), 0, nvme.NullSGL())
	_, err := h.io.Submit(context.Background(), cmd, p)
	return err
}

func (h *host) read(nsid uint32, lba uint64, n int) ([]byte, error) {
	p := make([]byte, n)
	cmd, _ := nvme.ReadCommand(nsid, lba, uint32(n/target.BlockSize), 0, nvme.NullSGL())
	_, err := h.io.Submit(context.Background(), cmd, p)
	return p, err
}

// busy keeps writing and reading back blocks of namespace 3 through another
// controller of the host until stop; it reports the rounds it verified and
// the first failure.
func busy(t *testing.T, r *adminRig, stop <-chan struct{}) func() (int, error) {
	h := r.host(t)
	var rounds atomic.Int64
	errc := make(chan error, 1)
	go func() {
		for round := 1; ; round++ {
			for lba := uint64(0); lba < 64; lba += 8 {
				want := bytes.Repeat(block(3, lba, round), 8)
				if err := h.write(3, lba, want); err != nil {
					errc <- fmt.Errorf("round %d write of block %d: %w", round, lba, err)
					return
				}
				got, err := h.read(3, lba, len(want))
				if err != nil || !bytes.Equal(got, want) {
					errc <- fmt.Errorf("round %d read of block %d: %v (data right: %v)", round, lba, err, err == nil && bytes.Equal(got, want))
					return
				}
			}
			rounds.Add(1)
			select {
			case <-stop:
				errc <- nil
				return
			default:
			}
		}
	}()
	return func() (int, error) { return int(rounds.Load()), <-errc }
}

// TestManageNamespacesWhileAHostServes creates, resizes and deletes a
// namespace of a subsystem while a host writes and verifies another
// namespace of it through one controller, and watches the changes through
// another: each change is a Namespace Attribute Changed notice whose log
// names the namespace; Identify and the region descriptor follow the size;
// the registration from before the resize still reads the old range; the
// delete is refused while the host is connected, and with force leaves it
// connected to the rest.
func TestManageNamespacesWhileAHostServes(t *testing.T) {
	r := newManageRig(t)
	stop := make(chan struct{})
	result := busy(t, r.adminRig, stop)
	h := r.host(t)

	n, err := r.tg.CreateNamespace(target.NamespaceRequest{Subsystem: subNQN, Name: "vol-a", Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	nsid := n.NSID()
	if nsid != 1 || n.Name() != "vol-a" || !n.Managed() || n.Backing() != filepath.Join(r.volDir, "vol-a.img") {
		t.Fatalf("created nsid %d name %q managed %v backing %s", nsid, n.Name(), n.Managed(), n.Backing())
	}
	if ids := h.notice(); !slices.Equal(ids, []uint32{nsid}) {
		t.Fatalf("changed namespace list after the create: %v", ids)
	}
	if got := h.size(nsid); got != 4<<20 {
		t.Fatalf("Identify Namespace size %d after the create", got)
	}
	if n.Region().Budget()*target.BlockSize != 1<<20 {
		t.Fatalf("budget %d pages, want a quarter of the size", n.Region().Budget())
	}
	before := h.region(nsid)
	if before.Length != 4<<20 {
		t.Fatalf("region descriptor length %d", before.Length)
	}
	last := uint64(4<<20/target.BlockSize - 1)
	if err := h.write(nsid, last, block(nsid, last, 1)); err != nil {
		t.Fatal(err)
	}

	if _, err := r.tg.ResizeNamespace(subNQN, nsid, 12<<20); err != nil {
		t.Fatal(err)
	}
	if ids := h.notice(); !slices.Equal(ids, []uint32{nsid}) {
		t.Fatalf("changed namespace list after the resize: %v", ids)
	}
	if got := h.size(nsid); got != 12<<20 {
		t.Fatalf("Identify Namespace size %d after the resize", got)
	}
	if st, err := os.Stat(n.Backing()); err != nil || st.Size() != 12<<20 {
		t.Fatalf("backing file after the resize: %v %v", st, err)
	}
	end := uint64(12<<20/target.BlockSize - 1)
	if err := h.write(nsid, end, block(nsid, end, 2)); err != nil {
		t.Fatalf("write in the grown range: %v", err)
	}
	if got, err := h.read(nsid, end, target.BlockSize); err != nil || !bytes.Equal(got, block(nsid, end, 2)) {
		t.Fatalf("read in the grown range: %v", err)
	}
	after := h.region(nsid)
	if after.Length != 12<<20 || after.RKey == before.RKey {
		t.Fatalf("region descriptor after the resize: length %d rkey %#x (before %#x)", after.Length, after.RKey, before.RKey)
	}
	// The registration from before keeps serving its range.
	buf, err := h.admin.Pool().Get(target.BlockSize)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Release()
	r.tg.Subsystem(subNQN).Namespace(nsid).Flush()
	if err := h.admin.ReadRemote(context.Background(), buf, 0, target.BlockSize, before.Address+last*target.BlockSize, before.RKey); err != nil {
		t.Fatalf("one-sided read with the registration from before the resize: %v", err)
	}
	if !bytes.Equal(buf.Bytes()[:target.BlockSize], block(nsid, last, 1)) && !isMagic(buf.Bytes()[:target.BlockSize], before.Magic) {
		t.Fatal("the registration from before the resize read other data")
	}

	err = r.tg.DeleteNamespace(subNQN, nsid, false)
	if !errors.Is(err, target.ErrInUse) || !strings.Contains(err.Error(), hostNQN) {
		t.Fatalf("delete while the host is connected: %v, want ErrInUse naming the host", err)
	}
	if r.tg.Subsystem(subNQN).Namespace(nsid) == nil {
		t.Fatal("the refused delete removed the namespace")
	}
	if err := r.tg.DeleteNamespace(subNQN, nsid, true); err != nil {
		t.Fatal(err)
	}
	if ids := h.notice(); !slices.Equal(ids, []uint32{nsid}) {
		t.Fatalf("changed namespace list after the delete: %v", ids)
	}
	if got := h.size(nsid); got != 0 {
		t.Fatalf("Identify Namespace of the deleted namespace: size %d", got)
	}
	if _, err := h.read(nsid, 0, target.BlockSize); !errors.Is(err, nvme.StatusInvalidNamespaceOrFormat) {
		t.Fatalf("read of the deleted namespace: %v", err)
	}
	if _, err := os.Stat(n.Backing()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("backing file of the deleted namespace: %v", err)
	}
	if ids := h.changedLog(); len(ids) != 0 {
		t.Fatalf("changed namespace list read twice: %v", ids)
	}

	// Two changes before the host reads the log: one notice, both in the
	// log, and the next change after the read raises the notice again.
	a, err := r.tg.CreateNamespace(target.NamespaceRequest{Subsystem: subNQN, Name: "vol-b", Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.tg.ResizeNamespace(subNQN, a.NSID(), 2<<20); err != nil {
		t.Fatal(err)
	}
	b, err := r.tg.CreateNamespace(target.NamespaceRequest{Subsystem: subNQN, Name: "vol-c", Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if ids := h.notice(); !slices.Equal(ids, []uint32{a.NSID(), b.NSID()}) {
		t.Fatalf("changed namespace list after three changes: %v, want [%d %d]", ids, a.NSID(), b.NSID())
	}
	if err := r.tg.DeleteNamespace(subNQN, b.NSID(), true); err != nil {
		t.Fatal(err)
	}
	if ids := h.notice(); !slices.Equal(ids, []uint32{b.NSID()}) {
		t.Fatalf("changed namespace list after the next change: %v", ids)
	}

	close(stop)
	rounds, err := result()
	if err != nil {
		t.Fatalf("the host's I/O on namespace 3: %v", err)
	}
	if rounds == 0 {
		t.Fatal("the host verified no round on namespace 3")
	}
	t.Logf("%d verified rounds on namespace 3 meanwhile", rounds)
}

// isMagic reports whether p is the region's magic page: a page that was
// not resident when read one-sidedly (the host would read it two-sided).
func isMagic(p []byte, magic uint64) bool {
	for i := 0; i < len(p); i += 8 {
		if binary.LittleEndian.Uint64(p[i:]) != magic {
			return false
		}
	}
	return true
}

// stable is the inventory's configuration, as JSON.
func stable(t testing.TB, tg *target.Target) string {
	t.Helper()
	inv, err := tg.Inventory()
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.MarshalIndent(inv.Configuration(), "", " ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestManageRestartRestoresTheSame: subsystems, hosts and namespaces made
// through the management API (one on a file the target created and grew,
// one on a file it was given) come back after a restart with the same
// NSIDs, names, sizes, budgets, identities, hosts and data; the
// configuration wins an NSID it takes, and the namespace it displaced comes
// back once it gives the NSID up.
func TestManageRestartRestoresTheSame(t *testing.T) {
	r := newManageRig(t)
	const other = "nqn.2026-11.io.nprdma:other"
	if _, err := r.tg.CreateSubsystem(target.SubsystemConfig{NQN: other, AllowHosts: []string{hostNQN}}); err != nil {
		t.Fatal(err)
	}
	if err := r.tg.AddHost(other, target.HostConfig{NQN: "nqn.2026-11.io.nprdma:second"}); err != nil {
		t.Fatal(err)
	}
	if err := r.tg.AddHost(subNQN, target.HostConfig{NQN: "nqn.2026-11.io.nprdma:third"}); err != nil {
		t.Fatal(err)
	}
	n, err := r.tg.CreateNamespace(target.NamespaceRequest{Subsystem: other, Name: "keep", Size: 4 << 20, Budget: 512 << 10})
	if err != nil {
		t.Fatal(err)
	}
	given := filepath.Join(t.TempDir(), "given.img")
	if err := blockdev.Create(given, 2<<20); err != nil {
		t.Fatal(err)
	}
	g, err := r.tg.CreateNamespace(target.NamespaceRequest{Subsystem: subNQN, Name: "given", NSID: 5, Backing: given})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.tg.ResizeNamespace(other, n.NSID(), 6<<20); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("restored"), 512)
	for _, ns := range []*target.Namespace{n, g} {
		if _, err := ns.Region().WriteAt(data, ns.Size()-int64(len(data))); err != nil {
			t.Fatal(err)
		}
	}
	want := stable(t, r.tg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.tg.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	r.adminRig = r.start(t, nil)
	if got := stable(t, r.tg); got != want {
		t.Fatalf("after the restart:\n%s\nbefore:\n%s", got, want)
	}
	for _, s := range []struct {
		nqn  string
		nsid uint32
	}{{other, n.NSID()}, {subNQN, 5}} {
		ns := r.tg.Subsystem(s.nqn).Namespace(s.nsid)
		got := make([]byte, len(data))
		if _, err := ns.Region().ReadAt(got, ns.Size()-int64(len(data))); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s ns %d: data after the restart: %v", s.nqn, s.nsid, err)
		}
	}
	if err := r.tg.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	// The configuration takes NSID 5: it wins, and the API's namespace is
	// not served, its record kept.
	taken := filepath.Join(t.TempDir(), "config5.img")
	if err := blockdev.Create(taken, 1<<20); err != nil {
		t.Fatal(err)
	}
	r.adminRig = r.start(t, map[uint32]string{5: taken})
	if ns := r.tg.Subsystem(subNQN).Namespace(5); ns.Backing() != taken || ns.Managed() {
		t.Fatalf("NSID 5 with the configuration claiming it: %s managed %v", ns.Backing(), ns.Managed())
	}
	if err := r.tg.DeleteNamespace(subNQN, 5, false); !errors.Is(err, target.ErrConfigured) {
		t.Fatalf("deleting the configuration's namespace: %v, want ErrConfigured", err)
	}
	if err := r.tg.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	r.adminRig = r.start(t, nil)
	if got := stable(t, r.tg); got != want {
		t.Fatalf("once the configuration gave NSID 5 up:\n%s\nwant:\n%s", got, want)
	}
}

// TestManageBadRequestsChangeNothing: each bad request fails with a clear
// error of the right kind and leaves the inventory, the store and the volume
// directory as they were.
func TestManageBadRequestsChangeNothing(t *testing.T) {
	r := newManageRig(t)
	if _, err := r.tg.CreateNamespace(target.NamespaceRequest{Subsystem: subNQN, Name: "taken", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	small := filepath.Join(t.TempDir(), "small.img")
	if err := blockdev.Create(small, 1<<20); err != nil {
		t.Fatal(err)
	}
	want := stable(t, r.tg)
	files := func() []string {
		entries, _ := os.ReadDir(r.volDir)
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return names
	}
	wantFiles := files()
	const unknown = "nqn.2026-11.io.nprdma:unknown"
	for _, c := range []struct {
		name string
		do   func() error
		kind error
		says string
	}{
		{"duplicate name", func() error {
			_, err := r.tg.CreateNamespace(target.NamespaceRequest{Subsystem: subNQN, Name: "taken", Size: 1 << 20})
			return err
		}, target.ErrExists, "name is taken"},
		{"duplicate NSID", func() error {
			_, err := r.tg.CreateNamespace(target.NamespaceRequest{Subsystem: subNQN, NSID: 3, Size: 1 << 20})
			return err
		}, target.ErrExists, "namespace 3 exists"},
		{"size beyond the backing", func() error {
			_, err := r.tg.CreateNamespace(target.NamespaceRequest{Subsystem: subNQN, Name: "big", Backing: small, Size: 2 << 20})
			return err
		}, target.ErrInvalid, "beyond the 1048576 bytes of backing"},
		{"size beyond the volume directory", func() error {
			_, err := r.tg.CreateNamespace(target.NamespaceRequest{Subsystem: subNQN, Name: "huge", Size: 1 << 50})
			return err
		}, target.ErrNoCapacity, "can still hold"},
		{"budget beyond the memory", func() error {
			_, err := r.tg.CreateNamespace(target.NamespaceRequest{Subsystem: subNQN, Name: "greedy", Size: 1 << 20, Budget: 1 << 30})
			return err
		}, target.ErrNoCapacity, "of the target's memory"},
		{"unaligned size", func() error {
			_, err := r.tg.CreateNamespace(target.NamespaceRequest{Subsystem: subNQN, Name: "odd", Size: 1000})
			return err
		}, target.ErrInvalid, "multiples of 4096"},
		{"bad name", func() error {
			_, err := r.tg.CreateNamespace(target.NamespaceRequest{Subsystem: subNQN, Name: "../escape", Size: 1 << 20})
			return err
		}, target.ErrInvalid, "a name is"},
		{"unknown subsystem", func() error {
			_, err := r.tg.CreateNamespace(target.NamespaceRequest{Subsystem: unknown, Name: "x", Size: 1 << 20})
			return err
		}, target.ErrNotFound, "no such subsystem"},
		{"unknown host", func() error { return r.tg.RemoveHost(subNQN, "nqn.2026-11.io.nprdma:stranger") }, target.ErrNotFound, "allow-list"},
		{"the configuration's host", func() error { return r.tg.RemoveHost(subNQN, hostNQN) }, target.ErrConfigured, "remove it there"},
		{"bad host NQN", func() error { return r.tg.AddHost(subNQN, target.HostConfig{NQN: "host"}) }, target.ErrInvalid, "nqn."},
		{"missing host key file", func() error {
			return r.tg.AddHost(subNQN, target.HostConfig{NQN: "nqn.2026-11.io.nprdma:keyed", DHCHAPKeyFile: filepath.Join(t.TempDir(), "none.key")})
		}, target.ErrInvalid, "DH-HMAC-CHAP"},
		{"controller key file without the host's", func() error {
			return r.tg.AddHost(subNQN, target.HostConfig{NQN: "nqn.2026-11.io.nprdma:keyed", DHCHAPCtrlKeyFile: filepath.Join(t.TempDir(), "ctrl.key")})
		}, target.ErrInvalid, "needs the host's key file"},
		{"shrink", func() error { _, err := r.tg.ResizeNamespace(subNQN, 1, 4096*16); return err }, target.ErrInvalid, "only grow"},
		{"beyond the maximum size", func() error { _, err := r.tg.ResizeNamespace(subNQN, 1, 1<<40); return err }, target.ErrInvalid, "max size"},
		{"resize of an unknown namespace", func() error { _, err := r.tg.ResizeNamespace(subNQN, 9, 1<<20); return err }, target.ErrNotFound, "no such namespace"},
		{"delete of the configuration's namespace", func() error { return r.tg.DeleteNamespace(subNQN, 3, true) }, target.ErrConfigured, "remove it there"},
		{"delete of the configuration's subsystem", func() error { return r.tg.DeleteSubsystem(subNQN, true) }, target.ErrConfigured, "remove it there"},
		{"duplicate subsystem", func() error {
			_, err := r.tg.CreateSubsystem(target.SubsystemConfig{NQN: subNQN})
			return err
		}, target.ErrExists, "exists already"},
		{"bad subsystem NQN", func() error {
			_, err := r.tg.CreateSubsystem(target.SubsystemConfig{NQN: "db"})
			return err
		}, target.ErrInvalid, "nqn."},
	} {
		err := c.do()
		if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want %v saying %q", c.name, err, c.kind, c.says)
		}
		if got := stable(t, r.tg); got != want {
			t.Fatalf("%s changed the inventory:\n%s", c.name, got)
		}
		if got := files(); !slices.Equal(got, wantFiles) {
			t.Fatalf("%s changed the volume directory: %v", c.name, got)
		}
	}
}

// TestManageFailedMetadataStoreRefusesEveryChange: once the store's
// directory is gone, every change fails wrapping ErrMetadataStore and
// changes nothing, not even a file in the volume directory.
func TestManageFailedMetadataStoreRefusesEveryChange(t *testing.T) {
	r := newManageRig(t)
	const other = "nqn.2026-11.io.nprdma:other"
	if _, err := r.tg.CreateSubsystem(target.SubsystemConfig{NQN: other}); err != nil {
		t.Fatal(err)
	}
	if err := r.tg.AddHost(other, target.HostConfig{NQN: hostNQN}); err != nil {
		t.Fatal(err)
	}
	n, err := r.tg.CreateNamespace(target.NamespaceRequest{Subsystem: other, Name: "v", Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	want := stable(t, r.tg)
	if err := os.RemoveAll(r.dataDir); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	for _, c := range []struct {
		name string
		do   func() error
	}{
		{"create subsystem", func() error {
			_, err := r.tg.CreateSubsystem(target.SubsystemConfig{NQN: "nqn.2026-11.io.nprdma:new"})
			return err
		}},
		{"delete subsystem", func() error { return r.tg.DeleteSubsystem(other, true) }},
		{"add host", func() error { return r.tg.AddHost(other, target.HostConfig{NQN: "nqn.2026-11.io.nprdma:new-host"}) }},
		{"remove host", func() error { return r.tg.RemoveHost(other, hostNQN) }},
		{"create namespace", func() error {
			_, err := r.tg.CreateNamespace(target.NamespaceRequest{Subsystem: other, Name: "w", Size: 1 << 20})
			return err
		}},
		{"resize namespace", func() error { _, err := r.tg.ResizeNamespace(other, n.NSID(), 2<<20); return err }},
		{"delete namespace", func() error { return r.tg.DeleteNamespace(other, n.NSID(), true) }},
	} {
		err := c.do()
		if !errors.Is(err, target.ErrMetadataStore) {
			t.Errorf("%s with the store's directory removed: %v, want ErrMetadataStore", c.name, err)
		}
		once.Do(func() { t.Logf("%s: %v", c.name, err) })
		if got := stable(t, r.tg); got != want {
			t.Fatalf("%s changed the inventory:\n%s", c.name, got)
		}
		if _, err := os.Stat(filepath.Join(r.volDir, "w.img")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: a backing file was created: %v", c.name, err)
		}
		if st, err := os.Stat(n.Backing()); err != nil || st.Size() != 1<<20 {
			t.Fatalf("%s changed the namespace's file: %v %v", c.name, st, err)
		}
	}
}
