package nvme

import (
	"fmt"
	"slices"
)

// IdentifySize is the size of every Identify data structure.
const IdentifySize = 4096

// CNS selects the Identify data structure (CDW10 bits 7:0).
type CNS uint8

// Identify CNS values implemented.
const (
	CNSNamespace            CNS = 0x00 // Identify Namespace (NSID)
	CNSController           CNS = 0x01 // Identify Controller
	CNSActiveNamespaces     CNS = 0x02 // active NSIDs greater than NSID
	CNSNamespaceDescriptors CNS = 0x03 // Namespace Identification Descriptor list (NSID)
)

// IdentifyParams are the Identify command's fields.
type IdentifyParams struct {
	CNS   CNS    // CDW10 bits 7:0
	CNTID uint16 // CDW10 bits 31:16
	// CNSSpecificID is CDW11 bits 15:0 (e.g. NVM set identifier).
	CNSSpecificID uint16
	CSI           uint8 // CDW11 bits 31:24: command set identifier
}

// IdentifyCommand builds an Identify command for cns. nsid is the namespace
// for CNSNamespace/CNSNamespaceDescriptors and the starting point ("greater
// than") for CNSActiveNamespaces. sgl describes the 4096-byte buffer.
func IdentifyCommand(cns CNS, nsid uint32, sgl SGLDescriptor) Command {
	return Command{Opcode: AdminIdentify, Flags: FlagsSGL, NSID: nsid, DPTR: sgl, CDW10: uint32(cns)}
}

// Identify decodes the Identify fields of c.
func (c *Command) Identify() IdentifyParams {
	return IdentifyParams{
		CNS:           CNS(c.CDW10),
		CNTID:         uint16(c.CDW10 >> 16),
		CNSSpecificID: uint16(c.CDW11),
		CSI:           uint8(c.CDW11 >> 24),
	}
}

// Controller types (CNTRLTYPE).
const (
	ControllerTypeIO             uint8 = 1
	ControllerTypeDiscovery      uint8 = 2
	ControllerTypeAdministrative uint8 = 3
)

// CMIC bits.
const (
	CMICMultiPort       uint8 = 1 << 0
	CMICMultiController uint8 = 1 << 1
	CMICSRIOV           uint8 = 1 << 2
	CMICANA             uint8 = 1 << 3
)

// LPA (log page attributes) bits.
const (
	LPASMARTPerNamespace uint8 = 1 << 0
	LPACommandEffects    uint8 = 1 << 1 // log 0x05 supported
	LPAExtendedData      uint8 = 1 << 2 // NUMDU, LPO honoured
	LPATelemetry         uint8 = 1 << 3
)

// ONCS (optional NVM command support) bits.
const (
	ONCSCompare            uint16 = 1 << 0
	ONCSWriteUncorrectable uint16 = 1 << 1
	ONCSDatasetManagement  uint16 = 1 << 2
	ONCSWriteZeroes        uint16 = 1 << 3
	ONCSSaveSelect         uint16 = 1 << 4
	ONCSReservations       uint16 = 1 << 5
	ONCSTimestamp          uint16 = 1 << 6
	ONCSVerify             uint16 = 1 << 7
)

// VWC bits.
const (
	VWCPresent uint8 = 1 << 0
	// VWCFlushBroadcastUnsupported (bits 2:1 = 10b) says Flush with NSID
	// 0xFFFFFFFF is not supported.
	VWCFlushBroadcastUnsupported uint8 = 2 << 1
	VWCFlushBroadcastSupported   uint8 = 3 << 1
)

// SGLS bits.
const (
	SGLSSupported          uint32 = 1 << 0 // SGLs, byte aligned
	SGLSDwordAligned       uint32 = 2 << 0 // SGLs, dword aligned (bits 1:0 = 10b)
	SGLSKeyedDataBlock     uint32 = 1 << 2 // keyed SGL data block (required for RDMA)
	SGLSBitBucket          uint32 = 1 << 16
	SGLSLongerThanData     uint32 = 1 << 18
	SGLSOffset             uint32 = 1 << 20 // address as offset: in-capsule data
	SGLSTransportDataBlock uint32 = 1 << 21
)

