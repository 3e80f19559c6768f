package target

import (
	"fmt"
	"sync"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/nprdma"
)

// store is what the command paths need from a namespace's memory: a
// swap.Region normally, a pinnedStore in the baseline mode.
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

// pinnedStore is the conventional RDMA target the benchmarks compare
// against (WithPinnedNamespaces): the whole namespace is loaded into DRAM at
// start and registered pinned, so a one-sided READ is a plain copy with no
// seqlock and no magic page; writes go through to the backing device.
// Its cost is the point: DRAM for the whole namespace, and a registration
// that pins (mlock) every page up front.
type pinnedStore struct {
	dev  blockdev.Device
	mem  []byte
	mu   sync.RWMutex // writers exclude readers so a copy is never torn
	size int64
}

func newPinnedStore(dev blockdev.Device, size int64) (*pinnedStore, error) {
	mem, err := nprdma.AllocBuffer(int(size))
	if err != nil {
		return nil, err
	}
	const chunk = 1 << 20
	for off := int64(0); off < size; off += chunk {
		n := min(chunk, size-off)
		if _, err := dev.ReadAt(mem[off:off+n], off); err != nil {
			nprdma.FreeBuffer(mem)
			return nil, fmt.Errorf("load %s into memory: %w", dev.Path(), err)
		}
	}
	return &pinnedStore{dev: dev, mem: mem, size: size}, nil
}

func (p *pinnedStore) check(off, n int64) error {
	if off < 0 || n < 0 || off > p.size || n > p.size-off {
		return fmt.Errorf("pinned namespace on %s: [%d, +%d) beyond %d bytes", p.dev.Path(), off, n, p.size)
	}
	return nil
}

func (p *pinnedStore) ReadAt(b []byte, off int64) (int, error) {
	if err := p.check(off, int64(len(b))); err != nil {
		return 0, err
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	return copy(b, p.mem[off:]), nil
}

func (p *pinnedStore) write(b []byte, off int64, fua bool) (int, error) {
	if err := p.check(off, int64(len(b))); err != nil {
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
func (p *pinnedStore) Advise(off, length int64) error              { return p.check(off, length) }
func (p *pinnedStore) Size() int64                                 { return p.size }

func (p *pinnedStore) Trim(off, length int64) error {
	if err := p.check(off, length); err != nil {
		return err
	}
	p.mu.Lock()
	clear(p.mem[off : off+length])
	p.mu.Unlock()
	return p.dev.Discard(off, length)
}

func (p *pinnedStore) WriteZeroes(off, length int64) error { return p.Trim(off, length) }

// Close flushes; the memory is freed by release once no queue pair can
// read it.
func (p *pinnedStore) Close() error { return p.dev.Flush() }

func (p *pinnedStore) release() { nprdma.FreeBuffer(p.mem) }
