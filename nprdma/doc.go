// Package nprdma is a verbs-style RDMA API in idiomatic Go, with memory
// regions that need not be pinned.
//
// A Device runs on a Provider (nprdma/tcp: software RDMA over TCP;
// nprdma/loop: in-process; nprdma/shm: peers on the same host, whose
// READs of a region shared with them run in place). From it come protection domains (PD), memory
// regions (MR), completion queues (CQ) and reliable-connected queue pairs
// (QP), which a Listener/ConnRequest pair or QP.Connect connect like
// rdma_cm. Work requests (SEND, SEND_WITH_IMM, RDMA WRITE, WRITE_WITH_IMM,
// RDMA READ, RECV) execute in order and exactly once, or complete with an
// error status and move the QP to the error state.
//
// The responder's side of one-sided READ and WRITE — the NIC engine — is in
// this package: every remote access is validated (rkey, protection domain,
// rights, bounds) before a byte is copied. A region registered with
// PD.RegisterUnpinned is read through its Pager page by page under a
// seqlock; a page that is absent, busy or changed while it was copied is
// delivered as the region's magic page, which the requester finds with
// FindMagicPages and re-reads two-sided (the NP-RDMA scheme).
//
// docs/nprdma.md describes the semantics, the NIC engine, the buffer pool
// and the providers' wire formats in full.
package nprdma