// Identify Controller constants a fabrics controller uses.
const (
	SQESFabrics uint8 = 0x66 // required and maximum SQ entry size 2^6
	CQESFabrics uint8 = 0x44 // CQ entry size 2^4
)

// PowerStateDescriptor is the part of a 32-byte power state descriptor a
// controller without power management fills in (PSD0 is mandatory).
type PowerStateDescriptor struct {
	MP    uint16 // @0 maximum power, in centiwatts (or 0.0001 W with MXPS)
	Flags uint8  // @3 bit0 MXPS, bit1 NOPS (non-operational)
	ENLAT uint32 // @4 entry latency, µs
	EXLAT uint32 // @8 exit latency, µs
	RRT   uint8  // @12 relative read throughput
	RRL   uint8  // @13 relative read latency
	RWT   uint8  // @14 relative write throughput
	RWL   uint8  // @15 relative write latency
}

func (p *PowerStateDescriptor) marshal(b []byte) {
	le.PutUint16(b[0:], p.MP)
	b[3] = p.Flags
	le.PutUint32(b[4:], p.ENLAT)
	le.PutUint32(b[8:], p.EXLAT)
	b[12], b[13], b[14], b[15] = p.RRT&0x1f, p.RRL&0x1f, p.RWT&0x1f, p.RWL&0x1f
}

func (p *PowerStateDescriptor) unmarshal(b []byte) {
	p.MP = le.Uint16(b[0:])
	p.Flags = b[3]
	p.ENLAT = le.Uint32(b[4:])
	p.EXLAT = le.Uint32(b[8:])
	p.RRT, p.RRL, p.RWT, p.RWL = b[12]&0x1f, b[13]&0x1f, b[14]&0x1f, b[15]&0x1f
}

