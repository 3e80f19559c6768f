package shm

import (
	"fmt"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/nprdma/nprdma/nprdma/link"

	"golang.org/x/sys/unix"
)

// InPlaceMode says how a requester reads the regions its peers share with
// it.
type InPlaceMode int

const (
	// InPlaceMapped maps a shared region read-only (private: nothing the
	// requester does can change the peer's memory) and registers the
	// mapping with a userfaultfd in SIGBUS mode, so that touching a page
	// the owner released raises SIGBUS instead of allocating a page in the
	// owner's memory; the copy recovers from it and the page is a
	// suspected fault. A hit costs the state checks and a memcpy. The
	// default; without userfaultfd it falls back to InPlacePread.
	InPlaceMapped InPlaceMode = iota
	// InPlacePread reads shared memory with pread, which reads a released
	// page as zeros without allocating it: a system call per page part.
	InPlacePread
	// InPlaceOff reads nothing in place: every READ goes to the peer.
	InPlaceOff
)

func (m InPlaceMode) String() string {
	switch m {
	case InPlaceMapped:
		return "mapped"
	case InPlacePread:
		return "pread"
	case InPlaceOff:
		return "off"
	}
	return fmt.Sprintf("InPlaceMode(%d)", int(m))
}

// fileKey identifies a shared memory file, so that a region shared on
// several queue pairs (one grant each) is mapped once.
type fileKey struct{ dev, ino uint64 }

// mapping is a peer's shared region as this process maps it: its memory
// (read-only, private), its page state table (read-only, private) and its
// access map (shared, written).
type mapping struct {
	ms     *mappings
	key    fileKey
	refs   int // grants using it, under mappings.mu
	mode   InPlaceMode
	data   []byte   // InPlaceMapped
	dataF  *os.File // InPlacePread
	dataFD int      // dataF's descriptor
	states []uint64
	stateM []byte
	access []uint64 // one bit per page
	accM   []byte
}

// mappings are the provider's mappings of peers' regions.
type mappings struct {
	mu      sync.Mutex
	byKey   map[fileKey]*mapping
	mode    InPlaceMode
	uffd    *os.File
	uffdErr error         // why mapped reads are not possible (then pread)
	faults  atomic.Uint64 // copies that faulted (the page was gone)
}

// get maps the region behind files (data, states, access; it takes them),
// or returns the mapping it has of the same files. The region is length
// bytes of pages of pageSize.
func (ms *mappings) get(files []*os.File, length uint64, pageSize int) (*mapping, error) {
	defer closeFiles(files)
	pages := length / uint64(pageSize)
	var st [3]unix.Stat_t
	need := []uint64{length, pages * 8, accessBytes(pages)}
	for i, f := range files {
		fd, err := rawFD(f)
		if err != nil {
			return nil, err
		}
		if err := unix.Fstat(fd, &st[i]); err != nil {
			return nil, os.NewSyscallError("fstat", err)
		}
		if st[i].Mode&unix.S_IFMT != unix.S_IFREG || uint64(st[i].Size) < need[i] {
			return nil, fmt.Errorf("%w: shared file %d of %d bytes, %d needed", errMessage, i, st[i].Size, need[i])
		}
	}
	key := fileKey{uint64(st[0].Dev), st[0].Ino}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if m := ms.byKey[key]; m != nil && uint64(len(m.states)) >= pages {
		m.refs++
		return m, nil
	}
	m := &mapping{ms: ms, key: key, refs: 1, mode: ms.mode}
	if err := m.mapFiles(ms, files, length, pages); err != nil {
		m.unmap()
		return nil, err
	}
	if ms.byKey == nil {
		ms.byKey = map[fileKey]*mapping{}
	}
	ms.byKey[key] = m
	return m, nil
}

func (m *mapping) mapFiles(ms *mappings, files []*os.File, length, pages uint64) error {
	fds := make([]int, 3)
	for i, f := range files {
		fd, err := rawFD(f)
		if err != nil {
			return err
		}
		fds[i] = fd
	}
	roundUp := func(n uint64) int { return int((n + uint64(os.Getpagesize()) - 1) &^ uint64(os.Getpagesize()-1)) }
	if m.mode == InPlaceMapped {
		if ms.uffd == nil && ms.uffdErr == nil {
			ms.uffd, ms.uffdErr = openSigbusUffd()
		}
		if ms.uffdErr != nil {
			m.mode = InPlacePread
		}
	}
	if m.mode == InPlaceMapped {
		d, err := unix.Mmap(fds[0], 0, roundUp(length), unix.PROT_READ, unix.MAP_PRIVATE)
		if err != nil {
			return os.NewSyscallError("mmap shared region", err)
		}
		m.data = d
		if err := uffdRegister(ms.uffd, d); err != nil {
			return err
		}
	} else {
		f, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", fds[0]), os.O_RDONLY, 0)
		if err != nil {
			return err
		}
		m.dataF = f
		if m.dataFD, err = rawFD(f); err != nil {
			return err
		}
	}
	s, err := unix.Mmap(fds[1], 0, roundUp(pages*8), unix.PROT_READ, unix.MAP_PRIVATE)
	if err != nil {
		return os.NewSyscallError("mmap shared page states", err)
	}
	m.stateM = s
	m.states = unsafe.Slice((*uint64)(unsafe.Pointer(&s[0])), pages)
	a, err := unix.Mmap(fds[2], 0, roundUp(accessBytes(pages)), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return os.NewSyscallError("mmap shared access map", err)
	}
	m.accM = a
	m.access = unsafe.Slice((*uint64)(unsafe.Pointer(&a[0])), accessBytes(pages)/8)
	return nil
}

