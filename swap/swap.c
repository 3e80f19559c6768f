// The C half of swap. Fault threads serve userfaultfd faults on the region
// without ever waiting for Go: a Go thread blocked in a page fault keeps its P
// and blocks stop-the-world, so a handler that needed the Go scheduler could
// deadlock. Every change of the mapping happens here, under the page's
// maplock bit, which only this file takes and only for microseconds.
#define _GNU_SOURCE
#include "swap.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

// UFFDIO_POISON (Linux 6.6) is newer than the headers of some distributions.
#ifndef UFFD_FEATURE_POISON
#define UFFD_FEATURE_POISON (1 << 14)
#endif
#ifndef _UFFDIO_POISON
#define _UFFDIO_POISON (0x08)
struct uffdio_poison {
	struct uffdio_range range;
	__u64 mode;
	__s64 updated;
};
#define UFFDIO_POISON _IOWR(UFFDIO, _UFFDIO_POISON, struct uffdio_poison)
#endif
#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)
#endif

#define PS SWAP_PAGE_SIZE

static inline uint64_t load_state(const uint64_t *w) { return __atomic_load_n(w, __ATOMIC_SEQ_CST); }

// update_state sets and clears bits atomically, keeping every other bit (Go
// changes readers, referenced and busy concurrently).
static inline uint64_t update_state(uint64_t *w, uint64_t set, uint64_t clear) {
	uint64_t s = load_state(w);
	while (!__atomic_compare_exchange_n(w, &s, (s & ~clear) | set, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
	}
	return s;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

// backoff spins first (the holder is a few instructions from done), then
// yields, then sleeps, so that a preempted holder gets the CPU back.
static void backoff(unsigned *spins) {
	unsigned n = (*spins)++;
	if (n < 64) {
		cpu_relax();
	} else if (n < 128) {
		sched_yield();
	} else {
		struct timespec ts = {0, 1000L << (n < 138 ? n - 128 : 10)};
		nanosleep(&ts, NULL);
	}
}

static void page_lock(uint64_t *w) {
	unsigned spins = 0;
	for (;;) {
		uint64_t s = __atomic_load_n(w, __ATOMIC_RELAXED);
		if (!(s & SWAP_MAPLOCK) &&
		    __atomic_compare_exchange_n(w, &s, s | SWAP_MAPLOCK, 1, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
			return;
		backoff(&spins);
	}
}

static inline void page_unlock(uint64_t *w) { __atomic_fetch_and(w, ~SWAP_MAPLOCK, __ATOMIC_SEQ_CST); }

static inline void count(uint64_t *c) { __atomic_fetch_add(c, 1, __ATOMIC_RELAXED); }

int swap_in_hole(const struct swap_region *r, uint64_t page) {
	size_t lo = 0, hi = r->nholes;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (r->holes[2 * mid + 1] <= page)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < r->nholes && r->holes[2 * lo] <= page;
}

static void uffd_wake(struct swap_region *r, uint64_t addr) {
	struct uffdio_range rng = {.start = addr, .len = PS};
	ioctl(r->uffd, UFFDIO_WAKE, &rng);
}

// punch releases the pages of [addr, addr+len) of a shared region: a hole in
// its memory file, which unmaps them from every process that maps it.
static int punch(struct swap_region *r, uint64_t addr, uint64_t len) {
	if (fallocate(r->data_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(addr - (uint64_t)r->base),
		      (off_t)len) != 0)
		return -errno;
	return 0;
}

// map_page maps one absent page (src NULL: the zero page). Called under the
// page's maplock with present clear, so nothing valid is mapped there; an
// EEXIST can only be a leftover marker (such as a poisoned entry after a
// failed fill) or, in a shared region, a page another process's mapping
// allocated by touching the hole (a reader that does not follow the
// protocol): either is zapped before trying again.
static int map_page(struct swap_region *r, uint64_t addr, const void *src) {
	if (r->uffd < 0) {
		// Without userfaultfd the released page reads zeros already; a
		// copy allocates it with an ordinary fault.
		if (src)
			memcpy((void *)addr, src, PS);
		return 0;
	}
	for (int attempt = 0;; attempt++) {
		int rc;
		if (src) {
			struct uffdio_copy cp = {.dst = addr, .src = (uint64_t)src, .len = PS, .mode = 0};
			rc = ioctl(r->uffd, UFFDIO_COPY, &cp);
		} else {
			struct uffdio_zeropage zp = {.range = {.start = addr, .len = PS}, .mode = 0};
			rc = ioctl(r->uffd, UFFDIO_ZEROPAGE, &zp);
		}
		if (rc == 0)
			return 0;
		int err = errno;
		if (err == EEXIST && attempt == 0) {
			madvise((void *)addr, PS, MADV_DONTNEED);
			if (r->data_fd >= 0)
				punch(r, addr, PS);
			continue;
		}
		if ((err == EAGAIN || err == EINTR) && attempt < 100)
			continue;
		return -err;
	}
}

static int read_backing(struct swap_region *r, uint64_t page, char *buf) {
	if (__atomic_load_n(&r->fail_fills, __ATOMIC_RELAXED))
		return -EIO;
	size_t done = 0;
	off_t off = (off_t)(page * PS);
	while (done < PS) {
		ssize_t n = pread(r->backing_fd, buf + done, PS - done, off + (off_t)done);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		done += (size_t)n;
	}
	return 0;
}

static void push_fill(struct swap_region *r, uint64_t page) {
	int notify = 0;
	pthread_mutex_lock(&r->qmu);
	if (r->qlen == r->qcap) {
		count(&r->counters.fill_overflows);
	} else {
		r->queue[(r->qhead + r->qlen) % r->qcap] = page;
		r->qlen++;
		notify = r->qlen == 1;
	}
	pthread_mutex_unlock(&r->qmu);
	if (notify && r->notify_fd >= 0) {
		uint64_t one = 1;
		ssize_t n = write(r->notify_fd, &one, sizeof one);
		(void)n; // EAGAIN only when the counter is saturated: Go is behind anyway.
	}
}

size_t swap_drain_fills(struct swap_region *r, uint64_t *out, size_t max) {
	pthread_mutex_lock(&r->qmu);
	size_t n = r->qlen < max ? r->qlen : max;
	for (size_t i = 0; i < n; i++)
		out[i] = r->queue[(r->qhead + i) % r->qcap];
	r->qhead = (r->qhead + n) % r->qcap;
	r->qlen -= n;
	pthread_mutex_unlock(&r->qmu);
	return n;
}

// fill resolves a fault on page. The backing read happens outside the lock
// (the lock is a spinlock); the version, which Go bumps whenever it starts to
// change a page, tells whether the page changed meanwhile, in which case the
// read may be stale and the fill starts again. An absent page's content is
// always on the backing device or known zero, so the fill needs nothing from
// Go.
static void fill(struct swap_region *r, uint64_t page, char *buf) {
	uint64_t *w = &r->states[page];
	uint64_t addr = (uint64_t)r->base + page * PS;
	int failures = 0;
	for (;;) {
		uint64_t s = load_state(w);
		if (s & SWAP_PRESENT) {
			count(&r->counters.uffd_wakes);
			uffd_wake(r, addr);
			return;
		}
		uint64_t version = s >> SWAP_VERSION_SHIFT;
		int zero = (s & SWAP_ZERO) || (version == 0 && swap_in_hole(r, page));
		int poison = 0;
		if (!zero) {
			int rc = read_backing(r, page, buf);
			if (rc != 0) {
				count(&r->counters.uffd_errors);
				if (++failures < 4) {
					struct timespec ts = {0, 1000000L * failures};
					nanosleep(&ts, NULL);
					continue;
				}
				if (!r->can_poison) {
					// Never hand out wrong bytes: keep the toucher
					// waiting and keep trying.
					struct timespec ts = {0, 100000000L};
					nanosleep(&ts, NULL);
					continue;
				}
				poison = 1;
			}
		}
		page_lock(w);
		s = load_state(w);
		if (s & SWAP_PRESENT) {
			page_unlock(w);
			count(&r->counters.uffd_wakes);
			uffd_wake(r, addr);
			return;
		}
		if ((s >> SWAP_VERSION_SHIFT) != version) {
			page_unlock(w);
			count(&r->counters.uffd_retries);
			continue;
		}
		if (poison) {
			// The toucher gets SIGBUS (a recoverable panic in Go with
			// debug.SetPanicOnFault) instead of wrong bytes. The page
			// stays absent; the next install maps over the marker.
			struct uffdio_poison po = {.range = {.start = addr, .len = PS}, .mode = 0};
			ioctl(r->uffd, UFFDIO_POISON, &po);
			page_unlock(w);
			count(&r->counters.uffd_poisoned);
			push_fill(r, page | SWAP_FILL_POISONED); // Go heals it later
			return;
		}
		int rc = map_page(r, addr, zero ? NULL : buf);
		if (rc == 0) {
			update_state(w, SWAP_PRESENT | (zero ? SWAP_ZERO : 0), zero ? 0 : SWAP_ZERO);
			__atomic_fetch_add(&r->counters.resident, 1, __ATOMIC_SEQ_CST);
		}
		page_unlock(w);
		if (rc == 0) {
			count(zero ? &r->counters.uffd_minor : &r->counters.uffd_major);
			push_fill(r, page);
			return;
		}
		count(&r->counters.uffd_errors);
		struct timespec ts = {0, 1000000L};
		nanosleep(&ts, NULL);
	}
}

// claim_fill records that thread self fills page, unless another thread is
// filling it already (then the fault is left to that thread, whose map or
// wake ends after this fault was queued, and so wakes its toucher).
static int claim_fill(struct swap_region *r, int self, uint64_t page) {
	int claimed = 1;
	pthread_mutex_lock(&r->fmu);
	for (int i = 0; i < SWAP_MAX_FAULT_THREADS; i++) {
		if (i != self && r->filling[i] == page) {
			claimed = 0;
			break;
		}
	}
	if (claimed)
		r->filling[self] = page;
	pthread_mutex_unlock(&r->fmu);
	return claimed;
}

static void end_fill(struct swap_region *r, int self) {
	pthread_mutex_lock(&r->fmu);
	r->filling[self] = UINT64_MAX;
	pthread_mutex_unlock(&r->fmu);
}

static void *fault_thread(void *arg) {
	struct swap_fault_thread *ft = arg;
	struct swap_region *r = ft->r;
	// Process-directed signals belong to Go's threads.
	sigset_t all;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	char *buf = NULL;
	if (posix_memalign((void **)&buf, PS, PS) != 0)
		return NULL;
	struct pollfd pfd[2] = {{.fd = r->uffd, .events = POLLIN}, {.fd = r->stop_fd, .events = POLLIN}};
	for (;;) {
		int n = poll(pfd, 2, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (pfd[1].revents)
			break;
		if (!(pfd[0].revents & POLLIN)) {
			if (pfd[0].revents & (POLLERR | POLLHUP | POLLNVAL))
				break;
			continue;
		}
		// One message at a time, so that the other threads take the next
		// faults while this one reads the backing device.
		struct uffd_msg msg;
		ssize_t got = read(r->uffd, &msg, sizeof msg);
		if (got != (ssize_t)sizeof msg || msg.event != UFFD_EVENT_PAGEFAULT)
			continue;
		uint64_t addr = msg.arg.pagefault.address & ~(PS - 1);
		uint64_t base = (uint64_t)r->base;
		if (addr < base || (addr - base) / PS >= r->npages)
			continue;
		count(&r->counters.uffd_faults);
		uint64_t page = (addr - base) / PS;
		if (!claim_fill(r, ft->index, page)) {
			count(&r->counters.uffd_shared);
			continue;
		}
		fill(r, page, buf);
		end_fill(r, ft->index);
	}
	free(buf);
	return NULL;
}

static int open_uffd(int features, uint64_t *got_features) {
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (fd < 0 && errno == EPERM) {
		// vm.unprivileged_userfaultfd=0: /dev/userfaultfd may still be open
		// to us.
		int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
		if (dev >= 0) {
			fd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
			close(dev);
		}
		if (fd < 0)
			errno = EPERM;
	}
	if (fd < 0)
		return -errno;
	struct uffdio_api api = {.api = UFFD_API, .features = (uint64_t)features};
	if (ioctl(fd, UFFDIO_API, &api) != 0) {
		int err = errno;
		close(fd);
		return -err;
	}
	*got_features = api.features;
	return fd;
}

static void destroy(struct swap_region *r) {
	if (r->nthreads > 0) {
		uint64_t one = 1;
		ssize_t n = write(r->stop_fd, &one, sizeof one);
		(void)n;
		for (int i = 0; i < r->nthreads; i++)
			pthread_join(r->threads[i], NULL);
	}
	if (r->uffd >= 0) {
		struct uffdio_range rng = {.start = (uint64_t)r->base, .len = r->size};
		ioctl(r->uffd, UFFDIO_UNREGISTER, &rng);
		close(r->uffd);
	}
	if (r->stop_fd >= 0)
		close(r->stop_fd);
	if (r->self_pidfd >= 0)
		close(r->self_pidfd);
	if (r->base)
		munmap(r->base, r->size);
	if (r->states)
		munmap(r->states, r->states_bytes);
	free(r->holes);
	free(r->queue);
	pthread_mutex_destroy(&r->qmu);
	pthread_mutex_destroy(&r->fmu);
	free(r);
}

void swap_region_destroy(struct swap_region *r) {
	if (r)
		destroy(r);
}

int swap_region_create(struct swap_region **out, uint64_t size, int use_uffd, int backing_fd,
		       int nthreads, uint64_t qcap, const uint64_t *holes, size_t nholes,
		       int notify_fd, int data_fd, int states_fd, const char **stage) {
	*out = NULL;
	*stage = "allocate";
	if (size == 0 || size % PS != 0 || qcap == 0)
		return -EINVAL;
	if (nthreads > SWAP_MAX_FAULT_THREADS)
		nthreads = SWAP_MAX_FAULT_THREADS;
	struct swap_region *r = calloc(1, sizeof *r);
	if (!r)
		return -ENOMEM;
	r->uffd = -1;
	r->stop_fd = -1;
	r->data_fd = data_fd;
	r->self_pidfd = syscall(SYS_pidfd_open, getpid(), 0);
	r->batch_discard = r->self_pidfd >= 0;
	r->backing_fd = backing_fd;
	r->notify_fd = notify_fd;
	r->size = size;
	r->npages = size / PS;
	pthread_mutex_init(&r->qmu, NULL);
	pthread_mutex_init(&r->fmu, NULL);
	for (int i = 0; i < SWAP_MAX_FAULT_THREADS; i++)
		r->filling[i] = UINT64_MAX;
	int err;

	*stage = "mmap region";
	void *base = data_fd >= 0 ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, data_fd, 0)
				  : mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (base == MAP_FAILED) {
		err = -errno;
		goto fail;
	}
	r->base = base;
	// A huge page would make one 4 KiB fault resident as 2 MiB and break
	// the budget; the region is managed at 4 KiB.
	madvise(base, size, MADV_NOHUGEPAGE);

	*stage = "mmap state table";
	r->states_bytes = (size_t)((r->npages * 8 + PS - 1) / PS * PS);
	void *states = states_fd >= 0 ? mmap(NULL, r->states_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, states_fd, 0)
				      : mmap(NULL, r->states_bytes, PROT_READ | PROT_WRITE,
					     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (states == MAP_FAILED) {
		err = -errno;
		goto fail;
	}
	r->states = states;

	*stage = "allocate";
	if (nholes > 0) {
		r->holes = malloc(nholes * 2 * sizeof(uint64_t));
		if (!r->holes) {
			err = -ENOMEM;
			goto fail;
		}
		memcpy(r->holes, holes, nholes * 2 * sizeof(uint64_t));
		r->nholes = nholes;
	}
	r->queue = malloc(qcap * sizeof(uint64_t));
	if (!r->queue) {
		err = -ENOMEM;
		goto fail;
	}
	r->qcap = qcap;

	if (use_uffd) {
		*stage = "userfaultfd";
		if (backing_fd < 0) {
			err = -EBADF;
			goto fail;
		}
		uint64_t features = 0;
		int fd = open_uffd(UFFD_FEATURE_POISON, &features);
		if (fd == -EINVAL)
			fd = open_uffd(0, &features);
		if (fd < 0) {
			err = fd;
			goto fail;
		}
		r->uffd = fd;
		r->can_poison = (features & UFFD_FEATURE_POISON) != 0;

		*stage = "UFFDIO_REGISTER";
		struct uffdio_register reg = {.range = {.start = (uint64_t)base, .len = size},
					      .mode = UFFDIO_REGISTER_MODE_MISSING};
		if (ioctl(fd, UFFDIO_REGISTER, &reg) != 0) {
			err = -errno;
			goto fail;
		}
		uint64_t need = (1ULL << _UFFDIO_COPY) | (1ULL << _UFFDIO_ZEROPAGE) | (1ULL << _UFFDIO_WAKE);
		if ((reg.ioctls & need) != need) {
			err = -ENOTSUP;
			goto fail;
		}
		if (!(reg.ioctls & (1ULL << _UFFDIO_POISON)))
			r->can_poison = 0;

		*stage = "eventfd";
		r->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (r->stop_fd < 0) {
			err = -errno;
			goto fail;
		}
		*stage = "pthread_create";
		// nthreads is final before any thread reads it in claim_fill.
		for (int i = 0; i < nthreads; i++) {
			r->thread_args[i].r = r;
			r->thread_args[i].index = i;
		}
		for (int i = 0; i < nthreads; i++) {
			int rc = pthread_create(&r->threads[i], NULL, fault_thread, &r->thread_args[i]);
			if (rc != 0) {
				err = -rc;
				goto fail;
			}
			r->nthreads++;
			// Named by the creator, so the name is there when New returns.
			pthread_setname_np(r->threads[i], "nprdma-uffd");
		}
	}
	*stage = "";
	*out = r;
	return 0;
fail:
	destroy(r);
	return err;
}

int swap_install(struct swap_region *r, uint64_t page, const void *src, int overwrite) {
	uint64_t *w = &r->states[page];
	char *dst = r->base + page * PS;
	page_lock(w);
	uint64_t s = load_state(w);
	int rc;
	if (s & SWAP_PRESENT) {
		if (overwrite) {
			if (src)
				memcpy(dst, src, PS);
			else
				memset(dst, 0, PS);
		}
		rc = 0;
	} else {
		rc = map_page(r, (uint64_t)dst, src);
		if (rc == 0) {
			update_state(w, SWAP_PRESENT | (src ? 0 : SWAP_ZERO), src ? SWAP_ZERO : 0);
			rc = 1;
		}
	}
	page_unlock(w);
	return rc;
}

void swap_heal(struct swap_region *r, uint64_t page) {
	uint64_t *w = &r->states[page];
	page_lock(w);
	if (!(load_state(w) & SWAP_PRESENT))
		madvise(r->base + page * PS, PS, MADV_DONTNEED); // the marker is in this mapping only
	page_unlock(w);
}

// discard releases the memory of the ranges in iov. One madvise per range
// costs a TLB shootdown each: an interrupt to every other CPU running a
// thread of this process, which on a VM is tens of µs per range (measured
// here: 38–67 µs per scattered page with a busy sibling thread, 10–17 µs in one
// batch). process_madvise on our own pidfd (MADV_DONTNEED there: Linux 6.13)
// releases them all with one flush. Where the kernel refuses it, discard
// falls back to madvise for good.
//
// A shared region's pages live in its memory file: a hole punched there is
// what releases them (MADV_DONTNEED would only unmap them here), one system
// call per range.
static void discard(struct swap_region *r, struct iovec *iov, size_t n) {
	if (r->data_fd >= 0) {
		for (size_t i = 0; i < n; i++)
			punch(r, (uint64_t)iov[i].iov_base, iov[i].iov_len);
		return;
	}
	if (__atomic_load_n(&r->batch_discard, __ATOMIC_RELAXED)) {
		size_t want = 0;
		for (size_t i = 0; i < n; i++)
			want += iov[i].iov_len;
		long done = syscall(SYS_process_madvise, r->self_pidfd, iov, n, MADV_DONTNEED, 0);
		if (done == (long)want)
			return;
		if (done < 0 && (errno == EINVAL || errno == ENOSYS || errno == EPERM))
			__atomic_store_n(&r->batch_discard, 0, __ATOMIC_RELAXED);
		// Otherwise (a partial or failed batch): madvise is idempotent,
		// so every range is released again below.
	}
	for (size_t i = 0; i < n; i++)
		madvise(iov[i].iov_base, iov[i].iov_len, MADV_DONTNEED);
}

int64_t swap_release(struct swap_region *r, const uint64_t *pages, size_t n, int setzero) {
	int64_t released = 0;
	size_t i = 0;
	while (i < n) {
		// Lock a batch of runs of consecutive pages (ascending, so no two
		// releases deadlock) and release them with one call.
		struct iovec iov[SWAP_RELEASE_BATCH];
		size_t nv = 0, first = i;
		while (i < n && nv < SWAP_RELEASE_BATCH) {
			size_t j = i + 1;
			while (j < n && pages[j] == pages[j - 1] + 1)
				j++;
			for (size_t k = i; k < j; k++)
				page_lock(&r->states[pages[k]]);
			iov[nv].iov_base = r->base + pages[i] * PS;
			iov[nv].iov_len = (j - i) * PS;
			nv++;
			i = j;
		}
		discard(r, iov, nv);
		for (size_t k = first; k < i; k++) {
			uint64_t *w = &r->states[pages[k]];
			uint64_t old = update_state(w, setzero ? SWAP_ZERO : 0, SWAP_PRESENT);
			if (old & SWAP_PRESENT)
				released++;
			page_unlock(w);
		}
	}
	if (released)
		__atomic_fetch_sub(&r->counters.resident, released, __ATOMIC_SEQ_CST);
	return released;
}