// IdentifyController is the Identify Controller data structure (CNS 0x01).
// Offsets are in the comments; bytes without a field are reserved (zero).
type IdentifyController struct {
	VID       uint16               // @0 PCI vendor ID
	SSVID     uint16               // @2 PCI subsystem vendor ID
	SN        string               // @4 (20) serial number, ASCII space-padded
	MN        string               // @24 (40) model number, ASCII space-padded
	FR        string               // @64 (8) firmware revision, ASCII space-padded
	RAB       uint8                // @72 recommended arbitration burst
	IEEE      [3]byte              // @73 IEEE OUI
	CMIC      uint8                // @76 multi-path I/O and namespace sharing
	MDTS      uint8                // @77 max data transfer, 2^n units of CAP.MPSMIN; 0 = no limit
	CNTLID    uint16               // @78 controller ID
	VER       uint32               // @80 version (same as the VS property)
	RTD3R     uint32               // @84 RTD3 resume latency, µs
	RTD3E     uint32               // @88 RTD3 entry latency, µs
	OAES      uint32               // @92 optional asynchronous events supported
	CTRATT    uint32               // @96 controller attributes
	RRLS      uint16               // @100 read recovery levels supported
	CNTRLTYPE uint8                // @111 controller type (ControllerTypeIO...)
	FGUID     [16]byte             // @112 FRU GUID
	CRDT      [3]uint16            // @128 command retry delay times 1-3, 100 ms units
	OACS      uint16               // @256 optional admin command support
	ACL       uint8                // @258 abort command limit, 0's based
	AERL      uint8                // @259 async event request limit, 0's based
	FRMW      uint8                // @260 firmware updates
	LPA       uint8                // @261 log page attributes
	ELPE      uint8                // @262 error log page entries, 0's based
	NPSS      uint8                // @263 number of power states, 0's based
	AVSCC     uint8                // @264
	APSTA     uint8                // @265
	WCTEMP    uint16               // @266 warning composite temperature threshold, K
	CCTEMP    uint16               // @268 critical composite temperature threshold, K
	KAS       uint16               // @320 keep alive support, 100 ms units; 0 = none
	ANATT     uint8                // @342 ANA transition time
	ANACAP    uint8                // @343 ANA capabilities
	ANAGRPMAX uint32               // @344
	NANAGRPID uint32               // @348
	SQES      uint8                // @512 SQ entry sizes (SQESFabrics)
	CQES      uint8                // @513 CQ entry sizes (CQESFabrics)
	MAXCMD    uint16               // @514 max outstanding commands per queue
	NN        uint32               // @516 number of namespaces (highest NSID)
	ONCS      uint16               // @520 optional NVM command support
	FUSES     uint16               // @522 fused operations supported
	FNA       uint8                // @524 format NVM attributes
	VWC       uint8                // @525 volatile write cache
	AWUN      uint16               // @526 atomic write unit normal, 0's based
	AWUPF     uint16               // @528 atomic write unit power fail, 0's based
	NVSCC     uint8                // @530
	NWPC      uint8                // @531 namespace write protection capabilities
	ACWU      uint16               // @532 atomic compare & write unit
	SGLS      uint32               // @536 SGL support
	MNAN      uint32               // @540 maximum number of allowed namespaces
	SUBNQN    string               // @768 (256) subsystem NQN, NUL-terminated
	IOCCSZ    uint32               // @1792 I/O queue command capsule size, 16-byte units
	IORCSZ    uint32               // @1796 I/O queue response capsule size, 16-byte units
	ICDOFF    uint16               // @1800 in-capsule data offset, 16-byte units
	FCATT     uint8                // @1802 fabrics controller attributes (bit0 static model)
	MSDBD     uint8                // @1803 max SGL data block descriptors
	OFCS      uint16               // @1804 optional fabrics commands supported
	PSD0      PowerStateDescriptor // @2048 power state 0
	NP        NPInstance           // @3072 vendor specific: the NP extension's target instance (zero: not reported)
	NPToken   uint64               // @3096 vendor specific: this controller's token (NPControllerRef; 0: not reported)
}

// Marshal returns the 4096-byte structure. It fails if a string does not fit
// its field or an ASCII field holds non-printable bytes.
func (id *IdentifyController) Marshal() ([]byte, error) {
	b := make([]byte, IdentifySize)
	le.PutUint16(b[0:], id.VID)
	le.PutUint16(b[2:], id.SSVID)
	if err := putPadded(b[4:24], id.SN, "identify controller SN"); err != nil {
		return nil, err
	}
	if err := putPadded(b[24:64], id.MN, "identify controller MN"); err != nil {
		return nil, err
	}
	if err := putPadded(b[64:72], id.FR, "identify controller FR"); err != nil {
		return nil, err
	}
	b[72] = id.RAB
	copy(b[73:76], id.IEEE[:])
	b[76] = id.CMIC
	b[77] = id.MDTS
	le.PutUint16(b[78:], id.CNTLID)
	le.PutUint32(b[80:], id.VER)
	le.PutUint32(b[84:], id.RTD3R)
	le.PutUint32(b[88:], id.RTD3E)
	le.PutUint32(b[92:], id.OAES)
	le.PutUint32(b[96:], id.CTRATT)
	le.PutUint16(b[100:], id.RRLS)
	b[111] = id.CNTRLTYPE
	copy(b[112:128], id.FGUID[:])
	for i, t := range id.CRDT {
		le.PutUint16(b[128+2*i:], t)
	}
	le.PutUint16(b[256:], id.OACS)
	b[258] = id.ACL
	b[259] = id.AERL
	b[260] = id.FRMW
	b[261] = id.LPA
	b[262] = id.ELPE
	b[263] = id.NPSS
	b[264] = id.AVSCC
	b[265] = id.APSTA
	le.PutUint16(b[266:], id.WCTEMP)
	le.PutUint16(b[268:], id.CCTEMP)
	le.PutUint16(b[320:], id.KAS)
	b[342] = id.ANATT
	b[343] = id.ANACAP
	le.PutUint32(b[344:], id.ANAGRPMAX)
	le.PutUint32(b[348:], id.NANAGRPID)
	b[512] = id.SQES
	b[513] = id.CQES
	le.PutUint16(b[514:], id.MAXCMD)
	le.PutUint32(b[516:], id.NN)
	le.PutUint16(b[520:], id.ONCS)
	le.PutUint16(b[522:], id.FUSES)
	b[524] = id.FNA
	b[525] = id.VWC
	le.PutUint16(b[526:], id.AWUN)
	le.PutUint16(b[528:], id.AWUPF)
	b[530] = id.NVSCC
	b[531] = id.NWPC
	le.PutUint16(b[532:], id.ACWU)
	le.PutUint32(b[536:], id.SGLS)
	le.PutUint32(b[540:], id.MNAN)
	if err := putCString(b[768:1024], id.SUBNQN, "identify controller SUBNQN"); err != nil {
		return nil, err
	}
	le.PutUint32(b[1792:], id.IOCCSZ)
	le.PutUint32(b[1796:], id.IORCSZ)
	le.PutUint16(b[1800:], id.ICDOFF)
	b[1802] = id.FCATT
	b[1803] = id.MSDBD
	le.PutUint16(b[1804:], id.OFCS)
	id.PSD0.marshal(b[2048:2080])
	id.NP.marshal(b[3072:3092])
	le.PutUint64(b[3096:], id.NPToken)
	return b, nil
}

