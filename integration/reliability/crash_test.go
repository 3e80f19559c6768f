package reliability_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/internal/banner"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/tcp"
	"github.com/nprdma/nprdma/target"
)

// A crash-test block: a header naming the block, its version and the run,
// then content derived from all three, so that a block that is torn, stale
// garbage or another block's is detected. An all-zero block is version 0
// (never written).
const (
	blockMagic = 0x7473657268736172 // "rashrest"
	headerSize = 32
)

func fillBlock(p []byte, blk, version, run uint64) {
	binary.LittleEndian.PutUint64(p[0:], blockMagic)
	binary.LittleEndian.PutUint64(p[8:], blk)
	binary.LittleEndian.PutUint64(p[16:], version)
	binary.LittleEndian.PutUint64(p[24:], run)
	x := blk*0x9e3779b97f4a7c15 ^ version*0xbf58476d1ce4e5b9 ^ run
	for i := headerSize; i < blockSize; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(p[i:], x)
	}
}

// blockVersion decodes a block read back: its version, or an error saying
// why it is neither zero nor a whole block written by this run.
func blockVersion(p []byte, blk, run uint64) (uint64, error) {
	zero := true
	for _, b := range p {
		if b != 0 {
			zero = false
			break
		}
	}
	if zero {
		return 0, nil
	}
	if m := binary.LittleEndian.Uint64(p[0:]); m != blockMagic {
		return 0, fmt.Errorf("garbage (header %#x)", m)
	}
	if b := binary.LittleEndian.Uint64(p[8:]); b != blk {
		return 0, fmt.Errorf("holds block %d", b)
	}
	if r := binary.LittleEndian.Uint64(p[24:]); r != run {
		return 0, fmt.Errorf("written by run %#x", r)
	}
	v := binary.LittleEndian.Uint64(p[16:])
	want := make([]byte, blockSize)
	fillBlock(want, blk, v, run)
	for i := headerSize; i < blockSize; i++ {
		if p[i] != want[i] {
			return v, fmt.Errorf("torn: version %d header, byte %d differs", v, i)
		}
	}
	return v, nil
}

// crashModel is what the host knows about every block. Versions of a block
// only grow. durable: the version that must be there after a crash (the
// last FUA write acknowledged, or the last write acknowledged before a
// flush that completed was sent); issued: the last version sent; lo: the
// last version sent before this round, so that the versions of this round
// are (lo, issued]. After a crash a block must hold durable, or a version
// of this round that is at least durable — a write not yet flushed may or
// may not have landed — and nothing else.
type crashModel struct {
	durable, lo, issued, acked []uint64
}

func newCrashModel(blocks int) *crashModel {
	return &crashModel{durable: make([]uint64, blocks), lo: make([]uint64, blocks),
		issued: make([]uint64, blocks), acked: make([]uint64, blocks)}
}

// crashStats are the test's figures.
type crashStats struct {
	writes, fuaWrites, flushes int
	checkedDurable             int // blocks whose durable version was required and found
	newerThanDurable           int // blocks holding a version newer than required
	bytesVerified              int64
	roundTimes                 []time.Duration
	killDelays                 []time.Duration
}

// TestCrashConsistency: fio-style verified writes (1–8 blocks, some FUA)
// with periodic flushes go through an in-process initiator to the real
// nprdma-target, which is killed with SIGKILL at a random moment, restarted
// on the same backing file and data directory, and checked: every block
// acknowledged before the last completed flush, and every FUA write, is
// intact, and no block is torn or garbage. 20 rounds (200 with
// NPRDMA_LONG=1); NPRDMA_CRASH_SEED replays a run. Over the nprdma fabric
// (tcp) and over NVMe/TCP.
func TestCrashConsistency(t *testing.T) {
	for _, kind := range []fabricKind{tcpFabric, nvmeTCPFabric} {
		t.Run(kind.name, func(t *testing.T) { crashConsistency(t, kind) })
	}
}

