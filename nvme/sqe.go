package nvme

import "fmt"

// SQESize is the size of a submission queue entry (a command without data).
const SQESize = 64

// Opcode is a command opcode. Admin and I/O opcodes share the number space
// (0x02 is Get Log Page on the admin queue and Read on an I/O queue); which
// set applies depends on the queue the command arrives on.
type Opcode uint8

// Admin command set opcodes.
const (
	AdminDeleteIOSQ            Opcode = 0x00
	AdminCreateIOSQ            Opcode = 0x01
	AdminGetLogPage            Opcode = 0x02
	AdminDeleteIOCQ            Opcode = 0x04
	AdminCreateIOCQ            Opcode = 0x05
	AdminIdentify              Opcode = 0x06
	AdminAbort                 Opcode = 0x08
	AdminSetFeatures           Opcode = 0x09
	AdminGetFeatures           Opcode = 0x0a
	AdminAsyncEventRequest     Opcode = 0x0c
	AdminNamespaceManagement   Opcode = 0x0d
	AdminFirmwareCommit        Opcode = 0x10
	AdminFirmwareImageDownload Opcode = 0x11
	AdminDeviceSelfTest        Opcode = 0x14
	AdminNamespaceAttachment   Opcode = 0x15
	AdminKeepAlive             Opcode = 0x18
	AdminDirectiveSend         Opcode = 0x19
	AdminDirectiveReceive      Opcode = 0x1a
	AdminDoorbellBufferConfig  Opcode = 0x7c
	AdminFormatNVM             Opcode = 0x80
	AdminSecuritySend          Opcode = 0x81
	AdminSecurityReceive       Opcode = 0x82
	AdminSanitize              Opcode = 0x84
	// AdminNPGetRegionDescriptor is the NP extension's admin command
	// (vendor specific range 0xC0-0xFF; bits 1:0 = 10b: controller to host).
	AdminNPGetRegionDescriptor Opcode = 0xc2
)

// NVM command set (I/O queue) opcodes.
const (
	IOFlush               Opcode = 0x00
	IOWrite               Opcode = 0x01
	IORead                Opcode = 0x02
	IOWriteUncorrectable  Opcode = 0x04
	IOCompare             Opcode = 0x05
	IOWriteZeroes         Opcode = 0x08
	IODatasetManagement   Opcode = 0x09
	IOVerify              Opcode = 0x0c
	IOReservationRegister Opcode = 0x0d
	IOReservationReport   Opcode = 0x0e
	IOReservationAcquire  Opcode = 0x11
	IOReservationRelease  Opcode = 0x15
	// IONPAdvise is the NP extension's I/O command (vendor specific range
	// 0x80-0xFF; bits 1:0 = 00b: no data).
	IONPAdvise Opcode = 0x80
)

// OpFabrics is the Fabrics command opcode; the command type is FCTYPE
// (Command.FabricsType). It is valid on admin and I/O queues.
const OpFabrics Opcode = 0x7f

// FabricsType is the FCTYPE of a Fabrics command (SQE byte 4).
type FabricsType uint8

// Fabrics command types.
const (
	FabricsPropertySet FabricsType = 0x00
	FabricsConnect     FabricsType = 0x01
	FabricsPropertyGet FabricsType = 0x04
	FabricsAuthSend    FabricsType = 0x05
	FabricsAuthReceive FabricsType = 0x06
	FabricsDisconnect  FabricsType = 0x08
)

// DataDirection is the data transfer direction encoded in bits 1:0 of an
// opcode (and of a Fabrics command type).
type DataDirection uint8

// Data transfer directions.
const (
	NoData           DataDirection = 0
	HostToController DataDirection = 1
	ControllerToHost DataDirection = 2
	Bidirectional    DataDirection = 3
)

func (d DataDirection) String() string {
	switch d {
	case NoData:
		return "no data"
	case HostToController:
		return "host to controller"
	case ControllerToHost:
		return "controller to host"
	default:
		return "bidirectional"
	}
}

// Direction is the data transfer direction bits of the opcode.
func (o Opcode) Direction() DataDirection { return DataDirection(o & 3) }

