// Package np holds black-box tests that join the NP-RDMA halves the
// architecture keeps apart: nprdma (the fabric, unpinned memory regions,
// magic pages) and swap (the SSD-backed region behind them). nprdma never
// imports swap, so the tests that run a real swap.Region through real
// providers (nprdma/loop and nprdma/tcp) live here, with the requester loop
// of npread: one-sided READ, FindMagicPages, two-sided slow path.
//
// The package has no code of its own; see docs/npbench.md.
package np
