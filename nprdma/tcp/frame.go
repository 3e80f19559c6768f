package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/nprdma/nprdma/nprdma/link"
)

// Wire format: every frame starts with an 8-byte prefix
//
//	0  u8   type
//	1  u8   flags (bit 0 IMM, bit 1 LAST, bit 2 ACK; undefined bits must be 0)
//	2  u16  reserved, 0 (NAK: syndrome in byte 2, byte 3 is 0)
//	4  u32  sequence number
//
// followed by a fixed, type-specific rest and, for SEND, WRITE and
// READ_RESP, the payload. All integers are little endian. The requests
// (SEND, WRITE, READ_REQ) end with a piggybacked acknowledgement, valid with
// the ACK flag and 0 without it. docs/nprdma.md has the full table.
const (
	frameSend       = 1  // +len u32, imm u32, ack u32                = 20, payload len
	frameWrite      = 2  // +len u32, rkey u32, addr u64, imm u32, ack u32 = 32, payload len
	frameReadReq    = 3  // +len u32, rkey u32, addr u64, ack u32     = 28
	frameReadResp   = 4  // +len u32, offset u32                      = 16, payload len
	frameReadFill   = 5  // +len u32, offset u32, pattern u64         = 24
	frameAck        = 6  //                                           = 8
	frameNak        = 7  // syndrome in prefix byte 2                 = 8
	frameDisconnect = 8  //                                           = 8
	framePad        = 9  // count u32 in place of the sequence number = 8, count bytes ignored
	frameConnect    = 16 // +magic u32, version u16, pdlen u16, qpn u32 = 20, private data
	frameAccept     = 17 // +pdlen u16, reserved u16, qpn u32         = 16, private data
	frameReject     = 18 // +pdlen u16, reserved u16                  = 12, private data

	flagImm  = 1 << 0
	flagLast = 1 << 1
	flagAck  = 1 << 2

	prefixLen = 8
	// maxHeaderLen is the longest fixed part of any frame.
	maxHeaderLen = 32

	// connectMagic is "NPRD" read as a little-endian u32.
	connectMagic = 0x4452504e
	// protocolVersion 2 added the piggybacked acknowledgement to requests.
	protocolVersion = 2
)

var headerLens = [...]int{
	frameSend: 20, frameWrite: 32, frameReadReq: 28, frameReadResp: 16, frameReadFill: 24,
	frameAck: 8, frameNak: 8, frameDisconnect: 8, framePad: 8,
	frameConnect: 20, frameAccept: 16, frameReject: 12,
}

// headerLen is the length of the fixed part of a frame of type t, 0 for an
// unknown type.
func headerLen(t byte) int {
	if int(t) >= len(headerLens) {
		return 0
	}
	return headerLens[t]
}

var (
	errShort = errors.New("short frame")
	errFrame = errors.New("malformed frame")
)

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errFrame}, args...)...)
}

// appendHeader encodes h (a data-path frame) after b.
func appendHeader(b []byte, h *link.Header) []byte {
	var t, flags byte
	var aux uint16
	switch h.Kind {
	case link.PacketSend:
		t = frameSend
	case link.PacketWrite:
		t = frameWrite
	case link.PacketReadRequest:
		t = frameReadReq
	case link.PacketReadResponse:
		t = frameReadResp
		if h.Fill {
			t = frameReadFill
		}
		if h.Last {
			flags |= flagLast
		}
	case link.PacketAck:
		t = frameAck
	case link.PacketNak:
		t = frameNak
		aux = uint16(h.Syndrome)
	case link.PacketDisconnect:
		t = frameDisconnect
	default:
		panic("tcp: encoding packet kind " + h.Kind.String())
	}
	if h.HasImm && (t == frameSend || t == frameWrite) {
		flags |= flagImm
	}
	var ack uint32
	if h.HasAck && (t == frameSend || t == frameWrite || t == frameReadReq) {
		flags |= flagAck
		ack = h.Ack
	}
	b = append(b, t, flags)
	b = binary.LittleEndian.AppendUint16(b, aux)
	b = binary.LittleEndian.AppendUint32(b, h.Seq)
	le := binary.LittleEndian
	switch t {
	case frameSend:
		b = le.AppendUint32(b, h.Len)
		b = le.AppendUint32(b, h.Imm)
		b = le.AppendUint32(b, ack)
	case frameWrite:
		b = le.AppendUint32(b, h.Len)
		b = le.AppendUint32(b, h.RKey)
		b = le.AppendUint64(b, h.Addr)
		b = le.AppendUint32(b, h.Imm)
		b = le.AppendUint32(b, ack)
	case frameReadReq:
		b = le.AppendUint32(b, h.Len)
		b = le.AppendUint32(b, h.RKey)
		b = le.AppendUint64(b, h.Addr)
		b = le.AppendUint32(b, ack)
	case frameReadResp:
		b = le.AppendUint32(b, h.Len)
		b = le.AppendUint32(b, h.Offset)
	case frameReadFill:
		b = le.AppendUint32(b, h.Len)
		b = le.AppendUint32(b, h.Offset)
		b = le.AppendUint64(b, h.Pattern)
	}
	return b
}

