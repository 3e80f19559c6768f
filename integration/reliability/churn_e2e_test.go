package reliability_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/internal/promtest"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nprdma/tcp"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/fabric"
)

// The layout of TestVersionedWritesSurviveConnectionChurn: a 4 MiB
// swap-backed namespace with a 512 KiB budget, of which the test uses the
// first 2 MiB (four times the budget, so pages are evicted, written back
// and faulted in all along); half the operations go to the first 32
// blocks, so that writers and readers meet on the same blocks often.
const (
	vwBlocks    = 512
	vwHot       = 32
	vwMagic     = 0x6e70766572736e31 // "npversn1"
	vwWriters   = 4
	vwReaders   = 2
	vwMaxWrite  = 4 // blocks per write
	vwMaxRead   = 8 // blocks per read
	vwOpTimeout = 20 * time.Second
)

// vwBlock is the test's model of one block. A writer holds mu while it
// writes the block (writes of one block are ordered by the test, so the
// version acknowledged last is well defined); versions only grow.
type vwBlock struct {
	mu     sync.Mutex
	next   uint64        // the last version given out (under mu)
	writer uint32        // the writer of the acknowledged version (under mu)
	issued atomic.Uint64 // the newest version sent (stored before it is)
	acked  atomic.Uint64 // the last version acknowledged; 0: never written (zeros)
}

// vwFill fills p (one block) with version v of block b, by writer w: a
// header (magic, block, version, writer, CRC-32 of the rest) and content
// derived from all three, so that a torn, misplaced or garbage block fails
// the checksum or the header.
func vwFill(p []byte, b, v uint64, w uint32) {
	binary.LittleEndian.PutUint64(p[0:], vwMagic)
	binary.LittleEndian.PutUint64(p[8:], b)
	binary.LittleEndian.PutUint64(p[16:], v)
	binary.LittleEndian.PutUint32(p[24:], w)
	seed := b*0x9e3779b97f4a7c15 ^ v<<20 ^ uint64(w)<<56
	for i := 32; i+8 <= len(p); i += 8 {
		seed = seed*6364136223846793005 + 1442695040888963407
		binary.LittleEndian.PutUint64(p[i:], seed)
	}
	binary.LittleEndian.PutUint32(p[28:], vwSum(p))
}

func vwSum(p []byte) uint32 {
	h := crc32.NewIEEE()
	h.Write(p[:28])
	h.Write(p[32:])
	return h.Sum32()
}

// vwDecode returns the version and writer of a block read back as block b:
// 0 for a block of zeros (never written), an error for anything that is
// not a whole version of block b.
func vwDecode(p []byte, b uint64) (v uint64, w uint32, err error) {
	if binary.LittleEndian.Uint64(p) == 0 && isZero(p) {
		return 0, 0, nil
	}
	if m := binary.LittleEndian.Uint64(p); m != vwMagic {
		return 0, 0, fmt.Errorf("block %d: no version header (magic %#x)", b, m)
	}
	if got := binary.LittleEndian.Uint64(p[8:]); got != b {
		return 0, 0, fmt.Errorf("block %d holds block %d's data", b, got)
	}
	v, w = binary.LittleEndian.Uint64(p[16:]), binary.LittleEndian.Uint32(p[24:])
	if sum, want := vwSum(p), binary.LittleEndian.Uint32(p[28:]); sum != want {
		return v, w, fmt.Errorf("block %d, version %d of writer %d: checksum %#x, header says %#x (a torn or mixed block)", b, v, w, sum, want)
	}
	return v, w, nil
}

func isZero(p []byte) bool {
	for _, c := range p {
		if c != 0 {
			return false
		}
	}
	return true
}

// vwExpected reports whether err is one of the outcomes the initiator and
// target document for an operation under connection churn: the initiator
// gave up after the connection was lost under the command on
// MaxCommandSessions sessions in a row, or the target held a write behind
// a failed queue's for the fence timeout (Namespace Not Ready). Anything
// else — a bare queue failure the initiator did not retry, a controller
// loss, a status — fails the test.
func vwExpected(err error) bool {
	switch {
	case errors.Is(err, nvme.StatusNamespaceNotReady):
		return true
	case errors.Is(err, fabric.ErrQueueFailed) && strings.Contains(err.Error(), "giving up"):
		return true
	}
	return false
}

