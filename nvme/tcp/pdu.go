package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

var le = binary.LittleEndian

// Well-known ports.
const (
	// Port is where NVMe/TCP I/O controllers listen by convention.
	Port = 4420
	// DiscoveryPort is where an NVMe/TCP discovery controller listens by
	// convention (hosts also find one on the I/O port).
	DiscoveryPort = 8009
)

// PDUType is the PDU-Type field of the common header. Bit 0 gives the
// direction: 0 host to controller, 1 controller to host.
type PDUType uint8

// PDU types.
const (
	TypeICReq       PDUType = 0x00
	TypeICResp      PDUType = 0x01
	TypeH2CTermReq  PDUType = 0x02
	TypeC2HTermReq  PDUType = 0x03
	TypeCapsuleCmd  PDUType = 0x04
	TypeCapsuleResp PDUType = 0x05
	TypeH2CData     PDUType = 0x06
	TypeC2HData     PDUType = 0x07
	TypeR2T         PDUType = 0x09
)

var typeNames = map[PDUType]string{
	TypeICReq: "ICReq", TypeICResp: "ICResp", TypeH2CTermReq: "H2CTermReq", TypeC2HTermReq: "C2HTermReq",
	TypeCapsuleCmd: "CapsuleCmd", TypeCapsuleResp: "CapsuleResp", TypeH2CData: "H2CData", TypeC2HData: "C2HData",
	TypeR2T: "R2T",
}

func (t PDUType) String() string {
	if n, ok := typeNames[t]; ok {
		return n
	}
	return fmt.Sprintf("PDU type 0x%02x", uint8(t))
}

// FromHost reports a type that hosts send (direction bit 0).
func (t PDUType) FromHost() bool { return t&1 == 0 }

// Flags is the FLAGS field of the common header.
type Flags uint8

// Common header flags.
const (
	// FlagHDGST: a header digest follows the header.
	FlagHDGST Flags = 1 << 0
	// FlagDDGST: a data digest follows the data.
	FlagDDGST Flags = 1 << 1
	// FlagLast (LAST_PDU): the last H2CData or C2HData PDU of a transfer.
	FlagLast Flags = 1 << 2
	// FlagSuccess (C2HData only, with FlagLast): the command succeeded and
	// no CapsuleResp follows.
	FlagSuccess Flags = 1 << 3
)

// Sizes of the PDUs' headers (HLEN) and of what follows them.
const (
	CommonHeaderSize      = 8
	ICSize                = 128 // ICReq and ICResp: HLEN = PLEN
	CapsuleCmdHeaderSize  = CommonHeaderSize + 64
	CapsuleRespHeaderSize = CommonHeaderSize + 16
	DataHeaderSize        = 24 // H2CData, C2HData
	R2THeaderSize         = 24
	TermReqHeaderSize     = 24
	// MaxTermReqData is how much of the offending PDU's header a
	// termination request carries.
	MaxTermReqData = 128
	// MaxHeaderSize is the largest HLEN.
	MaxHeaderSize = ICSize
	// DigestSize is the size of a header or data digest.
	DigestSize = 4
	// MaxPDA is the largest HPDA/CPDA: data aligned to (PDA+1)·4 bytes.
	MaxPDA = 31
	// MinMaxH2CData is the smallest MAXH2CDATA a controller may advertise.
	MinMaxH2CData = 4096
	// FabricsInCapsuleData is the in-capsule data every queue accepts with
	// Fabrics commands and on the admin queue (Linux's NVME_TCP_ADMIN_CCSZ):
	// the 1024-byte Connect data always arrives in the capsule.
	FabricsInCapsuleData = 8192
)

// headerSize is the HLEN each type must have.
var headerSize = [...]uint8{
	TypeICReq: ICSize, TypeICResp: ICSize, TypeH2CTermReq: TermReqHeaderSize, TypeC2HTermReq: TermReqHeaderSize,
	TypeCapsuleCmd: CapsuleCmdHeaderSize, TypeCapsuleResp: CapsuleRespHeaderSize, TypeH2CData: DataHeaderSize,
	TypeC2HData: DataHeaderSize, 8: 0, TypeR2T: R2THeaderSize,
}

// HeaderSize is the HLEN of PDUs of type t (0 for an unknown type).
func HeaderSize(t PDUType) int {
	if int(t) < len(headerSize) {
		return int(headerSize[t])
	}
	return 0
}

// hasHeaderDigest: types that carry a header digest when it is enabled.
func hasHeaderDigest(t PDUType) bool {
	switch t {
	case TypeCapsuleCmd, TypeCapsuleResp, TypeH2CData, TypeC2HData, TypeR2T:
		return true
	}
	return false
}

// carriesData: types that may carry data (with a data digest when enabled).
func carriesData(t PDUType) bool {
	switch t {
	case TypeCapsuleCmd, TypeH2CData, TypeC2HData:
		return true
	}
	return false
}

// validFlags are the flags each type may carry.
func validFlags(t PDUType) Flags {
	switch t {
	case TypeCapsuleCmd:
		return FlagHDGST | FlagDDGST
	case TypeCapsuleResp, TypeR2T:
		return FlagHDGST
	case TypeH2CData:
		return FlagHDGST | FlagDDGST | FlagLast
	case TypeC2HData:
		return FlagHDGST | FlagDDGST | FlagLast | FlagSuccess
	}
	return 0
}