// Unmarshal decodes a 4096-byte Identify Controller structure. Strings are
// taken as they are (trailing spaces/NULs trimmed, SUBNQN up to its NUL);
// checking them is up to the caller.
func (id *IdentifyController) Unmarshal(b []byte) error {
	if len(b) != IdentifySize {
		return fmt.Errorf("nvme: identify controller data is %d bytes, want %d", len(b), IdentifySize)
	}
	*id = IdentifyController{
		VID:       le.Uint16(b[0:]),
		SSVID:     le.Uint16(b[2:]),
		SN:        getPadded(b[4:24]),
		MN:        getPadded(b[24:64]),
		FR:        getPadded(b[64:72]),
		RAB:       b[72],
		IEEE:      [3]byte(b[73:76]),
		CMIC:      b[76],
		MDTS:      b[77],
		CNTLID:    le.Uint16(b[78:]),
		VER:       le.Uint32(b[80:]),
		RTD3R:     le.Uint32(b[84:]),
		RTD3E:     le.Uint32(b[88:]),
		OAES:      le.Uint32(b[92:]),
		CTRATT:    le.Uint32(b[96:]),
		RRLS:      le.Uint16(b[100:]),
		CNTRLTYPE: b[111],
		FGUID:     [16]byte(b[112:128]),
		CRDT:      [3]uint16{le.Uint16(b[128:]), le.Uint16(b[130:]), le.Uint16(b[132:])},
		OACS:      le.Uint16(b[256:]),
		ACL:       b[258],
		AERL:      b[259],
		FRMW:      b[260],
		LPA:       b[261],
		ELPE:      b[262],
		NPSS:      b[263],
		AVSCC:     b[264],
		APSTA:     b[265],
		WCTEMP:    le.Uint16(b[266:]),
		CCTEMP:    le.Uint16(b[268:]),
		KAS:       le.Uint16(b[320:]),
		ANATT:     b[342],
		ANACAP:    b[343],
		ANAGRPMAX: le.Uint32(b[344:]),
		NANAGRPID: le.Uint32(b[348:]),
		SQES:      b[512],
		CQES:      b[513],
		MAXCMD:    le.Uint16(b[514:]),
		NN:        le.Uint32(b[516:]),
		ONCS:      le.Uint16(b[520:]),
		FUSES:     le.Uint16(b[522:]),
		FNA:       b[524],
		VWC:       b[525],
		AWUN:      le.Uint16(b[526:]),
		AWUPF:     le.Uint16(b[528:]),
		NVSCC:     b[530],
		NWPC:      b[531],
		ACWU:      le.Uint16(b[532:]),
		SGLS:      le.Uint32(b[536:]),
		MNAN:      le.Uint32(b[540:]),
		SUBNQN:    getCString(b[768:1024]),
		IOCCSZ:    le.Uint32(b[1792:]),
		IORCSZ:    le.Uint32(b[1796:]),
		ICDOFF:    le.Uint16(b[1800:]),
		FCATT:     b[1802],
		MSDBD:     b[1803],
		OFCS:      le.Uint16(b[1804:]),
	}
	id.PSD0.unmarshal(b[2048:2080])
	id.NP.unmarshal(b[3072:3092])
	id.NPToken = le.Uint64(b[3096:])
	return nil
}

