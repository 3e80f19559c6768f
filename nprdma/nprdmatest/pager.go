// Package nprdmatest has test doubles for nprdma: a Pager whose page states a
// test controls.
package nprdmatest

import (
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nprdma/nprdma/nprdma"
)

// PageState is the state a test gives a page of a Pager.
type PageState int

// Page states.
const (
	// Resident: present and stable; NIC reads succeed.
	Resident PageState = iota
	// Absent: not in memory; NIC reads get the magic page.
	Absent
	// Busy: being changed; NIC reads get the magic page.
	Busy
	// Zero: present and known to hold only zeros; NIC reads get zeros
	// without reading the page's memory (whatever a test wrote there).
	Zero
)

// Page state word, like the swap layer's: present and busy bits, a version
// above them.
const (
	bitPresent = 1 << 0
	bitBusy    = 1 << 1
	bitZero    = 1 << 4
	versionOne = 1 << 16
)

// Pager is an in-memory nprdma.Pager. Its memory lives outside the Go heap,
// as a real region's does. Safe for concurrent use.
type Pager struct {
	mem      []byte
	pageSize int
	words    []atomic.Uint64
	shared   *sharedFiles  // NewSharedPager
	change   []atomic.Bool // bump the version between the next ReadBegin and ReadEnd
	inFlight atomic.Int64
	begins   atomic.Uint64
	advised  atomic.Uint64
}

var _ nprdma.Pager = (*Pager)(nil)

// NewPager returns a pager of pages pages of pageSize bytes, all resident and
// zero.
func NewPager(pages, pageSize int) (*Pager, error) {
	if pages <= 0 || pageSize <= 0 || pageSize%8 != 0 {
		return nil, fmt.Errorf("nprdmatest: pager of %d pages of %d bytes: bad geometry", pages, pageSize)
	}
	mem, err := nprdma.AllocBuffer(pages * pageSize)
	if err != nil {
		return nil, err
	}
	p := &Pager{mem: mem, pageSize: pageSize, words: make([]atomic.Uint64, pages), change: make([]atomic.Bool, pages)}
	for i := range p.words {
		p.words[i].Store(bitPresent)
	}
	return p, nil
}

// Close frees the pager's memory.
func (p *Pager) Close() error {
	if p.shared != nil {
		return p.shared.close()
	}
	return nprdma.FreeBuffer(p.mem)
}

// Bytes implements nprdma.Pager.
func (p *Pager) Bytes() []byte { return p.mem }

// PageSize implements nprdma.Pager.
func (p *Pager) PageSize() int { return p.pageSize }

// Pages is the number of pages.
func (p *Pager) Pages() int { return len(p.words) }

// Page returns page i's memory, for a test to fill.
func (p *Pager) Page(i int) []byte { return p.mem[i*p.pageSize : (i+1)*p.pageSize] }

// ReadBegin implements nprdma.Pager.
func (p *Pager) ReadBegin(i int) (seq uint64, zero, ok bool) {
	p.begins.Add(1)
	w := p.words[i].Load()
	if w&bitPresent == 0 || w&bitBusy != 0 {
		return 0, false, false
	}
	p.inFlight.Add(1)
	return w, w&bitZero != 0, true
}

// ReadEnd implements nprdma.Pager.
func (p *Pager) ReadEnd(i int, seq uint64) bool {
	if p.inFlight.Add(-1) < 0 {
		panic("nprdmatest: ReadEnd without ReadBegin")
	}
	if p.change[i].CompareAndSwap(true, false) {
		// A writer changed the page while the NIC copied it.
		p.words[i].Add(versionOne)
	}
	return p.words[i].Load() == seq
}

// Advise implements nprdma.Pager; it only counts calls.
func (p *Pager) Advise(off, length int64) error {
	p.advised.Add(1)
	return nil
}

// SetState sets page i's state; every change bumps the version. On a
// shared pager, Absent also releases the page's memory (it reads zeros when
// it is made resident again), as a real pager's eviction does.
func (p *Pager) SetState(i int, s PageState) {
	if s == Absent && p.shared != nil {
		defer p.shared.punch(i*p.pageSize, p.pageSize)
	}
	for {
		old := p.words[i].Load()
		w := (old &^ (versionOne - 1)) + versionOne
		switch s {
		case Resident:
			w |= bitPresent
		case Busy:
			w |= bitPresent | bitBusy
		case Zero:
			w |= bitPresent | bitZero
		}
		if p.words[i].CompareAndSwap(old, w) {
			return
		}
	}
}

// ChangeDuringCopy makes the next NIC read of page i see the page change
// between ReadBegin and ReadEnd, as a concurrent writer would.
func (p *Pager) ChangeDuringCopy(i int) { p.change[i].Store(true) }

// InFlight is the number of reads begun and not ended (0 when the NIC
// engine matched every ReadBegin with a ReadEnd).
func (p *Pager) InFlight() int64 { return p.inFlight.Load() }

