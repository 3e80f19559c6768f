package target

import (
	"fmt"
	"sync"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/nprdma"
)

// store is what the command paths need from a namespace's memory: a
// swap.Region normally; in the pinned baseline a pinnedStore, or a
// directStore for a namespace that does not fit in the pinned memory.
type store interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	WriteAtFUA(p []byte, off int64) (int, error)
	Flush() error
	Trim(off, length int64) error
	WriteZeroes(off, length int64) error
	Advise(off, length int64) error
	Size() int64
	Close() error
}

// pinnedArena is the baseline mode's DRAM (WithPinnedBudget): the whole
// budget, allocated and registered pinned (mlock) by New before anything is
// served, as a conventional RDMA target does. That up-front cost is what the
// mode exists to show. Namespaces are carved from it in the order they are
// added; a namespace held there cannot be removed while the target runs, so
// its space is never given back.
type pinnedArena struct {
	mem []byte
	mr  *nprdma.MR

	mu   sync.Mutex
	used int64
}

func newPinnedArena(pd *nprdma.PD, budget int64) (*pinnedArena, error) {
	size := (budget + BlockSize - 1) / BlockSize * BlockSize
	mem, err := nprdma.AllocBuffer(int(size))
	if err != nil {
		return nil, fmt.Errorf("pinned memory of %d bytes: %w", size, err)
	}
	mr, err := pd.Register(mem, nprdma.AccessRemoteRead)
	if err != nil {
		nprdma.FreeBuffer(mem)
		return nil, fmt.Errorf("pinned memory of %d bytes: %w", size, err)
	}
	return &pinnedArena{mem: mem, mr: mr}, nil
}

// carve returns size bytes of the arena, or nil when they do not fit in
// what is left.
func (a *pinnedArena) carve(size int64) []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	if size > int64(len(a.mem))-a.used {
		return nil
	}
	b := a.mem[a.used : a.used+size : a.used+size]
	a.used += size
	return b
}

// giveBack returns the last carve when its namespace could not be built.
func (a *pinnedArena) giveBack(b []byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.used >= int64(len(b)) && &a.mem[a.used-int64(len(b))] == &b[0] {
		a.used -= int64(len(b))
	}
}

// release deregisters and frees the arena; every MR over it must be gone.
func (a *pinnedArena) release() {
	a.mr.Deregister()
	nprdma.FreeBuffer(a.mem)
}

// pinnedStore is a namespace of the pinned baseline that fits in the pinned
// memory: loaded wholly into its part of the arena at start, so a one-sided
// READ is a plain copy with no seqlock and no magic page; writes go to
// memory and through to the backing device.
type pinnedStore struct {
	dev  blockdev.Device
	mem  []byte
	mu   sync.RWMutex // writers exclude readers so a copy is never torn
	size int64
}

// newPinnedStore loads the backing device into mem (len(mem) == size).
func newPinnedStore(dev blockdev.Device, mem []byte, size int64) (*pinnedStore, error) {
	const chunk = 1 << 20
	for off := int64(0); off < size; off += chunk {
		n := min(chunk, size-off)
		if _, err := dev.ReadAt(mem[off:off+n], off); err != nil {
			return nil, fmt.Errorf("load %s into pinned memory: %w", dev.Path(), err)
		}
	}
	return &pinnedStore{dev: dev, mem: mem, size: size}, nil
}

func checkRange(dev blockdev.Device, size, off, n int64) error {
	if off < 0 || n < 0 || off > size || n > size-off {
		return fmt.Errorf("namespace on %s: [%d, +%d) beyond %d bytes", dev.Path(), off, n, size)
	}
	return nil
}

