// Package reliability holds black-box tests of nprdma under faults, bad
// input, crashes, peer death, churn, limits and attacks on access control,
// across the whole stack: the initiator, the fabric, the target, swap and the
// backing device. Scenarios about processes run the real nprdma-target
// binary (built from ./cmd/nprdma-target, or NPRDMA_TARGET_BIN) and, for an
// initiator killed mid-I/O, a child process of the test binary.
//
// The package has no code of its own; docs/reliability.md lists every test,
// the figures it produced and how to run the long versions (NPRDMA_LONG=1).
package reliability
