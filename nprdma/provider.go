package nprdma

import (
	"context"
	"strconv"
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
	// Buf, when set, is released once the payload has been consumed.
	Buf Releaser
}
