package reliability_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/fabric"
)

// accessTarget serves two namespaces to hosts a and b only.
func accessTarget(t *testing.T) *targetRig {
	return newTarget(t, loopFabric, []subSpec{{NQN: subNQN, Hosts: []string{hostNQN("a"), hostNQN("b")}, NS: []nsSpec{
		{NSID: 1, Size: 4 << 20, Budget: 4 << 20}, {NSID: 2, Size: 2 << 20, Budget: 2 << 20}}}})
}

// requireRemoteAccessError checks that a one-sided READ was refused by the
// target's NIC engine: a remote access error that failed the queue, and
// nothing of the region in the buffer.
func requireRemoteAccessError(t *testing.T, what string, got []byte, err error) {
	t.Helper()
	if !errors.Is(err, nprdma.ErrRemoteAccess) || !errors.Is(err, fabric.ErrQueueFailed) {
		t.Fatalf("%s: %v, want a remote access error failing the queue", what, err)
	}
	for i, b := range got {
		if b != 0xEE {
			t.Fatalf("%s: byte %d of the buffer changed to %#x although the READ was refused", what, i, b)
		}
	}
}

// writeKnown writes a pattern over namespace nsid through an initiator of
// host a, disconnects, and returns the pattern. Call it before any other
// controller exists.
func writeKnown(t *testing.T, r *targetRig, nsid uint32, size int, seed uint64) []byte {
	t.Helper()
	dev, _ := r.hostDevice(t)
	c := r.connect(t, dev, subNQN, "a")
	n := openNamespace(t, c, nsid)
	data := make([]byte, size)
	fillPattern(data, 0, seed)
	if _, err := n.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	c.Close()
	// The target tears the controller down once it sees the queues go.
	if !eventually(10*time.Second, func() bool { return r.tg.Controllers() == 0 }) {
		t.Fatalf("%d controllers left after the writer disconnected", r.tg.Controllers())
	}
	return data
}

