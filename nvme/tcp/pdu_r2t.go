package tcp

import "fmt"

// R2T (Ready to Transfer) asks the host for a range of a write's data, which
// the host sends in H2CData PDUs of at most MAXH2CDATA bytes each, echoing
// the tag. It has a 24-byte header and no data.

// Offsets in R2T.
const (
	offR2TCCCID = 8  // u16
	offR2TTTAG  = 10 // u16
	offR2TR2TO  = 12 // u32
	offR2TR2TL  = 16 // u32
)

// R2T is the header of an R2T PDU.
type R2T struct {
	CCCID uint16 // the command's CID
	TTAG  uint16 // the controller's tag, echoed in the H2CData PDUs
	R2TO  uint32 // offset of the range in the command's data
	R2TL  uint32 // length of the range
}

// Unmarshal decodes an R2T header.
func (r *R2T) Unmarshal(b []byte) error {
	if len(b) < R2THeaderSize || PDUType(b[0]) != TypeR2T {
		return fmt.Errorf("nvme/tcp: not an R2T header (%d bytes)", len(b))
	}
	r.CCCID, r.TTAG = le.Uint16(b[offR2TCCCID:]), le.Uint16(b[offR2TTTAG:])
	r.R2TO, r.R2TL = le.Uint32(b[offR2TR2TO:]), le.Uint32(b[offR2TR2TL:])
	return nil
}

func (r *R2T) marshalPSH(b []byte) {
	le.PutUint16(b[offR2TCCCID:], r.CCCID)
	le.PutUint16(b[offR2TTTAG:], r.TTAG)
	le.PutUint32(b[offR2TR2TO:], r.R2TO)
	le.PutUint32(b[offR2TR2TL:], r.R2TL)
	clear(b[20:R2THeaderSize])
}
