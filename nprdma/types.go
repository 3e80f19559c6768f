package nprdma

import (
	"errors"
	"strconv"
	"strings"

	"github.com/nprdma/nprdma/nprdma/link"
)

// Limits of the API. They bound what a peer may claim on the wire, so a frame
// announcing more is refused before anything is allocated.
const (
	// MaxMessageSize is the largest SEND, WRITE or READ (the sum of a work
	// request's scatter/gather list).
	MaxMessageSize = link.MaxMessageSize
	// MaxSGE is the longest scatter/gather list of one work request.
	MaxSGE = link.MaxSGE
	// MaxPrivateData is the largest private data of a connect, accept or
	// reject on the software NIC (a hardware device's: Caps).
	MaxPrivateData = link.MaxPrivateData
)

// Access is the set of rights a memory region grants.
type Access uint32

// Access rights. Local read is always granted.
const (
	// AccessLocalWrite lets the local NIC write into the region (RECV
	// buffers, READ destinations).
	AccessLocalWrite Access = 1 << iota
	// AccessRemoteRead lets a peer RDMA READ the region.
	AccessRemoteRead
	// AccessRemoteWrite lets a peer RDMA WRITE the region.
	AccessRemoteWrite
	// AccessOnDemand registers without pinning: the device faults pages in
	// when it touches them (on-demand paging, IBV_ACCESS_ON_DEMAND; hardware
	// with Caps.OnDemand). The software NIC refuses it: its regions that
	// are not pinned are RegisterUnpinned's.
	AccessOnDemand
)

const accessAll = AccessLocalWrite | AccessRemoteRead | AccessRemoteWrite | AccessOnDemand

func (a Access) String() string {
	if a == 0 {
		return "none"
	}
	var parts []string
	if a&AccessLocalWrite != 0 {
		parts = append(parts, "local-write")
	}
	if a&AccessRemoteRead != 0 {
		parts = append(parts, "remote-read")
	}
	if a&AccessRemoteWrite != 0 {
		parts = append(parts, "remote-write")
	}
	if a&AccessOnDemand != 0 {
		parts = append(parts, "on-demand")
	}
	if a&^accessAll != 0 {
		parts = append(parts, "unknown")
	}
	return strings.Join(parts, "|")
}

// Opcode names a work request or the kind of a completion.
type Opcode uint8

// Opcodes. OpRecv and OpRecvRDMAWithImm only appear in completions of
// receive work requests: OpRecv for a receive consumed by SEND or
// SEND_WITH_IMM, OpRecvRDMAWithImm for one consumed by WRITE_WITH_IMM (as
// IBV_WC_RECV and IBV_WC_RECV_RDMA_WITH_IMM in libibverbs).
const (
	OpSend Opcode = iota + 1
	OpSendWithImm
	OpWrite
	OpWriteWithImm
	OpRead
	OpRecv
	OpRecvRDMAWithImm
	// OpSendWithInv is a SEND that also invalidates the peer's remote key
	// SendWR.InvalidateRKey (IBV_WR_SEND_WITH_INV), as an NVMe/RDMA
	// controller answers a host that asked for it. Only hardware devices
	// offer it (Caps.SendWithInvalidate); the software NIC refuses it at
	// post time.
	OpSendWithInv
)

func (o Opcode) String() string {
	switch o {
	case OpSend:
		return "SEND"
	case OpSendWithImm:
		return "SEND_WITH_IMM"
	case OpWrite:
		return "RDMA_WRITE"
	case OpWriteWithImm:
		return "RDMA_WRITE_WITH_IMM"
	case OpRead:
		return "RDMA_READ"
	case OpRecv:
		return "RECV"
	case OpRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	case OpSendWithInv:
		return "SEND_WITH_INV"
	}
	return "opcode(" + strconv.Itoa(int(o)) + ")"
}

func (o Opcode) hasImm() bool { return o == OpSendWithImm || o == OpWriteWithImm }

// Status is the outcome of a work request.
type Status uint8

// Completion statuses, named after their libibverbs counterparts.
const (
	StatusSuccess Status = iota
	// StatusLocalLength: a message is longer than the receive buffers (on the
	// receive side) or than MaxMessageSize (on the send side).
	StatusLocalLength
	// StatusLocalProtection: an SGE names an invalid lkey, lies outside its
	// region, or needs local write access the region does not grant.
	StatusLocalProtection
	// StatusWRFlushed: the queue pair entered the error state before the work
	// request completed.
	StatusWRFlushed
	// StatusRemoteAccess: the responder refused a READ or WRITE: bad rkey,
	// out of bounds, or a right the region does not grant.
	StatusRemoteAccess
	// StatusRemoteInvalidRequest: the responder could not take the request
	// (a SEND longer than the posted receive buffers, a READ over
	// MaxMessageSize).
	StatusRemoteInvalidRequest
	// StatusRemoteOperation: the responder failed locally while executing
	// the request (its receive buffer violated its own protection).
	StatusRemoteOperation
	// StatusRNRRetryExceeded: the responder had no receive posted, RNRRetry
	// times in a row.
	StatusRNRRetryExceeded
	// StatusRetryExceeded: the peer vanished (connection lost, process gone)
	// or stayed silent for QPConfig.Timeout.
	StatusRetryExceeded
	// StatusBadResponse: the peer sent a response that breaks the protocol.
	StatusBadResponse
	// StatusDeviceError: a hardware device reported an error nprdma has no
	// name for; the queue pair's Err names it.
	StatusDeviceError
)