// Padding. The kernel copies each write into socket buffers that continue
// where the previous write of the thread left off, and on this machine's
// CPUs a copy whose source and destination differ in alignment (mod 64)
// runs several times slower. A PAD frame lets the writer place a large
// payload at its source's alignment and end each write on a multiple of
// 64 bytes; the reader skips it.
const (
	alignTo      = 64
	alignPayload = 1024 // payloads at least this long are aligned
	maxPad       = alignTo + prefixLen - 1
)

// padFor is the size of the PAD frame that moves the position pos to
// want (mod alignTo): 0, or between prefixLen and maxPad bytes.
func padFor(pos, want int) int {
	k := (want - pos) & (alignTo - 1)
	if k != 0 && k < prefixLen {
		k += alignTo
	}
	return k
}

// payloadOffset is the length of h's encoded header: where its payload
// starts.
func payloadOffset(h *link.Header) int {
	switch h.Kind {
	case link.PacketSend:
		return headerLens[frameSend]
	case link.PacketWrite:
		return headerLens[frameWrite]
	case link.PacketReadResponse:
		if h.Fill {
			return headerLens[frameReadFill]
		}
		return headerLens[frameReadResp]
	}
	return prefixLen
}

// appendPad appends a PAD frame of n bytes in all (prefixLen ≤ n ≤ maxPad).
func appendPad(b []byte, n int) []byte {
	b = append(b, framePad, 0, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(n-prefixLen))
	for i := prefixLen; i < n; i++ {
		b = append(b, 0)
	}
	return b
}

// parsePad decodes the PAD frame at the start of b and returns how many
// bytes follow its prefix. The padding's content is ignored.
func parsePad(b []byte) (int, error) {
	if len(b) < prefixLen {
		return 0, errShort
	}
	if b[0] != framePad {
		return 0, malformed("frame type %d is not PAD", b[0])
	}
	if b[1] != 0 || b[2] != 0 || b[3] != 0 {
		return 0, malformed("PAD with flags or reserved bits %#x", b[1:4])
	}
	n := binary.LittleEndian.Uint32(b[4:])
	if n > maxPad-prefixLen {
		return 0, malformed("PAD of %d bytes, at most %d", n, maxPad-prefixLen)
	}
	return int(n), nil
}

// parseHeader decodes the data-path frame header at the start of b into h
// and returns its length. It returns errShort when b holds less than the
// header, and an errFrame error for anything malformed, including a length
// beyond link.MaxMessageSize: nothing is allocated on a peer's say-so.
func parseHeader(b []byte, h *link.Header) (int, error) {
	if len(b) < 1 {
		return 0, errShort
	}
	t := b[0]
	n := headerLen(t)
	if n == 0 || t >= frameConnect || t == framePad {
		return 0, malformed("unknown frame type %d", t)
	}
	if len(b) < n {
		return 0, errShort
	}
	le := binary.LittleEndian
	flags, aux, seq := b[1], le.Uint16(b[2:]), le.Uint32(b[4:])
	*h = link.Header{Seq: seq}
	allowed := byte(0)
	switch t {
	case frameSend, frameWrite:
		allowed = flagImm | flagAck
	case frameReadReq:
		allowed = flagAck
	case frameReadResp, frameReadFill:
		allowed = flagLast
	}
	if flags&^allowed != 0 {
		return 0, malformed("frame type %d with flags %#x", t, flags)
	}
	if aux != 0 && t != frameNak {
		return 0, malformed("frame type %d with reserved bits %#x", t, aux)
	}
	switch t {
	case frameSend:
		h.Kind, h.Len, h.Imm = link.PacketSend, le.Uint32(b[8:]), le.Uint32(b[12:])
		h.HasImm = flags&flagImm != 0
	case frameWrite:
		h.Kind, h.Len, h.RKey, h.Addr, h.Imm = link.PacketWrite, le.Uint32(b[8:]), le.Uint32(b[12:]), le.Uint64(b[16:]), le.Uint32(b[24:])
		h.HasImm = flags&flagImm != 0
	case frameReadReq:
		h.Kind, h.Len, h.RKey, h.Addr = link.PacketReadRequest, le.Uint32(b[8:]), le.Uint32(b[12:]), le.Uint64(b[16:])
	case frameReadResp, frameReadFill:
		h.Kind, h.Len, h.Offset = link.PacketReadResponse, le.Uint32(b[8:]), le.Uint32(b[12:])
		h.Last = flags&flagLast != 0
		if t == frameReadFill {
			h.Fill, h.Pattern = true, le.Uint64(b[16:])
		}
		if uint64(h.Offset)+uint64(h.Len) > link.MaxMessageSize {
			return 0, malformed("READ response segment [%d, +%d) beyond %d bytes", h.Offset, h.Len, link.MaxMessageSize)
		}
	case frameAck:
		h.Kind = link.PacketAck
	case frameNak:
		h.Kind, h.Syndrome = link.PacketNak, link.Syndrome(aux&0xff)
		if aux>>8 != 0 || h.Syndrome < link.NakRNR || h.Syndrome > link.NakRemoteOperation {
			return 0, malformed("NAK with syndrome field %#x", aux)
		}
	case frameDisconnect:
		h.Kind = link.PacketDisconnect
	}
	if t == frameSend || t == frameWrite || t == frameReadReq {
		// The acknowledgement is a request's last field; without the flag it
		// must be 0, so that every header has one encoding.
		h.HasAck, h.Ack = flags&flagAck != 0, le.Uint32(b[n-4:])
		if !h.HasAck && h.Ack != 0 {
			return 0, malformed("frame type %d with acknowledgement %d but no ACK flag", t, h.Ack)
		}
	}
	if (t == frameSend || t == frameWrite) && h.Len > link.MaxMessageSize {
		return 0, malformed("%s of %d bytes beyond %d", h.Kind, h.Len, link.MaxMessageSize)
	}
	return n, nil
}

