// Package npread is the NP-RDMA read path end to end, small enough for
// tests and benchmarks to share: a Requester reads a remote unpinned region
// with one-sided READs, finds the pages that came back as the region's magic
// page (nprdma.FindMagicPages) and fetches just those two-sided from a
// Server, which reads them from the memory behind the region (a swap.Region,
// faulting them in) and RDMA WRITEs them over the magic pages before it
// answers.
//
// The two-sided part is a minimal RPC over SEND/RECV, not the NVMe command
// set: a fixed-size request (tag, region offset, length, destination address
// and rkey), the data by RDMA WRITE into the requester's registered buffer,
// then a fixed-size response (tag, status, how many pages were minor and
// major faults). The server describes the region (address, length, rkey,
// page size, magic, largest read) in the private data of the connection's
// accept. wire.go has the byte layout; every decoder has a fuzz target.
//
// The requester counts one-sided hits, suspected faults, false positives
// (slow-path data that is itself the magic page: real content) and the
// minor and major faults the server reports.
package npread
