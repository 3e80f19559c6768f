package nprdma

import "os"

// Pager is what an unpinned memory region needs from the memory behind it.
// nprdma defines it so that it never depends on the package that implements
// it (swap.Region does; the target wires the two together).
//
// The NIC engine reads a page with a seqlock that never blocks:
//
//	seq, zero, ok := p.ReadBegin(i)
//	if !ok { send the magic page }
//	copy page i out of p.Bytes() (zeros without reading it if zero)
//	if !p.ReadEnd(i, seq) { send the magic page instead }
//
// ReadBegin succeeds only for a page that is resident and not being changed,
// and keeps it resident until ReadEnd (so the copy never faults). ReadEnd
// reports whether the page's content may have changed since ReadBegin. Every
// ReadBegin that returned ok must be matched by exactly one ReadEnd.
type Pager interface {
	// Bytes is the whole region. Only pages between a successful ReadBegin
	// and its ReadEnd may be read by the NIC engine.
	Bytes() []byte
	// PageSize is the granularity of ReadBegin/ReadEnd (4096).
	PageSize() int
	// ReadBegin starts a NIC read of page i; ok is false when the page is
	// absent or busy. zero reports that the page holds only zeros, so the
	// engine writes zeros instead of reading its memory. It never blocks and
	// never faults.
	ReadBegin(page int) (seq uint64, zero, ok bool)
	// ReadEnd ends the read begun with seq and reports whether the copy is a
	// consistent snapshot of one version of the page.
	ReadEnd(page int, seq uint64) bool
	// Advise asks the pager to make [off, off+length) resident soon
	// (prefetch, like ibv_advise_mr). It returns once the work is queued.
	Advise(off, length int64) error
}

// SharedPager is a Pager whose memory another process on the same host may
// map and read in place, under the same seqlock, without the owner's CPU
// (nprdma/shm). swap.Region is one when it is created shareable.
//
// The reader's protocol, per page i (the state words are the pager's own,
// read with atomic loads):
//
//	s := states[i]; if s&Present == 0 || s&Busy != 0 { magic page }
//	copy page i (zeros without reading it if s&Zero != 0)
//	if states[i]>>VersionShift != s>>VersionShift { magic page instead }
//	set bit i of access (a use, for the pager's eviction policy)
//
// The reader holds no reference: the owner may release a page while it is
// copied, so the reader's copy must survive finding the page gone (and must
// not put a page back in its place: see docs/np-rdma.md); the version
// check then refuses it.
type SharedPager interface {
	Pager
	// ShareFiles returns descriptors of the memory (read-only), of the page
	// state table (read-only; one native uint64 per page) and of the access
	// map (writable; one bit per page in native uint64 words, bit i%64 of
	// word i/64, set by readers with an atomic OR), or ok false when the
	// memory cannot be shared. They belong to the pager.
	ShareFiles() (data, states, access *os.File, ok bool)
	// StateBits says where the reader finds what it checks in a state
	// word: the masks of present, busy and zero, and the shift of the
	// version (plain types, so that a pager needs no import of nprdma).
	StateBits() (present, busy, zero uint64, versionShift uint)
}
