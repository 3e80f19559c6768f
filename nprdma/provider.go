package nprdma

import (
	"context"
	"os"
	"strconv"
	"time"
)

// This file is the provider interface: what a transport (nprdma/tcp,
// nprdma/loop) implements so that a Device can run on it. The protocol
// itself (sequence numbers, acknowledgements, RNR, validation of remote
// access, completions) lives in this package and is the same for every
// provider; a provider connects queue pairs and moves their packets, in
// order, between two endpoints, and says when the link breaks.

// Provider is a transport for queue pairs.
type Provider interface {
	// Name is a short name for devices and metrics ("tcp", "loop").
	Name() string
	// Listen accepts connection requests on addr.
	Listen(addr string) (LinkListener, error)
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

// LinkListener yields incoming connection requests.
type LinkListener interface {
	Accept(ctx context.Context) (LinkRequest, error)
	Addr() string
	Close() error
}

// LinkRequest is an incoming connection request, answered exactly once.
type LinkRequest interface {
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

// PacketKind is the type of a packet.
type PacketKind uint8

// Packet kinds: requests (requester to responder), then responses.
const (
	PacketSend PacketKind = iota + 1
	PacketWrite
	PacketReadRequest
	PacketReadResponse
	PacketAck
	PacketNak
	PacketDisconnect
)

func (k PacketKind) String() string {
	switch k {
	case PacketSend:
		return "SEND"
	case PacketWrite:
		return "WRITE"
	case PacketReadRequest:
		return "READ_REQUEST"
	case PacketReadResponse:
		return "READ_RESPONSE"
	case PacketAck:
		return "ACK"
	case PacketNak:
		return "NAK"
	case PacketDisconnect:
		return "DISCONNECT"
	}
	return "packet(" + strconv.Itoa(int(k)) + ")"
}

// Syndrome is the reason of a NAK.
type Syndrome uint8

// NAK syndromes.
const (
	NakRNR Syndrome = iota + 1
	NakRemoteAccess
	NakInvalidRequest
	NakRemoteOperation
)

func (s Syndrome) String() string {
	switch s {
	case NakRNR:
		return "receiver not ready"
	case NakRemoteAccess:
		return "remote access error"
	case NakInvalidRequest:
		return "invalid request"
	case NakRemoteOperation:
		return "remote operation error"
	}
	return "syndrome(" + strconv.Itoa(int(s)) + ")"
}

// Header is the decoded header of a packet. Which fields are meaningful
// depends on Kind (see docs/nprdma.md for the tcp encoding).
type Header struct {
	Kind PacketKind
	// Seq is the request's sequence number; in ACK the last request
	// acknowledged (cumulative); in NAK and READ_RESPONSE the request
	// answered (which acknowledges every request before it).
	Seq uint32
	// Len: payload bytes (SEND, WRITE, READ_RESPONSE), bytes requested
	// (READ_REQUEST), bytes to fill (READ_RESPONSE with Fill).
	Len    uint32
	HasImm bool
	Imm    uint32
	RKey   uint32
	Addr   uint64 // remote address (WRITE, READ_REQUEST)
	// Offset is the position of a READ_RESPONSE segment inside the READ.
	Offset uint32
	// Last marks the final READ_RESPONSE segment of a READ.
	Last bool
	// Fill marks a READ_RESPONSE segment without payload: Len bytes where
	// byte j is byte j%8 of Pattern (little endian).
	Fill     bool
	Pattern  uint64
	Syndrome Syndrome // NAK
	// HasAck marks a request (SEND, WRITE, READ_REQUEST) that carries a
	// piggybacked acknowledgement of the receiver's own requests: Ack is the
	// last one the sender executed (cumulative), as in an ACK packet.
	HasAck bool
	Ack    uint32
}

// PayloadLen is the number of payload bytes that follow the header.
func (h *Header) PayloadLen() int {
	switch h.Kind {
	case PacketSend, PacketWrite:
		return int(h.Len)
	case PacketReadResponse:
		if h.Fill {
			return 0
		}
		return int(h.Len)
	}
	return 0
}

// Packet is an outbound packet: a header and its payload as a gather list.
type Packet struct {
	Header
	Data [][]byte
	// Src, when set, produces the payload in place of Data at the moment
	// the receiving side consumes it. Only links that implement
	// DeliveryCopier are given such packets.
	Src PayloadSource
	// Buf, when set, is released once the payload has been consumed.
	Buf Releaser
}

// PayloadSource produces a packet's payload as the receiver consumes it, in
// order: the NIC engine uses it to copy an unpinned region straight into
// the requester's buffer, page by page under the pager's seqlock.
type PayloadSource interface {
	// Read fills dst with the next len(dst) bytes of the payload.
	Read(dst []byte)
	// Discard skips the next n bytes without producing them.
	Discard(n int)
}

// DeliveryCopier is implemented by links that move a payload by copying it
// from the sender's memory when the receiver consumes it (nprdma/loop),
// rather than when the packet is sent. Such links accept packets with a
// Src, which the receiving side reads through its Payload.
type DeliveryCopier interface {
	CopiesAtDelivery()
}

// LocalReader is implemented by links whose peer lets this side read some of
// its unpinned regions in place (nprdma/shm: the peer's memory is mapped
// here). A READ of such a region is then executed by the requester itself
// when it is posted: page by page under the pager's seqlock, the magic page
// in place of every page that could not be read, exactly what the peer's
// NIC engine would have delivered; no packet is sent and the peer's CPU
// takes no part. Its completion still comes in posting order.
type LocalReader interface {
	// ReadLocal copies [addr, addr+len) of the peer's region rkey into the
	// concatenation of dst (whose lengths sum to len). ok is false, with dst
	// unspecified, when the link cannot: the region is not shared with it,
	// the range is not inside it, or the share was revoked. The READ then
	// goes to the peer like any other, whose NIC engine decides.
	ReadLocal(rkey uint32, addr uint64, dst [][]byte) (r LocalRead, ok bool)
}

// LocalRead is what a READ executed by the requester (LocalReader) did.
type LocalRead struct {
	Pages int // pages of the region touched
	Magic int // of which delivered as the magic page
}

// RegionSharer is implemented by links that can let the peer read an
// unpinned region in place (nprdma/shm). The queue pair offers the link a
// region the first time the peer's READ of it passes the NIC engine's
// checks on this queue pair (key, protection domain, access tag, right,
// bounds), if the region's pager is a SharedPager.
type RegionSharer interface {
	// ShareRegion passes the region to the peer. The returned revoke, called
	// when the region is deregistered, must make sure that no READ the peer
	// executes in place completes successfully after it returns (a fence the
	// peer checks after every copy); it may be called after the link is
	// down. ok is false when the link declines.
	ShareRegion(r SharedRegion) (revoke func(), ok bool)
}

// SharedRegion is an unpinned region a link passes to its peer.
type SharedRegion struct {
	RKey     uint32
	Addr     uint64 // the region's address, as the peer names it in READs
	Len      int
	PageSize int
	Magic    uint64
	// Data, States and Access come from the pager (SharedPager.ShareFiles);
	// the link passes them on and keeps no reference once ShareRegion
	// returns.
	Data, States, Access *os.File
	Bits                 StateBits
}