// CommonHeader is the 8 bytes every PDU starts with.
type CommonHeader struct {
	Type  PDUType
	Flags Flags
	HLEN  uint8  // header length, header digest excluded
	PDO   uint8  // offset of the data from the start of the PDU; 0 without data
	PLEN  uint32 // the whole PDU: header, digests, padding, data
}

// Offsets of the common header's fields (FEI values).
const (
	offType  = 0
	offFlags = 1
	offHLEN  = 2
	offPDO   = 3
	offPLEN  = 4
)

// Unmarshal decodes the first 8 bytes of b.
func (h *CommonHeader) Unmarshal(b []byte) error {
	if len(b) < CommonHeaderSize {
		return fmt.Errorf("nvme/tcp: common header of %d bytes", len(b))
	}
	h.Type, h.Flags, h.HLEN, h.PDO, h.PLEN = PDUType(b[0]), Flags(b[1]), b[2], b[3], le.Uint32(b[4:])
	return nil
}

// MarshalTo encodes h into the first 8 bytes of b.
func (h *CommonHeader) MarshalTo(b []byte) {
	b[0], b[1], b[2], b[3] = byte(h.Type), byte(h.Flags), h.HLEN, h.PDO
	le.PutUint32(b[4:], h.PLEN)
}

// Digests are the digests a connection uses (the DGST field of ICReq and
// ICResp).
type Digests uint8

// Digest bits.
const (
	HeaderDigest Digests = 1 << 0
	DataDigest   Digests = 1 << 1
)

func (d Digests) String() string {
	switch d & (HeaderDigest | DataDigest) {
	case 0:
		return "none"
	case HeaderDigest:
		return "header"
	case DataDigest:
		return "data"
	}
	return "header+data"
}

// castagnoli is CRC32C, the digest of NVMe/TCP: seed and final XOR
// 0xFFFFFFFF (as hash/crc32 computes it), stored little-endian.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Digest is the CRC32C of b.
func Digest(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// pdaAlignment is the data alignment in bytes that a PDA value asks for.
func pdaAlignment(pda uint8) int { return (int(pda) + 1) * 4 }

// dataOffset is the PDO of a PDU of type t with data: its header and
// header digest, padded to align bytes.
func dataOffset(hlen int, hdgst bool, align int) int {
	n := hlen
	if hdgst {
		n += DigestSize
	}
	if align > 1 {
		n = (n + align - 1) / align * align
	}
	return n
}

// FES is the fatal error status of a termination request.
type FES uint16

// Fatal error statuses.
const (
	FESInvalidHeaderField   FES = 0x01
	FESPDUSequenceError     FES = 0x02
	FESHeaderDigestError    FES = 0x03
	FESDataOutOfRange       FES = 0x04
	FESDataLimitExceeded    FES = 0x05 // also "R2T limit exceeded"
	FESUnsupportedParameter FES = 0x06
)

var fesNames = map[FES]string{
	FESInvalidHeaderField: "invalid PDU header field", FESPDUSequenceError: "PDU sequence error",
	FESHeaderDigestError: "header digest error", FESDataOutOfRange: "data transfer out of range",
	FESDataLimitExceeded: "data transfer limit exceeded", FESUnsupportedParameter: "unsupported parameter",
}

func (f FES) String() string {
	if n, ok := fesNames[f]; ok {
		return n
	}
	return fmt.Sprintf("FES 0x%02x", uint16(f))
}

// ProtocolError is a fatal error of the transport: the connection cannot go
// on. The side that detects it sends a termination request made from it
// (TermReq) and closes the connection; a termination request received is
// never answered with another.
type ProtocolError struct {
	FES FES
	// FEI is the byte offset of the offending field in the PDU (for
	// FESInvalidHeaderField and FESUnsupportedParameter), else 0.
	FEI uint32
	// Type is the offending PDU's type.
	Type PDUType
	// Header holds the offending PDU's header as far as it was read, at
	// most MaxTermReqData bytes.
	Header []byte
	// Detail says what was wrong, for logs.
	Detail string
}

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("nvme/tcp: %s: %s (FES %d, FEI %d)", e.Type, e.Detail, e.FES, e.FEI)
}

// TermReq is the termination request that reports e, of type t
// (TypeC2HTermReq from a controller, TypeH2CTermReq from a host).
func (e *ProtocolError) TermReq(t PDUType) TermReq {
	return TermReq{Type: t, FES: e.FES, FEI: e.FEI, Data: e.Header}
}

func protocolErrorf(fes FES, fei uint32, t PDUType, hdr []byte, format string, args ...any) *ProtocolError {
	if len(hdr) > MaxTermReqData {
		hdr = hdr[:MaxTermReqData]
	}
	return &ProtocolError{FES: fes, FEI: fei, Type: t, Header: append([]byte(nil), hdr...), Detail: fmt.Sprintf(format, args...)}
}

// ErrDataDigest is wrapped by the error Reader.ReadData returns when the
// data's digest does not match. The PDU was read whole, so the stream is
// still in step: the side that reads it may fail only the command (a
// controller answers Transient Transport Error) and go on.
var ErrDataDigest = errors.New("nvme/tcp: data digest mismatch")

// ErrTermReq is wrapped by the error of a termination request received: the
// peer is closing the connection.
var ErrTermReq = errors.New("nvme/tcp: termination request received")