// Begins counts ReadBegin calls.
func (p *Pager) Begins() uint64 { return p.begins.Load() }

// MagicPage returns what a page reads as when the NIC cannot read it.
func MagicPage(magic uint64, pageSize int) []byte {
	b := make([]byte, pageSize)
	for k := range b {
		b[k] = byte(magic >> (8 * (k % 8)))
	}
	return b
}

// sharedFiles are the memory files of a shared pager.
type sharedFiles struct {
	data, states, access *os.File
	roData, roStates     *os.File
	stateMem, accessMem  []byte
	mem                  []byte
}

// NewSharedPager returns a pager like NewPager whose memory, state words and
// access map are memory files that another process may map
// (nprdma.SharedPager), as a shareable swap.Region's are. A page set Absent
// has its memory released (a hole in the file).
func NewSharedPager(pages, pageSize int) (*Pager, error) {
	if pages <= 0 || pageSize <= 0 || pageSize%8 != 0 || pageSize%os.Getpagesize() != 0 {
		return nil, fmt.Errorf("nprdmatest: shared pager of %d pages of %d bytes: bad geometry", pages, pageSize)
	}
	sf := &sharedFiles{}
	fail := func(err error) (*Pager, error) {
		sf.close()
		return nil, err
	}
	mk := func(name string, size int) (*os.File, []byte, error) {
		fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
		if err != nil {
			return nil, nil, err
		}
		f := os.NewFile(uintptr(fd), name)
		if err := f.Truncate(int64(size)); err != nil {
			f.Close()
			return nil, nil, err
		}
		m, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			f.Close()
			return nil, nil, err
		}
		return f, m, nil
	}
	var err error
	roundUp := func(n int) int { return (n + os.Getpagesize() - 1) &^ (os.Getpagesize() - 1) }
	if sf.data, sf.mem, err = mk("nprdmatest-data", pages*pageSize); err != nil {
		return fail(err)
	}
	if sf.states, sf.stateMem, err = mk("nprdmatest-states", roundUp(pages*8)); err != nil {
		return fail(err)
	}
	if sf.access, sf.accessMem, err = mk("nprdmatest-access", roundUp((pages+63)/64*8)); err != nil {
		return fail(err)
	}
	if sf.roData, err = os.Open(fmt.Sprintf("/proc/self/fd/%d", sf.data.Fd())); err != nil {
		return fail(err)
	}
	if sf.roStates, err = os.Open(fmt.Sprintf("/proc/self/fd/%d", sf.states.Fd())); err != nil {
		return fail(err)
	}
	p := &Pager{mem: sf.mem, pageSize: pageSize, shared: sf, change: make([]atomic.Bool, pages),
		words: unsafe.Slice((*atomic.Uint64)(unsafe.Pointer(&sf.stateMem[0])), pages)}
	for i := range p.words {
		p.words[i].Store(bitPresent)
	}
	return p, nil
}

var _ nprdma.SharedPager = (*Pager)(nil)

// ShareFiles implements nprdma.SharedPager (ok false unless the pager was
// made with NewSharedPager).
func (p *Pager) ShareFiles() (data, states, access *os.File, ok bool) {
	if p.shared == nil {
		return nil, nil, nil, false
	}
	return p.shared.roData, p.shared.roStates, p.shared.access, true
}

// StateBits implements nprdma.SharedPager.
func (p *Pager) StateBits() (present, busy, zero uint64, versionShift uint) {
	return bitPresent, bitBusy, bitZero, 16
}

// Accessed reports whether a reader in place marked page i used, and clears
// the mark.
func (p *Pager) Accessed(i int) bool {
	if p.shared == nil {
		return false
	}
	w := (*atomic.Uint64)(unsafe.Pointer(&p.shared.accessMem[i/64*8]))
	bit := uint64(1) << (i % 64)
	return w.And(^bit)&bit != 0
}

// Allocated reports whether page i of a shared pager's memory file holds a
// page (false: a hole).
func (p *Pager) Allocated(i int) bool {
	if p.shared == nil {
		return true
	}
	off := int64(i * p.pageSize)
	at, err := unix.Seek(int(p.shared.data.Fd()), off, unix.SEEK_DATA)
	return err == nil && at < off+int64(p.pageSize)
}

func (sf *sharedFiles) punch(off, n int) {
	unix.Fallocate(int(sf.data.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(off), int64(n))
}

func (sf *sharedFiles) close() error {
	for _, m := range [][]byte{sf.mem, sf.stateMem, sf.accessMem} {
		if m != nil {
			unix.Munmap(m)
		}
	}
	for _, f := range []*os.File{sf.data, sf.states, sf.access, sf.roData, sf.roStates} {
		if f != nil {
			f.Close()
		}
	}
	return nil
}