// Command flags (SQE byte 1).
const (
	// FlagsFuseMask covers FUSE (bits 1:0): fused operations, not supported
	// over fabrics here.
	FlagsFuseMask uint8 = 0x03
	// FlagsPSDTMask covers PSDT (bits 7:6).
	FlagsPSDTMask uint8 = 0xc0
	// FlagsSGL is PSDT 01b: SGLs for data, MPTR an address. Fabrics hosts
	// (Linux) always set it; every builder in this package does.
	FlagsSGL uint8 = 0x40
)

// Command is a 64-byte submission queue entry. Every byte of the wire form
// has a field, so Unmarshal followed by Marshal reproduces the input.
//
// Fabrics commands reuse the layout: FCTYPE is the low byte of NSID and their
// fields live in CDW10-CDW13 (see the Fabrics accessors).
type Command struct {
	Opcode Opcode        // byte 0
	Flags  uint8         // byte 1: FUSE bits 1:0, PSDT bits 7:6
	CID    uint16        // bytes 2-3: command identifier
	NSID   uint32        // bytes 4-7 (FCTYPE in byte 4 for Fabrics)
	CDW2   uint32        // bytes 8-11
	CDW3   uint32        // bytes 12-15
	MPTR   uint64        // bytes 16-23: metadata pointer
	DPTR   SGLDescriptor // bytes 24-39: SGL1
	CDW10  uint32        // bytes 40-43
	CDW11  uint32        // bytes 44-47
	CDW12  uint32        // bytes 48-51
	CDW13  uint32        // bytes 52-55
	CDW14  uint32        // bytes 56-59
	CDW15  uint32        // bytes 60-63
}

// MarshalTo writes the 64-byte entry into b, which must hold SQESize bytes.
func (c *Command) MarshalTo(b []byte) {
	_ = b[SQESize-1]
	b[0] = byte(c.Opcode)
	b[1] = c.Flags
	le.PutUint16(b[2:], c.CID)
	le.PutUint32(b[4:], c.NSID)
	le.PutUint32(b[8:], c.CDW2)
	le.PutUint32(b[12:], c.CDW3)
	le.PutUint64(b[16:], c.MPTR)
	copy(b[24:40], c.DPTR[:])
	le.PutUint32(b[40:], c.CDW10)
	le.PutUint32(b[44:], c.CDW11)
	le.PutUint32(b[48:], c.CDW12)
	le.PutUint32(b[52:], c.CDW13)
	le.PutUint32(b[56:], c.CDW14)
	le.PutUint32(b[60:], c.CDW15)
}

// Marshal returns the 64-byte entry.
func (c *Command) Marshal() []byte {
	b := make([]byte, SQESize)
	c.MarshalTo(b)
	return b
}

// Unmarshal decodes a 64-byte entry. It checks only the length; ParseCapsule
// also validates flags and the SGL.
func (c *Command) Unmarshal(b []byte) error {
	if len(b) != SQESize {
		return fmt.Errorf("nvme: submission queue entry is %d bytes, want %d", len(b), SQESize)
	}
	c.Opcode = Opcode(b[0])
	c.Flags = b[1]
	c.CID = le.Uint16(b[2:])
	c.NSID = le.Uint32(b[4:])
	c.CDW2 = le.Uint32(b[8:])
	c.CDW3 = le.Uint32(b[12:])
	c.MPTR = le.Uint64(b[16:])
	copy(c.DPTR[:], b[24:40])
	c.CDW10 = le.Uint32(b[40:])
	c.CDW11 = le.Uint32(b[44:])
	c.CDW12 = le.Uint32(b[48:])
	c.CDW13 = le.Uint32(b[52:])
	c.CDW14 = le.Uint32(b[56:])
	c.CDW15 = le.Uint32(b[60:])
	return nil
}

// IsFabrics reports whether c is a Fabrics command.
func (c *Command) IsFabrics() bool { return c.Opcode == OpFabrics }

// FabricsType is the FCTYPE of a Fabrics command (meaningless otherwise).
func (c *Command) FabricsType() FabricsType { return FabricsType(c.NSID) }