// cmFrame is a connection-manager frame (CONNECT, ACCEPT, REJECT).
type cmFrame struct {
	typ         byte
	qpn         uint32
	privateData []byte
}

func appendCM(b []byte, f cmFrame) []byte {
	le := binary.LittleEndian
	b = append(b, f.typ, 0, 0, 0, 0, 0, 0, 0)
	pdlen := uint16(len(f.privateData))
	switch f.typ {
	case frameConnect:
		b = le.AppendUint32(b, connectMagic)
		b = le.AppendUint16(b, protocolVersion)
		b = le.AppendUint16(b, pdlen)
		b = le.AppendUint32(b, f.qpn)
	case frameAccept:
		b = le.AppendUint16(b, pdlen)
		b = le.AppendUint16(b, 0)
		b = le.AppendUint32(b, f.qpn)
	case frameReject:
		b = le.AppendUint16(b, pdlen)
		b = le.AppendUint16(b, 0)
	default:
		panic("tcp: encoding cm frame type " + fmt.Sprint(f.typ))
	}
	return append(b, f.privateData...)
}

// parseCM decodes the connection-manager frame at the start of b, which
// must be of one of the types in want. It returns errShort while b holds
// less than the whole frame; private data beyond link.MaxPrivateData is
// refused before it is read.
func parseCM(b []byte, want ...byte) (cmFrame, int, error) {
	if len(b) < 1 {
		return cmFrame{}, 0, errShort
	}
	t := b[0]
	ok := false
	for _, w := range want {
		ok = ok || t == w
	}
	if !ok {
		return cmFrame{}, 0, malformed("frame type %d during the handshake", t)
	}
	n := headerLen(t)
	if len(b) < n {
		return cmFrame{}, 0, errShort
	}
	le := binary.LittleEndian
	for _, x := range b[1:prefixLen] {
		if x != 0 {
			return cmFrame{}, 0, malformed("handshake frame with a non-zero prefix")
		}
	}
	f := cmFrame{typ: t}
	var pdlen int
	switch t {
	case frameConnect:
		if m := le.Uint32(b[8:]); m != connectMagic {
			return cmFrame{}, 0, malformed("connect magic %#x, not an nprdma peer", m)
		}
		if v := le.Uint16(b[12:]); v != protocolVersion {
			return cmFrame{}, 0, malformed("protocol version %d, want %d", v, protocolVersion)
		}
		pdlen, f.qpn = int(le.Uint16(b[14:])), le.Uint32(b[16:])
	case frameAccept:
		pdlen, f.qpn = int(le.Uint16(b[8:])), le.Uint32(b[12:])
		if le.Uint16(b[10:]) != 0 {
			return cmFrame{}, 0, malformed("accept with reserved bits")
		}
	case frameReject:
		pdlen = int(le.Uint16(b[8:]))
		if le.Uint16(b[10:]) != 0 {
			return cmFrame{}, 0, malformed("reject with reserved bits")
		}
	}
	if pdlen > link.MaxPrivateData {
		return cmFrame{}, 0, malformed("%d bytes of private data, at most %d", pdlen, link.MaxPrivateData)
	}
	if len(b) < n+pdlen {
		return cmFrame{}, 0, errShort
	}
	f.privateData = append([]byte(nil), b[n:n+pdlen]...)
	return f, n + pdlen, nil
}