func crashConsistency(t *testing.T, kind fabricKind) {
	rounds := 20
	if longRun() {
		rounds = 200
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("NPRDMA_CRASH_SEED"); s != "" {
		fmt.Sscan(s, &seed)
	}
	t.Logf("NPRDMA_CRASH_SEED=%d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	run := rng.Uint64()

	const (
		size    = 8 << 20 // the namespace; --memory is 1 MiB
		blocks  = size / blockSize
		working = 1024 // blocks written: 4 MiB, four times the memory
		workers = 4
	)
	dir := t.TempDir()
	backing := filepath.Join(dir, "disk.img")
	if err := blockdev.Create(backing, size); err != nil {
		t.Fatal(err)
	}
	// startTarget starts the target on the files; over NVMe/TCP also on
	// a free port of its own, returned as where the host connects.
	startTarget := func() (*targetProc, string) {
		args := targetArgs(backing, filepath.Join(dir, "data"), "127.0.0.1:0", "1MiB")
		if !kind.nvmeTCP {
			p := startTargetProc(t, args...)
			return p, p.addr
		}
		addr := freeAddr(t)
		return startTargetProc(t, append(args, "--listen-nvme-tcp", addr)...), addr
	}
	m := newCrashModel(blocks)
	var st crashStats

	connect := func(p *targetProc, addr string) (*nprdma.Device, *initiator.Controller, *initiator.Namespace) {
		t.Helper()
		dev := nprdma.NewDevice(tcp.New(), nprdma.WithPinning(false))
		tr := initiator.NPRDMA(dev)
		if kind.nvmeTCP {
			tr = initiator.TCP()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, err := initiator.ConnectOver(ctx, tr, addr, subNQN, hostOptions("crash",
			initiator.WithControllerLossTimeout(2*time.Second), initiator.WithQPTimeout(2*time.Second),
			initiator.WithReconnectDelay(20*time.Millisecond))...)
		if err != nil {
			dev.Close()
			t.Fatalf("connect: %v\n%s", err, p.output())
		}
		n, err := c.Namespace(ctx, 1)
		if err != nil {
			c.Close()
			dev.Close()
			t.Fatal(err)
		}
		return dev, c, n
	}

	// verify reads the blocks written (all of them in the first and the
	// last round: a write that landed elsewhere shows there) and checks
	// them against the model; afterwards what it found is the durable
	// state the next round starts from.
	verify := func(round int, n *initiator.Namespace) {
		t.Helper()
		buf := make([]byte, 256<<10)
		var bad []string
		end := int64(working * blockSize)
		if round == 0 || round == rounds {
			end = size
		}
		for off := int64(0); off < end; off += int64(len(buf)) {
			if _, err := n.ReadAt(buf, off); err != nil {
				t.Fatalf("round %d: read [%d, +%d): %v", round, off, len(buf), err)
			}
			for i := 0; i < len(buf); i += blockSize {
				b := int(off/blockSize) + i/blockSize
				v, err := blockVersion(buf[i:i+blockSize], uint64(b), run)
				d, lo, is := m.durable[b], m.lo[b], m.issued[b]
				switch {
				case err != nil:
					bad = append(bad, fmt.Sprintf("block %d: %v (durable %d, this round (%d, %d])", b, err, d, lo, is))
				case v != d && !(v > lo && v >= d && v <= is):
					bad = append(bad, fmt.Sprintf("block %d holds version %d; durable %d, this round wrote (%d, %d]", b, v, d, lo, is))
				}
				if d > 0 && err == nil && v >= d {
					st.checkedDurable++
					st.bytesVerified += blockSize
				}
				if err == nil && v > d {
					st.newerThanDurable++
				}
				m.durable[b], m.acked[b], m.lo[b] = v, v, m.issued[b]
			}
		}
		if len(bad) > 0 {
			if len(bad) > 10 {
				bad = append(bad[:10], fmt.Sprintf("... %d blocks in all", len(bad)))
			}
			t.Fatalf("round %d (NPRDMA_CRASH_SEED=%d): after SIGKILL and restart:\n%s", round, seed, strings.Join(bad, "\n"))
		}
	}

	// worker w writes blocks [w*span, (w+1)*span) until stop or an error
	// (the target died). Each worker owns its blocks, so no two writes to
	// a block are ever in flight together.
	writer := func(n *initiator.Namespace, w int, wseed uint64, stop <-chan struct{}, out *crashStats) {
		rng := rand.New(rand.NewPCG(wseed, uint64(w)))
		span := working / workers
		base := w * span
		buf := make([]byte, 8*blockSize)
		for ops := 1; ; ops++ {
			select {
			case <-stop:
				return
			default:
			}
			start := base + rng.IntN(span)
			k := min(1+rng.IntN(8), base+span-start)
			fua := rng.IntN(8) == 0
			for i := 0; i < k; i++ {
				b := start + i
				m.issued[b]++
				fillBlock(buf[i*blockSize:(i+1)*blockSize], uint64(b), m.issued[b], run)
			}
			var err error
			if fua {
				_, err = n.WriteAtFUA(buf[:k*blockSize], int64(start)*blockSize)
			} else {
				_, err = n.WriteAt(buf[:k*blockSize], int64(start)*blockSize)
			}
			if err != nil {
				return
			}
			out.writes++
			for i := 0; i < k; i++ {
				b := start + i
				m.acked[b] = m.issued[b]
				if fua {
					m.durable[b] = m.issued[b]
				}
			}
			if fua {
				out.fuaWrites++
			}
			if ops%16 == 0 {
				snap := append([]uint64(nil), m.acked[base:base+span]...)
				if err := n.Flush(); err != nil {
					return
				}
				out.flushes++
				for i, v := range snap {
					m.durable[base+i] = max(m.durable[base+i], v)
				}
			}
		}
	}

	p, addr := startTarget()
	for round := 0; round <= rounds; round++ {
		start := time.Now()
		if round > 0 {
			p, addr = startTarget()
			if !strings.Contains(p.banner, banner.PreviousRun+target.PreviousRunUnclean.String()) {
				t.Fatalf("round %d: restart after SIGKILL says %q", round, p.banner)
			}
		}
		dev, c, n := connect(p, addr)
		verify(round, n)
		if round == rounds {
			c.Close()
			dev.Close()
			break
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		per := make([]crashStats, workers)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			wseed := rng.Uint64()
			go func() {
				defer wg.Done()
				writer(n, w, wseed, stop, &per[w])
			}()
		}
		delay := time.Duration(50+rng.IntN(550)) * time.Millisecond
		time.Sleep(delay)
		p.kill(syscall.SIGKILL)
		close(stop)
		c.Close() // I/O waiting for a reconnect fails now
		wg.Wait()
		dev.Close()
		for _, s := range per {
			st.writes += s.writes
			st.fuaWrites += s.fuaWrites
			st.flushes += s.flushes
		}
		st.killDelays = append(st.killDelays, delay)
		st.roundTimes = append(st.roundTimes, time.Since(start))
	}
	// A clean stop at the end: SIGTERM flushes and exits 0.
	p.kill(syscall.SIGTERM)
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM:\n%s", code, p.output())
	}

	if st.flushes == 0 || st.fuaWrites == 0 || st.checkedDurable == 0 {
		t.Fatalf("the test proved nothing: %d flushes, %d FUA writes, %d durable blocks checked", st.flushes, st.fuaWrites, st.checkedDurable)
	}
	t.Logf("%d rounds of SIGKILL + restart: %d writes (%d FUA), %d flushes completed; %d durable blocks checked (%.1f MiB verified), "+
		"%d blocks held a newer unflushed version; kill after %v..%v; round p50 %v max %v",
		rounds, st.writes, st.fuaWrites, st.flushes, st.checkedDurable, float64(st.bytesVerified)/(1<<20), st.newerThanDurable,
		percentile(st.killDelays, 0), percentile(st.killDelays, 100), percentile(st.roundTimes, 50).Round(time.Millisecond),
		percentile(st.roundTimes, 100).Round(time.Millisecond))
}