// Direction is the command's data transfer direction: from the FCTYPE for a
// Fabrics command, else from the opcode.
func (c *Command) Direction() DataDirection {
	if c.IsFabrics() {
		return DataDirection(c.FabricsType() & 3)
	}
	return c.Opcode.Direction()
}

// newFabrics starts a Fabrics command of type t.
func newFabrics(t FabricsType) Command {
	return Command{Opcode: OpFabrics, Flags: FlagsSGL, NSID: uint32(t)}
}

var adminNames = map[Opcode]string{
	AdminDeleteIOSQ:            "delete-io-sq",
	AdminCreateIOSQ:            "create-io-sq",
	AdminGetLogPage:            "get-log-page",
	AdminDeleteIOCQ:            "delete-io-cq",
	AdminCreateIOCQ:            "create-io-cq",
	AdminIdentify:              "identify",
	AdminAbort:                 "abort",
	AdminSetFeatures:           "set-features",
	AdminGetFeatures:           "get-features",
	AdminAsyncEventRequest:     "async-event-request",
	AdminNamespaceManagement:   "namespace-management",
	AdminFirmwareCommit:        "firmware-commit",
	AdminFirmwareImageDownload: "firmware-image-download",
	AdminDeviceSelfTest:        "device-self-test",
	AdminNamespaceAttachment:   "namespace-attachment",
	AdminKeepAlive:             "keep-alive",
	AdminDirectiveSend:         "directive-send",
	AdminDirectiveReceive:      "directive-receive",
	AdminDoorbellBufferConfig:  "doorbell-buffer-config",
	AdminFormatNVM:             "format-nvm",
	AdminSecuritySend:          "security-send",
	AdminSecurityReceive:       "security-receive",
	AdminSanitize:              "sanitize",
	AdminNPGetRegionDescriptor: "np-get-region-descriptor",
}

var ioNames = map[Opcode]string{
	IOFlush:               "flush",
	IOWrite:               "write",
	IORead:                "read",
	IOWriteUncorrectable:  "write-uncorrectable",
	IOCompare:             "compare",
	IOWriteZeroes:         "write-zeroes",
	IODatasetManagement:   "dataset-management",
	IOVerify:              "verify",
	IOReservationRegister: "reservation-register",
	IOReservationReport:   "reservation-report",
	IOReservationAcquire:  "reservation-acquire",
	IOReservationRelease:  "reservation-release",
	IONPAdvise:            "np-advise",
}

var fabricsNames = map[FabricsType]string{
	FabricsPropertySet: "property-set",
	FabricsConnect:     "connect",
	FabricsPropertyGet: "property-get",
	FabricsAuthSend:    "auth-send",
	FabricsAuthReceive: "auth-receive",
	FabricsDisconnect:  "disconnect",
}

// Name is a short lower-case name for the command ("read", "identify",
// "fabrics-connect"), suitable as a metric label; admin says which command
// set applies. Unknown opcodes give "admin-0xNN", "io-0xNN" or
// "fabrics-0xNN".
func (c *Command) Name(admin bool) string {
	if c.IsFabrics() {
		if n, ok := fabricsNames[c.FabricsType()]; ok {
			return "fabrics-" + n
		}
		return fmt.Sprintf("fabrics-0x%02x", uint8(c.FabricsType()))
	}
	names, prefix := ioNames, "io"
	if admin {
		names, prefix = adminNames, "admin"
	}
	if n, ok := names[c.Opcode]; ok {
		return n
	}
	return fmt.Sprintf("%s-0x%02x", prefix, uint8(c.Opcode))
}

// InvalidOpcode is the error for a command the controller does not
// implement on the queue it arrived on: Invalid Command Opcode with DNR (for
// a Fabrics command, an unknown or misplaced FCTYPE).
func InvalidOpcode(c *Command, admin bool) *StatusError {
	if c.IsFabrics() {
		return Errorf(StatusInvalidOpcode.WithDNR(), "fabrics command type 0x%02x not supported here", uint8(c.FabricsType()))
	}
	set := "I/O"
	if admin {
		set = "admin"
	}
	return Errorf(StatusInvalidOpcode.WithDNR(), "%s opcode 0x%02x not supported", set, uint8(c.Opcode))
}
