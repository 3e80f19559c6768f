package swap

// The page state word: one uint64 per page, changed only with atomic
// operations (Go) or __atomic builtins (swap.c). This file is the single Go
// definition of the layout; swap.h mirrors it and TestStateLayoutMatchesC
// checks that they agree. docs/architecture.md has the table.
const (
	// StatePresent: the page is mapped and holds the page's current content.
	StatePresent uint64 = 1 << 0
	// StateBusy: a writer, the evictor, a trim or a fault-in is changing the
	// page; NIC reads fail. Set together with a version bump.
	StateBusy uint64 = 1 << 1
	// StateDirty: the content is newer than the backing device.
	StateDirty uint64 = 1 << 2
	// StateReferenced: touched since the eviction policy last looked.
	StateReferenced uint64 = 1 << 3
	// StateZero: the content is all zeros (never written, trimmed). While
	// absent this makes a fault minor; swap also keeps it while a zero-filled
	// page stays unwritten, so that evicting it keeps the fault minor.
	StateZero uint64 = 1 << 4
	// StateWriteback: a write of this page to the backing device is in
	// flight (at most one at a time).
	StateWriteback uint64 = 1 << 5
	// StateMaplock: held only by C code while it changes the mapping.
	StateMaplock uint64 = 1 << 6
	// StateTracked: the page has an entry in the eviction policy (bit 7,
	// unassigned in the architecture table; swap-internal bookkeeping that
	// keeps policy membership O(1) without a map).
	StateTracked uint64 = 1 << 7

	// StateReadersShift and StateReadersMask locate the count of NIC reads in
	// progress (ReadBegin..ReadEnd); release waits for zero.
	StateReadersShift = 8
	StateReadersMask  = uint64(0xff) << StateReadersShift
	// StateVersionShift locates the version, bumped whenever busy is set.
	StateVersionShift = 16

	readerOne  = uint64(1) << StateReadersShift
	readerDec  = ^(readerOne - 1) // adding it subtracts one reader
	maxReaders = 0xff
	versionOne = uint64(1) << StateVersionShift
)

// StateVersion extracts the version from a state word.
func StateVersion(s uint64) uint64 { return s >> StateVersionShift }

// StateReaders extracts the number of NIC reads in progress.
func StateReaders(s uint64) int { return int((s & StateReadersMask) >> StateReadersShift) }

// isZero reports whether an absent page with state s reads as zeros: it was
// marked zero, or it was never changed since the region was created and lay
// in a hole of the backing file then.
func (r *Region) isZero(page int, s uint64) bool {
	if s&StateZero != 0 {
		return true
	}
	return StateVersion(s) == 0 && r.holes.contains(page)
}
