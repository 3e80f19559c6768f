// Package link is what a provider of nprdma's software NIC implements: the
// transport beneath a Device made with nprdma.NewDevice (nprdma/tcp,
// nprdma/loop, nprdma/shm). It is to package nprdma what database/sql/driver
// is to database/sql: applications use nprdma's Device, PD, MR, CQ and QP; a
// provider imports this package, not those.
//
// The protocol (sequence numbers, acknowledgements, RNR, validation of remote
// access, completions) lives in nprdma and is the same for every provider; a
// provider connects queue pairs and moves their packets, in order, between
// two endpoints, and says when the link breaks. Hardware RDMA devices plug in
// one level higher, as nprdma.DeviceDriver (nprdma/verbs).
package link

import (
	"context"
	"errors"
	"strconv"
	"time"
)

// Limits every link carries (nprdma re-exports them).
const (
	// MaxMessageSize bounds the bytes of one message (a work request's SGEs).
	MaxMessageSize = 1 << 30
	// MaxSGE bounds the SGEs of one work request.
	MaxSGE = 16
	// MaxPrivateData bounds the private data of a connection request, an
	// accept or a reject.
	MaxPrivateData = 1024
)

// Errors a link reports to nprdma, which returns them to the application
// (nprdma re-exports them).
var (
	// ErrPeerLost: the connection broke (a reset, the end of the stream
	// without a graceful close).
	ErrPeerLost = errors.New("peer lost (connection broken)")
	// ErrProtocol: the peer sent something the protocol does not allow.
	ErrProtocol = errors.New("protocol violation by the peer")
)

// RejectError is returned by Provider.Dial (and so by nprdma's QP.Connect)
// when the peer rejects the connection.
type RejectError struct {
	// PrivateData is what the peer passed with the rejection.
	PrivateData []byte
}

func (e *RejectError) Error() string {
	return "nprdma: connection rejected by the peer (" + strconv.Itoa(len(e.PrivateData)) + " bytes of private data)"
}

// Provider is a transport for queue pairs.
type Provider interface {
	// Name is a short name for devices and metrics ("tcp", "loop").
	Name() string
	// Listen accepts connection requests on addr.
	Listen(addr string) (Listener, error)
	// Dial sends a connection request to addr and waits for the answer. A
	// rejection is returned as *RejectError.
	Dial(ctx context.Context, addr string, hello Hello) (Link, Hello, error)
}

// Hello is what each side of a connection tells the other: its queue pair
// number and the application's private data.
type Hello struct {
	QPNum       uint32
	PrivateData []byte
}

// Listener yields incoming connection requests.
type Listener interface {
	Accept(ctx context.Context) (Request, error)
	Addr() string
	Close() error
}

// Request is an incoming connection request, answered exactly once.
type Request interface {
	Hello() Hello
	RemoteAddr() string
	// Accept answers with hello and returns the established link.
	Accept(hello Hello) (Link, error)
	// Reject answers with the private data and drops the connection.
	Reject(privateData []byte) error
}

// Link carries one queue pair's packets to its peer, reliably and in order.
//
// Contract: Start is called once. Send and Flush may be called from any
// goroutine and never wait for the peer (a link that cannot write hands
// the bytes to a goroutine of its own). Receiver methods are called from one
// goroutine at a time, never from inside Send, Flush, Close or Abort.
// LinkDown is called exactly once, after the last Deliver has returned; it
// follows Close or Abort promptly (Close waits for the peer to close too:
// the caller bounds that wait with Abort).
type Link interface {
	// Start begins delivering inbound packets to r.
	Start(r Receiver)
	// Send queues packets for transmission in order. The link keeps
	// references to the payload slices (not to pkts) until they are written
	// and then calls each packet's Release.
	Send(pkts []Packet)
	// Flush starts transmitting what Send queued.
	Flush()
	// Close sends what is queued, then shuts the link down gracefully; the
	// peer sees the end of the stream after every packet sent before.
	Close()
	// Abort breaks the link at once, dropping anything queued, as the death
	// of the process would.
	Abort()
}

