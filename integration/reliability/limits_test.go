package reliability_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/internal/promtest"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/fabric"
	"github.com/nprdma/nprdma/target"
)

// oneNamespace is a subsystem with one 4 MiB namespace that every host may
// use.
var oneNamespace = []subSpec{{NQN: subNQN, AllowAny: true, NS: []nsSpec{{NSID: 1, Size: 4 << 20, Budget: 1 << 20}}}}

// requireReject checks that err is a CM REJECT with status want.
func requireReject(t *testing.T, what string, err error, want nvme.CMRejectStatus) {
	t.Helper()
	var rej *nvme.CMRejectError
	if !errors.As(err, &rej) || rej.Status != want {
		t.Fatalf("%s: %v, want a REJECT with %s", what, err, want)
	}
}

// TestLimitControllers: beyond WithMaxControllers a Connect is answered
// with Controller Busy and leaves nothing behind; once a controller goes, a
// new one is admitted.
func TestLimitControllers(t *testing.T) {
	r := newTarget(t, loopFabric, oneNamespace, target.WithMaxControllers(2))
	dev, _ := r.hostDevice(t)
	a := r.connect(t, dev, subNQN, "a")
	r.connect(t, dev, subNQN, "b")
	_, err := r.connectE(dev, subNQN, hostOptions("c")...)
	if !errors.Is(err, nvme.StatusControllerBusy) {
		t.Fatalf("third controller: %v, want Controller Busy", err)
	}
	if n := r.tg.Controllers(); n != 2 {
		t.Fatalf("%d controllers after the refused Connect, want 2", n)
	}
	t.Logf("refused: %v", err)
	a.Close()
	if !eventually(10*time.Second, func() bool { return r.tg.Controllers() == 1 }) {
		t.Fatal("the closed controller is not torn down")
	}
	c := r.connect(t, dev, subNQN, "c")
	n := openNamespace(t, c, 1)
	if _, err := n.WriteAt(make([]byte, blockSize), 0); err != nil {
		t.Fatal(err)
	}
}

