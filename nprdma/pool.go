package nprdma

import (
	"fmt"
	"math/bits"
	"sync"
)

// Size classes of a BufferPool: powers of two from MinBufferClass to
// MaxBufferClass.
const (
	MinBufferClass = 4 << 10
	MaxBufferClass = 1 << 20
	numClasses     = 9 // 4 KiB .. 1 MiB
	// DefaultSlabSize is the size of one registration of a BufferPool.
	DefaultSlabSize = 4 << 20
)

// BufferPool hands out registered buffers from large slabs, each registered
// once, so that a data path never registers memory per I/O (explicit reuse
// of registered memory). Buffers come in power-of-two size classes; a slab
// serves one class. Slabs live outside the Go heap and stay registered
// until Close.
type BufferPool struct {
	pd       *PD
	access   Access
	slabSize int
	maxBytes int64

	mu     sync.Mutex
	free   [numClasses][]*Buffer
	slabs  []poolSlab
	stats  PoolStats
	closed bool
}

type poolSlab struct {
	mem []byte
	mr  *MR
}

// PoolStats are a pool's counters.
type PoolStats struct {
	Slabs                int
	BytesRegistered      int64
	Registrations        uint64 // slab registrations
	Gets                 uint64
	RegistrationsAvoided uint64 // gets served from a slab already registered
	InUseBytes           int64  // class bytes of buffers handed out
}

// PoolOption configures a BufferPool.
type PoolOption func(*BufferPool)

// WithSlabSize sets the size of each registration (rounded up to a
// multiple of MaxBufferClass; default 4 MiB).
func WithSlabSize(n int) PoolOption { return func(p *BufferPool) { p.slabSize = n } }

// WithMaxBytes caps the bytes the pool registers; Get fails beyond it
// (default: no cap).
func WithMaxBytes(n int64) PoolOption { return func(p *BufferPool) { p.maxBytes = n } }

// NewBufferPool creates a pool whose buffers are registered in pd with
// access.
func NewBufferPool(pd *PD, access Access, opts ...PoolOption) (*BufferPool, error) {
	p := &BufferPool{pd: pd, access: access, slabSize: DefaultSlabSize}
	for _, o := range opts {
		o(p)
	}
	if p.slabSize <= 0 {
		return nil, fmt.Errorf("nprdma: buffer pool: slab size %d must be positive", p.slabSize)
	}
	p.slabSize = (p.slabSize + MaxBufferClass - 1) / MaxBufferClass * MaxBufferClass
	return p, nil
}

// Buffer is a registered buffer from a BufferPool.
type Buffer struct {
	pool  *BufferPool
	mr    *MR
	mem   []byte // the whole class-sized chunk
	n     int
	class int
	inUse bool
}

// Bytes is the buffer's memory (the size asked for).
func (b *Buffer) Bytes() []byte { return b.mem[:b.n] }

// SGE names the buffer's memory for a work request.
func (b *Buffer) SGE() SGE { return b.mr.SGE(b.offset(), b.n) }

// Addr is the address of the buffer's first byte.
func (b *Buffer) Addr() uint64 { return b.mr.addr + uint64(b.offset()) }

// LKey is the local key of the slab the buffer lives in.
func (b *Buffer) LKey() uint32 { return b.mr.lkey }

// RKey is the remote key of the slab the buffer lives in (valid only if the
// pool's access grants remote rights).
func (b *Buffer) RKey() uint32 { return b.mr.rkey }

// MR is the slab's memory region.
func (b *Buffer) MR() *MR { return b.mr }

func (b *Buffer) offset() int {
	return int(uint64(uintptrOf(b.mem)) - b.mr.addr)
}

// Release returns the buffer to its pool. Releasing twice panics.
func (b *Buffer) Release() {
	p := b.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if !b.inUse {
		panic("nprdma: buffer released twice")
	}
	b.inUse = false
	p.stats.InUseBytes -= int64(len(b.mem))
	p.free[b.class] = append(p.free[b.class], b)
}

func classOf(n int) int {
	if n <= MinBufferClass {
		return 0
	}
	return bits.Len(uint(n-1)) - bits.Len(uint(MinBufferClass-1))
}

// Get returns a buffer of n bytes (1 <= n <= MaxBufferClass). It registers a
// new slab only when the class has no free buffer.
func (p *BufferPool) Get(n int) (*Buffer, error) {
	if n <= 0 || n > MaxBufferClass {
		return nil, fmt.Errorf("nprdma: buffer pool get %d bytes: size must be in [1, %d]", n, MaxBufferClass)
	}
	c := classOf(n)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, fmt.Errorf("nprdma: buffer pool get %d bytes: pool %w", n, ErrClosed)
	}
	p.stats.Gets++
	if len(p.free[c]) == 0 {
		if err := p.growLocked(c); err != nil {
			return nil, fmt.Errorf("nprdma: buffer pool get %d bytes: %w", n, err)
		}
	} else {
		p.stats.RegistrationsAvoided++
	}
	fl := p.free[c]
	b := fl[len(fl)-1]
	p.free[c] = fl[:len(fl)-1]
	b.inUse, b.n = true, n
	p.stats.InUseBytes += int64(len(b.mem))
	return b, nil
}

func (p *BufferPool) growLocked(c int) error {
	size := MinBufferClass << c
	if p.maxBytes > 0 && p.stats.BytesRegistered+int64(p.slabSize) > p.maxBytes {
		return fmt.Errorf("pool limit of %d bytes reached (%d registered)", p.maxBytes, p.stats.BytesRegistered)
	}
	mem, err := AllocBuffer(p.slabSize)
	if err != nil {
		return err
	}
	mr, err := p.pd.Register(mem, p.access)
	if err != nil {
		FreeBuffer(mem)
		return err
	}
	p.slabs = append(p.slabs, poolSlab{mem: mem, mr: mr})
	p.stats.Slabs++
	p.stats.Registrations++
	p.stats.BytesRegistered += int64(len(mem))
	for off := 0; off+size <= len(mem); off += size {
		p.free[c] = append(p.free[c], &Buffer{pool: p, mr: mr, mem: mem[off : off+size : off+size], class: c})
	}
	return nil
}

// Stats returns a snapshot of the pool's counters.
func (p *BufferPool) Stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Close deregisters and frees every slab. It fails while buffers are still
// handed out.
func (p *BufferPool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	if p.stats.InUseBytes > 0 {
		return fmt.Errorf("nprdma: close buffer pool: %d bytes of buffers still in use", p.stats.InUseBytes)
	}
	p.closed = true
	var first error
	for _, s := range p.slabs {
		if err := s.mr.Deregister(); err != nil && first == nil {
			first = err
		}
		if err := FreeBuffer(s.mem); err != nil && first == nil {
			first = err
		}
	}
	p.slabs = nil
	p.free = [numClasses][]*Buffer{}
	p.stats.Slabs, p.stats.BytesRegistered = 0, 0
	return first
}