// TestVersionedWritesSurviveConnectionChurn: the real initiator against a
// swap-backed namespace four times its budget, on loop and tcp, and over
// NVMe/TCP (through a proxy that resets the connections). Writers
// write versioned blocks (block, version, writer, checksum) to overlapping
// ranges, one write of a block at a time, and remember the version
// acknowledged last; readers check that every block they read is a whole
// version of that block no older than the version acknowledged before the
// read began and no newer than any sent; a flusher flushes now and then;
// and every 100–250 ms every connection of the host is reset (as a network
// failure does), so the initiator reconnects and retries what was in
// flight while the target may still execute the lost attempts. An
// operation may fail only with an expected outcome (vwExpected), and is
// then retried by the test with the same data. At the end, after a final
// Flush, every block must read back exactly its last acknowledged version
// through the initiator and on the backing file.
func TestVersionedWritesSurviveConnectionChurn(t *testing.T) {
	for _, kind := range []fabricKind{loopFabric, tcpFabric, nvmeTCPFabric} {
		t.Run(kind.name, func(t *testing.T) { versionedChurn(t, kind, 1) })
	}
}

func versionedChurn(t *testing.T, kind fabricKind, seed uint64) {
	run := 4 * time.Second
	if longRun() {
		run = 20 * time.Second
	}
	r := newTarget(t, kind, []subSpec{{NQN: subNQN, Hosts: []string{hostNQN("a")},
		NS: []nsSpec{{NSID: 1, Size: 4 << 20, Budget: 512 << 10}}}})
	if !r.namespace(t, 1).OneSided() {
		t.Fatal("namespace 1 is not a swap-backed (one-sided) namespace")
	}
	opts := []initiator.Option{initiator.WithIOQueues(2), initiator.WithQueueDepth(16), initiator.WithReconnectDelay(10 * time.Millisecond)}
	var c *initiator.Controller
	var cutAll func() // resets every connection of the host
	if kind.nvmeTCP {
		p := startCutProxy(t, r.tcpAddr)
		cutAll = p.Cut
		c = r.connectTCP(t, p.Addr(), subNQN, "a", opts...)
	} else {
		cut := &cutter{Provider: tcp.New()}
		if kind.loop {
			cut.Provider = loop.New(loop.WithFabric(r.lf))
		}
		dev := nprdma.NewDevice(cut, nprdma.WithName("host"), nprdma.WithPinning(false))
		t.Cleanup(func() { dev.Close() })
		cutAll = cut.Cut
		c = r.connect(t, dev, subNQN, "a", opts...)
	}
	n := openNamespace(t, c, 1)

	blocks := make([]vwBlock, vwBlocks)
	var failures atomic.Int32
	fail := func(format string, args ...any) {
		if failures.Add(1) <= 10 {
			t.Errorf(format, args...)
		}
	}
	// retry runs op until it succeeds, retrying the expected failures; it
	// reports whether op succeeded.
	var retries, giveUps, notReady atomic.Int64
	retry := func(what string, op func() error) bool {
		start := time.Now()
		for {
			err := op()
			if err == nil {
				return true
			}
			if !vwExpected(err) {
				fail("%s: %v", what, err)
				return false
			}
			retries.Add(1)
			if errors.Is(err, nvme.StatusNamespaceNotReady) {
				notReady.Add(1)
			} else {
				giveUps.Add(1)
			}
			if time.Since(start) > vwOpTimeout {
				fail("%s: still failing after %v: %v", what, vwOpTimeout, err)
				return false
			}
		}
	}
	pick := func(rng *rand.Rand, max int) (lo, cnt int) {
		cnt = 1 + rng.IntN(max)
		if rng.IntN(2) == 0 {
			return rng.IntN(vwHot - cnt + 1), cnt
		}
		return rng.IntN(vwBlocks - cnt + 1), cnt
	}

	stop := make(chan struct{})
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	var wg sync.WaitGroup
	var writes, fuaWrites, reads, readBlocks, flushes, cuts atomic.Int64
	for w := range vwWriters {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)+1))
			buf := make([]byte, vwMaxWrite*blockSize)
			vers := make([]uint64, vwMaxWrite)
			for !stopped() && failures.Load() == 0 {
				lo, cnt := pick(rng, vwMaxWrite)
				p := buf[:cnt*blockSize]
				for i := range cnt { // ascending: no deadlock between writers
					bl := &blocks[lo+i]
					bl.mu.Lock()
					bl.next++
					vers[i] = bl.next
					vwFill(p[i*blockSize:(i+1)*blockSize], uint64(lo+i), vers[i], uint32(w))
					bl.issued.Store(vers[i])
				}
				fua := rng.IntN(8) == 0
				off := int64(lo) * blockSize
				ok := retry(fmt.Sprintf("writer %d: write of blocks [%d, %d)", w, lo, lo+cnt), func() error {
					var err error
					if fua {
						_, err = n.WriteAtFUA(p, off)
					} else {
						_, err = n.WriteAt(p, off)
					}
					return err
				})
				for i := range cnt {
					bl := &blocks[lo+i]
					if ok {
						bl.acked.Store(vers[i])
						bl.writer = uint32(w)
					}
					bl.mu.Unlock()
				}
				if !ok {
					return
				}
				writes.Add(1)
				if fua {
					fuaWrites.Add(1)
				}
			}
		})
	}
	for rd := range vwReaders {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, 100+uint64(rd)))
			buf := make([]byte, vwMaxRead*blockSize)
			floor := make([]uint64, vwMaxRead)
			for !stopped() && failures.Load() == 0 {
				lo, cnt := pick(rng, vwMaxRead)
				p := buf[:cnt*blockSize]
				for i := range cnt {
					floor[i] = blocks[lo+i].acked.Load()
				}
				if !retry(fmt.Sprintf("reader %d: read of blocks [%d, %d)", rd, lo, lo+cnt), func() error {
					_, err := n.ReadAt(p, int64(lo)*blockSize)
					return err
				}) {
					return
				}
				for i := range cnt {
					b := uint64(lo + i)
					v, w, err := vwDecode(p[i*blockSize:(i+1)*blockSize], b)
					switch {
					case err != nil:
						fail("reader %d: %v", rd, err)
					case v < floor[i]:
						fail("reader %d: block %d reads version %d (writer %d), but version %d was acknowledged before the read began",
							rd, b, v, w, floor[i])
					case v > blocks[b].issued.Load():
						fail("reader %d: block %d reads version %d, never sent", rd, b, v)
					}
				}
				reads.Add(1)
				readBlocks.Add(int64(cnt))
			}
		})
	}
	wg.Go(func() { // the flusher
		rng := rand.New(rand.NewPCG(seed, 200))
		for !stopped() && failures.Load() == 0 {
			time.Sleep(time.Duration(50+rng.IntN(100)) * time.Millisecond)
			if !retry("flush", n.Flush) {
				return
			}
			flushes.Add(1)
		}
	})
	rng := rand.New(rand.NewPCG(seed, 300))
	deadline := time.Now().Add(run)
	for time.Now().Before(deadline) && failures.Load() == 0 {
		time.Sleep(time.Duration(100+rng.IntN(150)) * time.Millisecond)
		cutAll()
		cuts.Add(1)
	}
	close(stop)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * vwOpTimeout):
		t.Fatalf("writers, readers or the flusher still run %v after the end:\n%s", 2*vwOpTimeout, goroutineDump())
	}
	st := c.Stats()
	t.Logf("%v: %d cuts, %d reconnects; %d writes acknowledged (%d FUA), %d reads (%d blocks) verified, %d flushes; "+
		"%d operations retried by the test (%d gave up after %d sessions, %d Namespace Not Ready); "+
		"pages the target read from its backing device for fallback reads: %d; target: %v fenced commands dropped",
		run, cuts.Load(), st.Reconnects, writes.Load(), fuaWrites.Load(), reads.Load(), readBlocks.Load(), flushes.Load(),
		retries.Load(), giveUps.Load(), initiator.MaxCommandSessions, notReady.Load(), st.MajorResolved,
		promtest.Sum(t, r.reg, "nprdma_target_fenced_commands_dropped_total"))
	if t.Failed() {
		return
	}
	if cuts.Load() < 3 || writes.Load() == 0 || reads.Load() == 0 || st.Reconnects == 0 {
		t.Fatalf("the run did too little to show anything: %d cuts, %d reconnects, %d writes, %d reads",
			cuts.Load(), st.Reconnects, writes.Load(), reads.Load())
	}

	// The end: after a final Flush every block holds exactly the version
	// acknowledged last, read through the initiator and on the file.
	if !retry("final flush", n.Flush) {
		t.FailNow()
	}
	check := func(where string, p []byte, first int) {
		for i := 0; i < len(p)/blockSize; i++ {
			b := uint64(first + i)
			bl := &blocks[b]
			v, w, err := vwDecode(p[i*blockSize:(i+1)*blockSize], b)
			switch {
			case err != nil:
				fail("%s: %v", where, err)
			case v != bl.acked.Load() || v != 0 && w != bl.writer:
				fail("%s: block %d holds version %d of writer %d; the version acknowledged last is %d, of writer %d",
					where, b, v, w, bl.acked.Load(), bl.writer)
			}
		}
	}
	got := make([]byte, 64*blockSize)
	for lo := 0; lo < vwBlocks; lo += 64 {
		if !retry("final read", func() error { _, err := n.ReadAt(got, int64(lo)*blockSize); return err }) {
			t.FailNow()
		}
		check("read back after the final flush", got, lo)
	}
	file, err := os.ReadFile(r.backingPath(0, 1))
	if err != nil {
		t.Fatal(err)
	}
	check("backing file after the final flush", file[:vwBlocks*blockSize], 0)
}