// MaxTransfer is the largest data transfer MDTS allows with the given
// minimum memory page size (4096 for CAP.MPSMIN 0), or 0 for no limit.
func (id *IdentifyController) MaxTransfer(minPageSize int) int64 {
	if id.MDTS == 0 || id.MDTS >= 40 {
		return 0
	}
	return int64(minPageSize) << id.MDTS
}

// MDTSFor is the MDTS value for a maximum transfer of maxBytes with the given
// minimum memory page size: the largest n with minPageSize<<n <= maxBytes.
// MDTS 0 means "no limit", so the smallest limit it can express is two
// pages; a smaller maxBytes is an error.
func MDTSFor(maxBytes int64, minPageSize int) (uint8, error) {
	if minPageSize <= 0 || maxBytes < 2*int64(minPageSize) {
		return 0, fmt.Errorf("nvme: MDTS cannot express a %d-byte transfer limit with %d-byte pages", maxBytes, minPageSize)
	}
	var n uint8
	for n < 39 && int64(minPageSize)<<(n+1) <= maxBytes {
		n++
	}
	return n, nil
}

// LBAFormat is one LBA format descriptor (LBAF0-15 of Identify Namespace).
type LBAFormat struct {
	MS    uint16 // bits 15:0 metadata size
	LBADS uint8  // bits 23:16 LBA data size as a power of two (9 = 512, 12 = 4096)
	RP    uint8  // bits 25:24 relative performance
}

func (f LBAFormat) encode() uint32 {
	return uint32(f.MS) | uint32(f.LBADS)<<16 | uint32(f.RP&3)<<24
}

func decodeLBAFormat(v uint32) LBAFormat {
	return LBAFormat{MS: uint16(v), LBADS: uint8(v >> 16), RP: uint8(v>>24) & 3}
}

// BlockSize is the LBA data size in bytes (0 if LBADS is implausible).
func (f LBAFormat) BlockSize() int {
	if f.LBADS < 9 || f.LBADS > 30 {
		return 0
	}
	return 1 << f.LBADS
}

// NSFEAT and DLFEAT bits used by nprdma.
const (
	NSFEATThinProvisioning uint8 = 1 << 0
	// DLFEATReadZeroes is DLFEAT bits 2:0 = 001b: deallocated blocks read as
	// zeroes.
	DLFEATReadZeroes uint8 = 1
	// DLFEATWriteZeroesDeallocate is DLFEAT bit 3: Write Zeroes with DEAC
	// deallocates.
	DLFEATWriteZeroesDeallocate uint8 = 1 << 3
)

