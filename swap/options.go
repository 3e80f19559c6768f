package swap

import (
	"fmt"
	"log/slog"
	"time"
)

// Policy selects the eviction policy.
type Policy int

const (
	// PolicyS3FIFO is S3-FIFO (a small probationary FIFO, a main FIFO with
	// second chances and a ghost history): scan-resistant. The default; see
	// docs/swap.md for the comparison that chose it.
	PolicyS3FIFO Policy = iota + 1
	// PolicyCLOCK is CLOCK (FIFO with reinsertion of referenced pages).
	PolicyCLOCK
)

// DefaultPolicy is the policy New uses without WithPolicy.
const DefaultPolicy = PolicyS3FIFO

func (p Policy) String() string {
	switch p {
	case PolicyCLOCK:
		return "clock"
	case PolicyS3FIFO:
		return "s3fifo"
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// ParsePolicy maps "clock" or "s3fifo" to a Policy (for flags).
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "clock", "CLOCK":
		return PolicyCLOCK, nil
	case "s3fifo", "S3FIFO", "s3-fifo", "S3-FIFO":
		return PolicyS3FIFO, nil
	}
	return 0, fmt.Errorf("unknown eviction policy %q (want clock or s3fifo)", s)
}

type config struct {
	size             int64 // 0: the device size
	maxSize          int64 // 0: size (no growth)
	budget           int64 // bytes; 0: default
	policy           Policy
	dirtyLimit       int // pages; 0: default
	freeMargin       int // pages; -1: default
	writebackWorkers int
	observer         Observer
	uffd             bool
	faultThreads     int
	logger           *slog.Logger
	zeroScan         bool
	reclaimTimeout   time.Duration
	adviseQueue      int
	shareable        bool
}

func defaultConfig() config {
	return config{
		policy:           DefaultPolicy,
		freeMargin:       -1,
		writebackWorkers: 4,
		uffd:             true,
		faultThreads:     2,
		logger:           slog.Default(),
		zeroScan:         true,
		reclaimTimeout:   10 * time.Second,
		adviseQueue:      256,
	}
}

// Option configures New.
type Option func(*config)

// WithBudget sets the DRAM budget in bytes: the explicit API never holds more
// than budget/PageSize pages resident. Default: a quarter of the region, at
// least 16 pages; a budget above the region's maximum size (WithMaxSize) is
// clamped to it.
func WithBudget(bytes int64) Option { return func(c *config) { c.budget = bytes } }

// WithSize sets the region size in bytes (a positive multiple of PageSize, at
// most the device size). Default: the device size rounded down to PageSize.
func WithSize(bytes int64) Option { return func(c *config) { c.size = bytes } }

// WithMaxSize reserves address space (the mapping and its state table, both
// NORESERVE: nothing is committed) for the region to Grow to bytes (a
// multiple of PageSize) while it is in use. Default: the region's size, so
// that it cannot grow.
func WithMaxSize(bytes int64) Option { return func(c *config) { c.maxSize = bytes } }

// WithPolicy selects the eviction policy (default DefaultPolicy).
func WithPolicy(p Policy) Option { return func(c *config) { c.policy = p } }

// WithDirtyLimit sets how many dirty pages the writeback workers let
// accumulate before they start writing back (default a quarter of the budget).
func WithDirtyLimit(pages int) Option { return func(c *config) { c.dirtyLimit = pages } }

// WithFreeMargin sets how many budget slots the background evictor keeps free
// so that faults rarely reclaim directly (default budget/16, at least 1, at
// most 4096).
func WithFreeMargin(pages int) Option { return func(c *config) { c.freeMargin = pages } }

// WithWritebackWorkers sets the number of background writeback goroutines
// (default 4: writeback is I/O bound, not CPU bound).
func WithWritebackWorkers(n int) Option { return func(c *config) { c.writebackWorkers = n } }

// WithObserver receives fault, eviction, writeback and reclaim events (see
// NewPrometheusObserver).
func WithObserver(o Observer) Option { return func(c *config) { c.observer = o } }

// WithoutUserfaultfd leaves the raw view unprotected: absent pages read as
// zeros through Bytes. For tests and benchmarks that use only the explicit API
// (and devices without a file descriptor).
func WithoutUserfaultfd() Option { return func(c *config) { c.uffd = false } }

// WithFaultThreads sets the number of C threads serving userfaultfd faults
// (default 2, at most 8).
func WithFaultThreads(n int) Option { return func(c *config) { c.faultThreads = n } }

// WithLogger sets where the region reports trouble (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithZeroScan enables (default) or disables the scan of the backing file for
// holes at New: pages wholly inside holes fault in as zeros without a read.
// Block devices are never scanned.
func WithZeroScan(on bool) Option { return func(c *config) { c.zeroScan = on } }

// WithReclaimTimeout bounds how long an operation waits for memory when no
// page can be evicted (everything dirty and writeback failing, or all pages
// busy) before it fails with ErrNoMemory (default 10 s).
func WithReclaimTimeout(d time.Duration) Option { return func(c *config) { c.reclaimTimeout = d } }

// WithShareable keeps the region's memory, its page state table and an
// access map in memory files that another process on the host may map and
// read in place under the seqlock (ShareFiles; nprdma/shm does), instead
// of anonymous memory (default off). A page is then released by punching a
// hole in the memory file, one system call per run of pages, and Close
// truncates the file, so a peer's mapping holds no memory afterwards.
func WithShareable() Option { return func(c *config) { c.shareable = true } }
