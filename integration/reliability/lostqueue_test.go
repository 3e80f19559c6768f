package reliability_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/internal/logtest"
	"github.com/nprdma/nprdma/internal/promtest"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/link"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nprdma/tcp"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/fabric"
	"github.com/nprdma/nprdma/target"
)

// cutter is a host provider whose connections a test can cut: Cut breaks
// every link dialled so far, while later dials work, so the host
// reconnects. By default the links are reset, as a network failure resets
// them, and both sides see it. Silent links instead fail for the host only
// (its queue pairs go down at once) while the target sees nothing: the
// connection stays open and whatever either side sends is dropped, as when
// a network path dies without a reset; the target notices only at its own
// timeouts. Silent links hide the provider's optional interfaces (no direct
// completion).
type cutter struct {
	nprdma.Provider
	silent bool
	mu     sync.Mutex
	links  []link.Link
}

func (c *cutter) Dial(ctx context.Context, addr string, hello link.Hello) (link.Link, link.Hello, error) {
	l, h, err := c.Provider.Dial(ctx, addr, hello)
	if err != nil {
		return nil, h, err
	}
	if c.silent {
		l = &silentLink{Link: l}
	}
	c.mu.Lock()
	c.links = append(c.links, l)
	c.mu.Unlock()
	return l, h, nil
}

// Cut breaks every connection of the host.
func (c *cutter) Cut() {
	c.mu.Lock()
	links := c.links
	if !c.silent {
		c.links = nil
	}
	c.mu.Unlock()
	for _, l := range links {
		if sl, ok := l.(*silentLink); ok {
			sl.silence()
		} else {
			l.Abort()
		}
	}
}

// close aborts silent links for real (the test's end).
func (c *cutter) close() {
	c.mu.Lock()
	links := c.links
	c.links = nil
	c.mu.Unlock()
	for _, l := range links {
		if sl, ok := l.(*silentLink); ok {
			sl.Link.Abort()
		}
	}
}

type silentLink struct {
	link.Link
	silent atomic.Bool
	mu     sync.Mutex // orders deliveries and silence
	rx     link.Receiver
}

func (l *silentLink) Start(r link.Receiver) {
	l.mu.Lock()
	l.rx = r
	l.mu.Unlock()
	l.Link.Start(silentReceiver{l})
}

func (l *silentLink) Send(pkts []link.Packet) {
	if !l.silent.Load() {
		l.Link.Send(pkts)
		return
	}
	for _, p := range pkts {
		if p.Buf != nil {
			p.Buf.Release()
		}
	}
}

func (l *silentLink) Flush() {
	if !l.silent.Load() {
		l.Link.Flush()
	}
}

func (l *silentLink) Close() {
	if !l.silent.Load() {
		l.Link.Close()
	}
}

func (l *silentLink) Abort() {
	if !l.silent.Load() {
		l.Link.Abort()
	}
}

func (l *silentLink) silence() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rx == nil || l.silent.Swap(true) {
		return
	}
	l.rx.LinkDown(errors.New("test: the connection went silent"))
}

type silentReceiver struct{ l *silentLink }

func (r silentReceiver) Deliver(h *link.Header, p link.Payload) error {
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	if r.l.silent.Load() {
		return p.Discard(h.PayloadLen())
	}
	return r.l.rx.Deliver(h, p)
}

func (r silentReceiver) Idle() {
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	if !r.l.silent.Load() {
		r.l.rx.Idle()
	}
}

func (r silentReceiver) LinkDown(err error) {
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	if !r.l.silent.Swap(true) {
		r.l.rx.LinkDown(err)
	}
}

