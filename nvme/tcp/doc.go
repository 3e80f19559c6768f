// Package tcp is the NVMe/TCP transport binding (NVM Express TCP Transport
// Specification 1.0, TP 8000): the PDU codec both sides share, the
// controller side that serves a target's queues over it, and the host side.
//
// The codec (pdu*.go) turns the nine PDU types into Go values and back at
// explicit byte offsets: the 8-byte common header (CommonHeader), one file
// per PDU family — ICReq/ICResp, CapsuleCmd/CapsuleResp, H2CData/C2HData,
// R2T, H2CTermReq/C2HTermReq — header and data digests (CRC32C) and the
// padding of a PDU's data to the receiver's alignment (HPDA/CPDA).
//
// A Reader reads PDUs from a stream for one side of a connection
// (RoleController reads what hosts send, RoleHost what controllers send):
// Next validates a PDU's common header against its type, the connection's
// state, the negotiated digests and the data limits before a byte of its
// data is read, verifies the header digest, and returns the header; ReadData
// then places the data where the caller wants it and checks its digest. A
// violation is a *ProtocolError carrying the fatal error status (FES), the
// offset of the offending field (FEI) and the offending header, which is
// what a termination request reports before the connection is closed.
//
// A Writer encodes PDUs into a batch and sends the batch with one vectored
// write (writev), data slices referenced rather than copied.
//
// docs/nvme.md describes the binding, what a Linux host sends and what the
// target answers.
package tcp
