package nvme

import (
	"fmt"
	"math"
)

// LogPageID is the log identifier (LID) of Get Log Page.
type LogPageID uint8

// Log pages.
const (
	LogErrorInformation  LogPageID = 0x01
	LogSMARTHealth       LogPageID = 0x02
	LogFirmwareSlot      LogPageID = 0x03
	LogChangedNamespaces LogPageID = 0x04
	LogCommandEffects    LogPageID = 0x05
	LogDiscovery         LogPageID = 0x70
)

// Log page sizes.
const (
	ErrorLogEntrySize     = 64
	HealthLogSize         = 512
	FirmwareSlotLogSize   = 512
	CommandEffectsLogSize = 4096
)

// GetLogPageParams are the Get Log Page fields.
type GetLogPageParams struct {
	LID  LogPageID // CDW10 bits 7:0
	LSP  uint8     // CDW10 bits 14:8 log specific field
	RAE  bool      // CDW10 bit 15 retain asynchronous event
	NUMD uint32    // number of dwords, 0's based: CDW11 bits 15:0 (NUMDU) : CDW10 bits 31:16 (NUMDL)
	LSI  uint16    // CDW11 bits 31:16 log specific identifier
	LPO  uint64    // CDW13:CDW12 log page offset, bytes
	CSI  uint8     // CDW14 bits 31:24
}

// Length is the number of bytes requested: (NUMD+1)*4.
func (p GetLogPageParams) Length() uint64 { return (uint64(p.NUMD) + 1) * 4 }

// GetLogPageCommand reads length bytes of log lid from byte offset, for
// namespace nsid (0xFFFFFFFF or 0 for controller-wide logs), into sgl.
// length must be a positive multiple of 4 and offset a multiple of 4.
func GetLogPageCommand(lid LogPageID, nsid uint32, offset uint64, length uint32, sgl SGLDescriptor) (Command, error) {
	if length == 0 || length%4 != 0 {
		return Command{}, fmt.Errorf("nvme: get log page 0x%02x: length %d is not a positive multiple of 4", uint8(lid), length)
	}
	if offset%4 != 0 {
		return Command{}, fmt.Errorf("nvme: get log page 0x%02x: offset %d is not a multiple of 4", uint8(lid), offset)
	}
	numd := length/4 - 1
	return Command{
		Opcode: AdminGetLogPage,
		Flags:  FlagsSGL,
		NSID:   nsid,
		DPTR:   sgl,
		CDW10:  uint32(lid) | (numd&0xffff)<<16,
		CDW11:  numd >> 16,
		CDW12:  uint32(offset),
		CDW13:  uint32(offset >> 32),
	}, nil
}

// GetLogPage decodes the Get Log Page fields of c.
func (c *Command) GetLogPage() GetLogPageParams {
	return GetLogPageParams{
		LID:  LogPageID(c.CDW10),
		LSP:  uint8(c.CDW10>>8) & 0x7f,
		RAE:  c.CDW10&(1<<15) != 0,
		NUMD: c.CDW10>>16 | (c.CDW11&0xffff)<<16,
		LSI:  uint16(c.CDW11 >> 16),
		LPO:  uint64(c.CDW12) | uint64(c.CDW13)<<32,
		CSI:  uint8(c.CDW14 >> 24),
	}
}

// SliceLog returns the length bytes of log that start at offset, zero-filled
// past the end of log, as a controller answers Get Log Page. An offset that
// is not a multiple of 4 or lies beyond the end of the log is Invalid Field
// in Command (DNR). length is the transfer the command asked for; check it
// against the SGL and MDTS first.
func SliceLog(log []byte, offset, length uint64) ([]byte, error) {
	if offset%4 != 0 {
		return nil, Errorf(StatusInvalidField.WithDNR(), "log page offset %d is not dword aligned", offset)
	}
	if offset > uint64(len(log)) {
		return nil, Errorf(StatusInvalidField.WithDNR(), "log page offset %d beyond the %d-byte log", offset, len(log))
	}
	out := make([]byte, length)
	copy(out, log[offset:])
	return out, nil
}

