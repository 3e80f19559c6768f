package tcp

import "fmt"

// H2CData carries write data the controller asked for with an R2T; C2HData
// carries data for a read. Both have a 24-byte header and the data at PDO.

// Offsets in H2CData and C2HData.
const (
	offDataCCCID = 8  // u16: the command's CID
	offDataTTAG  = 10 // u16: H2CData only (the R2T's tag); reserved in C2HData
	offDataDATAO = 12 // u32: offset of the data in the command's transfer
	offDataDATAL = 16 // u32: bytes of data in this PDU
)

// DataHeader is the header of an H2CData or C2HData PDU.
type DataHeader struct {
	CCCID uint16
	TTAG  uint16 // H2CData: the tag of the R2T answered; C2HData: 0
	DATAO uint32
	DATAL uint32
	// Last is LAST_PDU: the last PDU of the R2T (H2CData) or of the read
	// (C2HData).
	Last bool
	// Success (C2HData only, with Last): the command succeeded and no
	// CapsuleResp follows. Only when the host disabled SQ flow control.
	Success bool
}

// Unmarshal decodes an H2CData or C2HData header.
func (d *DataHeader) Unmarshal(b []byte) error {
	if len(b) < DataHeaderSize || (PDUType(b[0]) != TypeH2CData && PDUType(b[0]) != TypeC2HData) {
		return fmt.Errorf("nvme/tcp: not a data PDU header (%d bytes)", len(b))
	}
	f := Flags(b[1])
	d.CCCID, d.TTAG = le.Uint16(b[offDataCCCID:]), le.Uint16(b[offDataTTAG:])
	d.DATAO, d.DATAL = le.Uint32(b[offDataDATAO:]), le.Uint32(b[offDataDATAL:])
	d.Last, d.Success = f&FlagLast != 0, f&FlagSuccess != 0
	return nil
}

func (d *DataHeader) flags() Flags {
	var f Flags
	if d.Last {
		f |= FlagLast
	}
	if d.Success {
		f |= FlagSuccess
	}
	return f
}

func (d *DataHeader) marshalPSH(b []byte) {
	le.PutUint16(b[offDataCCCID:], d.CCCID)
	le.PutUint16(b[offDataTTAG:], d.TTAG)
	le.PutUint32(b[offDataDATAO:], d.DATAO)
	le.PutUint32(b[offDataDATAL:], d.DATAL)
	clear(b[20:DataHeaderSize])
}
