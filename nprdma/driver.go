package nprdma

import (
	"context"
	"time"
)

// This file is the device seam: what a device implementation provides so
// that Device, PD, MR, CQ, QP, Listener and ConnRequest run on it, as
// database/sql runs on a driver. Two implement it: the software NIC of this
// package (NewDevice, over a Provider: nprdma/tcp, nprdma/loop) and
// hardware (nprdma/verbs, over libibverbs and librdmacm). The user-facing
// types check their arguments and keep the bookkeeping every device needs
// (keys, sizes, the suspected-fault counter); a driver does the rest.
// docs/nprdma.md §2 describes where the two differ (Caps).

// DeviceDriver is a device implementation.
type DeviceDriver interface {
	// Name names the device in errors and metrics ("tcp", "rxe0").
	Name() string
	// Caps says what the device offers beyond the common API.
	Caps() Caps
	AllocPD() (PDDriver, error)
	// NewCQ creates a completion queue of depth completions whose waiters
	// spin for busyPoll before they sleep (0: never).
	NewCQ(depth int, busyPoll time.Duration) (CQDriver, error)
	Listen(addr string) (ListenerDriver, error)
	Stats() Stats
	Close() error
}

// PDDriver is a protection domain of a DeviceDriver.
type PDDriver interface {
	// Register registers buf (off the Go heap) with access; tag is the
	// access tag (WithAccessTag), 0 when none.
	Register(buf []byte, access Access, tag uint64) (MRDriver, error)
	// RegisterUnpinned registers the pager's memory without pinning it
	// (Caps.UnpinnedRegions); other devices return an error.
	RegisterUnpinned(p Pager, access Access, tag uint64) (MRDriver, error)
	NewQP(cfg QPDriverConfig) (QPDriver, error)
	Close() error
}

// MRDriver is a registered memory region of a DeviceDriver.
type MRDriver interface {
	LKey() uint32
	RKey() uint32
	Pinned() bool
	// Magic is the magic value of an unpinned region (0 otherwise).
	Magic() uint64
	PageSize() int
	Deregister() error
}

// CQDriver is a completion queue of a DeviceDriver (see CQ).
type CQDriver interface {
	Poll(wcs []WC) int
	Wait(ctx context.Context, wcs []WC) (int, error)
	Overflowed() bool
	Close() error
}

// QPDriverConfig is QPConfig with the completion queues' drivers. Zero
// fields take the defaults QPConfig states.
type QPDriverConfig struct {
	SendCQ, RecvCQ       CQDriver
	SendDepth, RecvDepth int
	MaxInline            int
	RNRRetry             int
	RNRTimeout           time.Duration
	Timeout              time.Duration
}

// QPDriver is a reliable-connected queue pair of a DeviceDriver (see QP).
type QPDriver interface {
	Num() uint32
	RemoteNum() uint32
	State() QPState
	Done() <-chan struct{}
	Err() error
	// MaxInline is the largest inline payload the device granted.
	MaxInline() int
	SetAccessTag(tag uint64)
	Connect(ctx context.Context, addr string, privateData []byte) ([]byte, error)
	PostSend(wrs ...SendWR) error
	PostRecv(wrs ...RecvWR) error
	Disconnect() error
	Close() error
}

// ListenerDriver accepts connection requests for a DeviceDriver.
type ListenerDriver interface {
	Accept(ctx context.Context) (ConnRequestDriver, error)
	Addr() string
	Close() error
}

// ConnRequestDriver is a connection request of a ListenerDriver. Accept is
// given a queue pair of the same driver.
type ConnRequestDriver interface {
	PrivateData() []byte
	RemoteAddr() string
	Accept(qp QPDriver, privateData []byte) error
	Reject(privateData []byte) error
}

// Caps is what a device offers where devices differ.
type Caps struct {
	// UnpinnedRegions: PD.RegisterUnpinned works (the NP mechanism of
	// docs/np-rdma.md). A hardware NIC cannot be handed a paged region.
	UnpinnedRegions bool
	// AccessTags: a region registered WithAccessTag serves only queue pairs
	// with that tag (QP.SetAccessTag). Without it tags are recorded and not
	// enforced: the rkey is the only protection.
	AccessTags bool
	// ResponderStats: Stats counts what the device serves as responder
	// (READs, WRITEs, remote access errors, RNR NAKs); a hardware NIC does
	// that without software.
	ResponderStats bool
	// SendWithInvalidate: OpSendWithInv is supported.
	SendWithInvalidate bool
	// OnDemand: regions may be registered AccessOnDemand (on-demand paging).
	OnDemand bool
	// PeerErrorCauses: a queue pair whose peer failed learns why (a remote
	// access error, a lost peer). On hardware a peer that fails or dies
	// disconnects, and the queue pair fails with ErrPeerDisconnected.
	PeerErrorCauses bool
	// PadsPrivateData: the peer receives private data padded with zeros to
	// the connection manager's fixed size (RDMA CM over IB CM does).
	PadsPrivateData bool
	// ExactErrorStatus: every error completes with the status and fails the
	// queue pair with the error docs/nprdma.md §3 gives it. Hardware
	// reports what it detects: Soft-RoCE completes a receive too small
	// with a protection error, answers it with a remote operation error,
	// and completes some local errors as flushes (the queue pair then fails
	// with ErrDevice).
	ExactErrorStatus bool
	// OrderedLocalErrors: a request that fails locally (a bad SGE) completes
	// with its error only after every request before it completed. On
	// hardware the requests still awaiting their acknowledgement are
	// flushed with it.
	OrderedLocalErrors bool
	// CQOverflow: a CQ holds exactly its depth and overflows as CQ says.
	// Hardware queues are sized with slack instead, and an overrun fails
	// every queue pair on them.
	CQOverflow bool
	// The largest private data of a connect, an accept and a reject.
	MaxConnectPrivateData, MaxAcceptPrivateData, MaxRejectPrivateData int
}
