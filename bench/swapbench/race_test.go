//go:build race

package swapbench

// The race detector's shadow memory counts in RSS, so the RSS bound is only
// checked without it.
const raceEnabled = true
