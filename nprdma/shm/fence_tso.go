//go:build amd64 || 386

package shm

// readFence orders the copy of a page before the second load of its state
// word. x86 never reorders loads with loads, so it is nothing here.
func readFence() {}
