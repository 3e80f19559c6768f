package npread

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Wire format of the slow path, all integers little endian. Three messages,
// each of a fixed size; a decoder refuses any other size, an unknown
// opcode, non-zero reserved bytes and values outside their range, before
// the caller acts on any field.
//
// Descriptor (private data of the connection's accept, DescriptorSize):
//
//	0  u32 magic "NPSD"    4 u16 version 1   6 u16 reserved
//	8  u64 region address  16 u64 region length
//	24 u32 rkey            28 u32 page size
//	32 u64 magic page value
//	40 u32 largest slow-path read   44 u32 reserved
//
// Request (SEND from the requester, RequestSize):
//
//	0  u8 opcode 1 (read)  1..3 reserved     4 u32 length
//	8  u64 tag             16 u64 offset in the region
//	24 u64 destination address (requester's memory, written by RDMA WRITE)
//	32 u32 destination rkey                  36 u32 reserved
//
// Response (SEND from the server, after the RDMA WRITE of the data, ResponseSize):
//
//	0  u8 opcode 2 (read response)  1 u8 status   2..3 reserved
//	4  u32 length          8 u64 tag
//	16 u32 minor faults    20 u32 major faults   24 u64 reserved
const (
	DescriptorSize = 48
	RequestSize    = 40
	ResponseSize   = 32

	descriptorMagic   = 0x4453504e // "NPSD"
	descriptorVersion = 1
	opRead            = 1
	opReadResponse    = 2

	// MaxReadLimit bounds a slow-path read (and the largest read a
	// descriptor may announce).
	MaxReadLimit = 16 << 20
)

// ErrMalformed matches every decoding error (errors.Is).
var ErrMalformed = errors.New("malformed slow-path message")

func malformed(what string, args ...any) error {
	return fmt.Errorf("npread: %w: %s", ErrMalformed, fmt.Sprintf(what, args...))
}

// Descriptor is what a requester needs to read a region one-sided: the
// region's remote address, length and key, its page size and magic value,
// and the largest read the slow path serves.
type Descriptor struct {
	Addr     uint64
	Length   uint64
	RKey     uint32
	PageSize uint32
	Magic    uint64
	MaxRead  uint32
}

// AppendDescriptor appends the encoding of d to b.
func AppendDescriptor(b []byte, d Descriptor) []byte {
	var m [DescriptorSize]byte
	le := binary.LittleEndian
	le.PutUint32(m[0:], descriptorMagic)
	le.PutUint16(m[4:], descriptorVersion)
	le.PutUint64(m[8:], d.Addr)
	le.PutUint64(m[16:], d.Length)
	le.PutUint32(m[24:], d.RKey)
	le.PutUint32(m[28:], d.PageSize)
	le.PutUint64(m[32:], d.Magic)
	le.PutUint32(m[40:], d.MaxRead)
	return append(b, m[:]...)
}

// DecodeDescriptor decodes and validates a descriptor.
func DecodeDescriptor(b []byte) (Descriptor, error) {
	if len(b) != DescriptorSize {
		return Descriptor{}, malformed("descriptor of %d bytes, want %d", len(b), DescriptorSize)
	}
	le := binary.LittleEndian
	if m := le.Uint32(b[0:]); m != descriptorMagic {
		return Descriptor{}, malformed("descriptor magic %#x, want %#x", m, descriptorMagic)
	}
	if v := le.Uint16(b[4:]); v != descriptorVersion {
		return Descriptor{}, malformed("descriptor version %d, want %d", v, descriptorVersion)
	}
	if le.Uint16(b[6:]) != 0 || le.Uint32(b[44:]) != 0 {
		return Descriptor{}, malformed("descriptor reserved fields not zero")
	}
	d := Descriptor{
		Addr: le.Uint64(b[8:]), Length: le.Uint64(b[16:]), RKey: le.Uint32(b[24:]),
		PageSize: le.Uint32(b[28:]), Magic: le.Uint64(b[32:]), MaxRead: le.Uint32(b[40:]),
	}
	switch {
	case d.Length == 0:
		return Descriptor{}, malformed("descriptor of an empty region")
	case d.Addr+d.Length < d.Addr:
		return Descriptor{}, malformed("descriptor region [%#x, +%d) wraps around", d.Addr, d.Length)
	case d.PageSize < 8 || d.PageSize&(d.PageSize-1) != 0:
		return Descriptor{}, malformed("descriptor page size %d is not a power of two ≥ 8", d.PageSize)
	case d.Magic == 0:
		return Descriptor{}, malformed("descriptor magic page value is zero")
	case d.MaxRead == 0 || d.MaxRead > MaxReadLimit:
		return Descriptor{}, malformed("descriptor largest read %d outside [1, %d]", d.MaxRead, MaxReadLimit)
	}
	return d, nil
}

