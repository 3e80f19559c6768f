package initiator

import (
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/nprdma/nprdma/target"
)

// TestMeasureWhereDataLives compares, under the same skewed 4 KiB reads of
// a namespace four times the budget, how much a host reads one-sided when
// every resident page is readable in place (the region, what the software
// NIC serves: the "home" model) and when a share of the budget holds second
// copies in frames (what a hardware NIC gets: frames.go), at several
// shares (NPRDMA_LONG=1; docs/np-rdma.md §11 quotes it). Reported, never
// asserted.
func TestMeasureWhereDataLives(t *testing.T) {
	if os.Getenv("NPRDMA_LONG") != "1" {
		t.Skip("measurement: set NPRDMA_LONG=1")
	}
	const size, budget, reads = 64 << 20, 16 << 20, 20000
	for _, m := range []struct {
		name string
		opts []target.Option
	}{
		{"region (home)", nil},
		{"frames, share 0.25", []target.Option{target.WithFrames(target.FramesAlways), target.WithFrameShare(0.25)}},
		{"frames, share 0.50", []target.Option{target.WithFrames(target.FramesAlways), target.WithFrameShare(0.5)}},
		{"frames, share 0.75", []target.Option{target.WithFrames(target.FramesAlways), target.WithFrameShare(0.75)}},
	} {
		r := newRig(t, kinds[0], targetSpec{size: size, budget: budget, allowAny: true, targetOpts: m.opts})
		c := r.connect(t, WithIOQueues(1))
		n := namespace(t, c)
		writePattern(t, n, 1, 1<<20)
		// Zipf over the namespace's blocks, the hottest spread over it.
		rng := rand.New(rand.NewPCG(5, 6))
		z := rand.NewZipf(rng, 1.1, 1, size/BlockSize-1)
		perm := rng.Perm(size / BlockSize)
		buf := make([]byte, BlockSize)
		read := func() {
			if _, err := n.ReadAt(buf, int64(perm[z.Uint64()])*BlockSize); err != nil {
				t.Fatal(err)
			}
		}
		for range reads {
			read() // warm
		}
		before := c.Stats()
		lat := make([]time.Duration, reads)
		for i := range lat {
			s := time.Now()
			read()
			lat[i] = time.Since(s)
		}
		after := c.Stats()
		slices.Sort(lat)
		var sum time.Duration
		for _, l := range lat {
			sum += l
		}
		share := float64(after.ReadsOneSided-before.ReadsOneSided) / float64(after.Reads-before.Reads)
		fs := r.tg.Subsystem(testSubNQN).Namespace(1).FrameStats()
		t.Logf("%-20s one-sided %5.1f%%  mean %6.1f µs  p50 %6.1f µs  p99 %7.1f µs  frames %d (%d KiB pinned)",
			m.name, 100*share, us(sum/time.Duration(len(lat))), us(lat[len(lat)/2]), us(lat[len(lat)*99/100]), fs.Frames, fs.PinnedBytes>>10)
	}
}
