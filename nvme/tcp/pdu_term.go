package tcp

import "fmt"

// H2CTermReq and C2HTermReq end a connection after a fatal transport error:
// a 24-byte header with the fatal error status and the offset of the bad
// field, then up to 128 bytes of the offending PDU's header. They are never
// digested, and never answered: the sender closes the connection.

// Offsets in a termination request (the specification's; Linux's struct
// is not packed and would put FEI at 12).
const (
	offTermFES = 8  // u16
	offTermFEI = 10 // u32
)

// MaxTermReqSize is the largest PLEN of a termination request.
const MaxTermReqSize = TermReqHeaderSize + MaxTermReqData

// TermReq is a termination request.
type TermReq struct {
	Type PDUType // TypeH2CTermReq or TypeC2HTermReq
	FES  FES
	FEI  uint32
	// Data is the offending PDU's header, at most MaxTermReqData bytes.
	Data []byte
}

// Unmarshal decodes a termination request from its header and data.
func (t *TermReq) Unmarshal(hdr, data []byte) error {
	if len(hdr) < TermReqHeaderSize || (PDUType(hdr[0]) != TypeH2CTermReq && PDUType(hdr[0]) != TypeC2HTermReq) {
		return fmt.Errorf("nvme/tcp: not a termination request header (%d bytes)", len(hdr))
	}
	if len(data) > MaxTermReqData {
		return fmt.Errorf("nvme/tcp: termination request with %d bytes of data, at most %d", len(data), MaxTermReqData)
	}
	t.Type, t.FES, t.FEI = PDUType(hdr[0]), FES(le.Uint16(hdr[offTermFES:])), le.Uint32(hdr[offTermFEI:])
	t.Data = append(t.Data[:0], data...)
	return nil
}

func (t *TermReq) marshalPSH(b []byte) {
	le.PutUint16(b[offTermFES:], uint16(t.FES))
	le.PutUint32(b[offTermFEI:], t.FEI)
	clear(b[14:TermReqHeaderSize])
}

func (t *TermReq) String() string {
	return fmt.Sprintf("%s: %s (FEI %d)", t.Type, t.FES, t.FEI)
}