// Request asks the server to read Len bytes at Off of the region and to
// RDMA WRITE them to DestAddr (DestRKey) before answering.
type Request struct {
	Tag      uint64
	Off      uint64
	Len      uint32
	DestAddr uint64
	DestRKey uint32
}

// AppendRequest appends the encoding of q to b.
func AppendRequest(b []byte, q Request) []byte {
	var m [RequestSize]byte
	le := binary.LittleEndian
	m[0] = opRead
	le.PutUint32(m[4:], q.Len)
	le.PutUint64(m[8:], q.Tag)
	le.PutUint64(m[16:], q.Off)
	le.PutUint64(m[24:], q.DestAddr)
	le.PutUint32(m[32:], q.DestRKey)
	return append(b, m[:]...)
}

// DecodeRequest decodes a request. It checks the encoding only; whether the
// range lies in the region is the server's business (StatusOutOfRange).
func DecodeRequest(b []byte) (Request, error) {
	if len(b) != RequestSize {
		return Request{}, malformed("request of %d bytes, want %d", len(b), RequestSize)
	}
	if b[0] != opRead {
		return Request{}, malformed("request opcode %d, want %d (read)", b[0], opRead)
	}
	le := binary.LittleEndian
	if b[1] != 0 || b[2] != 0 || b[3] != 0 || le.Uint32(b[36:]) != 0 {
		return Request{}, malformed("request reserved fields not zero")
	}
	q := Request{Len: le.Uint32(b[4:]), Tag: le.Uint64(b[8:]), Off: le.Uint64(b[16:]),
		DestAddr: le.Uint64(b[24:]), DestRKey: le.Uint32(b[32:])}
	if q.Len == 0 || q.Len > MaxReadLimit {
		return Request{}, malformed("request length %d outside [1, %d]", q.Len, MaxReadLimit)
	}
	return q, nil
}

// Status is the outcome of a slow-path read.
type Status uint8

// Statuses.
const (
	StatusOK Status = iota
	// StatusInvalid: the request asked for more than the server's largest
	// read.
	StatusInvalid
	// StatusOutOfRange: the range is not inside the region.
	StatusOutOfRange
	// StatusReadError: the backend failed to read the range.
	StatusReadError
)

func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusInvalid:
		return "invalid request"
	case StatusOutOfRange:
		return "out of range"
	case StatusReadError:
		return "read error"
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Response answers the request with the same Tag. On StatusOK the data was
// written before the response was sent (RC order), and MinorFaults and
// MajorFaults say how the server resolved the pages it had to fault in.
type Response struct {
	Tag         uint64
	Status      Status
	Len         uint32
	MinorFaults uint32
	MajorFaults uint32
}

// AppendResponse appends the encoding of r to b.
func AppendResponse(b []byte, r Response) []byte {
	var m [ResponseSize]byte
	le := binary.LittleEndian
	m[0] = opReadResponse
	m[1] = byte(r.Status)
	le.PutUint32(m[4:], r.Len)
	le.PutUint64(m[8:], r.Tag)
	le.PutUint32(m[16:], r.MinorFaults)
	le.PutUint32(m[20:], r.MajorFaults)
	return append(b, m[:]...)
}

// DecodeResponse decodes a response.
func DecodeResponse(b []byte) (Response, error) {
	if len(b) != ResponseSize {
		return Response{}, malformed("response of %d bytes, want %d", len(b), ResponseSize)
	}
	if b[0] != opReadResponse {
		return Response{}, malformed("response opcode %d, want %d (read response)", b[0], opReadResponse)
	}
	le := binary.LittleEndian
	if b[2] != 0 || b[3] != 0 || le.Uint64(b[24:]) != 0 {
		return Response{}, malformed("response reserved fields not zero")
	}
	r := Response{Status: Status(b[1]), Len: le.Uint32(b[4:]), Tag: le.Uint64(b[8:]),
		MinorFaults: le.Uint32(b[16:]), MajorFaults: le.Uint32(b[20:])}
	if r.Status > StatusReadError {
		return Response{}, malformed("response status %d unknown", b[1])
	}
	if r.Len > MaxReadLimit {
		return Response{}, malformed("response length %d beyond %d", r.Len, MaxReadLimit)
	}
	return r, nil
}
