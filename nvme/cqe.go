package nvme

import (
	"errors"
	"fmt"
)

// CQESize is the size of a completion queue entry.
const CQESize = 16

// Completion is a 16-byte completion queue entry: DW0 @0, DW1 @4, SQHD @8,
// SQID @10, CID @12, status @14 (bit 0 the phase tag, which fabrics ignore).
type Completion struct {
	DW0    uint32 // command specific result
	DW1    uint32
	SQHD   uint16 // submission queue head pointer
	SQID   uint16 // submission queue identifier
	CID    uint16 // identifier of the completed command
	Status Status
	Phase  bool
}

// MarshalTo writes the entry into b, which must hold CQESize bytes.
func (c *Completion) MarshalTo(b []byte) {
	_ = b[CQESize-1]
	le.PutUint32(b[0:], c.DW0)
	le.PutUint32(b[4:], c.DW1)
	le.PutUint16(b[8:], c.SQHD)
	le.PutUint16(b[10:], c.SQID)
	le.PutUint16(b[12:], c.CID)
	st := uint16(c.Status) &^ 1
	if c.Phase {
		st |= 1
	}
	le.PutUint16(b[14:], st)
}

// Marshal returns the 16-byte entry.
func (c *Completion) Marshal() []byte {
	b := make([]byte, CQESize)
	c.MarshalTo(b)
	return b
}

// Unmarshal decodes a 16-byte entry.
func (c *Completion) Unmarshal(b []byte) error {
	if len(b) != CQESize {
		return fmt.Errorf("nvme: completion queue entry is %d bytes, want %d", len(b), CQESize)
	}
	c.DW0 = le.Uint32(b[0:])
	c.DW1 = le.Uint32(b[4:])
	c.SQHD = le.Uint16(b[8:])
	c.SQID = le.Uint16(b[10:])
	c.CID = le.Uint16(b[12:])
	st := le.Uint16(b[14:])
	c.Status = Status(st &^ 1)
	c.Phase = st&1 != 0
	return nil
}

// Result64 is DW1:DW0, the value of an 8-byte Property Get.
func (c *Completion) Result64() uint64 { return uint64(c.DW1)<<32 | uint64(c.DW0) }

// Err is nil for a successful completion, else a *StatusError carrying the
// status and DW0.
func (c *Completion) Err() error {
	if c.Status.OK() {
		return nil
	}
	return &StatusError{Status: c.Status, Result: c.DW0, Detail: fmt.Sprintf("command %d on queue %d", c.CID, c.SQID)}
}

// SetError sets Status from err (see StatusOf) and, for a *StatusError, DW0
// from its Result.
func (c *Completion) SetError(err error) {
	c.Status = StatusOf(err)
	var se *StatusError
	if errors.As(err, &se) {
		c.DW0 = se.Result
	}
}