// IdentifyNamespace is the Identify Namespace data structure (CNS 0x00) of
// the NVM command set.
type IdentifyNamespace struct {
	NSZE     uint64        // @0 namespace size, blocks
	NCAP     uint64        // @8 capacity, blocks
	NUSE     uint64        // @16 utilization, blocks
	NSFEAT   uint8         // @24 features
	NLBAF    uint8         // @25 number of LBA formats, 0's based
	FLBAS    uint8         // @26 formatted LBA size: bits 3:0 the LBAF index in use
	MC       uint8         // @27 metadata capabilities
	DPC      uint8         // @28
	DPS      uint8         // @29
	NMIC     uint8         // @30 bit0: may be attached to several controllers
	RESCAP   uint8         // @31
	FPI      uint8         // @32
	DLFEAT   uint8         // @33 deallocate logical block features
	NAWUN    uint16        // @34
	NAWUPF   uint16        // @36
	NACWU    uint16        // @38
	NABSN    uint16        // @40
	NABO     uint16        // @42
	NABSPF   uint16        // @44
	NOIOB    uint16        // @46 optimal I/O boundary, blocks
	NVMCAP   [16]byte      // @48 NVM capacity, bytes (128-bit)
	NPWG     uint16        // @64 preferred write granularity, 0's based
	NPWA     uint16        // @66
	NPDG     uint16        // @68 preferred deallocate granularity, 0's based
	NPDA     uint16        // @70
	NOWS     uint16        // @72 optimal write size, 0's based
	ANAGRPID uint32        // @92
	NSATTR   uint8         // @99 bit0 write protected
	NVMSETID uint16        // @100
	ENDGID   uint16        // @102
	NGUID    [16]byte      // @104
	EUI64    [8]byte       // @120
	LBAF     [16]LBAFormat // @128, 4 bytes each
}

// Marshal returns the 4096-byte structure.
func (ns *IdentifyNamespace) Marshal() ([]byte, error) {
	if ns.NLBAF > 15 {
		return nil, fmt.Errorf("nvme: identify namespace NLBAF %d exceeds 15", ns.NLBAF)
	}
	if int(ns.FLBAS&0xf) > int(ns.NLBAF) {
		return nil, fmt.Errorf("nvme: identify namespace FLBAS index %d beyond NLBAF %d", ns.FLBAS&0xf, ns.NLBAF)
	}
	b := make([]byte, IdentifySize)
	le.PutUint64(b[0:], ns.NSZE)
	le.PutUint64(b[8:], ns.NCAP)
	le.PutUint64(b[16:], ns.NUSE)
	b[24] = ns.NSFEAT
	b[25] = ns.NLBAF
	b[26] = ns.FLBAS
	b[27] = ns.MC
	b[28] = ns.DPC
	b[29] = ns.DPS
	b[30] = ns.NMIC
	b[31] = ns.RESCAP
	b[32] = ns.FPI
	b[33] = ns.DLFEAT
	le.PutUint16(b[34:], ns.NAWUN)
	le.PutUint16(b[36:], ns.NAWUPF)
	le.PutUint16(b[38:], ns.NACWU)
	le.PutUint16(b[40:], ns.NABSN)
	le.PutUint16(b[42:], ns.NABO)
	le.PutUint16(b[44:], ns.NABSPF)
	le.PutUint16(b[46:], ns.NOIOB)
	copy(b[48:64], ns.NVMCAP[:])
	le.PutUint16(b[64:], ns.NPWG)
	le.PutUint16(b[66:], ns.NPWA)
	le.PutUint16(b[68:], ns.NPDG)
	le.PutUint16(b[70:], ns.NPDA)
	le.PutUint16(b[72:], ns.NOWS)
	le.PutUint32(b[92:], ns.ANAGRPID)
	b[99] = ns.NSATTR
	le.PutUint16(b[100:], ns.NVMSETID)
	le.PutUint16(b[102:], ns.ENDGID)
	copy(b[104:120], ns.NGUID[:])
	copy(b[120:128], ns.EUI64[:])
	for i, f := range ns.LBAF {
		le.PutUint32(b[128+4*i:], f.encode())
	}
	return b, nil
}

