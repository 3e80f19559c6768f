//go:build !race

package npread_test

const raceEnabled = false
