package nvme

import "fmt"

// Property offsets (the controller registers reachable over fabrics).
const (
	PropCAP  uint32 = 0x00 // 8 bytes
	PropVS   uint32 = 0x08
	PropCC   uint32 = 0x14
	PropCSTS uint32 = 0x1c
	PropNSSR uint32 = 0x20
)

// PropertySize is the size in bytes of the property at offset (8 for CAP,
// 4 for the others), or 0 for an offset this package does not know.
func PropertySize(offset uint32) int {
	switch offset {
	case PropCAP:
		return 8
	case PropVS, PropCC, PropCSTS, PropNSSR:
		return 4
	}
	return 0
}

// PropertyParams are the Property Get/Set fields.
type PropertyParams struct {
	Size   int    // ATTRIB @40 bits 2:0: 0 = 4 bytes, 1 = 8 bytes
	Offset uint32 // OFST @44
	Value  uint64 // VALUE @48 (Property Set)
}

func propertyAttrib(size int) (uint32, error) {
	switch size {
	case 4:
		return 0, nil
	case 8:
		return 1, nil
	}
	return 0, fmt.Errorf("nvme: property size %d is neither 4 nor 8", size)
}

// PropertyGetCommand reads size (4 or 8) bytes of the property at offset;
// the value comes back in DW0 (and DW1 for 8 bytes).
func PropertyGetCommand(offset uint32, size int) (Command, error) {
	attrib, err := propertyAttrib(size)
	if err != nil {
		return Command{}, err
	}
	c := newFabrics(FabricsPropertyGet)
	c.DPTR = NullSGL()
	c.CDW10 = attrib
	c.CDW11 = offset
	return c, nil
}

// PropertySetCommand writes value to the size-byte property at offset.
func PropertySetCommand(offset uint32, size int, value uint64) (Command, error) {
	attrib, err := propertyAttrib(size)
	if err != nil {
		return Command{}, err
	}
	c := newFabrics(FabricsPropertySet)
	c.DPTR = NullSGL()
	c.CDW10 = attrib
	c.CDW11 = offset
	c.CDW12 = uint32(value)
	c.CDW13 = uint32(value >> 32)
	return c, nil
}

// Property decodes the Property Get/Set fields of c. An ATTRIB size other
// than 4 or 8 bytes is Invalid Field in Command (DNR).
func (c *Command) Property() (PropertyParams, error) {
	p := PropertyParams{Offset: c.CDW11, Value: uint64(c.CDW12) | uint64(c.CDW13)<<32}
	switch c.CDW10 & 7 {
	case 0:
		p.Size = 4
		if c.FabricsType() == FabricsPropertySet {
			p.Value &= 0xffffffff
		}
	case 1:
		p.Size = 8
	default:
		return p, Errorf(StatusInvalidField.WithDNR(), "property ATTRIB size code %d", c.CDW10&7)
	}
	return p, nil
}

// CAP is the Controller Capabilities property.
type CAP struct {
	MQES   uint16 // bits 15:0 max queue entries supported, 0's based
	CQR    bool   // bit 16 contiguous queues required (always on fabrics)
	AMS    uint8  // bits 18:17 arbitration mechanisms supported
	TO     uint8  // bits 31:24 ready timeout, 500 ms units
	DSTRD  uint8  // bits 35:32 doorbell stride
	NSSRS  bool   // bit 36 NVM subsystem reset supported
	CSS    uint8  // bits 44:37 command sets supported (CSSNVM...)
	BPS    bool   // bit 45 boot partition support
	MPSMIN uint8  // bits 51:48 minimum memory page size 2^(12+n)
	MPSMAX uint8  // bits 55:52 maximum memory page size 2^(12+n)
	CRMS   uint8  // bits 60:59 controller ready modes supported
}

// CAP.CSS bits (bit 0 of the field is CAP bit 37).
const (
	CSSNVM           uint8 = 1 << 0 // NVM command set
	CSSIOCommandSets uint8 = 1 << 6 // one or more I/O command sets (CSI)
	CSSAdminOnly     uint8 = 1 << 7 // no I/O command set
)

// Encode returns the 64-bit property value.
func (c CAP) Encode() uint64 {
	v := uint64(c.MQES) |
		uint64(c.AMS&3)<<17 |
		uint64(c.TO)<<24 |
		uint64(c.DSTRD&0xf)<<32 |
		uint64(c.CSS)<<37 |
		uint64(c.MPSMIN&0xf)<<48 |
		uint64(c.MPSMAX&0xf)<<52 |
		uint64(c.CRMS&3)<<59
	if c.CQR {
		v |= 1 << 16
	}
	if c.NSSRS {
		v |= 1 << 36
	}
	if c.BPS {
		v |= 1 << 45
	}
	return v
}

// DecodeCAP decodes the 64-bit property value.
func DecodeCAP(v uint64) CAP {
	return CAP{
		MQES:   uint16(v),
		CQR:    v&(1<<16) != 0,
		AMS:    uint8(v>>17) & 3,
		TO:     uint8(v >> 24),
		DSTRD:  uint8(v>>32) & 0xf,
		NSSRS:  v&(1<<36) != 0,
		CSS:    uint8(v >> 37),
		BPS:    v&(1<<45) != 0,
		MPSMIN: uint8(v>>48) & 0xf,
		MPSMAX: uint8(v>>52) & 0xf,
		CRMS:   uint8(v>>59) & 3,
	}
}