func (p *pinnedStore) ReadAt(b []byte, off int64) (int, error) {
	if err := checkRange(p.dev, p.size, off, int64(len(b))); err != nil {
		return 0, err
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	return copy(b, p.mem[off:]), nil
}

// TryReadAt is ReadAt unless a writer holds or waits for the memory (then
// false): writers hold it only for a copy, but a reader on a receive loop
// waits for nothing (inline.go).
func (p *pinnedStore) TryReadAt(b []byte, off int64) bool {
	if checkRange(p.dev, p.size, off, int64(len(b))) != nil || !p.mu.TryRLock() {
		return false
	}
	defer p.mu.RUnlock()
	copy(b, p.mem[off:])
	return true
}

func (p *pinnedStore) write(b []byte, off int64, fua bool) (int, error) {
	if err := checkRange(p.dev, p.size, off, int64(len(b))); err != nil {
		return 0, err
	}
	p.mu.Lock()
	copy(p.mem[off:], b)
	p.mu.Unlock()
	// The device gets the aligned copy in memory, not b (in-capsule data
	// is not aligned for direct I/O).
	src := p.mem[off : off+int64(len(b))]
	if fua {
		return p.dev.WriteAtFUA(src, off)
	}
	return p.dev.WriteAt(src, off)
}

func (p *pinnedStore) WriteAt(b []byte, off int64) (int, error)    { return p.write(b, off, false) }
func (p *pinnedStore) WriteAtFUA(b []byte, off int64) (int, error) { return p.write(b, off, true) }
func (p *pinnedStore) Flush() error                                { return p.dev.Flush() }
func (p *pinnedStore) Size() int64                                 { return p.size }

func (p *pinnedStore) Advise(off, length int64) error {
	return checkRange(p.dev, p.size, off, length)
}

func (p *pinnedStore) Trim(off, length int64) error {
	if err := checkRange(p.dev, p.size, off, length); err != nil {
		return err
	}
	p.mu.Lock()
	clear(p.mem[off : off+length])
	p.mu.Unlock()
	return p.dev.Discard(off, length)
}

func (p *pinnedStore) WriteZeroes(off, length int64) error { return p.Trim(off, length) }

// Close flushes; the memory belongs to the arena.
func (p *pinnedStore) Close() error { return p.dev.Flush() }

// directStore is a namespace of the pinned baseline that does not fit in
// the pinned memory. A conventional target cannot register what it cannot
// pin, so hosts get no region descriptor and read with NVMe Read; every
// command goes straight to the backing device, with no cache of our own.
type directStore struct {
	dev  blockdev.Device
	size int64
}

func (d *directStore) align() int { return max(d.dev.BlockSize(), 1) }

func (d *directStore) ReadAt(b []byte, off int64) (int, error) {
	if err := checkRange(d.dev, d.size, off, int64(len(b))); err != nil {
		return 0, err
	}
	if blockdev.IsAligned(b, d.align()) {
		return d.dev.ReadAt(b, off)
	}
	bounce := blockdev.AlignedBuffer(len(b))
	n, err := d.dev.ReadAt(bounce, off)
	copy(b, bounce[:n])
	return n, err
}

func (d *directStore) write(b []byte, off int64, fua bool) (int, error) {
	if err := checkRange(d.dev, d.size, off, int64(len(b))); err != nil {
		return 0, err
	}
	src := b
	if !blockdev.IsAligned(b, d.align()) {
		// In-capsule data is not aligned for direct I/O.
		src = blockdev.AlignedBuffer(len(b))
		copy(src, b)
	}
	if fua {
		return d.dev.WriteAtFUA(src, off)
	}
	return d.dev.WriteAt(src, off)
}

func (d *directStore) WriteAt(b []byte, off int64) (int, error)    { return d.write(b, off, false) }
func (d *directStore) WriteAtFUA(b []byte, off int64) (int, error) { return d.write(b, off, true) }
func (d *directStore) Flush() error                                { return d.dev.Flush() }
func (d *directStore) Size() int64                                 { return d.size }
func (d *directStore) Close() error                                { return d.dev.Flush() }

func (d *directStore) Advise(off, length int64) error {
	return checkRange(d.dev, d.size, off, length)
}

func (d *directStore) Trim(off, length int64) error {
	if err := checkRange(d.dev, d.size, off, length); err != nil {
		return err
	}
	return d.dev.Discard(off, length)
}

func (d *directStore) WriteZeroes(off, length int64) error { return d.Trim(off, length) }