// TestGuessedRKeyIsRefused: keys a host was never told — random ones, and
// its own key plus and minus one — are remote access errors on its own
// queue pair, counted by the target, with nothing read; its own key works.
func TestGuessedRKeyIsRefused(t *testing.T) {
	r := accessTarget(t)
	data := writeKnown(t, r, 1, 64<<10, 11)
	dev, _ := r.hostDevice(t)
	c := dialRaw(t, dev, r.tg.Addr(), subNQN, "a", 1)
	d := c.mustRegion(t, 1)
	var guesses []uint32
	for len(guesses) < 16 {
		var b [4]byte
		rand.Read(b[:])
		if k := binary.LittleEndian.Uint32(b[:]); k != d.RKey {
			guesses = append(guesses, k)
		}
	}
	guesses = append(guesses, d.RKey+1, d.RKey-1)
	before := r.tg.Device().Stats().RemoteAccessErrors
	for _, k := range guesses {
		q := c.dialIO(t, 1, 8) // a refused key fails the queue pair: a fresh one each time
		got, err := c.readRemote(q, d, k, 0, 4096)
		requireRemoteAccessError(t, "READ with a guessed rkey", got, err)
	}
	if got := r.tg.Device().Stats().RemoteAccessErrors - before; got != uint64(len(guesses)) {
		t.Fatalf("target counted %d remote access errors, want %d", got, len(guesses))
	}
	got, err := c.readRemote(c.dialIO(t, 1, 8), d, d.RKey, 0, 64<<10)
	if err != nil {
		t.Fatalf("READ with the host's own rkey: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("READ with the host's own rkey returned wrong data")
	}
}

// TestStaleRKeyIsRefused: an rkey dies with the registration it came from —
// when its controller disconnects (a new controller of the same host gets
// a remote access error with it) and when its controller is reset
// (CC.EN 1→0) — and the target's unpinned registrations return to what
// the live controllers hold.
func TestStaleRKeyIsRefused(t *testing.T) {
	r := accessTarget(t)
	writeKnown(t, r, 1, 64<<10, 12)
	dev, _ := r.hostDevice(t)
	np := func() int64 { return r.tg.Device().Stats().UnpinnedBytes }

	old := dialRaw(t, dev, r.tg.Addr(), subNQN, "a", 1)
	stale := old.mustRegion(t, 1)
	if _, err := old.readRemote(old.dialIO(t, 1, 8), stale, stale.RKey, 0, 4096); err != nil {
		t.Fatalf("READ with a live rkey: %v", err)
	}
	if np() != 4<<20 {
		t.Fatalf("%d unpinned bytes registered, want the namespace's 4 MiB", np())
	}
	old.close()
	if !eventually(10*time.Second, func() bool { return r.tg.Controllers() == 0 && np() == 0 }) {
		t.Fatalf("after the disconnect: %d controllers, %d unpinned bytes registered", r.tg.Controllers(), np())
	}
	c := dialRaw(t, dev, r.tg.Addr(), subNQN, "a", 1)
	fresh := c.mustRegion(t, 1)
	if fresh.RKey == stale.RKey || fresh.Magic == stale.Magic {
		t.Fatalf("the new controller got the old key %#x or magic %#x", stale.RKey, stale.Magic)
	}
	got, err := c.readRemote(c.dialIO(t, 1, 8), stale, stale.RKey, 0, 4096)
	requireRemoteAccessError(t, "READ with the rkey of a disconnected controller", got, err)

	// A controller reset revokes too; the re-enabled controller registers
	// afresh.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.propertySet(ctx, nvme.CC{IOSQES: 6, IOCQES: 4}); err != nil {
		t.Fatal(err)
	}
	if np() != 0 {
		t.Fatalf("%d unpinned bytes registered after CC.EN 1→0", np())
	}
	if err := c.propertySet(ctx, nvme.CC{EN: true, IOSQES: 6, IOCQES: 4}); err != nil {
		t.Fatal(err)
	}
	nq, _ := nvme.NumberOfQueues{Submission: 1, Completion: 1}.Encode()
	if _, err := c.admin.Submit(ctx, nvme.SetFeaturesCommand(nvme.FeatureNumberOfQueues, nq, false), nil); err != nil {
		t.Fatal(err)
	}
	again := c.mustRegion(t, 1)
	got, err = c.readRemote(c.dialIO(t, 1, 8), fresh, fresh.RKey, 0, 4096)
	requireRemoteAccessError(t, "READ with the rkey from before a controller reset", got, err)
	if _, err := c.readRemote(c.dialIO(t, 1, 8), again, again.RKey, 0, 4096); err != nil {
		t.Fatalf("READ with the key registered after the reset: %v", err)
	}
}