func (s Status) String() string {
	switch s {
	case StatusSuccess:
		return "success"
	case StatusLocalLength:
		return "local length error"
	case StatusLocalProtection:
		return "local protection error"
	case StatusWRFlushed:
		return "work request flushed"
	case StatusRemoteAccess:
		return "remote access error"
	case StatusRemoteInvalidRequest:
		return "remote invalid request"
	case StatusRemoteOperation:
		return "remote operation error"
	case StatusRNRRetryExceeded:
		return "RNR retry exceeded"
	case StatusRetryExceeded:
		return "transport retry exceeded"
	case StatusBadResponse:
		return "bad response"
	case StatusDeviceError:
		return "device error"
	}
	return "status(" + strconv.Itoa(int(s)) + ")"
}

// SGE is one scatter/gather element: Length bytes at virtual address Addr
// inside the memory region whose local key is LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendWR is a work request for the send queue.
type SendWR struct {
	// ID is returned in the completion.
	ID uint64
	// Op is OpSend, OpSendWithImm, OpWrite, OpWriteWithImm or OpRead.
	Op Opcode
	// SG is the local memory: the payload of SEND and WRITE, the destination
	// of READ.
	SG []SGE
	// Imm is the immediate data of OpSendWithImm and OpWriteWithImm.
	Imm uint32
	// RemoteAddr and RKey name the peer's memory for WRITE and READ.
	RemoteAddr uint64
	RKey       uint32
	// Signaled asks for a completion on success. Errors always complete.
	Signaled bool
	// Inline copies the payload at post time (SEND and WRITE only, at most
	// QPConfig.MaxInline bytes), so the buffer may be reused as soon as
	// PostSend returns. The payload is InlineData when it is non-nil (no
	// memory registration needed), else the bytes the SG list names.
	Inline bool
	// InlineData is an inline payload given directly as bytes.
	InlineData []byte
	// InvalidateRKey is the peer's remote key an OpSendWithInv invalidates.
	InvalidateRKey uint32
}

// RecvWR is a work request for the receive queue.
type RecvWR struct {
	ID uint64
	SG []SGE
}

// WC is a work completion.
type WC struct {
	ID      uint64
	Status  Status
	Op      Opcode
	ByteLen uint32 // bytes received (receive completions) or transferred
	Imm     uint32
	HasImm  bool
	QPNum   uint32 // the local queue pair the work request was posted to
	// Invalidated reports a receive consumed by a SEND_WITH_INV, which
	// invalidated this side's remote key InvalidatedRKey.
	Invalidated     bool
	InvalidatedRKey uint32
}

// QPState is the state of a queue pair.
type QPState int32

// Queue pair states. A QP starts in QPStateInit, is QPStateConnecting during
// Connect or ConnRequest.Accept, QPStateRTS (ready to send) once connected,
// QPStateError after any failure or a disconnect, QPStateClosed after Close.
const (
	QPStateInit QPState = iota
	QPStateConnecting
	QPStateRTS
	QPStateError
	QPStateClosed
)

func (s QPState) String() string {
	switch s {
	case QPStateInit:
		return "init"
	case QPStateConnecting:
		return "connecting"
	case QPStateRTS:
		return "ready-to-send"
	case QPStateError:
		return "error"
	case QPStateClosed:
		return "closed"
	}
	return "state(" + strconv.Itoa(int(s)) + ")"
}

// Reasons a queue pair left the ready-to-send state, returned (wrapped, with
// the queue pair number and details) by QP.Err. Test with errors.Is.
var (
	ErrDisconnected       = errors.New("disconnected")
	ErrPeerDisconnected   = errors.New("disconnected by the peer")
	ErrPeerLost           = link.ErrPeerLost
	ErrTimeout            = errors.New("peer silent beyond the timeout")
	ErrRemoteAccess       = errors.New("remote access error")
	ErrRemoteRequest      = errors.New("remote invalid request")
	ErrRemoteOperation    = errors.New("remote operation error")
	ErrRNRRetryExceeded   = errors.New("receiver not ready, retries exhausted")
	ErrLocalProtection    = errors.New("local protection error")
	ErrLocalLength        = errors.New("local length error")
	ErrProtocol           = link.ErrProtocol
	ErrCQOverflow         = errors.New("completion queue overflow")
	ErrClosed             = errors.New("closed")
	ErrNotConnected       = errors.New("queue pair is not connected")
	ErrQueueFull          = errors.New("work queue full")
	ErrInvalidWorkRequest = errors.New("invalid work request")
	// ErrDevice: a hardware device failed the queue pair for a reason it
	// did not report (a completion status nprdma has no name for, or work
	// flushed from a queue pair it moved to the error state by itself).
	ErrDevice = errors.New("device error")
)

// RejectError is returned by QP.Connect when the peer rejects the
// connection; PrivateData is what the peer passed to ConnRequest.Reject.
type RejectError = link.RejectError

// seqBefore reports whether sequence number a comes before b (mod 2^32).
func seqBefore(a, b uint32) bool { return int32(a-b) < 0 }