// ErrorLogEntry is one 64-byte Error Information log entry.
type ErrorLogEntry struct {
	ErrorCount        uint64 // @0 unique, increasing; 0 = entry invalid
	SQID              uint16 // @8
	CID               uint16 // @10
	Status            Status // @12 bits 15:1 (bit 0 is the phase tag)
	Phase             bool
	ParameterLocation uint16 // @14 byte (7:0) and bit (10:8) of the failing field
	LBA               uint64 // @16
	NSID              uint32 // @24
	VSIA              uint8  // @28 vendor specific information available
	TRTYPE            uint8  // @29 transport type
	CommandSpecific   uint64 // @32
	TransportSpecific uint16 // @40
}

// MarshalErrorLog encodes entries as consecutive 64-byte entries.
func MarshalErrorLog(entries []ErrorLogEntry) []byte {
	b := make([]byte, len(entries)*ErrorLogEntrySize)
	for i := range entries {
		e, p := &entries[i], b[i*ErrorLogEntrySize:]
		le.PutUint64(p[0:], e.ErrorCount)
		le.PutUint16(p[8:], e.SQID)
		le.PutUint16(p[10:], e.CID)
		st := uint16(e.Status) &^ 1
		if e.Phase {
			st |= 1
		}
		le.PutUint16(p[12:], st)
		le.PutUint16(p[14:], e.ParameterLocation)
		le.PutUint64(p[16:], e.LBA)
		le.PutUint32(p[24:], e.NSID)
		p[28] = e.VSIA
		p[29] = e.TRTYPE
		le.PutUint64(p[32:], e.CommandSpecific)
		le.PutUint16(p[40:], e.TransportSpecific)
	}
	return b
}

// ParseErrorLog decodes consecutive 64-byte entries.
func ParseErrorLog(b []byte) ([]ErrorLogEntry, error) {
	if len(b)%ErrorLogEntrySize != 0 {
		return nil, fmt.Errorf("nvme: error information log is %d bytes, not a multiple of %d", len(b), ErrorLogEntrySize)
	}
	entries := make([]ErrorLogEntry, len(b)/ErrorLogEntrySize)
	for i := range entries {
		p := b[i*ErrorLogEntrySize:]
		st := le.Uint16(p[12:])
		entries[i] = ErrorLogEntry{
			ErrorCount:        le.Uint64(p[0:]),
			SQID:              le.Uint16(p[8:]),
			CID:               le.Uint16(p[10:]),
			Status:            Status(st &^ 1),
			Phase:             st&1 != 0,
			ParameterLocation: le.Uint16(p[14:]),
			LBA:               le.Uint64(p[16:]),
			NSID:              le.Uint32(p[24:]),
			VSIA:              p[28],
			TRTYPE:            p[29],
			CommandSpecific:   le.Uint64(p[32:]),
			TransportSpecific: le.Uint16(p[40:]),
		}
	}
	return entries, nil
}

// DefaultCompositeTemperature is the composite temperature a controller
// without a sensor reports, in kelvin (35 °C): hosts log and graph it, so 0
// (-273 °C) would look like a broken device.
const DefaultCompositeTemperature = 308

// HealthLog is the SMART / Health Information log (0x02, 512 bytes). The
// 128-bit counters are held in 64 bits; larger values decode as
// math.MaxUint64.
type HealthLog struct {
	CriticalWarning         uint8     // @0
	CompositeTemperature    uint16    // @1 kelvin
	AvailableSpare          uint8     // @3 percent
	AvailableSpareThreshold uint8     // @4 percent
	PercentageUsed          uint8     // @5
	EnduranceGroupWarning   uint8     // @6
	DataUnitsRead           uint64    // @32 thousands of 512-byte units
	DataUnitsWritten        uint64    // @48
	HostReadCommands        uint64    // @64
	HostWriteCommands       uint64    // @80
	ControllerBusyTime      uint64    // @96 minutes
	PowerCycles             uint64    // @112
	PowerOnHours            uint64    // @128
	UnsafeShutdowns         uint64    // @144
	MediaErrors             uint64    // @160
	ErrorLogEntries         uint64    // @176
	WarningTempTime         uint32    // @192 minutes
	CriticalTempTime        uint32    // @196 minutes
	TemperatureSensors      [8]uint16 // @200 kelvin, 0 = not implemented
}

