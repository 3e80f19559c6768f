package nbd

import (
	"math/bits"
	"sync"
)

// Payload buffers come from per-size-class pools (powers of two from 4 KiB
// to 1 GiB), so that steady-state I/O allocates nothing per request.
const (
	minBufferClass = 12
	maxBufferClass = 30
)

var bufferPools [maxBufferClass + 1]sync.Pool

func bufferClass(n int) int {
	if n <= 1<<minBufferClass {
		return minBufferClass
	}
	return bits.Len(uint(n - 1))
}

// getBuffer returns a buffer of length n.
func getBuffer(n int) *[]byte {
	class := bufferClass(n)
	if class > maxBufferClass {
		b := make([]byte, n)
		return &b
	}
	if p, ok := bufferPools[class].Get().(*[]byte); ok {
		*p = (*p)[:n]
		return p
	}
	b := make([]byte, n, 1<<class)
	return &b
}

// putBuffer returns a buffer from getBuffer to its pool (nil is ignored).
func putBuffer(p *[]byte) {
	if p == nil {
		return
	}
	c := cap(*p)
	class := bufferClass(c)
	if class > maxBufferClass || c != 1<<class {
		return
	}
	bufferPools[class].Put(p)
}