// TestStaleRKeyAfterNamespaceRemoval: removing a namespace while a host is
// connected revokes that host's rkey for it at once (remote access error)
// and its unpinned registration; commands naming it fail with Invalid
// Namespace; the host's other namespace goes on working, and so does the
// initiator, which reports Invalid Namespace for the removed one.
func TestStaleRKeyAfterNamespaceRemoval(t *testing.T) {
	r := accessTarget(t)
	data1 := writeKnown(t, r, 1, 64<<10, 13)
	devA, _ := r.hostDevice(t)
	devB, _ := r.hostDevice(t)
	c := dialRaw(t, devA, r.tg.Addr(), subNQN, "a", 1)
	d1, d2 := c.mustRegion(t, 1), c.mustRegion(t, 2)
	ib := r.connect(t, devB, subNQN, "b")
	nb1, nb2 := openNamespace(t, ib, 1), openNamespace(t, ib, 2)
	if _, err := nb2.ReadAt(make([]byte, blockSize), 0); err != nil {
		t.Fatal(err)
	}
	np := r.tg.Device().Stats().UnpinnedBytes
	if np != 2*(4<<20+2<<20) {
		t.Fatalf("%d unpinned bytes registered before the removal, want both namespaces for both hosts", np)
	}

	if err := r.tg.Subsystem(subNQN).RemoveNamespace(2); err != nil {
		t.Fatal(err)
	}
	if got := r.tg.Device().Stats().UnpinnedBytes; got != 2*(4<<20) {
		t.Fatalf("%d unpinned bytes registered after the removal, want namespace 1's for both hosts", got)
	}
	got, err := c.readRemote(c.dialIO(t, 1, 8), d2, d2.RKey, 0, 4096)
	requireRemoteAccessError(t, "READ of a removed namespace with its old rkey", got, err)
	q := c.dialIO(t, 1, 8)
	got, err = c.readRemote(q, d1, d1.RKey, 0, 64<<10)
	if err != nil || !bytes.Equal(got, data1) {
		t.Fatalf("READ of the remaining namespace: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.region(ctx, 2); !errors.Is(err, nvme.StatusInvalidNamespaceOrFormat) {
		t.Fatalf("region descriptor of the removed namespace: %v, want Invalid Namespace", err)
	}
	read, _ := nvme.ReadCommand(2, 0, 1, 0, nvme.NullSGL())
	if _, err := q.Submit(ctx, read, make([]byte, blockSize)); !errors.Is(err, nvme.StatusInvalidNamespaceOrFormat) {
		t.Fatalf("Read of the removed namespace: %v, want Invalid Namespace", err)
	}

	// The initiator: its one-sided READ with the dead key fails the queue,
	// it reconnects, and the removed namespace is then Invalid Namespace.
	_, err = nb2.ReadAt(make([]byte, blockSize), 0)
	if !errors.Is(err, nvme.StatusInvalidNamespaceOrFormat) {
		t.Fatalf("initiator read of the removed namespace: %v, want Invalid Namespace", err)
	}
	got = make([]byte, 64<<10)
	if _, err := nb1.ReadAt(got, 0); err != nil || !bytes.Equal(got, data1) {
		t.Fatalf("initiator read of the remaining namespace: %v", err)
	}
	t.Logf("initiator: %d reconnects; removed namespace: %v", ib.Stats().Reconnects, err)
}

// TestRemoteWriteIntoTheCacheIsRefused: the namespace's region cannot be
// registered for remote writes at all, and an RDMA WRITE with the rkey a
// host was given (for READ) is refused by the NIC engine — remote access
// error, counted — and changes nothing in the namespace.
func TestRemoteWriteIntoTheCacheIsRefused(t *testing.T) {
	r := accessTarget(t)
	data := writeKnown(t, r, 1, 64<<10, 14)
	region := r.namespace(t, 1).Region()
	pd := r.tg.Device().AllocPD()
	defer pd.Close()
	for _, acc := range []nprdma.Access{nprdma.AccessRemoteRead | nprdma.AccessRemoteWrite | nprdma.AccessLocalWrite,
		nprdma.AccessLocalWrite | nprdma.AccessRemoteRead} {
		if mr, err := pd.RegisterUnpinned(region, acc); err == nil {
			mr.Deregister()
			t.Fatalf("the namespace's region was registered with %s", acc)
		}
	}

	dev, _ := r.hostDevice(t)
	c := dialRaw(t, dev, r.tg.Addr(), subNQN, "a", 1)
	d := c.mustRegion(t, 1)
	q := c.dialIO(t, 1, 8)
	buf, err := c.pool.Get(blockSize)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Release()
	for i := range buf.Bytes() {
		buf.Bytes()[i] = 0xAB
	}
	before := r.tg.Device().Stats()
	qp := q.QP()
	if err := qp.PostSend(nprdma.SendWR{Op: nprdma.OpWrite, SG: []nprdma.SGE{buf.SGE()}, RemoteAddr: d.Address, RKey: d.RKey, Signaled: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-qp.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the queue pair survived an RDMA WRITE into the cache")
	}
	if !errors.Is(qp.Err(), nprdma.ErrRemoteAccess) {
		t.Fatalf("queue pair error %v, want a remote access error", qp.Err())
	}
	after := r.tg.Device().Stats()
	if after.RemoteAccessErrors != before.RemoteAccessErrors+1 || after.WritesServed != before.WritesServed {
		t.Fatalf("target: remote access errors %d -> %d, writes served %d -> %d", before.RemoteAccessErrors,
			after.RemoteAccessErrors, before.WritesServed, after.WritesServed)
	}
	got, err := c.readRemote(c.dialIO(t, 1, 8), d, d.RKey, 0, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the namespace changed after a refused RDMA WRITE")
	}
}
