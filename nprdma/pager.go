package nprdma

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
