package nvme

import "fmt"

// ConnectDataSize is the size of the Connect command's data.
const ConnectDataSize = 1024

// DynamicControllerID is the CNTLID an admin queue Connect carries to ask
// for a new controller (dynamic controller model).
const DynamicControllerID = 0xffff

// Byte offsets of the Connect fields, in the SQE and in the data: the IPO
// of Connect Invalid Parameters.
const (
	ConnectOffsetRECFMT = 40
	ConnectOffsetQID    = 42
	ConnectOffsetSQSIZE = 44
	ConnectOffsetCATTR  = 46
	ConnectOffsetKATO   = 48

	ConnectDataOffsetHostID  = 0
	ConnectDataOffsetCNTLID  = 16
	ConnectDataOffsetSubNQN  = 256
	ConnectDataOffsetHostNQN = 512
)

// CATTR bits.
const (
	// CATTRPriorityMask covers the priority class (bits 1:0).
	CATTRPriorityMask uint8 = 3
	// CATTRDisableSQFlowControl asks the controller not to track SQHD.
	CATTRDisableSQFlowControl uint8 = 1 << 2
)

// ConnectParams are the Connect SQE fields.
type ConnectParams struct {
	RECFMT uint16 // @40 record format, 0
	QID    uint16 // @42 queue: 0 admin, 1+ I/O
	SQSIZE uint16 // @44 submission queue size, 0's based (0 is invalid)
	CATTR  uint8  // @46 connect attributes
	KATO   uint32 // @48 keep alive timeout, ms (admin queue only; 0 = none)
}

// QueueEntries is the number of SQ entries, SQSIZE+1.
func (p ConnectParams) QueueEntries() int { return int(p.SQSIZE) + 1 }

// ConnectCommand builds a Connect for p; sgl describes the 1024-byte
// Connect data (in the capsule on I/O queues, keyed on the admin queue over
// RDMA).
func ConnectCommand(p ConnectParams, sgl SGLDescriptor) Command {
	c := newFabrics(FabricsConnect)
	c.DPTR = sgl
	c.CDW10 = uint32(p.RECFMT) | uint32(p.QID)<<16
	c.CDW11 = uint32(p.SQSIZE) | uint32(p.CATTR)<<16
	c.CDW12 = p.KATO
	return c
}

// Connect decodes the Connect fields of c.
func (c *Command) Connect() ConnectParams {
	return ConnectParams{
		RECFMT: uint16(c.CDW10),
		QID:    uint16(c.CDW10 >> 16),
		SQSIZE: uint16(c.CDW11),
		CATTR:  uint8(c.CDW11 >> 16),
		KATO:   c.CDW12,
	}
}

// ConnectData is the Connect command's 1024-byte data.
type ConnectData struct {
	HostID  UUID   // @0 host identifier
	CNTLID  uint16 // @16 DynamicControllerID on the admin queue
	SubNQN  string // @256 (256) NUL-terminated
	HostNQN string // @512 (256) NUL-terminated
	// Replaces (@768, vendor specific, admin queue only): the controller
	// this one replaces, for the target to tear down (NPControllerRef).
	Replaces NPControllerRef
}

// Marshal returns the 1024-byte data. The NQNs must fit their fields (255
// bytes and a NUL); their syntax is not checked (see ValidateNQN).
func (d *ConnectData) Marshal() ([]byte, error) {
	b := make([]byte, ConnectDataSize)
	copy(b[0:16], d.HostID[:])
	le.PutUint16(b[16:], d.CNTLID)
	if err := putCString(b[256:512], d.SubNQN, "connect SUBNQN"); err != nil {
		return nil, err
	}
	if err := putCString(b[512:768], d.HostNQN, "connect HOSTNQN"); err != nil {
		return nil, err
	}
	d.Replaces.marshal(b[768:])
	return b, nil
}

// Unmarshal decodes the 1024-byte data. The NQN fields are force-terminated
// at their last byte. Any length but 1024 is Data SGL Length Invalid (DNR),
// as nvmet answers.
func (d *ConnectData) Unmarshal(b []byte) error {
	if len(b) != ConnectDataSize {
		return Errorf(StatusDataSGLLengthInvalid.WithDNR(), "connect data is %d bytes, want %d", len(b), ConnectDataSize)
	}
	*d = ConnectData{
		HostID:  UUID(b[0:16]),
		CNTLID:  le.Uint16(b[16:]),
		SubNQN:  getCString(b[256:512]),
		HostNQN: getCString(b[512:768]),
	}
	d.Replaces.unmarshal(b[768:])
	return nil
}

// ConnectResponse is DW0 of a successful Connect.
type ConnectResponse struct {
	CNTLID uint16 // bits 15:0
	// AuthRequired (ATR, bit 17): authentication is required before any
	// other command.
	AuthRequired bool
	// SecureChannelRequired (ASCR, bit 18).
	SecureChannelRequired bool
}

// DW0 encodes the response.
func (r ConnectResponse) DW0() uint32 {
	v := uint32(r.CNTLID)
	if r.AuthRequired {
		v |= 1 << 17
	}
	if r.SecureChannelRequired {
		v |= 1 << 18
	}
	return v
}

// DecodeConnectResponse decodes DW0 of a successful Connect.
func DecodeConnectResponse(dw0 uint32) ConnectResponse {
	return ConnectResponse{CNTLID: uint16(dw0), AuthRequired: dw0&(1<<17) != 0, SecureChannelRequired: dw0&(1<<18) != 0}
}

// InvalidParameter locates the field a Connect Invalid Parameters status
// blames (DW0: IPO bits 15:0, IATTR bits 23:16).
type InvalidParameter struct {
	InData bool   // IATTR 1: Offset is in the Connect data; 0: in the SQE
	Offset uint16 // IPO: byte offset of the field
}

// DW0 encodes the location.
func (p InvalidParameter) DW0() uint32 {
	v := uint32(p.Offset)
	if p.InData {
		v |= 1 << 16
	}
	return v
}

// DecodeInvalidParameter decodes DW0 of a Connect Invalid Parameters
// completion.
func DecodeInvalidParameter(dw0 uint32) InvalidParameter {
	return InvalidParameter{Offset: uint16(dw0), InData: uint8(dw0>>16) == 1}
}

// ConnectInvalidParameter returns Connect Invalid Parameters (SCT 1 SC 0x82,
// DNR) blaming the field at offset (in the data if inData, else in the SQE;
// use the ConnectOffset* and ConnectDataOffset* constants).
func ConnectInvalidParameter(inData bool, offset uint16, format string, args ...any) *StatusError {
	e := Errorf(StatusConnectInvalidParameters.WithDNR(), format, args...)
	e.Result = InvalidParameter{InData: inData, Offset: offset}.DW0()
	return e
}

// String names a Fabrics command type.
func (t FabricsType) String() string {
	if n, ok := fabricsNames[t]; ok {
		return n
	}
	return fmt.Sprintf("fabrics type 0x%02x", uint8(t))
}