// Driver is implemented by links that let the goroutine waiting for a
// completion receive in place of the link's own goroutine ("direct
// completion"). A waiter that needs the next inbound packet then reads it
// from the network itself, as a client blocked in read() does, instead of
// being woken by the goroutine that read it: on a machine where waking a
// goroutine on another CPU costs tens of microseconds, that hand-off is most
// of the difference between a READ and a raw request/response.
//
// Contract: Drive delivers inbound packets to the link's Receiver on the
// calling goroutine, with the same guarantees as the link's own goroutine
// (one goroutine at a time, in order), until w.Done reports true (checked
// between packets) or ctx ends; a packet it has begun to deliver is always
// delivered whole. It reports false at once, delivering nothing, when it
// cannot drive: another goroutine is receiving, the link is frozen or going
// down. When the link's own goroutine was receiving, it gives the receive
// side up at its next pause and calls w.Wake, so that the waiter can drive
// next time. When Drive stops it flushes the responses the Receiver queued
// but not an acknowledgement it owes (see Receiver.Idle): that goes with
// the next request or at the next Idle. If nobody drives again within a
// short delay the link's own goroutine resumes receiving, so inbound
// packets never wait long for the application.
type Driver interface {
	Drive(ctx context.Context, w DriveWaiter) bool
}

// DriveWaiter is the goroutine that calls Driver.Drive.
type DriveWaiter interface {
	// Done reports whether the waiter has what it waits for.
	Done() bool
	// Wake wakes the waiter where it waits when it could not drive.
	Wake()
	// BusyPoll is how long the driver may spin on the link, polling for
	// packets without blocking, before it blocks for them (0: it blocks at
	// once). Spinning saves the wake-up of a goroutine blocked in the
	// network poller; it pays only with a CPU to spare.
	BusyPoll() time.Duration
}

// Receiver is the queue pair side of a link.
type Receiver interface {
	// Deliver hands over one inbound packet. Its payload (h.PayloadLen()
	// bytes) must be consumed from p before Deliver returns. An error is
	// fatal: the provider aborts the link and calls LinkDown with it.
	Deliver(h *Header, p Payload) error
	// Idle says the link has delivered everything that arrived and is about
	// to wait for the network: a good moment to send acknowledgements.
	Idle()
	// LinkDown says the link is gone; err says why (io.EOF after the peer
	// closed gracefully).
	LinkDown(err error)
}

// PayloadExpecter is implemented by a Receiver that can name the packet it
// expects next and where that packet's payload lands. A provider may then
// read the packet's header and payload with one system call, the payload
// straight into place, before it knows whether the guess was right.
type PayloadExpecter interface {
	// ExpectPayload fills e with the packet expected next, if its payload
	// is at least min bytes. e.Dst is memory that the queue pair gave the
	// network to write (a READ's own destination, a posted receive buffer):
	// a provider may write into it before it has checked the header, and
	// reads again from the stream whatever a wrong guess put there, so a
	// receive buffer may hold such bytes past the message it finally
	// receives. It stays valid until the packet is delivered or the link
	// fails: only the goroutine that delivers completes the request or
	// receive it belongs to.
	ExpectPayload(min int, e *ExpectedPayload) bool
}

// ExpectedPayload is a packet a Receiver expects next (PayloadExpecter).
type ExpectedPayload struct {
	Header Header
	// Src is the payload's address at the sender: the sender pads the
	// stream so that the payload keeps its source's alignment. SrcUnknown:
	// the receiver cannot know it (a SEND's), and the provider goes by the
	// last packet of the kind.
	Src        uint64
	SrcUnknown bool
	// Dst is where the first len(Dst) bytes of the payload land.
	Dst []byte
}

// Payload is the payload of the packet being delivered.
type Payload interface {
	// Read fills dst with the next len(dst) bytes of the payload.
	Read(dst []byte) error
	// Discard skips the next n bytes of the payload.
	Discard(n int) error
}

// Releaser is implemented by buffers a packet borrows until it is sent.
type Releaser interface {
	Release()
}