// lostQueueTarget is the layout of the lost-queue tests: the pinned
// baseline's two-sided-only namespaces, whose every command goes straight
// to the backing device as on a conventional target, so that a command
// held in the device has not changed anything yet. Namespace 1 (4 MiB) is on
// a faulty file, namespace 2 (4 MiB) on a plain one; hosts a and b are
// allowed. (In a namespace's swap region a write held in the device holds
// its page's busy or writeback bit, behind which the host's retry waits.)
func lostQueueTarget(t *testing.T, kind fabricKind, opts ...target.Option) *targetRig {
	t.Helper()
	r := &targetRig{kind: kind, dir: t.TempDir(),
		subs: []subSpec{{NQN: subNQN, Hosts: []string{hostNQN("a"), hostNQN("b")}, NS: []nsSpec{
			{NSID: 1, Size: 4 << 20, Faulty: true},
			{NSID: 2, Size: 4 << 20},
		}}},
		opts: append([]target.Option{target.WithPinnedBudget(64 << 10)}, opts...)}
	if kind.loop {
		r.lf = loop.NewFabric()
	}
	if err := r.start(""); err != nil {
		if strings.Contains(err.Error(), "mlock") {
			t.Skipf("pinning not permitted here: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { r.tg.Close() })
	for _, nsid := range []uint32{1, 2} {
		if r.namespace(t, nsid).OneSided() {
			t.Fatalf("namespace %d is not two-sided only", nsid)
		}
	}
	return r
}

// cuttableHost connects host to the rig's subsystem over a provider whose
// connections the test can cut (silently: see cutter).
func (r *targetRig) cuttableHost(t *testing.T, host string, silent bool) (*cutter, *initiator.Controller) {
	t.Helper()
	cut := &cutter{Provider: tcp.New(), silent: silent}
	if r.kind.loop {
		cut.Provider = loop.New(loop.WithFabric(r.lf))
	}
	t.Cleanup(cut.close)
	dev := nprdma.NewDevice(cut, nprdma.WithName("host"), nprdma.WithPinning(false))
	t.Cleanup(func() { dev.Close() })
	c := r.connect(t, dev, subNQN, host, initiator.WithIOQueues(1), initiator.WithQueueDepth(16),
		initiator.WithReconnectDelay(10*time.Millisecond))
	return cut, c
}

// holdFirst holds the first operation of the kinds in ops that touches byte
// off of f until release is called: entered is closed when it arrives.
func holdFirst(f *blockdev.Faulty, ops blockdev.Op, off int64) (entered <-chan struct{}, release func()) {
	in, out := make(chan struct{}), make(chan struct{})
	var once, releaseOnce sync.Once
	f.Intercept(ops, func(_ blockdev.Op, o, n int64) error {
		if o <= off && off < o+n {
			held := false
			once.Do(func() { held = true })
			if held {
				close(in)
				<-out
			}
		}
		return nil
	})
	return in, func() { releaseOnce.Do(func() { close(out) }) }
}

// lostChange is a command that changes one block, as the lost connection's
// command in the tests.
type lostChange struct {
	name   string // the target's name of the command (its metric label)
	change func(n *initiator.Namespace, off int64) error
	want   func(p []byte, off int64) // the block's content after it
}

var lostChanges = []lostChange{
	{"write", func(n *initiator.Namespace, off int64) error {
		b := make([]byte, blockSize)
		fillPattern(b, off, 1)
		_, err := n.WriteAt(b, off)
		return err
	}, func(p []byte, off int64) { fillPattern(p, off, 1) }},
	{"write-zeroes", func(n *initiator.Namespace, off int64) error { return n.WriteZeroes(off, blockSize) },
		func(p []byte, _ int64) { clear(p) }},
	{"dataset-management", func(n *initiator.Namespace, off int64) error { return n.Trim(off, blockSize) },
		func(p []byte, _ int64) { clear(p) }},
}

// TestLostWriteCannotOverwriteALaterOne: a write (a write-zeroes, a trim)
// is held in the backing device when the host's connection is reset; the
// initiator reconnects and retries it on the new controller; once that is
// acknowledged the host writes new data to the same block. Then the device
// lets the old connection's command go. The block must read back the new
// data: the old command was never acknowledged, the new write was. Before
// the target fenced failed queues, the retry and the new write went
// through at once and the old command landed last, wiping the
// acknowledged write ("block 7 reads back what the lost connection's
// write wrote").
func TestLostWriteCannotOverwriteALaterOne(t *testing.T) {
	for _, kind := range []fabricKind{loopFabric, tcpFabric} {
		for _, old := range lostChanges {
			t.Run(kind.name+"/"+old.name, func(t *testing.T) {
				r := lostQueueTarget(t, kind)
				cut, c := r.cuttableHost(t, "a", false)
				testLostChange(t, r, cut, c, old)
			})
		}
	}
}

// TestSilentlyLostWriteCannotOverwriteALaterOne is the same with a link
// that fails silently (tcp): the host gives up on it and reconnects while
// the target still sees the old connection alive, so the target cannot
// fence the old queue on its own. The host's Connect names the controller
// it replaces and the target tears that down first. Without that ("block 7
// reads back what the lost connection's write wrote") the retried write
// and the later one went through at once and the old one landed last.
func TestSilentlyLostWriteCannotOverwriteALaterOne(t *testing.T) {
	for _, old := range lostChanges {
		t.Run(old.name, func(t *testing.T) {
			r := lostQueueTarget(t, tcpFabric)
			cut, c := r.cuttableHost(t, "a", true)
			cntlid := c.CNTLID()
			testLostChange(t, r, cut, c, old)
			if got := promtest.Sum(t, r.reg, "nprdma_target_controllers_replaced_total"); got != 1 {
				t.Fatalf("%v controllers replaced, want 1 (controller %d)", got, cntlid)
			}
		})
	}
}

func testLostChange(t *testing.T, r *targetRig, cut *cutter, c *initiator.Controller, old lostChange) {
	n := openNamespace(t, c, 1)
	const block = 7
	off := int64(block * blockSize)
	before := make([]byte, blockSize)
	fillPattern(before, off, 3)
	if _, err := n.WriteAt(before, off); err != nil {
		t.Fatal(err)
	}

	entered, release := holdFirst(r.faulty[1], blockdev.OpWrite|blockdev.OpWriteFUA|blockdev.OpDiscard, off)
	defer release()
	base := promtest.Sum(t, r.reg, "nprdma_target_commands_total", "opcode", old.name)
	later := make([]byte, blockSize)
	fillPattern(later, off, 2)
	oldDone, laterDone := make(chan error, 1), make(chan error, 1)
	go func() {
		err := old.change(n, off)
		oldDone <- err
		if err == nil {
			_, err = n.WriteAt(later, off) // issued once the old change is acknowledged
		}
		laterDone <- err
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatalf("the %s never reached the backing device", old.name)
	}
	cntlid := c.CNTLID()
	cut.Cut()

	// Either the host gets the later write acknowledged while the
	// old command is still in the device (what must not lead to a
	// loss), or the target holds the retry back until it is done.
	var laterErr error
	laterReturned := false
	if !eventually(30*time.Second, func() bool {
		select {
		case laterErr = <-laterDone:
			laterReturned = true
			return true
		default:
		}
		return promtest.Sum(t, r.reg, "nprdma_target_commands_held") >= 1
	}) {
		t.Fatalf("30 s after the cut: the retried %s neither completed nor is held by the target", old.name)
	}
	t.Logf("later write acknowledged before the old %s left the device: %v", old.name, laterReturned)
	release()
	if !laterReturned {
		select {
		case laterErr = <-laterDone:
		case <-time.After(30 * time.Second):
			t.Fatal("the retried command and the later write did not complete after the old one left the device")
		}
	}
	if err := <-oldDone; err != nil {
		t.Fatalf("the retried %s: %v", old.name, err)
	}
	if laterErr != nil {
		t.Fatalf("the later write: %v", laterErr)
	}
	if c.CNTLID() == cntlid {
		t.Fatalf("the host did not reconnect (controller %d)", cntlid)
	}
	// The old command and its retry (and the later write, a write too)
	// have all finished on the target: the read comes after them.
	want := base + 2
	if old.name == "write" {
		want++
	}
	if !eventually(10*time.Second, func() bool { return promtest.Sum(t, r.reg, "nprdma_target_commands_total", "opcode", old.name) >= want }) {
		t.Fatalf("the target completed %v %s commands after the cut, want %v", promtest.Sum(t, r.reg, "nprdma_target_commands_total", "opcode", old.name)-base, old.name, want-base)
	}
	got := make([]byte, blockSize)
	if _, err := n.ReadAt(got, off); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, later) {
		lost := make([]byte, blockSize)
		old.want(lost, off)
		what := "neither"
		if bytes.Equal(got, lost) {
			what = "what the lost connection's " + old.name + " wrote"
		}
		t.Fatalf("block %d does not hold the write acknowledged last: it reads back %s", block, what)
	}
}

// TestWedgedLostWriteIsBounded: the lost connection's write never leaves
// the device. The host reconnects at once; its retry of that write, and a
// later write to the same block, wait for the fence timeout and fail with
// Namespace Not Ready (retryable), with a log line saying why; nothing else
// is held up meanwhile: the host reads that block, writes other blocks of
// the namespace and another namespace, and another host writes the same
// namespace. Once the device lets the old write go, the host writes the
// block again.
func TestWedgedLostWriteIsBounded(t *testing.T) {
	logs := &logtest.Buffer{}
	const fenceTimeout = 300 * time.Millisecond
	r := lostQueueTarget(t, loopFabric, target.WithFenceTimeout(fenceTimeout),
		target.WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))))
	cut, c := r.cuttableHost(t, "a", false)
	n1, n2 := openNamespace(t, c, 1), openNamespace(t, c, 2)
	devB, _ := r.hostDevice(t)
	b1 := openNamespace(t, r.connect(t, devB, subNQN, "b"), 1)

	const block = 7
	off := int64(block * blockSize)
	before := make([]byte, 16*blockSize)
	fillPattern(before, 0, 5)
	if _, err := n1.WriteAt(before, 0); err != nil {
		t.Fatal(err)
	}
	entered, release := holdFirst(r.faulty[1], blockdev.OpWrite|blockdev.OpWriteFUA|blockdev.OpDiscard, off)
	defer release()
	w1 := make([]byte, blockSize)
	fillPattern(w1, off, 6)
	oldDone := make(chan error, 1)
	go func() {
		_, err := n1.WriteAt(w1, off)
		oldDone <- err
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the write never reached the backing device")
	}
	cut.Cut()

	// The retry is held, then fails: bounded, retryable, said.
	var err error
	select {
	case err = <-oldDone:
	case <-time.After(30 * time.Second):
		t.Fatal("the retried write still waits 30 s after the cut")
	}
	se := statusOf(err)
	if se == nil || !errors.Is(err, nvme.StatusNamespaceNotReady) || se.Status.DNR() {
		t.Fatalf("the retried write: %v; want Namespace Not Ready without DNR", err)
	}
	for _, want := range []string{"held back", hostNQN("a"), "nsid=1"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the target's log lacks %q:\n%s", want, logs.String())
		}
	}
	// A later write of the same block is held too: it could be overwritten.
	if _, err := n1.WriteAt(w1, off); !errors.Is(err, nvme.StatusNamespaceNotReady) {
		t.Fatalf("a later write of the same block: %v; want Namespace Not Ready", err)
	}

	// Nothing else waits: reads, other blocks, another namespace, another host.
	got := make([]byte, blockSize)
	if _, err := n1.ReadAt(got, off); err != nil {
		t.Fatalf("read of the block: %v", err)
	}
	if err := checkPattern(got, off, 5); err != nil {
		t.Fatalf("the block before the old write left the device: %v", err)
	}
	start := time.Now()
	for i, w := range []struct {
		what string
		n    *initiator.Namespace
		off  int64
	}{{"another block", n1, (block + 1) * blockSize}, {"namespace 2", n2, off}, {"host b", b1, (block + 2) * blockSize}} {
		p := make([]byte, blockSize)
		fillPattern(p, w.off, uint64(10+i))
		if _, err := w.n.WriteAt(p, w.off); err != nil {
			t.Fatalf("write to %s: %v", w.what, err)
		}
		if _, err := w.n.ReadAt(got, w.off); err != nil {
			t.Fatalf("read of %s: %v", w.what, err)
		}
		if err := checkPattern(got, w.off, uint64(10+i)); err != nil {
			t.Fatalf("%s: %v", w.what, err)
		}
	}
	t.Logf("other blocks, namespace 2 and host b written and read back in %v while the old write stayed in the device",
		time.Since(start).Round(time.Millisecond))
	if held := promtest.Sum(t, r.reg, "nprdma_target_held_timeouts_total"); held != 2 {
		t.Errorf("%v writes timed out waiting, want 2", held)
	}

	// The old write leaves the device; the block can be written again.
	base := promtest.Sum(t, r.reg, "nprdma_target_commands_total", "opcode", "write") // every write but the old one is done
	release()
	if !eventually(10*time.Second, func() bool {
		return promtest.Sum(t, r.reg, "nprdma_target_commands_total", "opcode", "write") >= base+1
	}) {
		t.Fatal("the old write did not complete after the device let it go")
	}
	w3 := make([]byte, blockSize)
	fillPattern(w3, off, 7)
	if _, err := n1.WriteAt(w3, off); err != nil {
		t.Fatalf("write of the block once the old write is done: %v", err)
	}
	if _, err := n1.ReadAt(got, off); err != nil {
		t.Fatal(err)
	}
	if err := checkPattern(got, off, 7); err != nil {
		t.Fatal(err)
	}
}

