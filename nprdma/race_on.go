//go:build race

package nprdma

import "sync/atomic"

// Under the race detector, memory a remote peer placed (or will read) must be
// ordered with the completion that reports it. A real network carries that
// order but the detector cannot see it through a socket; this fence shows it
// the same order: every delivery acquires it first and releases it after.
// It only exists in race builds.
var raceFence atomic.Uint64

func raceAcquire() { raceFence.Load() }
func raceRelease() { raceFence.Add(1) }