func (m *mapping) unmap() {
	if m.data != nil {
		unix.Munmap(m.data)
		m.data = nil
	}
	if m.dataF != nil {
		m.dataF.Close()
		m.dataF = nil
	}
	if m.stateM != nil {
		unix.Munmap(m.stateM)
		m.stateM, m.states = nil, nil
	}
	if m.accM != nil {
		unix.Munmap(m.accM)
		m.accM, m.access = nil, nil
	}
}

// put drops a grant's reference; the last one unmaps.
func (ms *mappings) put(m *mapping) {
	ms.mu.Lock()
	m.refs--
	last := m.refs == 0
	if last && ms.byKey[m.key] == m {
		delete(ms.byKey, m.key)
	}
	ms.mu.Unlock()
	if last {
		m.unmap()
	}
}

// count is the number of mappings held (for tests).
func (ms *mappings) count() int {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return len(ms.byKey)
}

// read copies [off, off+sum(len(dst))) of the region into dst under the
// seqlock of each page, writing the magic page where a page is absent,
// busy, changed during the copy, or gone (a fault).
func (m *mapping) read(g *grant, off int, dst [][]byte) link.LocalRead {
	var r link.LocalRead
	if m.mode == InPlaceMapped {
		old := debug.SetPanicOnFault(true)
		defer debug.SetPanicOnFault(old)
	}
	ps := g.info.pageSize
	var parts [link.MaxSGE + 1][]byte
	si, so := 0, 0 // position in dst
	for pos, end := off, off+totalLen(dst); pos < end; {
		page := pos / ps
		pe := min((page+1)*ps, end)
		// The destination pieces of this page part.
		pieces := parts[:0]
		for need := pe - pos; need > 0; {
			k := min(need, len(dst[si])-so)
			pieces = append(pieces, dst[si][so:so+k])
			need -= k
			so += k
			if so == len(dst[si]) {
				si, so = si+1, 0
			}
		}
		r.Pages++
		if !m.copyPage(g, page, pos, pieces) {
			r.Magic++
			at := pos
			for _, p := range pieces {
				link.FillMagic(p, g.info.magic, at)
				at += len(p)
			}
		}
		pos = pe
	}
	return r
}

// copyPage copies the part of page that starts at region offset at into
// pieces under the page's seqlock, and reports whether it is one whole
// version of the page. A fault — the owner released the page, or took the
// memory away — is a refusal like any other.
func (m *mapping) copyPage(g *grant, page, at int, pieces [][]byte) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			if _, fault := r.(interface{ Addr() uintptr }); !fault {
				panic(r)
			}
			m.ms.faults.Add(1)
			ok = false
		}
	}()
	b := &g.info.bits
	w := &m.states[page]
	s := atomic.LoadUint64(w)
	if s&b.Present == 0 || s&b.Busy != 0 {
		return false
	}
	if beforeCopy != nil {
		beforeCopy(page)
	}
	if s&b.Zero != 0 {
		for _, p := range pieces {
			clear(p)
		}
	} else if m.mode == InPlaceMapped {
		src := m.data[at:]
		for _, p := range pieces {
			src = src[copy(p, src):]
		}
	} else if !m.pread(at, pieces) {
		return false
	}
	readFence()
	t := atomic.LoadUint64(w)
	if t>>b.VersionShift != s>>b.VersionShift || t&b.Busy != 0 || t&b.Present == 0 {
		return false
	}
	if a, bit := &m.access[page/64], uint64(1)<<(page%64); atomic.LoadUint64(a)&bit == 0 {
		atomic.OrUint64(a, bit)
	}
	return true
}

// beforeCopy, when set (by tests), runs between a page's first state check
// and its copy: it widens the window in which the owner may release it.
var beforeCopy func(page int)

// pread reads a page part with a system call per piece (one, unless the
// destination splits the part): a released page reads as zeros there (and
// the version check refuses it), nothing is allocated.
func (m *mapping) pread(at int, pieces [][]byte) bool {
	for _, p := range pieces {
		n, err := unix.Pread(m.dataFD, p, int64(at))
		if err != nil || n != len(p) {
			return false
		}
		at += n
	}
	return true
}

// accessBytes is the size of the access map of pages pages.
func accessBytes(pages uint64) uint64 { return (pages + 63) / 64 * 8 }

func totalLen(b [][]byte) int {
	n := 0
	for _, p := range b {
		n += len(p)
	}
	return n
}
