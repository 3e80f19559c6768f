//go:build race

package reliability_test

// raceEnabled: the race detector keeps shadow memory and per-goroutine and
// per-sync-object history that it does not give back to the OS, so RSS is
// no leak signal under it (see churnRSSSlack).
const raceEnabled = true
