package initiator

import (
	"context"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/nprdma/nprdma/target"
)

// TestMeasureReadPaths measures 4 KiB reads at QD1 over nprdma/tcp with
// target and initiator in one process (NPRDMA_LONG=1; figures go to the
// log and docs/np-rdma.md): the bare RDMA READ, the one-sided path (READ +
// magic scan + copy), the two-sided NVMe Read, and the fallback after a
// minor and a major fault. Timing is reported, never asserted.
func TestMeasureReadPaths(t *testing.T) {
	if os.Getenv("NPRDMA_LONG") != "1" {
		t.Skip("measurement: set NPRDMA_LONG=1")
	}
	const size = 64 << 20
	const reads = 3000
	k := kinds[1] // tcp
	res := newRig(t, k, targetSpec{size: size, budget: size, allowAny: true})
	c := res.connect(t, WithIOQueues(1))
	n := namespace(t, c)
	writePattern(t, n, 1, 1<<20)
	buf := make([]byte, BlockSize)
	rng := rand.New(rand.NewPCG(3, 4))
	// The hot phases read the first half: swap keeps a free margin of a
	// sixteenth of the budget, so the whole namespace would not stay
	// resident even with a budget of its size.
	const hotLen = size / 2
	pick := func() int64 { return rng.Int64N(hotLen/BlockSize) * BlockSize }
	for pass := 0; pass < 2; pass++ {
		for off := int64(0); off < hotLen; off += 1 << 20 {
			n.ReadAt(make([]byte, 1<<20), off)
		}
	}
	warm := c.Stats()
	measure := func(name string, fn func()) []time.Duration {
		lat := make([]time.Duration, reads)
		for i := range lat {
			s := time.Now()
			fn()
			lat[i] = time.Since(s)
		}
		slices.Sort(lat)
		t.Logf("%-28s p50 %6.1f µs  p99 %6.1f µs", name, us(lat[len(lat)/2]), us(lat[len(lat)*99/100]))
		return lat
	}
	c.mu.Lock()
	q := c.sess.io[0].(remoteReader)
	desc := c.sess.regions[1].desc
	c.mu.Unlock()
	pb, _ := c.b.remote().pool.Get(BlockSize)
	raw := measure("bare RDMA READ", func() {
		if err := q.ReadRemote(context.Background(), pb, 0, BlockSize, desc.Address+uint64(pick()), desc.RKey); err != nil {
			t.Fatal(err)
		}
	})
	pb.Release()
	one := measure("one-sided ReadAt (resident)", func() { n.ReadAt(buf, pick()) })
	two := res.connect(t, WithIOQueues(1), WithOneSidedReads(false))
	n2 := namespace(t, two)
	tw := measure("two-sided NVMe Read", func() { n2.ReadAt(buf, pick()) })
	polled := newRig(t, k, targetSpec{size: 16 << 20, budget: 16 << 20, allowAny: true,
		targetOpts: []target.Option{target.WithBusyPoll(50 * time.Microsecond)}})
	pc := polled.connect(t, WithIOQueues(1), WithOneSidedReads(false), WithBusyPoll(50*time.Microsecond))
	pn := namespace(t, pc)
	writePattern(t, pn, 1, 1<<20)
	measure("two-sided, both sides polling", func() { pn.ReadAt(buf, rng.Int64N(16<<20/BlockSize)*BlockSize) })
	if s := c.Stats(); s.SuspectedPages != warm.SuspectedPages {
		t.Logf("note: %d suspected pages in the resident phase", s.SuspectedPages-warm.SuspectedPages)
	}

	// Minor faults: trimmed pages fault in as zeros.
	if err := n.Trim(0, size); err != nil {
		t.Fatal(err)
	}
	bm := c.Stats()
	minor := measure("fallback, minor fault", func() { n.ReadAt(buf, rng.Int64N(size/BlockSize)*BlockSize) })
	am := c.Stats()
	t.Logf("minor phase: %d fallbacks, %d minor and %d major faults reported", am.FallbackReads-bm.FallbackReads,
		am.MinorResolved-bm.MinorResolved, am.MajorResolved-bm.MajorResolved)

	// Major faults: a budget of 256 KiB over 64 MiB of written data.
	cold := newRig(t, k, targetSpec{size: size, budget: 256 << 10, allowAny: true})
	cc := cold.connect(t, WithIOQueues(1))
	cn := namespace(t, cc)
	writePattern(t, cn, 2, 1<<20)
	if err := cn.Flush(); err != nil {
		t.Fatal(err)
	}
	before := cc.Stats()
	major := measure("fallback, major fault", func() { cn.ReadAt(buf, pick()) })
	after := cc.Stats()
	t.Logf("cold phase: %d fallbacks, %d major and %d minor faults reported for %d reads",
		after.FallbackReads-before.FallbackReads, after.MajorResolved-before.MajorResolved, after.MinorResolved-before.MinorResolved, reads)
	p50 := func(l []time.Duration) float64 { return us(l[len(l)/2]) }
	t.Logf("ratios of p50 to the bare READ: one-sided %.2fx, two-sided %.2fx, minor %.2fx, major %.2fx",
		p50(one)/p50(raw), p50(tw)/p50(raw), p50(minor)/p50(raw), p50(major)/p50(raw))
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
