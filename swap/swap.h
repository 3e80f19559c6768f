// The C half of swap: the region mapping, its userfaultfd and every change of
// the mapping. See docs/swap.md ("The C fault handler") for why this is C.
#ifndef NPRDMA_SWAP_H
#define NPRDMA_SWAP_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define SWAP_PAGE_SIZE 4096ULL

// The page state word. Mirror of state.go; TestStateLayoutMatchesC checks
// that the two agree.
#define SWAP_PRESENT (1ULL << 0)
#define SWAP_BUSY (1ULL << 1)
#define SWAP_DIRTY (1ULL << 2)
#define SWAP_REFERENCED (1ULL << 3)
#define SWAP_ZERO (1ULL << 4)
#define SWAP_WRITEBACK (1ULL << 5)
#define SWAP_MAPLOCK (1ULL << 6)
#define SWAP_TRACKED (1ULL << 7)
#define SWAP_READERS_SHIFT 8
#define SWAP_READERS_MASK (0xffULL << SWAP_READERS_SHIFT)
#define SWAP_VERSION_SHIFT 16

#define SWAP_MAX_FAULT_THREADS 8

// Counters shared with Go, which reads them with atomic loads. resident is
// also changed by Go (reservations), always with atomic operations.
struct swap_counters {
	int64_t resident;         // mapped pages plus Go's outstanding reservations
	uint64_t uffd_faults;     // fault messages read from the userfaultfd
	uint64_t uffd_minor;      // of those, filled with the zero page
	uint64_t uffd_major;      // of those, filled from the backing device
	uint64_t uffd_wakes;      // page already present: woken only
	uint64_t uffd_shared;     // fault on a page another thread is filling: left to it
	uint64_t uffd_retries;    // fill raced with a change of the page; redone
	uint64_t uffd_errors;     // backing reads that failed (each attempt)
	uint64_t uffd_poisoned;   // pages poisoned after repeated read failures
	uint64_t fill_overflows;  // filled pages the Go side could not be told about
};

struct swap_region {
	char *base;             // the region mapping
	uint64_t size;          // bytes
	uint64_t npages;
	uint64_t *states;       // NORESERVE mapping, npages words
	size_t states_bytes;
	int data_fd;            // the region's memory file when shareable; -1: anonymous
	int uffd;               // -1 without userfaultfd
	int backing_fd;         // -1 when unknown (only allowed without userfaultfd)
	int stop_fd;            // eventfd: stops the fault threads
	int self_pidfd;         // pidfd of this process for process_madvise; -1: none
	int batch_discard;      // release batches with process_madvise (atomic; 0 once refused)
	int notify_fd;          // eventfd owned by Go: "fill queue became non-empty"
	int can_poison;
	int fail_fills;         // test hook: backing reads of the fault threads fail
	int nthreads;
	pthread_t threads[SWAP_MAX_FAULT_THREADS];
	struct swap_fault_thread {
		struct swap_region *r;
		int index;
	} thread_args[SWAP_MAX_FAULT_THREADS];

	// The page each fault thread is filling (UINT64_MAX: none), so that a
	// second fault on the same page does not read it again: the first
	// fill's UFFDIO_COPY wakes every thread waiting on the page.
	pthread_mutex_t fmu;
	uint64_t filling[SWAP_MAX_FAULT_THREADS];

	// Page ranges [start, end) that were holes of the backing file when the
	// region was created; they read as zeros while the page's version is 0.
	uint64_t *holes;
	size_t nholes;

	// Pages filled by the fault threads, for Go to track (MPSC, tiny mutex).
	pthread_mutex_t qmu;
	uint64_t *queue;
	uint64_t qcap, qhead, qlen;

	struct swap_counters counters;
};

// swap_region_create maps a region of size bytes (a multiple of the page
// size) and its state table, and with use_uffd registers the region with a
// new userfaultfd served by nthreads threads that read backing_fd. With
// data_fd and states_fd (memory files of the caller's, or -1) the region and
// the table are shared mappings of them, which other processes may map too;
// a page is then released by punching a hole in data_fd. It returns 0 or a
// negative errno, and in *stage names the step that failed.
int swap_region_create(struct swap_region **out, uint64_t size, int use_uffd, int backing_fd,
		       int nthreads, uint64_t qcap, const uint64_t *holes, size_t nholes,
		       int notify_fd, int data_fd, int states_fd, const char **stage);

// swap_region_destroy stops the fault threads, closes the userfaultfd and
// unmaps everything. Nothing may touch the region afterwards.
void swap_region_destroy(struct swap_region *r);

// swap_install maps page from src (NULL: the zero page) unless it is already
// mapped; with overwrite an already mapped page gets src copied over it. It
// sets present (and zero when src is NULL, clears it otherwise). Returns 1 if
// this call mapped the page, 0 if it was mapped already, or -errno. The caller
// holds the page's busy bit.
int swap_install(struct swap_region *r, uint64_t page, const void *src, int overwrite);

// swap_release unmaps the given pages (ascending) and clears present; with
// setzero it marks them zero, otherwise it keeps their zero bit. The caller
// holds busy on each and has drained its readers. Returns how many were
// present.
int64_t swap_release(struct swap_region *r, const uint64_t *pages, size_t n, int setzero);

// SWAP_RELEASE_BATCH is how many runs of pages swap_release releases with
// one system call.
#define SWAP_RELEASE_BATCH 64

// SWAP_FILL_POISONED marks a queued page that was poisoned, not filled.
#define SWAP_FILL_POISONED (1ULL << 63)

// swap_drain_fills moves up to max pages filled (or poisoned) by the fault
// threads into out.
size_t swap_drain_fills(struct swap_region *r, uint64_t *out, size_t max);

// swap_heal removes a poison marker from an absent page, so that the next
// touch faults again and retries the backing read.
void swap_heal(struct swap_region *r, uint64_t page);

// swap_in_hole reports whether page was in a hole of the backing file at
// creation.
int swap_in_hole(const struct swap_region *r, uint64_t page);

#endif