// MaxQueueEntries is MQES+1.
func (c CAP) MaxQueueEntries() int { return int(c.MQES) + 1 }

// MinPageSize is 2^(12+MPSMIN) bytes.
func (c CAP) MinPageSize() int { return 1 << (12 + c.MPSMIN) }

// Version is the VS property (and Identify Controller VER): major bits
// 31:16, minor 15:8, tertiary 7:0.
type Version uint32

// Versions.
const (
	Version1_3 Version = 0x00010300
	Version1_4 Version = 0x00010400
	Version2_0 Version = 0x00020000
)

// NewVersion packs a version.
func NewVersion(major uint16, minor, tertiary uint8) Version {
	return Version(uint32(major)<<16 | uint32(minor)<<8 | uint32(tertiary))
}

// Major is the major version.
func (v Version) Major() uint16 { return uint16(v >> 16) }

// Minor is the minor version.
func (v Version) Minor() uint8 { return uint8(v >> 8) }

// Tertiary is the tertiary version.
func (v Version) Tertiary() uint8 { return uint8(v) }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major(), v.Minor(), v.Tertiary()) }

// Shutdown notifications (CC.SHN).
const (
	ShutdownNone   uint8 = 0
	ShutdownNormal uint8 = 1
	ShutdownAbrupt uint8 = 2
)

// CC is the Controller Configuration property.
type CC struct {
	EN     bool  // bit 0 enable
	CSS    uint8 // bits 6:4 I/O command set selected (0 NVM)
	MPS    uint8 // bits 10:7 memory page size 2^(12+n)
	AMS    uint8 // bits 13:11 arbitration mechanism
	SHN    uint8 // bits 15:14 shutdown notification
	IOSQES uint8 // bits 19:16 I/O SQ entry size 2^n (6)
	IOCQES uint8 // bits 23:20 I/O CQ entry size 2^n (4)
	CRIME  bool  // bit 24 controller ready independent of media
}

// Encode returns the 32-bit property value.
func (c CC) Encode() uint32 {
	v := uint32(c.CSS&7)<<4 | uint32(c.MPS&0xf)<<7 | uint32(c.AMS&7)<<11 | uint32(c.SHN&3)<<14 |
		uint32(c.IOSQES&0xf)<<16 | uint32(c.IOCQES&0xf)<<20
	if c.EN {
		v |= 1
	}
	if c.CRIME {
		v |= 1 << 24
	}
	return v
}

// DecodeCC decodes the 32-bit property value.
func DecodeCC(v uint32) CC {
	return CC{
		EN:     v&1 != 0,
		CSS:    uint8(v>>4) & 7,
		MPS:    uint8(v>>7) & 0xf,
		AMS:    uint8(v>>11) & 7,
		SHN:    uint8(v>>14) & 3,
		IOSQES: uint8(v>>16) & 0xf,
		IOCQES: uint8(v>>20) & 0xf,
		CRIME:  v&(1<<24) != 0,
	}
}

// CheckEnable reports why a controller cannot be enabled with c (entry
// sizes other than 64/16 bytes, a page size other than 4 KiB, an
// arbitration mechanism other than round robin or a command set other than
// NVM), or nil. The controller then sets CSTS.CFS, as nvmet does.
func (c CC) CheckEnable() error {
	switch {
	case c.IOSQES != 6:
		return fmt.Errorf("nvme: CC.IOSQES %d, want 6 (64-byte entries)", c.IOSQES)
	case c.IOCQES != 4:
		return fmt.Errorf("nvme: CC.IOCQES %d, want 4 (16-byte entries)", c.IOCQES)
	case c.MPS != 0:
		return fmt.Errorf("nvme: CC.MPS %d, want 0 (4 KiB pages)", c.MPS)
	case c.AMS != 0:
		return fmt.Errorf("nvme: CC.AMS %d, want 0 (round robin)", c.AMS)
	case c.CSS != 0:
		return fmt.Errorf("nvme: CC.CSS %d, want 0 (NVM command set)", c.CSS)
	}
	return nil
}

// Shutdown statuses (CSTS.SHST).
const (
	ShutdownStatusNormal    uint8 = 0
	ShutdownStatusOccurring uint8 = 1
	ShutdownStatusComplete  uint8 = 2
)

// CSTS is the Controller Status property.
type CSTS struct {
	RDY   bool  // bit 0 ready
	CFS   bool  // bit 1 controller fatal status
	SHST  uint8 // bits 3:2 shutdown status
	NSSRO bool  // bit 4 NVM subsystem reset occurred
	PP    bool  // bit 5 processing paused
}

// Encode returns the 32-bit property value.
func (s CSTS) Encode() uint32 {
	v := uint32(s.SHST&3) << 2
	if s.RDY {
		v |= 1
	}
	if s.CFS {
		v |= 1 << 1
	}
	if s.NSSRO {
		v |= 1 << 4
	}
	if s.PP {
		v |= 1 << 5
	}
	return v
}

// DecodeCSTS decodes the 32-bit property value.
func DecodeCSTS(v uint32) CSTS {
	return CSTS{RDY: v&1 != 0, CFS: v&2 != 0, SHST: uint8(v>>2) & 3, NSSRO: v&(1<<4) != 0, PP: v&(1<<5) != 0}
}
