package swapbench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/swap"
)

// PolicyResult is the hit ratio of one eviction policy on one workload.
type PolicyResult struct {
	Policy         string
	Workload       string  // "zipf" or "zipf+scan"
	HitRatio       float64 // accesses served without a fault
	Zipf           float64 // skew of the Zipf part
	RegionToBudget float64
	Accesses       int
}

// PolicyConfig sizes ComparePolicies. Zero fields take the defaults.
type PolicyConfig struct {
	Pages    int       // region size in pages (default 16384: 64 MiB)
	Ratios   []float64 // region/budget ratios (default 2, 4, 8)
	Accesses int       // per run (default 200000)
	Zipf     float64   // skew (default 0.99)
	// ScanShare is the fraction of accesses that belong to sequential scans
	// over the whole region in the "zipf+scan" workload (default 0.3).
	ScanShare float64
	Seed      uint64
}

// ComparePolicies measures the hit ratio of every policy on a Zipf workload
// and on the same workload polluted by sequential scans, over an in-memory
// device (the hit ratio does not depend on the device's speed). Each run uses
// a real swap.Region with its evictor.
func ComparePolicies(ctx context.Context, cfg PolicyConfig) ([]PolicyResult, error) {
	if cfg.Pages == 0 {
		cfg.Pages = 16384
	}
	if len(cfg.Ratios) == 0 {
		cfg.Ratios = []float64{2, 4, 8}
	}
	if cfg.Accesses == 0 {
		cfg.Accesses = 200000
	}
	if cfg.Zipf == 0 {
		cfg.Zipf = 0.99
	}
	if cfg.ScanShare == 0 {
		cfg.ScanShare = 0.3
	}
	if cfg.Seed == 0 {
		cfg.Seed = 42
	}
	var out []PolicyResult
	for _, ratio := range cfg.Ratios {
		for _, workload := range []string{"zipf", "zipf+scan"} {
			for _, policy := range []swap.Policy{swap.PolicyCLOCK, swap.PolicyS3FIFO} {
				if err := ctx.Err(); err != nil {
					return out, err
				}
				scan := 0.0
				if workload == "zipf+scan" {
					scan = cfg.ScanShare
				}
				hit, err := hitRatio(policy, cfg, ratio, scan)
				if err != nil {
					return out, fmt.Errorf("%v %s 1:%g: %w", policy, workload, ratio, err)
				}
				out = append(out, PolicyResult{Policy: policy.String(), Workload: workload, HitRatio: hit,
					Zipf: cfg.Zipf, RegionToBudget: ratio, Accesses: cfg.Accesses})
			}
		}
	}
	return out, nil
}

func hitRatio(policy swap.Policy, cfg PolicyConfig, ratio, scanShare float64) (float64, error) {
	dev := newMemDevice(int64(cfg.Pages) * pageSize)
	budget := int64(float64(cfg.Pages)/ratio) * pageSize
	r, err := swap.New(dev, swap.WithBudget(budget), swap.WithPolicy(policy), swap.WithoutUserfaultfd())
	if err != nil {
		return 0, err
	}
	defer r.Close()
	rng := rand.New(rand.NewPCG(cfg.Seed, 7))
	z := newZipf(cfg.Pages, cfg.Zipf, rng)
	perm := rng.Perm(cfg.Pages) // hot pages are scattered over the region
	buf := make([]byte, 1)
	scanPos := 0
	// Warm up with the same workload so both policies start from a full
	// cache, then count faults over the measured accesses.
	var faultsBefore uint64
	for i := 0; i < 2*cfg.Accesses; i++ {
		if i == cfg.Accesses {
			st := r.Stats()
			faultsBefore = st.MajorFaults + st.MinorFaults
		}
		var page int
		if rng.Float64() < scanShare {
			page = scanPos
			scanPos = (scanPos + 1) % cfg.Pages
		} else {
			page = perm[z.next()]
		}
		if _, err := r.ReadAt(buf, int64(page)*pageSize); err != nil {
			return 0, err
		}
	}
	st := r.Stats()
	misses := st.MajorFaults + st.MinorFaults - faultsBefore
	return 1 - float64(misses)/float64(cfg.Accesses), nil
}

// zipf draws ranks 0..n-1 with P(rank k) proportional to 1/(k+1)^theta, for
// any theta in (0, 1) as well (math/rand's Zipf needs s > 1). It is the
// generator of Gray et al., "Quickly generating billion-record synthetic
// databases" (SIGMOD'94), as used by YCSB.
type zipf struct {
	n                   int
	theta, alpha, zetan float64
	eta, half           float64
	rng                 *rand.Rand
}

func newZipf(n int, theta float64, rng *rand.Rand) *zipf {
	zeta := func(n int) float64 {
		s := 0.0
		for i := 1; i <= n; i++ {
			s += 1 / math.Pow(float64(i), theta)
		}
		return s
	}
	z := &zipf{n: n, theta: theta, alpha: 1 / (1 - theta), zetan: zeta(n), rng: rng}
	z.eta = (1 - math.Pow(2/float64(n), 1-theta)) / (1 - zeta(2)/z.zetan)
	z.half = 1 + math.Pow(0.5, theta)
	return z
}

func (z *zipf) next() int {
	u := z.rng.Float64()
	uz := u * z.zetan
	switch {
	case uz < 1:
		return 0
	case uz < z.half:
		return 1
	}
	k := int(float64(z.n) * math.Pow(z.eta*u-z.eta+1, z.alpha))
	return min(k, z.n-1)
}

// memDevice is a blockdev.Device in memory, for measurements that must not
// depend on a disk.
type memDevice struct {
	mu   sync.RWMutex
	data []byte
}

func newMemDevice(size int64) *memDevice { return &memDevice{data: make([]byte, size)} }

func (d *memDevice) ReadAt(p []byte, off int64) (int, error) {
	if err := blockdev.CheckRange(d, "read", off, int64(len(p))); err != nil {
		return 0, err
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	return copy(p, d.data[off:]), nil
}

func (d *memDevice) WriteAt(p []byte, off int64) (int, error) {
	if err := blockdev.CheckRange(d, "write", off, int64(len(p))); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return copy(d.data[off:], p), nil
}

func (d *memDevice) WriteAtFUA(p []byte, off int64) (int, error) { return d.WriteAt(p, off) }
func (d *memDevice) Flush() error                                { return nil }
func (d *memDevice) Discard(off, length int64) error {
	if err := blockdev.CheckRange(d, "discard", off, length); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	clear(d.data[off : off+length])
	return nil
}
func (d *memDevice) Size() int64    { return int64(len(d.data)) }
func (d *memDevice) BlockSize() int { return pageSize }
func (d *memDevice) Path() string   { return "memory" }
func (d *memDevice) Close() error   { return nil }

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 7)) }
