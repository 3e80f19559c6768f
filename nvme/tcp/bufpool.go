package tcp

import (
	"math/bits"
	"sync"
)

// bufferPool hands out data buffers in power-of-two size classes from
// minBufferClass up, so that a command's data buffer is reused by later
// commands instead of allocated each time.
type bufferPool struct {
	classes [maxBufferShift - minBufferShift + 1]sync.Pool
}

const (
	minBufferShift = 12 // 4 KiB
	maxBufferShift = 24 // 16 MiB: above any transfer a controller allows
)

func classOf(n int) int {
	if n <= 1<<minBufferShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minBufferShift
}

// get returns a buffer of n bytes (1 ≤ n ≤ 16 MiB); its content is
// whatever it held before.
func (p *bufferPool) get(n int) []byte {
	c := classOf(n)
	if b, ok := p.classes[c].Get().(*[]byte); ok {
		return (*b)[:n]
	}
	return make([]byte, n, 1<<(c+minBufferShift))
}

// put gives b back.
func (p *bufferPool) put(b []byte) {
	c := classOf(cap(b))
	if cap(b) != 1<<(c+minBufferShift) {
		return // not one of ours
	}
	b = b[:cap(b)]
	p.classes[c].Put(&b)
}
