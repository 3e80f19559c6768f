package blockio

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// memoryChunk is the granularity of the Memory backend's range locks: large
// enough that a 1 MiB request takes one or two locks, small enough that
// concurrent I/O to different places rarely shares one.
const memoryChunk = 1 << 20

// Memory is a Backend holding its contents in RAM, for tests and demos. It
// enforces its block size like a real namespace would, counts every call, and
// can be told to fail. Overlapping concurrent requests are serialised per
// 1 MiB chunk, so the race detector sees no data race on the contents.
type Memory struct {
	data      []byte
	blockSize int
	locks     []sync.RWMutex // one per memoryChunk of data
	fail      atomic.Pointer[error]

	reads, writes, fuaWrites, flushes, trims, zeroes atomic.Uint64
	bytesRead, bytesWritten                          atomic.Uint64
}

// MemoryStats counts the calls a Memory backend has served.
type MemoryStats struct {
	Reads, Writes, FUAWrites, Flushes, Trims, WriteZeroes uint64
	BytesRead, BytesWritten                               uint64
}

// NewMemory returns a zero-filled Memory backend. It panics unless blockSize
// is positive and size a non-negative multiple of it: a test bug.
func NewMemory(size int64, blockSize int) *Memory {
	if blockSize <= 0 || size < 0 || size%int64(blockSize) != 0 {
		panic(fmt.Sprintf("blockio.NewMemory(%d, %d): size must be a multiple of a positive block size", size, blockSize))
	}
	return &Memory{
		data:      make([]byte, size),
		blockSize: blockSize,
		locks:     make([]sync.RWMutex, (size+memoryChunk-1)/memoryChunk+1),
	}
}

func (m *Memory) Size() int64    { return int64(len(m.data)) }
func (m *Memory) BlockSize() int { return m.blockSize }

// FailWith makes every following call return err (nil restores service).
func (m *Memory) FailWith(err error) {
	if err == nil {
		m.fail.Store(nil)
		return
	}
	m.fail.Store(&err)
}

// Stats returns the call counters.
func (m *Memory) Stats() MemoryStats {
	return MemoryStats{
		Reads: m.reads.Load(), Writes: m.writes.Load(), FUAWrites: m.fuaWrites.Load(),
		Flushes: m.flushes.Load(), Trims: m.trims.Load(), WriteZeroes: m.zeroes.Load(),
		BytesRead: m.bytesRead.Load(), BytesWritten: m.bytesWritten.Load(),
	}
}

// Snapshot returns a copy of the whole contents.
func (m *Memory) Snapshot() []byte {
	out := make([]byte, len(m.data))
	for start := int64(0); start < int64(len(m.data)); start += memoryChunk {
		end := min(start+memoryChunk, int64(len(m.data)))
		m.lock(start, end-start, false)
		copy(out[start:end], m.data[start:end])
		m.unlock(start, end-start, false)
	}
	return out
}

func (m *Memory) ReadAt(p []byte, off int64) (int, error) {
	m.reads.Add(1)
	if err := m.check("read", off, int64(len(p))); err != nil {
		return 0, err
	}
	m.lock(off, int64(len(p)), false)
	n := copy(p, m.data[off:])
	m.unlock(off, int64(len(p)), false)
	m.bytesRead.Add(uint64(n))
	return n, nil
}

func (m *Memory) WriteAt(p []byte, off int64) (int, error) {
	m.writes.Add(1)
	return m.write("write", p, off)
}

func (m *Memory) WriteAtFUA(p []byte, off int64) (int, error) {
	m.fuaWrites.Add(1)
	return m.write("write (FUA)", p, off)
}

func (m *Memory) write(op string, p []byte, off int64) (int, error) {
	if err := m.check(op, off, int64(len(p))); err != nil {
		return 0, err
	}
	m.lock(off, int64(len(p)), true)
	n := copy(m.data[off:], p)
	m.unlock(off, int64(len(p)), true)
	m.bytesWritten.Add(uint64(n))
	return n, nil
}

func (m *Memory) Flush() error {
	m.flushes.Add(1)
	if e := m.fail.Load(); e != nil {
		return fmt.Errorf("memory backend: flush: %w", *e)
	}
	return nil
}

func (m *Memory) Trim(off, length int64) error {
	m.trims.Add(1)
	return m.zero("trim", off, length)
}

func (m *Memory) WriteZeroes(off, length int64) error {
	m.zeroes.Add(1)
	return m.zero("write zeroes", off, length)
}

func (m *Memory) zero(op string, off, length int64) error {
	if err := m.check(op, off, length); err != nil {
		return err
	}
	m.lock(off, length, true)
	clear(m.data[off : off+length])
	m.unlock(off, length, true)
	return nil
}

func (m *Memory) check(op string, off, length int64) error {
	if e := m.fail.Load(); e != nil {
		return rangeError("memory backend", op, off, length, *e)
	}
	if !CheckRange(off, length, int64(len(m.data))) {
		return rangeError("memory backend", op, off, length,
			fmt.Errorf("%w (size %d)", ErrOutOfRange, len(m.data)))
	}
	bs := int64(m.blockSize)
	if off%bs != 0 || length%bs != 0 {
		return rangeError("memory backend", op, off, length,
			fmt.Errorf("%w (block size %d)", ErrUnaligned, bs))
	}
	return nil
}

// lock takes the chunk locks covering [off, off+length) in ascending order,
// which keeps concurrent multi-chunk requests free of deadlock.
func (m *Memory) lock(off, length int64, exclusive bool) {
	first, last := off/memoryChunk, (off+max(length, 1)-1)/memoryChunk
	for i := first; i <= last; i++ {
		if exclusive {
			m.locks[i].Lock()
		} else {
			m.locks[i].RLock()
		}
	}
}

func (m *Memory) unlock(off, length int64, exclusive bool) {
	first, last := off/memoryChunk, (off+max(length, 1)-1)/memoryChunk
	for i := first; i <= last; i++ {
		if exclusive {
			m.locks[i].Unlock()
		} else {
			m.locks[i].RUnlock()
		}
	}
}