// NewHealthLog returns a healthy log: composite temperature
// DefaultCompositeTemperature, 100% spare, threshold 10%.
func NewHealthLog() HealthLog {
	return HealthLog{CompositeTemperature: DefaultCompositeTemperature, AvailableSpare: 100, AvailableSpareThreshold: 10}
}

func put128(b []byte, v uint64) { le.PutUint64(b, v); le.PutUint64(b[8:], 0) }

func get128(b []byte) uint64 {
	if le.Uint64(b[8:]) != 0 {
		return math.MaxUint64
	}
	return le.Uint64(b)
}

// Marshal returns the 512-byte log.
func (h *HealthLog) Marshal() []byte {
	b := make([]byte, HealthLogSize)
	b[0] = h.CriticalWarning
	le.PutUint16(b[1:], h.CompositeTemperature)
	b[3] = h.AvailableSpare
	b[4] = h.AvailableSpareThreshold
	b[5] = h.PercentageUsed
	b[6] = h.EnduranceGroupWarning
	for i, v := range []uint64{h.DataUnitsRead, h.DataUnitsWritten, h.HostReadCommands, h.HostWriteCommands,
		h.ControllerBusyTime, h.PowerCycles, h.PowerOnHours, h.UnsafeShutdowns, h.MediaErrors, h.ErrorLogEntries} {
		put128(b[32+16*i:], v)
	}
	le.PutUint32(b[192:], h.WarningTempTime)
	le.PutUint32(b[196:], h.CriticalTempTime)
	for i, t := range h.TemperatureSensors {
		le.PutUint16(b[200+2*i:], t)
	}
	return b
}

// Unmarshal decodes a 512-byte log.
func (h *HealthLog) Unmarshal(b []byte) error {
	if len(b) != HealthLogSize {
		return fmt.Errorf("nvme: SMART / health log is %d bytes, want %d", len(b), HealthLogSize)
	}
	*h = HealthLog{
		CriticalWarning:         b[0],
		CompositeTemperature:    le.Uint16(b[1:]),
		AvailableSpare:          b[3],
		AvailableSpareThreshold: b[4],
		PercentageUsed:          b[5],
		EnduranceGroupWarning:   b[6],
		DataUnitsRead:           get128(b[32:]),
		DataUnitsWritten:        get128(b[48:]),
		HostReadCommands:        get128(b[64:]),
		HostWriteCommands:       get128(b[80:]),
		ControllerBusyTime:      get128(b[96:]),
		PowerCycles:             get128(b[112:]),
		PowerOnHours:            get128(b[128:]),
		UnsafeShutdowns:         get128(b[144:]),
		MediaErrors:             get128(b[160:]),
		ErrorLogEntries:         get128(b[176:]),
		WarningTempTime:         le.Uint32(b[192:]),
		CriticalTempTime:        le.Uint32(b[196:]),
	}
	for i := range h.TemperatureSensors {
		h.TemperatureSensors[i] = le.Uint16(b[200+2*i:])
	}
	return nil
}

// FirmwareSlotLog is the Firmware Slot Information log (0x03, 512 bytes).
type FirmwareSlotLog struct {
	ActiveSlot uint8     // AFI bits 2:0: slot running now (1-7)
	NextSlot   uint8     // AFI bits 6:4: slot activated at the next reset, 0 = none
	Revisions  [7]string // FRS1-FRS7 @8, 8 bytes each, ASCII; "" = empty slot (zeros)
}

