//go:build !race

package swapbench

const raceEnabled = false