// TestFailedQueueHoldsItsSiblingsAndDropsTheirHeldWrites, with a host of
// its own on nvme/fabric: queue 1 of a controller fails (the host closes
// it) while its write is in the device. A write of queue 2 to the same
// block waits for it; one to another block does not. When queue 2 fails
// too, its waiting write is dropped, never executed (it was never
// acknowledged): once queue 1's write leaves the device, the block holds
// that write's data.
func TestFailedQueueHoldsItsSiblingsAndDropsTheirHeldWrites(t *testing.T) {
	r := lostQueueTarget(t, loopFabric)
	dev, _ := r.hostDevice(t)
	c := dialRaw(t, dev, r.tg.Addr(), subNQN, "a", 2)
	q1, q2 := c.dialIO(t, 1, 16), c.dialIO(t, 2, 16)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	write := func(q *fabric.HostQueue, block uint64, seed uint64) error {
		p := make([]byte, blockSize)
		fillPattern(p, int64(block)*blockSize, seed)
		cmd, err := nvme.WriteCommand(1, block, 1, 0, nvme.NullSGL())
		if err != nil {
			return err
		}
		_, err = q.Submit(ctx, cmd, p)
		return err
	}
	const block = 7
	entered, release := holdFirst(r.faulty[1], blockdev.OpWrite, block*blockSize)
	defer release()
	base := promtest.Sum(t, r.reg, "nprdma_target_commands_total", "opcode", "write")
	w1 := make(chan error, 1)
	go func() { w1 <- write(q1, block, 1) }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the write never reached the backing device")
	}
	conns := promtest.Sum(t, r.reg, "nprdma_target_connections")
	q1.Close()
	if err := <-w1; !errors.Is(err, fabric.ErrQueueFailed) {
		t.Fatalf("write on the closed queue: %v", err)
	}
	// The target notices the loss by itself; a write sent before it has
	// could not be told from one sent before the loss.
	if !eventually(10*time.Second, func() bool { return promtest.Sum(t, r.reg, "nprdma_target_connections") == conns-1 }) {
		t.Fatal("the target did not notice queue 1's loss")
	}

	w2 := make(chan error, 1)
	go func() { w2 <- write(q2, block, 2) }()
	if !eventually(10*time.Second, func() bool { return promtest.Sum(t, r.reg, "nprdma_target_commands_held") == 1 }) {
		t.Fatal("queue 2's write of the same block is not held")
	}
	if err := write(q2, block+1, 3); err != nil {
		t.Fatalf("queue 2's write of another block: %v", err)
	}
	select {
	case err := <-w2:
		t.Fatalf("queue 2's write of the same block returned (%v) while queue 1's is in the device", err)
	default:
	}
	q2.Close()
	if err := <-w2; !errors.Is(err, fabric.ErrQueueFailed) {
		t.Fatalf("held write on the closed queue: %v", err)
	}
	if !eventually(10*time.Second, func() bool { return promtest.Sum(t, r.reg, "nprdma_target_fenced_commands_dropped_total") == 1 }) {
		t.Fatalf("%v held writes dropped, want 1", promtest.Sum(t, r.reg, "nprdma_target_fenced_commands_dropped_total"))
	}
	if held := promtest.Sum(t, r.reg, "nprdma_target_commands_held"); held != 0 {
		t.Fatalf("%v commands still held", held)
	}

	release()
	// Queue 1's write, queue 2's two (one dropped).
	if !eventually(10*time.Second, func() bool {
		return promtest.Sum(t, r.reg, "nprdma_target_commands_total", "opcode", "write") >= base+3
	}) {
		t.Fatal("queue 1's write did not complete after the device let it go")
	}
	q := c.dialIO(t, 1, 16)
	got := make([]byte, blockSize)
	cmd, err := nvme.ReadCommand(1, block, 1, 0, nvme.NullSGL())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Submit(ctx, cmd, got); err != nil {
		t.Fatal(err)
	}
	if err := checkPattern(got, block*blockSize, 1); err != nil {
		t.Fatalf("block %d after the dropped write: %v", block, err)
	}
}