// Marshal returns the 512-byte log.
func (f *FirmwareSlotLog) Marshal() ([]byte, error) {
	if f.ActiveSlot > 7 || f.NextSlot > 7 {
		return nil, fmt.Errorf("nvme: firmware slot log: slots %d/%d out of range 0-7", f.ActiveSlot, f.NextSlot)
	}
	b := make([]byte, FirmwareSlotLogSize)
	b[0] = f.ActiveSlot | f.NextSlot<<4
	for i, r := range f.Revisions {
		if r == "" {
			continue
		}
		if err := putPadded(b[8+8*i:16+8*i], r, fmt.Sprintf("firmware slot %d revision", i+1)); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// Unmarshal decodes a 512-byte log.
func (f *FirmwareSlotLog) Unmarshal(b []byte) error {
	if len(b) != FirmwareSlotLogSize {
		return fmt.Errorf("nvme: firmware slot log is %d bytes, want %d", len(b), FirmwareSlotLogSize)
	}
	*f = FirmwareSlotLog{ActiveSlot: b[0] & 7, NextSlot: b[0] >> 4 & 7}
	for i := range f.Revisions {
		f.Revisions[i] = getPadded(b[8+8*i : 16+8*i])
	}
	return nil
}

// CommandEffects is one entry of the Commands Supported and Effects log.
type CommandEffects uint32

// Command effects bits.
const (
	EffectSupported           CommandEffects = 1 << 0 // CSUPP
	EffectLBAContentChange    CommandEffects = 1 << 1 // LBCC
	EffectNamespaceCapChange  CommandEffects = 1 << 2 // NCC
	EffectNamespaceInventory  CommandEffects = 1 << 3 // NIC
	EffectControllerCapChange CommandEffects = 1 << 4 // CCC
	// EffectSubmissionMask covers CSE (bits 18:16): 0 no restriction,
	// 1 no other command for the same namespace outstanding, 2 none at all.
	EffectSubmissionMask CommandEffects = 7 << 16
)

// CommandEffectsLog is the Commands Supported and Effects log (0x05, 4096
// bytes): one entry per admin opcode @0, one per I/O opcode @1024.
type CommandEffectsLog struct {
	Admin [256]CommandEffects
	IO    [256]CommandEffects
}

// Marshal returns the 4096-byte log.
func (l *CommandEffectsLog) Marshal() []byte {
	b := make([]byte, CommandEffectsLogSize)
	for i := range 256 {
		le.PutUint32(b[4*i:], uint32(l.Admin[i]))
		le.PutUint32(b[1024+4*i:], uint32(l.IO[i]))
	}
	return b
}

// Unmarshal decodes a 4096-byte log.
func (l *CommandEffectsLog) Unmarshal(b []byte) error {
	if len(b) != CommandEffectsLogSize {
		return fmt.Errorf("nvme: commands supported and effects log is %d bytes, want %d", len(b), CommandEffectsLogSize)
	}
	for i := range 256 {
		l.Admin[i] = CommandEffects(le.Uint32(b[4*i:]))
		l.IO[i] = CommandEffects(le.Uint32(b[1024+4*i:]))
	}
	return nil
}

// ChangedNamespaceListSize is the size of the Changed Namespace List log
// (0x04): up to 1024 NSIDs.
const ChangedNamespaceListSize = 4096

// ChangedNamespaceListOverflow is the first entry of a Changed Namespace
// List log that lost count: more than 1024 namespaces changed, so the host
// must look at every one.
const ChangedNamespaceListOverflow uint32 = 0xffffffff

// MarshalChangedNamespaceList encodes the Changed Namespace List log: the
// NSIDs in order, zero-filled; more than 1024 are the overflow entry alone.
func MarshalChangedNamespaceList(nsids []uint32) []byte {
	b := make([]byte, ChangedNamespaceListSize)
	if len(nsids) > ChangedNamespaceListSize/4 {
		le.PutUint32(b, ChangedNamespaceListOverflow)
		return b
	}
	for i, id := range nsids {
		le.PutUint32(b[4*i:], id)
	}
	return b
}

// ParseChangedNamespaceList decodes a Changed Namespace List log (or its
// first part: a multiple of 4 bytes): the NSIDs up to the first zero entry.
// overflow is set when the controller lost count (the list is then empty):
// every namespace may have changed.
func ParseChangedNamespaceList(b []byte) (nsids []uint32, overflow bool, err error) {
	if len(b)%4 != 0 || len(b) > ChangedNamespaceListSize {
		return nil, false, fmt.Errorf("nvme: changed namespace list of %d bytes: want a multiple of 4 up to %d", len(b), ChangedNamespaceListSize)
	}
	for i := 0; i < len(b); i += 4 {
		id := le.Uint32(b[i:])
		switch {
		case id == 0:
			return nsids, false, nil
		case id == ChangedNamespaceListOverflow && i == 0:
			return nil, true, nil
		case id == ChangedNamespaceListOverflow:
			return nil, false, fmt.Errorf("nvme: changed namespace list: entry %d is the overflow marker", i/4)
		}
		nsids = append(nsids, id)
	}
	return nsids, false, nil
}
