package link

import "strconv"

// The packets a link carries: what the software NIC's queue pairs send
// each other (docs/nprdma.md §8 for their meaning, the providers' docs for
// their encodings).

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
