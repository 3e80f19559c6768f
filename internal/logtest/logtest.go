// Package logtest holds what tests need to capture logs written from
// several goroutines.
package logtest

import (
	"bytes"
	"sync"
)

// Buffer is a log destination safe for concurrent writers and readers
// (slog handlers, a CLI's stderr): a bytes.Buffer under a mutex.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
