package swap

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A shareable region (WithShareable) keeps its memory and its state table
// in memory files, so that a reader in another process can map them and
// read pages in place under the same seqlock as nprdma's NIC engine
// (nprdma.SharedPager; nprdma/shm is that reader). The reader cannot write
// the state words, so it reports its accesses in an access map, one bit per
// page, which the eviction policy reads like the referenced bit.
//
// What a reader gets is read-only: the descriptors of the memory and the
// table are opened read-only, and the files' mode (0400) keeps a process of
// another user from opening them again for writing through /proc (root
// can; a process of the target's own user can write the target's memory
// anyway).
type sharedFiles struct {
	data, states, accessF *os.File // read-write, the region's
	roData, roStates      *os.File // read-only, for readers
	accessMem             []byte
	access                []uint64 // one bit per page
}

// open creates the memory files of a region of up to npages pages (its
// MaxSize: the files stay sparse where nothing was written).
func (sf *sharedFiles) open(npages int64) error {
	mk := func(name string, size int64, mode uint32) (*os.File, error) {
		fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
		if err != nil {
			return nil, os.NewSyscallError("memfd_create", err)
		}
		f := os.NewFile(uintptr(fd), name)
		if err := f.Truncate(size); err != nil {
			f.Close()
			return nil, err
		}
		if err := unix.Fchmod(fd, mode); err != nil {
			f.Close()
			return nil, os.NewSyscallError("fchmod", err)
		}
		return f, nil
	}
	reopen := func(f *os.File) (*os.File, error) {
		return os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), os.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	accessSize := (npages + 63) / 64 * 8
	var err error
	if sf.data, err = mk("nprdma-swap-data", npages*PageSize, 0o400); err != nil {
		return err
	}
	if sf.states, err = mk("nprdma-swap-states", statesBytes(npages), 0o400); err != nil {
		return err
	}
	if sf.accessF, err = mk("nprdma-swap-access", accessSize, 0o600); err != nil {
		return err
	}
	if sf.roData, err = reopen(sf.data); err != nil {
		return err
	}
	if sf.roStates, err = reopen(sf.states); err != nil {
		return err
	}
	m, err := unix.Mmap(int(sf.accessF.Fd()), 0, int(accessSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return os.NewSyscallError("mmap access map", err)
	}
	sf.accessMem = m
	sf.access = unsafe.Slice((*uint64)(unsafe.Pointer(&m[0])), accessSize/8)
	return nil
}

// statesBytes is the size of the state table of npages pages (whole pages).
func statesBytes(npages int64) int64 { return (npages*8 + PageSize - 1) / PageSize * PageSize }

// fileFD is the descriptor of f for the C half, or -1.
func fileFD(f *os.File) int {
	if f == nil {
		return -1
	}
	return int(f.Fd())
}

// close releases the files. The memory file is truncated first: a reader
// that still maps it holds no memory, and its next access faults.
func (sf *sharedFiles) close() {
	if sf.accessMem != nil {
		unix.Munmap(sf.accessMem)
		sf.accessMem, sf.access = nil, nil
	}
	if sf.data != nil {
		sf.data.Truncate(0)
	}
	if sf.states != nil {
		sf.states.Truncate(0)
	}
	for _, f := range []*os.File{sf.data, sf.states, sf.accessF, sf.roData, sf.roStates} {
		if f != nil {
			f.Close()
		}
	}
	*sf = sharedFiles{}
}

// ShareFiles returns the descriptors a reader in another process maps to
// read the region in place (nprdma.SharedPager): the memory and the state
// table read-only, the access map writable. ok is false unless the region
// was made WithShareable. They belong to the region and are valid until
// Close.
func (r *Region) ShareFiles() (data, states, access *os.File, ok bool) {
	sf := &r.shared
	if sf.data == nil {
		return nil, nil, nil, false
	}
	return sf.roData, sf.roStates, sf.accessF, true
}

// StateBits locates what a reader in place checks in a state word
// (nprdma.SharedPager): the present, busy and zero bits and the shift of
// the version.
func (r *Region) StateBits() (present, busy, zero uint64, versionShift uint) {
	return StatePresent, StateBusy, StateZero, StateVersionShift
}
