package nvme

import (
	"bytes"
	"fmt"
)

// The Discovery log page (0x70), which a discovery controller
// (DiscoveryNQN) returns: a 1024-byte header, then one 1024-byte entry per
// subsystem port the host may connect to.

// Discovery log layout.
const (
	DiscoveryLogHeaderSize = 1024
	DiscoveryLogEntrySize  = 1024
	// MaxDiscoveryLogEntries bounds the entries a decoder accepts, so that a
	// NUMREC from the network cannot make it allocate without limit.
	MaxDiscoveryLogEntries = 1024
)

// Transport types (TRTYPE).
const (
	TransportRDMA uint8 = 1
	TransportFC   uint8 = 2
	TransportTCP  uint8 = 3
	// TransportLoop is Linux's intra-host transport; nprdma uses it for its
	// in-process loop provider.
	TransportLoop uint8 = 254
)

// Address families (ADRFAM).
const (
	AddressIPv4      uint8 = 1
	AddressIPv6      uint8 = 2
	AddressIB        uint8 = 3
	AddressFC        uint8 = 4
	AddressIntraHost uint8 = 254
)

// Subsystem types (SUBTYPE).
const (
	SubtypeReferral  uint8 = 1
	SubtypeNVM       uint8 = 2
	SubtypeDiscovery uint8 = 3 // the current discovery subsystem
)

// Transport requirements (TREQ bits 1:0).
const (
	TREQSecureChannelUnspecified uint8 = 0
	TREQSecureChannelRequired    uint8 = 1
	TREQSecureChannelNotRequired uint8 = 2
)

// DiscoveryLogEntry is one 1024-byte entry:
//
//	@0 TRTYPE u8, @1 ADRFAM u8, @2 SUBTYPE u8, @3 TREQ u8, @4 PORTID u16,
//	@6 CNTLID u16, @8 ASQSZ u16, @10 EFLAGS u16, @32 TRSVCID (32, ASCII),
//	@256 SUBNQN (256, NUL-terminated), @512 TRADDR (256, ASCII),
//	@768 TSAS (256, transport specific).
type DiscoveryLogEntry struct {
	TRTYPE  uint8
	ADRFAM  uint8
	SUBTYPE uint8
	TREQ    uint8
	PORTID  uint16
	CNTLID  uint16 // 0xFFFF: dynamic controller model
	ASQSZ   uint16 // admin max SQ size
	EFLAGS  uint16
	TRSVCID string // service (port), e.g. "4420"
	SubNQN  string
	TRADDR  string // address, e.g. "127.0.0.1"
	TSAS    [256]byte
}

// DiscoveryLog is the Discovery log page: a generation counter that changes
// whenever the entries do, and the entries.
type DiscoveryLog struct {
	GenCtr  uint64
	Entries []DiscoveryLogEntry
}

// RDMATSAS is the TSAS of an RDMA entry: QPTYPE 1 (reliable connected),
// PRTYPE 1 (no provider-specific type), CMS 1 (RDMA CM).
func RDMATSAS() [256]byte {
	var t [256]byte
	t[0], t[1], t[2] = 1, 1, 1
	return t
}

// Marshal returns the whole log: header and entries. Strings must fit
// their fields (TRSVCID 32 bytes, SUBNQN 255, TRADDR 256) without NULs.
func (l *DiscoveryLog) Marshal() ([]byte, error) {
	if len(l.Entries) > MaxDiscoveryLogEntries {
		return nil, fmt.Errorf("nvme: discovery log of %d entries, at most %d", len(l.Entries), MaxDiscoveryLogEntries)
	}
	b := make([]byte, DiscoveryLogHeaderSize+len(l.Entries)*DiscoveryLogEntrySize)
	le.PutUint64(b[0:], l.GenCtr)
	le.PutUint64(b[8:], uint64(len(l.Entries)))
	for i := range l.Entries {
		if err := l.Entries[i].marshal(b[DiscoveryLogHeaderSize+i*DiscoveryLogEntrySize:][:DiscoveryLogEntrySize]); err != nil {
			return nil, fmt.Errorf("nvme: discovery log entry %d: %w", i, err)
		}
	}
	return b, nil
}

