package initiator

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/target"
)

// TestFramesEndToEnd is TestEndToEnd with the namespace read through
// frames (what a target on a hardware NIC serves): a namespace four times
// the budget written, flushed and read back whole; a hot set read almost
// entirely one-sided; cold reads missing the table and verifying.
func TestFramesEndToEnd(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			const size, budget = 32 << 20, 8 << 20
			r := newRig(t, k, targetSpec{size: size, budget: budget, allowAny: true,
				targetOpts: []target.Option{target.WithFrames(target.FramesAlways)}})
			c := r.connect(t)
			n := namespace(t, c)
			d, err := n.RegionDescriptor(context.Background())
			if err != nil || d == nil || d.Format != nvme.RegionDescriptorFormat2 {
				t.Fatalf("region descriptor %+v, %v; want format 2", d, err)
			}
			const seed = 0xf4a3e5
			writePattern(t, n, seed, 1<<20)
			if err := n.Flush(); err != nil {
				t.Fatal(err)
			}
			for off := int64(0); off < size; off += 1 << 20 {
				verifyRange(t, n, off, 1<<20, seed)
			}
			ns := r.tg.Subsystem(testSubNQN).Namespace(1)
			fs := ns.FrameStats()
			if fs.Frames == 0 || fs.Installs == 0 || fs.Evictions == 0 {
				t.Fatalf("reading a namespace larger than its frames: %+v", fs)
			}
			if want := int64(budget / 2); fs.PinnedBytes > want+want/16 || fs.PinnedBytes < want/2 {
				t.Fatalf("frames pin %d bytes for a budget share of %d", fs.PinnedBytes, want)
			}

			// Hot phase: a 1 MiB hot set, warmed once, then random reads.
			rng := rand.New(rand.NewPCG(3, 4))
			const hotOff, hotLen = 8 << 20, 1 << 20
			verifyRange(t, n, hotOff, hotLen, seed)
			verifyRange(t, n, hotOff, hotLen, seed) // the table read once: hints from here on
			before := c.Stats()
			for i := 0; i < 300; i++ {
				blocks := int64(1 + rng.IntN(8))
				off := hotOff + rng.Int64N(hotLen/BlockSize-blocks+1)*BlockSize
				verifyRange(t, n, off, blocks*BlockSize, seed)
			}
			hot := c.Stats()
			reads, oneSided := hot.Reads-before.Reads, hot.ReadsOneSided-before.ReadsOneSided
			t.Logf("hot phase: %d of %d reads one-sided; %d table reads", oneSided, reads, hot.FrameTableReads-before.FrameTableReads)
			if float64(oneSided) < 0.95*float64(reads) {
				t.Fatalf("hot phase: one-sided share %d/%d < 0.95 (%+v)", oneSided, reads, hot)
			}

			// Cold phase: blocks no frame holds are read two-sided.
			before = c.Stats()
			for i := 0; i < 60; i++ {
				off := rng.Int64N(size/BlockSize-4) * BlockSize
				verifyRange(t, n, off, 4*BlockSize, seed)
			}
			cold := c.Stats()
			if cold.FrameMisses == before.FrameMisses || cold.FallbackReads == before.FallbackReads {
				t.Fatalf("cold phase: no miss read two-sided: %+v", cold)
			}
		})
	}
}

// TestFramesNoStaleOrTornBlock races writers, readers and eviction on a
// namespace read through frames: every block a reader gets is one whole
// write of that block, and no older than the last write acknowledged
// before the read began. The frames are few, so that they are taken from
// each other all the time, and so is the region's DRAM.
func TestFramesNoStaleOrTornBlock(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			const blocks = 192
			dur := 2 * time.Second
			if testing.Short() {
				dur = 500 * time.Millisecond
			}
			r := newRig(t, k, targetSpec{size: 4 << 20, budget: 320 << 10, allowAny: true,
				targetOpts: []target.Option{target.WithFrames(target.FramesAlways)}})
			c := r.connect(t, WithIOQueues(4))
			n := namespace(t, c)
			var acked [blocks]atomic.Uint64 // sequence of the last write acknowledged, per block
			block := func(b int, seq uint64) []byte {
				p := make([]byte, BlockSize)
				for i := 0; i < BlockSize; i += 16 {
					binary.LittleEndian.PutUint64(p[i:], uint64(b))
					binary.LittleEndian.PutUint64(p[i+8:], seq)
				}
				return p
			}
			for b := 0; b < blocks; b++ {
				if _, err := n.WriteAt(block(b, 1), int64(b)*BlockSize); err != nil {
					t.Fatal(err)
				}
				acked[b].Store(1)
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var failed atomic.Value
			fail := func(f string, a ...any) {
				failed.CompareAndSwap(nil, f)
				t.Errorf(f, a...)
			}
			const writers = 3
			for w := 0; w < writers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(w), 9))
					for seq := uint64(2); ; seq++ {
						select {
						case <-stop:
							return
						default:
						}
						// Writer w owns the blocks b%writers == w: one writer
						// per block keeps its sequence numbers in order.
						b := rng.IntN(blocks/writers)*writers + w
						if _, err := n.WriteAt(block(b, seq), int64(b)*BlockSize); err != nil {
							fail("write block %d: %v", b, err)
							return
						}
						acked[b].Store(seq)
					}
				}()
			}
			var checked atomic.Uint64
			for rd := 0; rd < 4; rd++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(rd), 77))
					buf := make([]byte, 8*BlockSize)
					var floor [8]uint64
					for {
						select {
						case <-stop:
							return
						default:
						}
						nb := 1 + rng.IntN(8)
						first := rng.IntN(blocks - nb + 1)
						for i := 0; i < nb; i++ {
							floor[i] = acked[first+i].Load()
						}
						if _, err := n.ReadAt(buf[:nb*BlockSize], int64(first)*BlockSize); err != nil {
							fail("read blocks %d+%d: %v", first, nb, err)
							return
						}
						for i := 0; i < nb; i++ {
							p := buf[i*BlockSize : (i+1)*BlockSize]
							b, seq := binary.LittleEndian.Uint64(p), binary.LittleEndian.Uint64(p[8:])
							for j := 16; j < BlockSize; j += 16 {
								if binary.LittleEndian.Uint64(p[j:]) != b || binary.LittleEndian.Uint64(p[j+8:]) != seq {
									fail("block %d torn: starts as block %d write %d, differs at byte %d", first+i, b, seq, j)
									return
								}
							}
							if b != uint64(first+i) {
								fail("block %d holds block %d's data", first+i, b)
								return
							}
							if seq < floor[i] {
								fail("block %d stale: write %d read after write %d was acknowledged", first+i, seq, floor[i])
								return
							}
							checked.Add(1)
						}
					}
				}()
			}
			time.Sleep(dur)
			close(stop)
			wg.Wait()
			st := c.Stats()
			fs := r.tg.Subsystem(testSubNQN).Namespace(1).FrameStats()
			t.Logf("%d blocks checked; initiator %d reads, %d one-sided, %d frame rejects, %d misses; target %+v",
				checked.Load(), st.Reads, st.ReadsOneSided, st.FrameRejects, st.FrameMisses, fs)
			if failed.Load() != nil {
				return
			}
			if st.ReadsOneSided == 0 || fs.Evictions == 0 || fs.Invalidations == 0 || st.FrameRejects+st.FrameMisses == 0 {
				t.Fatalf("the race did not exercise the frames: %+v, %+v", st, fs)
			}
		})
	}
}
