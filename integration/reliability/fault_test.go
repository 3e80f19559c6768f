package reliability_test

import (
	"bytes"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/swap"
)

// faultTarget is the layout of the fault-injection tests: namespace 1 on a
// faulty backing file (4 MiB, 256 KiB of DRAM: most of it lives on the
// device), namespace 2 on a plain one; hosts a (the victim) and b (the
// bystander) are allowed.
func faultTarget(t *testing.T) *targetRig {
	return newTarget(t, loopFabric, []subSpec{{NQN: subNQN, Hosts: []string{hostNQN("a"), hostNQN("b")}, NS: []nsSpec{
		{NSID: 1, Size: 4 << 20, Budget: 256 << 10, Faulty: true},
		{NSID: 2, Size: 4 << 20, Budget: 512 << 10},
	}}})
}

// requireMediaError checks that err carries the NVMe status want, of the
// media-error type.
func requireMediaError(t *testing.T, what string, err error, want nvme.Status) {
	t.Helper()
	se := statusOf(err)
	if se == nil || !errors.Is(err, want) || se.Status.SCT() != nvme.SCTMediaError {
		t.Fatalf("%s: %v, want the media error %s", what, err, want)
	}
}

// evicted waits until page of the target's namespace is not resident,
// reading other parts of the namespace through n to push it out.
func evicted(t *testing.T, r *targetRig, nsid uint32, page int, n *initiator.Namespace) {
	t.Helper()
	states := r.namespace(t, nsid).Region().States()
	buf := make([]byte, 256<<10)
	for i := 0; atomic.LoadUint64(&states[page])&swap.StatePresent != 0; i++ {
		if i == 64 {
			t.Fatalf("page %d of namespace %d stays resident", page, nsid)
		}
		off := (1<<20 + int64(i%12)*int64(len(buf))) % n.Size()
		if _, err := n.ReadAt(buf, off); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReadEIOIsAMediaError: a backing-device read error on a page that is
// not resident reaches the initiator as Unrecovered Read Error (SCT 2) for
// the read that needs it, only for that page; the page is not poisoned (it
// reads right once the device recovers); another host on another range of
// the same namespace and on another namespace keeps working throughout.
func TestReadEIOIsAMediaError(t *testing.T) {
	r := faultTarget(t)
	devA, _ := r.hostDevice(t)
	devB, _ := r.hostDevice(t)
	a := openNamespace(t, r.connect(t, devA, subNQN, "a"), 1)
	cb := r.connect(t, devB, subNQN, "b")
	b1 := startBystander(t, "b on namespace 1 [3 MiB, 4 MiB)", openNamespace(t, cb, 1), 3<<20, 1<<20)
	b2 := startBystander(t, "b on namespace 2", openNamespace(t, cb, 2), 0, 4<<20)

	const size = 3 << 20
	data := make([]byte, size)
	fillPattern(data, 0, 1)
	if _, err := a.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	const page = 5
	evicted(t, r, 1, page, a)
	f := r.faulty[1]
	rule := f.FailRange(blockdev.OpRead, page*blockSize, blockSize)

	buf := make([]byte, blockSize)
	_, err := a.ReadAt(buf, page*blockSize)
	requireMediaError(t, "read of the failing page", err, nvme.StatusUnrecoveredReadError)
	big := make([]byte, 64<<10)
	_, err = a.ReadAt(big, 0) // a transfer that includes the page
	requireMediaError(t, "read of 64 KiB including the failing page", err, nvme.StatusUnrecoveredReadError)
	if f.InjectedOf(blockdev.OpRead) == 0 {
		t.Fatal("no read fault injected: the failing page was read from memory")
	}
	// The rest of the namespace reads right meanwhile.
	if _, err := a.ReadAt(big, 1<<20); err != nil {
		t.Fatalf("read beside the failing page: %v", err)
	}
	if err := checkPattern(big, 1<<20, 1); err != nil {
		t.Fatal(err)
	}
	b1.waitRounds(t, 20)
	b2.waitRounds(t, 20)

	f.Remove(rule)
	if _, err := a.ReadAt(big, 0); err != nil {
		t.Fatalf("read after the device recovered: %v", err)
	}
	if err := checkPattern(big, 0, 1); err != nil {
		t.Fatalf("after the device recovered: %v", err)
	}
	t.Logf("read faults injected: %d", f.InjectedOf(blockdev.OpRead))
	b1.check(t, 20)
	b2.check(t, 20)
}

// TestWritebackEIOKeepsDataUntilALaterFlush: while every device write
// fails, acknowledged writes stay dirty in the target's memory (reads
// return them), Flush and FUA writes fail with Write Fault (SCT 2) and the
// backing file does not change; once the device recovers, a Flush persists
// everything, which a restart of the target on the same files shows. A
// bystander on the other namespace works throughout.
func TestWritebackEIOKeepsDataUntilALaterFlush(t *testing.T) {
	r := faultTarget(t)
	devA, _ := r.hostDevice(t)
	devB, _ := r.hostDevice(t)
	ca := r.connect(t, devA, subNQN, "a")
	a := openNamespace(t, ca, 1)
	b2 := startBystander(t, "b on namespace 2", openNamespace(t, r.connect(t, devB, subNQN, "b"), 2), 0, 4<<20)

	f := r.faulty[1]
	f.FailNth(blockdev.OpWrite|blockdev.OpWriteFUA, 1, blockdev.FromThenOn)
	const size = 128 << 10 // half the budget: it stays resident while nothing can be written back
	data := make([]byte, size)
	fillPattern(data, 0, 2)
	if _, err := a.WriteAt(data, 0); err != nil {
		t.Fatalf("write into the volatile cache: %v", err)
	}
	err := a.Flush()
	requireMediaError(t, "flush while the device fails writes", err, nvme.StatusWriteFault)
	_, err = a.WriteAtFUA(data[:blockSize], 2<<20)
	requireMediaError(t, "FUA write while the device fails writes", err, nvme.StatusWriteFault)

	got := make([]byte, size)
	if _, err := a.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("acknowledged writes are not what reads return while writeback fails")
	}
	if st := r.namespace(t, 1).Region().Stats(); st.Dirty < size/blockSize {
		t.Fatalf("%d dirty pages while every writeback fails, want at least %d", st.Dirty, size/blockSize)
	}
	file, err := os.ReadFile(r.backingPath(0, 1))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(file[:size], make([]byte, size)) {
		t.Fatal("the backing file changed although every device write failed")
	}
	b2.waitRounds(t, 20)

	f.Clear()
	if err := a.Flush(); err != nil {
		t.Fatalf("flush after the device recovered: %v", err)
	}
	if file, err = os.ReadFile(r.backingPath(0, 1)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(file[:size], data) {
		t.Fatal("the flush after recovery did not put the data on the backing file")
	}
	b2.check(t, 20)
	t.Logf("write faults injected: %d, writeback errors counted by swap: %d",
		f.InjectedOf(blockdev.OpWrite|blockdev.OpWriteFUA), r.namespace(t, 1).Region().Stats().WritebackErrors)

	// Restart the target on the same files: the data is there.
	ca.Close()
	if err := r.tg.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.start(""); err != nil {
		t.Fatal(err)
	}
	devC, _ := r.hostDevice(t)
	c := openNamespace(t, r.connect(t, devC, subNQN, "a"), 1)
	if _, err := c.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("data persisted by the flush after recovery is not there after a restart")
	}
}

// TestAddedLatencySlowsButDoesNotBreak: with every backing-device operation
// of namespace 1 delayed by 2 ms, writes, flushes and reads that fault go on
// working and return the right data; the bystander on namespace 2 is not
// held up by it. The slowdown is reported, not asserted.
func TestAddedLatencySlowsButDoesNotBreak(t *testing.T) {
	r := faultTarget(t)
	devA, _ := r.hostDevice(t)
	devB, _ := r.hostDevice(t)
	a := openNamespace(t, r.connect(t, devA, subNQN, "a"), 1)
	b2 := startBystander(t, "b on namespace 2", openNamespace(t, r.connect(t, devB, subNQN, "b"), 2), 0, 4<<20)

	const size = 2 << 20
	run := func(seed uint64) time.Duration {
		start := time.Now()
		data := make([]byte, size)
		fillPattern(data, 0, seed)
		for off := 0; off < size; off += 256 << 10 {
			if _, err := a.WriteAt(data[off:off+256<<10], int64(off)); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.Flush(); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 64<<10)
		for off := 0; off < size; off += len(got) {
			if _, err := a.ReadAt(got, int64(off)); err != nil {
				t.Fatal(err)
			}
			if err := checkPattern(got, int64(off), seed); err != nil {
				t.Fatal(err)
			}
		}
		return time.Since(start)
	}
	plain := run(3)
	r.faulty[1].SetLatency(blockdev.OpAll, 2*time.Millisecond)
	slow := run(4)
	r.faulty[1].SetLatency(blockdev.OpAll, 0)
	b2.check(t, 10)
	t.Logf("write 2 MiB + flush + read back (every page faults in: 4x the budget): %v without added latency, %v with 2 ms per device operation (%.1fx)",
		plain, slow, float64(slow)/float64(plain))
}
