//go:build !amd64 && !386

package shm

import "sync/atomic"

var fenceWord atomic.Uint32

// readFence orders the copy of a page before the second load of its state
// word: an atomic load only keeps later accesses after it, so the copy's
// loads could otherwise be satisfied after it. A read-modify-write is a
// full barrier.
func readFence() { fenceWord.Add(0) }