// Unmarshal decodes a 4096-byte Identify Namespace structure. An all-zero
// structure (an inactive NSID) decodes to NSZE 0.
func (ns *IdentifyNamespace) Unmarshal(b []byte) error {
	if len(b) != IdentifySize {
		return fmt.Errorf("nvme: identify namespace data is %d bytes, want %d", len(b), IdentifySize)
	}
	*ns = IdentifyNamespace{
		NSZE:     le.Uint64(b[0:]),
		NCAP:     le.Uint64(b[8:]),
		NUSE:     le.Uint64(b[16:]),
		NSFEAT:   b[24],
		NLBAF:    b[25],
		FLBAS:    b[26],
		MC:       b[27],
		DPC:      b[28],
		DPS:      b[29],
		NMIC:     b[30],
		RESCAP:   b[31],
		FPI:      b[32],
		DLFEAT:   b[33],
		NAWUN:    le.Uint16(b[34:]),
		NAWUPF:   le.Uint16(b[36:]),
		NACWU:    le.Uint16(b[38:]),
		NABSN:    le.Uint16(b[40:]),
		NABO:     le.Uint16(b[42:]),
		NABSPF:   le.Uint16(b[44:]),
		NOIOB:    le.Uint16(b[46:]),
		NVMCAP:   [16]byte(b[48:64]),
		NPWG:     le.Uint16(b[64:]),
		NPWA:     le.Uint16(b[66:]),
		NPDG:     le.Uint16(b[68:]),
		NPDA:     le.Uint16(b[70:]),
		NOWS:     le.Uint16(b[72:]),
		ANAGRPID: le.Uint32(b[92:]),
		NSATTR:   b[99],
		NVMSETID: le.Uint16(b[100:]),
		ENDGID:   le.Uint16(b[102:]),
		NGUID:    [16]byte(b[104:120]),
		EUI64:    [8]byte(b[120:128]),
	}
	for i := range ns.LBAF {
		ns.LBAF[i] = decodeLBAFormat(le.Uint32(b[128+4*i:]))
	}
	return nil
}

// LBAFormatInUse is the format FLBAS selects (bits 3:0; bits 6:5 extend it
// only past 16 formats, which this package does not describe).
func (ns *IdentifyNamespace) LBAFormatInUse() LBAFormat { return ns.LBAF[ns.FLBAS&0xf] }

// BlockSize is the LBA data size of the format in use, in bytes, or an
// error if the structure does not describe a usable format.
func (ns *IdentifyNamespace) BlockSize() (int, error) {
	if int(ns.FLBAS&0xf) > int(ns.NLBAF) {
		return 0, fmt.Errorf("nvme: identify namespace FLBAS index %d beyond NLBAF %d", ns.FLBAS&0xf, ns.NLBAF)
	}
	f := ns.LBAFormatInUse()
	bs := f.BlockSize()
	if bs == 0 {
		return 0, fmt.Errorf("nvme: identify namespace LBADS %d is not a usable block size", f.LBADS)
	}
	return bs, nil
}

// MaxNamespaceListEntries is how many NSIDs one CNS 0x02 list holds.
const MaxNamespaceListEntries = IdentifySize / 4

// ActiveNamespaceList builds the CNS 0x02 reply: the NSIDs in active that are
// greater than after, ascending, at most 1024, zero-filled to 4096 bytes.
// NSIDs 0 and 0xFFFFFFFF (broadcast) are never listed.
func ActiveNamespaceList(active []uint32, after uint32) []byte {
	ids := slices.Clone(active)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	b := make([]byte, IdentifySize)
	n := 0
	for _, id := range ids {
		if id <= after || id == 0 || id == 0xffffffff {
			continue
		}
		if n == MaxNamespaceListEntries {
			break
		}
		le.PutUint32(b[4*n:], id)
		n++
	}
	return b
}

