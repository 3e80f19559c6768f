//go:build cgo && !noverbs

package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/nprdma/nprdma/nprdma"
)

var osPageSize = os.Getpagesize()

// PD is a protection domain.
type PD struct {
	dev *Device
	pd  *C.struct_ibv_pd

	mu     sync.Mutex
	closed bool
	mrs    map[*MR]struct{}
	qps    map[*QP]struct{}
}

// AllocPD implements nprdma.DeviceDriver.
func (d *Device) AllocPD() (nprdma.PDDriver, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("verbs: %s: allocate protection domain: %w", d.info.Name, nprdma.ErrClosed)
	}
	var e C.int
	p := C.np_alloc_pd(d.ctx, &e)
	if p == nil {
		return nil, fmt.Errorf("verbs: %s: allocate protection domain: %w", d.info.Name, syscall.Errno(e))
	}
	pd := &PD{dev: d, pd: p, mrs: map[*MR]struct{}{}, qps: map[*QP]struct{}{}}
	d.pds[pd] = struct{}{}
	return pd, nil
}

// Device is the PD's device.
func (pd *PD) Device() *Device { return pd.dev }

// Close releases the PD; it fails while regions or queue pairs use it.
func (pd *PD) Close() error {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.closed {
		return nil
	}
	if len(pd.mrs) > 0 || len(pd.qps) > 0 {
		return fmt.Errorf("verbs: close protection domain: still used by %d memory regions and %d queue pairs", len(pd.mrs), len(pd.qps))
	}
	pd.closed = true
	pd.dev.mu.Lock()
	delete(pd.dev.pds, pd)
	pd.dev.mu.Unlock()
	if rc := C.np_dealloc_pd(pd.pd); rc != 0 {
		return fmt.Errorf("verbs: close protection domain: %w", errnoErr(rc))
	}
	return nil
}

// closeAll deregisters the PD's regions (Device.Close).
func (pd *PD) closeAll() {
	pd.mu.Lock()
	var mrs []*MR
	for mr := range pd.mrs {
		mrs = append(mrs, mr)
	}
	pd.mu.Unlock()
	for _, mr := range mrs {
		mr.Deregister()
	}
}

// MR is a registered memory region.
type MR struct {
	pd     *PD
	mr     *C.struct_ibv_mr
	buf    []byte
	addr   uint64
	access nprdma.Access
	odp    bool
	dead   atomic.Bool
}

// Register implements nprdma.PDDriver: it registers buf, pinning its pages
// (ibv_reg_mr). buf must be memory outside the Go heap (nprdma.AllocBuffer,
// an mmap): the NIC keeps its address. The pages are charged to
// RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK. The access tag is not
// enforced (nprdma.Caps.AccessTags).
func (pd *PD) Register(buf []byte, access nprdma.Access, tag uint64) (nprdma.MRDriver, error) {
	return pd.register(buf, access&^nprdma.AccessOnDemand, access&nprdma.AccessOnDemand != 0)
}

// RegisterUnpinned implements nprdma.PDDriver: a NIC cannot be handed a
// region it has not pinned (docs/np-rdma.md).
func (pd *PD) RegisterUnpinned(nprdma.Pager, nprdma.Access, uint64) (nprdma.MRDriver, error) {
	return nil, fmt.Errorf("verbs: %s: register unpinned: a NIC reads only memory that is pinned or on-demand paged", pd.dev.info.Name)
}

func (pd *PD) register(buf []byte, access nprdma.Access, odp bool) (*MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("verbs: register: empty buffer")
	}
	if access&^(nprdma.AccessLocalWrite|nprdma.AccessRemoteRead|nprdma.AccessRemoteWrite) != 0 {
		return nil, fmt.Errorf("verbs: register %d bytes: unknown access bits %#x", len(buf), uint32(access))
	}
	if access&nprdma.AccessRemoteWrite != 0 && access&nprdma.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("verbs: register %d bytes: remote-write needs local-write", len(buf))
	}
	flags := C.int(0)
	if access&nprdma.AccessLocalWrite != 0 {
		flags |= C.IBV_ACCESS_LOCAL_WRITE
	}
	if access&nprdma.AccessRemoteRead != 0 {
		flags |= C.IBV_ACCESS_REMOTE_READ
	}
	if access&nprdma.AccessRemoteWrite != 0 {
		flags |= C.IBV_ACCESS_REMOTE_WRITE
	}
	if odp {
		flags |= C.IBV_ACCESS_ON_DEMAND
	}
	addr := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.closed {
		return nil, fmt.Errorf("verbs: register %d bytes: protection domain %w", len(buf), nprdma.ErrClosed)
	}
	var e C.int
	m := C.np_reg_mr(pd.pd, C.uintptr_t(addr), C.size_t(len(buf)), flags, &e)
	if m == nil {
		err := error(syscall.Errno(e))
		hint := ""
		switch syscall.Errno(e) {
		case syscall.ENOMEM, syscall.EPERM:
			hint = " (pinned registrations are charged to RLIMIT_MEMLOCK: raise it, e.g. LimitMEMLOCK=infinity, or run with CAP_IPC_LOCK)"
		case syscall.EOPNOTSUPP, syscall.EINVAL:
			if odp {
				hint = " (the device has no on-demand paging for this memory)"
			}
		}
		return nil, fmt.Errorf("verbs: register %d bytes at %#x on %s: %w%s", len(buf), addr, pd.dev.info.Name, err, hint)
	}
	mr := &MR{pd: pd, mr: m, buf: buf, addr: addr, access: access, odp: odp}
	pd.mrs[mr] = struct{}{}
	pd.dev.ctr.registrations.Add(1)
	pd.dev.ctr.registeredBytes.Add(int64(len(buf)))
	return mr, nil
}

// Addr is the address of the region's first byte.
func (mr *MR) Addr() uint64 { return mr.addr }

// Len is the region's length.
func (mr *MR) Len() int { return len(mr.buf) }

// Bytes is the registered memory.
func (mr *MR) Bytes() []byte { return mr.buf }

// LKey is the local key.
func (mr *MR) LKey() uint32 { return uint32(mr.mr.lkey) }

// RKey is the remote key.
func (mr *MR) RKey() uint32 { return uint32(mr.mr.rkey) }

// Access is the set of rights granted.
func (mr *MR) Access() nprdma.Access { return mr.access }

// OnDemand reports whether the region was registered with on-demand paging.
func (mr *MR) OnDemand() bool { return mr.odp }

// Pinned implements nprdma.MRDriver.
func (mr *MR) Pinned() bool { return !mr.odp }

// Magic implements nprdma.MRDriver: none.
func (mr *MR) Magic() uint64 { return 0 }

// PageSize implements nprdma.MRDriver.
func (mr *MR) PageSize() int { return osPageSize }

// SGE names n bytes at offset off of the region.
func (mr *MR) SGE(off, n int) nprdma.SGE {
	return nprdma.SGE{Addr: mr.addr + uint64(off), Length: uint32(n), LKey: mr.LKey()}
}

// Deregister revokes the region's keys and unpins it.
func (mr *MR) Deregister() error {
	if !mr.dead.CompareAndSwap(false, true) {
		return nil
	}
	pd := mr.pd
	pd.mu.Lock()
	delete(pd.mrs, mr)
	pd.mu.Unlock()
	pd.dev.ctr.registeredBytes.Add(-int64(len(mr.buf)))
	if rc := C.np_dereg_mr(mr.mr); rc != 0 {
		return fmt.Errorf("verbs: deregister %d bytes: %w", len(mr.buf), errnoErr(rc))
	}
	return nil
}