func (e *DiscoveryLogEntry) marshal(b []byte) error {
	b[0], b[1], b[2], b[3] = e.TRTYPE, e.ADRFAM, e.SUBTYPE, e.TREQ
	le.PutUint16(b[4:], e.PORTID)
	le.PutUint16(b[6:], e.CNTLID)
	le.PutUint16(b[8:], e.ASQSZ)
	le.PutUint16(b[10:], e.EFLAGS)
	if err := putField(b[32:64], e.TRSVCID, "TRSVCID"); err != nil {
		return err
	}
	if err := putCString(b[256:512], e.SubNQN, "SUBNQN"); err != nil {
		return err
	}
	if err := putField(b[512:768], e.TRADDR, "TRADDR"); err != nil {
		return err
	}
	copy(b[768:1024], e.TSAS[:])
	return nil
}

func (e *DiscoveryLogEntry) unmarshal(b []byte) {
	*e = DiscoveryLogEntry{
		TRTYPE: b[0], ADRFAM: b[1], SUBTYPE: b[2], TREQ: b[3],
		PORTID: le.Uint16(b[4:]), CNTLID: le.Uint16(b[6:]), ASQSZ: le.Uint16(b[8:]), EFLAGS: le.Uint16(b[10:]),
		TRSVCID: trimField(b[32:64]),
		SubNQN:  getCString(b[256:512]),
		TRADDR:  trimField(b[512:768]),
	}
	copy(e.TSAS[:], b[768:1024])
}

// putField writes an ASCII field NUL-padded; it may fill the field.
func putField(dst []byte, s, field string) error {
	if len(s) > len(dst) {
		return fmt.Errorf("%s is %d bytes, the field holds %d", field, len(s), len(dst))
	}
	if i := bytes.IndexByte([]byte(s), 0); i >= 0 {
		return fmt.Errorf("%s contains a NUL byte at %d", field, i)
	}
	clear(dst[copy(dst, s):])
	return nil
}

// trimField reads an ASCII field that may be NUL- or space-padded (libnvme
// trims both).
func trimField(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(bytes.TrimRight(b, " "))
}

// ParseDiscoveryLogHeader decodes GENCTR and NUMREC from at least the first
// 16 bytes of the log (hosts read the header first to size the rest).
func ParseDiscoveryLogHeader(b []byte) (genCtr, numRec uint64, err error) {
	if len(b) < 16 {
		return 0, 0, fmt.Errorf("nvme: discovery log header is %d bytes, want at least 16", len(b))
	}
	return le.Uint64(b[0:]), le.Uint64(b[8:]), nil
}

// ParseDiscoveryLog decodes a whole log: the header and the NUMREC entries
// it announces, which b must hold. NUMREC above MaxDiscoveryLogEntries is
// refused before anything is allocated.
func ParseDiscoveryLog(b []byte) (DiscoveryLog, error) {
	if len(b) < DiscoveryLogHeaderSize {
		return DiscoveryLog{}, fmt.Errorf("nvme: discovery log is %d bytes, shorter than its %d-byte header", len(b), DiscoveryLogHeaderSize)
	}
	gen, n, _ := ParseDiscoveryLogHeader(b)
	if n > MaxDiscoveryLogEntries {
		return DiscoveryLog{}, fmt.Errorf("nvme: discovery log announces %d entries, at most %d accepted", n, MaxDiscoveryLogEntries)
	}
	if need := DiscoveryLogHeaderSize + int(n)*DiscoveryLogEntrySize; len(b) < need {
		return DiscoveryLog{}, fmt.Errorf("nvme: discovery log of %d entries needs %d bytes, got %d", n, need, len(b))
	}
	l := DiscoveryLog{GenCtr: gen, Entries: make([]DiscoveryLogEntry, n)}
	for i := range l.Entries {
		l.Entries[i].unmarshal(b[DiscoveryLogHeaderSize+i*DiscoveryLogEntrySize:][:DiscoveryLogEntrySize])
	}
	return l, nil
}

// DiscoveryLogSize is the size of a log with n entries.
func DiscoveryLogSize(n int) int { return DiscoveryLogHeaderSize + n*DiscoveryLogEntrySize }