// ParseNamespaceList decodes a CNS 0x02 list: NSIDs up to the first zero.
// The list must be strictly ascending.
func ParseNamespaceList(b []byte) ([]uint32, error) {
	if len(b) != IdentifySize {
		return nil, fmt.Errorf("nvme: namespace list is %d bytes, want %d", len(b), IdentifySize)
	}
	var ids []uint32
	for i := 0; i < IdentifySize; i += 4 {
		id := le.Uint32(b[i:])
		if id == 0 {
			break
		}
		if len(ids) > 0 && id <= ids[len(ids)-1] {
			return nil, fmt.Errorf("nvme: namespace list entry %d (NSID %d) does not ascend after NSID %d", i/4, id, ids[len(ids)-1])
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// Namespace identifier types (NIDT) of the CNS 0x03 descriptor list.
const (
	NIDTEUI64 uint8 = 1
	NIDTNGUID uint8 = 2
	NIDTUUID  uint8 = 3
	NIDTCSI   uint8 = 4
)

var nidLength = map[uint8]int{NIDTEUI64: 8, NIDTNGUID: 16, NIDTUUID: 16, NIDTCSI: 1}

// NamespaceIDs are the identifiers of the CNS 0x03 Namespace Identification
// Descriptor list. Zero values are absent (the specification forbids
// reporting an all-zero identifier).
type NamespaceIDs struct {
	EUI64  [8]byte
	NGUID  [16]byte
	UUID   UUID
	CSI    uint8
	HasCSI bool // CSI is reported (0 is the NVM command set)
}

// Marshal returns the 4096-byte descriptor list: one descriptor {NIDT, NIDL,
// 2 reserved, NID} for every identifier present, in NIDT order, then zeros.
// It fails if no identifier is present.
func (n *NamespaceIDs) Marshal() ([]byte, error) {
	b := make([]byte, IdentifySize)
	off := 0
	put := func(t uint8, v []byte) {
		b[off], b[off+1] = t, byte(len(v))
		copy(b[off+4:], v)
		off += 4 + len(v)
	}
	if !isZero(n.EUI64[:]) {
		put(NIDTEUI64, n.EUI64[:])
	}
	if !isZero(n.NGUID[:]) {
		put(NIDTNGUID, n.NGUID[:])
	}
	if !isZero(n.UUID[:]) {
		put(NIDTUUID, n.UUID[:])
	}
	if n.HasCSI {
		put(NIDTCSI, []byte{n.CSI})
	}
	if off == 0 {
		return nil, fmt.Errorf("nvme: namespace identification descriptor list would be empty: every ID is zero")
	}
	return b, nil
}

// Unmarshal decodes a descriptor list. Unknown identifier types are skipped
// by their length; a known type with the wrong length, a descriptor that
// runs past the end, or a repeated type is an error.
func (n *NamespaceIDs) Unmarshal(b []byte) error {
	if len(b) != IdentifySize {
		return fmt.Errorf("nvme: namespace identification descriptor list is %d bytes, want %d", len(b), IdentifySize)
	}
	*n = NamespaceIDs{}
	seen := map[uint8]bool{}
	for off := 0; off+4 <= len(b); {
		t, l := b[off], int(b[off+1])
		if t == 0 {
			break
		}
		if off+4+l > len(b) {
			return fmt.Errorf("nvme: namespace identification descriptor at %d (type %d, length %d) runs past the end", off, t, l)
		}
		v := b[off+4 : off+4+l]
		if want, known := nidLength[t]; known {
			if l != want {
				return fmt.Errorf("nvme: namespace identification descriptor at %d: type %d has length %d, want %d", off, t, l, want)
			}
			if seen[t] {
				return fmt.Errorf("nvme: namespace identification descriptor at %d: type %d repeated", off, t)
			}
			seen[t] = true
			switch t {
			case NIDTEUI64:
				n.EUI64 = [8]byte(v)
			case NIDTNGUID:
				n.NGUID = [16]byte(v)
			case NIDTUUID:
				n.UUID = UUID(v)
			case NIDTCSI:
				n.CSI, n.HasCSI = v[0], true
			}
		}
		off += 4 + l
	}
	return nil
}
