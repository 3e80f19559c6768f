package swap

/*
#cgo CFLAGS: -O2 -Wall
#cgo LDFLAGS: -lpthread
#include <stdlib.h>
#include "swap.h"
*/
import "C"

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// cRegion is the Go handle on the C half (swap.c): the mapping, the state
// table, the userfaultfd and its threads, and the counters they share.
type cRegion struct {
	c      *C.struct_swap_region
	base   []byte
	states []uint64
	uffd   bool
}

type cRegionConfig struct {
	size      int64
	uffd      bool
	backingFd int
	threads   int
	queueCap  int
	holes     []int64 // page pairs [start, end)
	notifyFd  int
	dataFd    int // memory files of a shareable region; -1: anonymous
	statesFd  int
}

func newCRegion(cfg cRegionConfig) (*cRegion, error) {
	var holesPtr *C.uint64_t
	if len(cfg.holes) > 0 {
		// C copies the list; a C buffer keeps Go pointers out of C.
		holesPtr = (*C.uint64_t)(C.malloc(C.size_t(len(cfg.holes) * 8)))
		defer C.free(unsafe.Pointer(holesPtr))
		hs := unsafe.Slice((*uint64)(unsafe.Pointer(holesPtr)), len(cfg.holes))
		for i, h := range cfg.holes {
			hs[i] = uint64(h)
		}
	}
	useUffd := C.int(0)
	if cfg.uffd {
		useUffd = 1
	}
	var c *C.struct_swap_region
	var stage *C.char
	rc := C.swap_region_create(&c, C.uint64_t(cfg.size), useUffd, C.int(cfg.backingFd), C.int(cfg.threads),
		C.uint64_t(cfg.queueCap), holesPtr, C.size_t(len(cfg.holes)/2), C.int(cfg.notifyFd),
		C.int(cfg.dataFd), C.int(cfg.statesFd), &stage)
	if rc != 0 {
		return nil, fmt.Errorf("%s: %w", C.GoString(stage), syscall.Errno(-rc))
	}
	npages := cfg.size / PageSize
	return &cRegion{
		c:      c,
		base:   unsafe.Slice((*byte)(unsafe.Pointer(c.base)), cfg.size),
		states: unsafe.Slice((*uint64)(unsafe.Pointer(c.states)), npages),
		uffd:   cfg.uffd,
	}, nil
}

func (cr *cRegion) destroy() {
	C.swap_region_destroy(cr.c)
	cr.c, cr.base, cr.states = nil, nil, nil
}

// install maps page from src (a PageSize, page-aligned buffer; nil for the
// zero page). It reports whether this call mapped it (false: it was mapped
// already, by a userfaultfd fill).
func (cr *cRegion) install(page int, src []byte, overwrite bool) (bool, error) {
	var p unsafe.Pointer
	if src != nil {
		p = unsafe.Pointer(&src[0])
	}
	ow := C.int(0)
	if overwrite {
		ow = 1
	}
	rc := C.swap_install(cr.c, C.uint64_t(page), p, ow)
	if rc < 0 {
		return false, syscall.Errno(-rc)
	}
	return rc == 1, nil
}

// release unmaps pages (ascending, busy held, readers drained) and returns how
// many were present.
func (cr *cRegion) release(pages []uint64, setZero bool) int {
	if len(pages) == 0 {
		return 0
	}
	z := C.int(0)
	if setZero {
		z = 1
	}
	return int(C.swap_release(cr.c, (*C.uint64_t)(unsafe.Pointer(&pages[0])), C.size_t(len(pages)), z))
}

// heal removes a poison marker from an absent page.
func (cr *cRegion) heal(page int) { C.swap_heal(cr.c, C.uint64_t(page)) }

const fillPoisoned = uint64(C.SWAP_FILL_POISONED)

// drainFills moves pages filled by the fault threads into out; poisoned ones
// carry fillPoisoned.
func (cr *cRegion) drainFills(out []uint64) int {
	return int(C.swap_drain_fills(cr.c, (*C.uint64_t)(unsafe.Pointer(&out[0])), C.size_t(len(out))))
}

func (cr *cRegion) resident() *int64 { return (*int64)(unsafe.Pointer(&cr.c.counters.resident)) }

func (cr *cRegion) counter(p *C.uint64_t) uint64 {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(p)))
}

type cCounters struct {
	faults, minor, major, wakes, shared, retries, errors, poisoned, overflows uint64
}

func (cr *cRegion) counters() cCounters {
	k := &cr.c.counters
	return cCounters{
		faults:    cr.counter(&k.uffd_faults),
		minor:     cr.counter(&k.uffd_minor),
		major:     cr.counter(&k.uffd_major),
		wakes:     cr.counter(&k.uffd_wakes),
		shared:    cr.counter(&k.uffd_shared),
		retries:   cr.counter(&k.uffd_retries),
		errors:    cr.counter(&k.uffd_errors),
		poisoned:  cr.counter(&k.uffd_poisoned),
		overflows: cr.counter(&k.fill_overflows),
	}
}

// setFailFills makes the fault threads' backing reads fail (a test hook: the
// threads read the descriptor directly, below any blockdev fault decorator).
func (cr *cRegion) setFailFills(on bool) { storeCFlag(&cr.c.fail_fills, on) }

// setBatchDiscard turns batched releases (process_madvise) on or off (a test
// hook: off is the path of kernels that refuse it); batchDiscard reports
// whether they are on.
func (cr *cRegion) setBatchDiscard(on bool) { storeCFlag(&cr.c.batch_discard, on) }

func (cr *cRegion) batchDiscard() bool {
	return atomic.LoadInt32((*int32)(unsafe.Pointer(&cr.c.batch_discard))) != 0
}

// storeCFlag sets a C int flag that the C side reads atomically.
func storeCFlag(p *C.int, on bool) {
	v := int32(0)
	if on {
		v = 1
	}
	atomic.StoreInt32((*int32)(unsafe.Pointer(p)), v)
}

// cStateLayout returns the C definitions of the state word, for the test
// that keeps state.go and swap.h in agreement.
func cStateLayout() map[string]uint64 {
	return map[string]uint64{
		"present":      uint64(C.SWAP_PRESENT),
		"busy":         uint64(C.SWAP_BUSY),
		"dirty":        uint64(C.SWAP_DIRTY),
		"referenced":   uint64(C.SWAP_REFERENCED),
		"zero":         uint64(C.SWAP_ZERO),
		"writeback":    uint64(C.SWAP_WRITEBACK),
		"maplock":      uint64(C.SWAP_MAPLOCK),
		"tracked":      uint64(C.SWAP_TRACKED),
		"readersShift": uint64(C.SWAP_READERS_SHIFT),
		"readersMask":  uint64(C.SWAP_READERS_MASK),
		"versionShift": uint64(C.SWAP_VERSION_SHIFT),
		"pageSize":     uint64(C.SWAP_PAGE_SIZE),
	}
}