// TestLimitConnections: beyond WithMaxConnections a connection request is
// refused with the REJECT status "no resources" — whether the queues that
// hold the slots ever sent Connect or not — and the initiator reports it;
// a slot that frees is usable again.
func TestLimitConnections(t *testing.T) {
	r := newTarget(t, loopFabric, oneNamespace, target.WithMaxConnections(4))
	dev, _ := r.hostDevice(t)
	c := r.connect(t, dev, subNQN, "a", initiator.WithIOQueues(1)) // 2 queues
	pd := dev.AllocPD()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// A peer that connects queue pairs and never sends Connect.
	var idle []*fabric.HostQueue
	for i := 0; i < 2; i++ {
		q, err := fabric.Dial(ctx, pd, r.tg.Addr(), fabric.QueueConfig{QID: 0, Entries: 32, CNTLID: nvme.DynamicControllerID})
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, q)
	}
	_, err := fabric.Dial(ctx, pd, r.tg.Addr(), fabric.QueueConfig{QID: 0, Entries: 32, CNTLID: nvme.DynamicControllerID})
	requireReject(t, "fifth queue", err, nvme.CMRejectNoResources)
	_, err = r.connectE(dev, subNQN, hostOptions("b")...)
	requireReject(t, "a second host beyond the limit", err, nvme.CMRejectNoResources)
	t.Logf("refused: %v", err)
	// The target counts a queue once its accept loop has it, just after the
	// host saw the ACCEPT.
	if !eventually(10*time.Second, func() bool { return promtest.Sum(t, r.reg, "nprdma_target_connections") == 4 }) {
		t.Fatalf("target counts %v connections, want 4", promtest.Sum(t, r.reg, "nprdma_target_connections"))
	}
	for _, q := range idle {
		q.Close()
	}
	var b *initiator.Controller
	if !eventually(10*time.Second, func() bool {
		b, err = r.connectE(dev, subNQN, hostOptions("b", initiator.WithIOQueues(1))...)
		return err == nil
	}) {
		t.Fatalf("no connection after slots freed: %v", err)
	}
	defer b.Close()
	for _, ctrl := range []*initiator.Controller{c, b} {
		if _, err := openNamespace(t, ctrl, 1).ReadAt(make([]byte, blockSize), 0); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLimitIOQueues: a host asking for more I/O queues than
// WithMaxIOQueues gets the limit and works; a queue beyond the listener's
// QID limit is refused at the CM (invalid QID), one beyond the controller's
// grant at Connect (Connect Invalid Parameters).
func TestLimitIOQueues(t *testing.T) {
	r := newTarget(t, loopFabric, oneNamespace, target.WithMaxIOQueues(2))
	dev, _ := r.hostDevice(t)
	c := r.connect(t, dev, subNQN, "a", initiator.WithIOQueues(8))
	if got := c.IOQueues(); got != 2 {
		t.Fatalf("%d I/O queues granted, want 2", got)
	}
	n := openNamespace(t, c, 1)
	if _, err := n.WriteAt(make([]byte, 64<<10), 0); err != nil {
		t.Fatal(err)
	}
	raw := dialRaw(t, dev, r.tg.Addr(), subNQN, "b", 1)
	if raw.granted != 1 {
		t.Fatalf("raw controller granted %d queues, want 1", raw.granted)
	}
	_, err := raw.dialIOE(3, 8)
	requireReject(t, "queue 3", err, nvme.CMRejectInvalidQID)
	_, err = raw.dialIOE(2, 8)
	if !errors.Is(err, nvme.StatusConnectInvalidParameters) {
		t.Fatalf("queue 2 beyond the grant of 1: %v, want Connect Invalid Parameters", err)
	}
	raw.dialIO(t, 1, 8)
}

// TestLimitQueueDepth: an I/O queue deeper than WithQueueDepth is refused
// at the CM (invalid HSQSIZE); the initiator asking for more gets the limit
// (CAP.MQES, MAXCMD) and 64 concurrent requests on one queue of 16 entries
// all complete with the right data.
func TestLimitQueueDepth(t *testing.T) {
	r := newTarget(t, loopFabric, oneNamespace, target.WithQueueDepth(16))
	dev, _ := r.hostDevice(t)
	raw := dialRaw(t, dev, r.tg.Addr(), subNQN, "b", 1)
	_, err := raw.dialIOE(1, 17)
	requireReject(t, "a queue of 17 entries", err, nvme.CMRejectInvalidHSQSIZE)
	if raw.maxCmd != 16 {
		t.Fatalf("MAXCMD %d, want 16", raw.maxCmd)
	}
	raw.dialIO(t, 1, 16)

	c := r.connect(t, dev, subNQN, "a", initiator.WithQueueDepth(1024), initiator.WithIOQueues(1))
	n := openNamespace(t, c, 1)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			off := int64(g) * 16 << 10
			buf := make([]byte, 16<<10)
			got := make([]byte, len(buf))
			for i := 0; i < 8; i++ {
				seed := uint64(g*100 + i)
				fillPattern(buf, off, seed)
				if _, err := n.WriteAt(buf, off); err != nil {
					errs <- err
					return
				}
				if _, err := n.ReadAt(got, off); err != nil {
					errs <- err
					return
				}
				if err := checkPattern(got, off, seed); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestLimitTransferSize: Identify reports the MDTS of WithMaxTransfer; the
// initiator splits larger requests; a command above it is Invalid Field.
func TestLimitTransferSize(t *testing.T) {
	const mdts = 64 << 10
	r := newTarget(t, loopFabric, oneNamespace, target.WithMaxTransfer(mdts))
	dev, _ := r.hostDevice(t)
	c := r.connect(t, dev, subNQN, "a")
	ctx := context.Background()
	id, err := c.Identify(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := id.MaxTransfer(blockSize); got != mdts {
		t.Fatalf("MDTS says %d bytes, want %d", got, mdts)
	}
	n := openNamespace(t, c, 1)
	data := make([]byte, 1<<20)
	fillPattern(data, 0, 9)
	if _, err := n.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if _, err := n.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if err := checkPattern(got, 0, 9); err != nil {
		t.Fatal(err)
	}

	raw := dialRaw(t, dev, r.tg.Addr(), subNQN, "b", 1)
	q := raw.dialIO(t, 1, 8)
	buf, err := raw.pool.Get(2 * mdts)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Release()
	read, _ := nvme.ReadCommand(1, 0, 2*mdts/blockSize, 0, nvme.NullSGL())
	_, err = q.SubmitBuffer(ctx, read, buf, 0, 2*mdts)
	if !errors.Is(err, nvme.StatusInvalidField) {
		t.Fatalf("read of %d bytes: %v, want Invalid Field", 2*mdts, err)
	}
	write, _ := nvme.WriteCommand(1, 0, 2*mdts/blockSize, 0, nvme.NullSGL())
	_, err = q.SubmitBuffer(ctx, write, buf, 0, 2*mdts)
	if !errors.Is(err, nvme.StatusInvalidField) {
		t.Fatalf("write of %d bytes: %v, want Invalid Field", 2*mdts, err)
	}
	// The queue goes on.
	if _, err := q.SubmitBuffer(ctx, read, buf, 0, 2*mdts); !errors.Is(err, nvme.StatusInvalidField) {
		t.Fatalf("again: %v", err)
	}
	ok, _ := nvme.ReadCommand(1, 0, mdts/blockSize, 0, nvme.NullSGL())
	if _, err := q.SubmitBuffer(ctx, ok, buf, 0, mdts); err != nil {
		t.Fatalf("read of exactly MDTS: %v", err)
	}
	if err := checkPattern(buf.Bytes()[:mdts], 0, 9); err != nil {
		t.Fatal(err)
	}
}

// TestLimitNamespaces: AddNamespace beyond WithMaxNamespaces is refused with
// an error naming the limit; removing one makes room, and a connected host
// sees the change in the active namespace list.
func TestLimitNamespaces(t *testing.T) {
	r := newTarget(t, loopFabric, []subSpec{{NQN: subNQN, AllowAny: true, NS: []nsSpec{
		{NSID: 1, Size: 1 << 20}, {NSID: 2, Size: 1 << 20}}}}, target.WithMaxNamespaces(2))
	dev, _ := r.hostDevice(t)
	c := r.connect(t, dev, subNQN, "a")
	sub := r.tg.Subsystem(subNQN)
	add := func(nsid uint32) error {
		path := filepath.Join(t.TempDir(), "ns.img")
		if err := blockdev.Create(path, 1<<20); err != nil {
			t.Fatal(err)
		}
		bd, err := blockdev.Open(path, blockdev.WithLogger(quiet))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sub.AddNamespace(target.NamespaceConfig{NSID: nsid, Backing: bd}); err != nil {
			bd.Close()
			return err
		}
		return nil
	}
	err := add(3)
	if err == nil || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("third namespace: %v, want a refusal naming the limit", err)
	}
	t.Logf("refused: %v", err)
	if err := sub.RemoveNamespace(2); err != nil {
		t.Fatal(err)
	}
	if err := add(3); err != nil {
		t.Fatalf("after a removal: %v", err)
	}
	ids, err := c.NamespaceIDs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, []uint32{1, 3}) {
		t.Fatalf("active namespaces %v, want [1 3]", ids)
	}
}

// TestFairness: a host flooding the target with 4 KiB requests at queue
// depth 64 (writes and two-sided reads, which all take the target's command
// path) does not starve another host doing QD1 reads: the victim completes
// its reads. Its latency alone and under the flood is reported (one-sided
// and two-sided), not asserted.
func TestFairness(t *testing.T) {
	r := newTarget(t, tcpFabric, []subSpec{{NQN: subNQN, AllowAny: true, NS: []nsSpec{{NSID: 1, Size: 16 << 20, Budget: 16 << 20}}}})
	devV, _ := r.hostDevice(t)
	devF, _ := r.hostDevice(t)
	victims := map[string]*initiator.Namespace{
		"one-sided": openNamespace(t, r.connect(t, devV, subNQN, "victim1"), 1),
		"two-sided": openNamespace(t, r.connect(t, devV, subNQN, "victim2", initiator.WithOneSidedReads(false)), 1),
	}
	flood := openNamespace(t, r.connect(t, devF, subNQN, "flood", initiator.WithOneSidedReads(false),
		initiator.WithQueueDepth(64), initiator.WithIOQueues(2)), 1)
	// The victims read [0, 8 MiB), resident after this; the flood works on
	// [8 MiB, 16 MiB).
	warm := make([]byte, 1<<20)
	for off := int64(0); off < 8<<20; off += 1 << 20 {
		fillPattern(warm, off, 5)
		if _, err := victims["one-sided"].WriteAt(warm, off); err != nil {
			t.Fatal(err)
		}
	}
	const reads = 300
	victim := func(n *initiator.Namespace) ([]time.Duration, error) {
		rng := rand.New(rand.NewPCG(1, 2))
		buf := make([]byte, blockSize)
		lat := make([]time.Duration, 0, reads)
		for i := 0; i < reads; i++ {
			off := rng.Int64N(2048) * blockSize
			start := time.Now()
			if _, err := n.ReadAt(buf, off); err != nil {
				return lat, err
			}
			lat = append(lat, time.Since(start))
			if err := checkPattern(buf, off, 5); err != nil {
				return lat, err
			}
		}
		return lat, nil
	}
	alone := map[string][]time.Duration{}
	for _, mode := range []string{"one-sided", "two-sided"} {
		lat, err := victim(victims[mode])
		if err != nil {
			t.Fatal(err)
		}
		alone[mode] = lat
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var floodOps [64]int
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			buf := make([]byte, blockSize)
			for {
				select {
				case <-stop:
					return
				default:
				}
				off := 8<<20 + rng.Int64N(2048)*blockSize
				var err error
				if rng.IntN(2) == 0 {
					_, err = flood.WriteAt(buf, off)
				} else {
					_, err = flood.ReadAt(buf, off)
				}
				if err != nil {
					t.Errorf("flood: %v", err)
					return
				}
				floodOps[g]++
			}
		}()
	}
	time.Sleep(200 * time.Millisecond) // the flood is under way
	under := map[string][]time.Duration{}
	start := time.Now()
	for _, mode := range []string{"one-sided", "two-sided"} {
		done := make(chan struct{})
		var lat []time.Duration
		var err error
		go func() {
			lat, err = victim(victims[mode])
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Fatalf("victim (%s) starved: %d of %d reads in 60 s under the flood", mode, len(lat), reads)
		}
		if err != nil {
			t.Fatal(err)
		}
		under[mode] = lat
	}
	elapsed := time.Since(start)
	close(stop)
	wg.Wait()
	total := 0
	for _, n := range floodOps {
		total += n
	}
	t.Logf("flood: %d requests at QD64 (%.0f/s) while the victims read", total, float64(total)/elapsed.Seconds())
	for _, mode := range []string{"one-sided", "two-sided"} {
		t.Logf("victim %s QD1 4 KiB reads: alone p50 %v p99 %v; under the flood p50 %v p99 %v (p50 x%.1f)", mode,
			percentile(alone[mode], 50), percentile(alone[mode], 99), percentile(under[mode], 50), percentile(under[mode], 99),
			float64(percentile(under[mode], 50))/float64(percentile(alone[mode], 50)))
	}
}
