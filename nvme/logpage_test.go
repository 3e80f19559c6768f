package nvme

import (
	"bytes"
	"encoding/binary"
	"math"
	"reflect"
	"slices"
	"testing"
)

func TestGetLogPageCommand(t *testing.T) {
	sgl, _ := KeyedSGL(0x2000, 8192, 3)
	// 0x50000 bytes: NUMD = 0x13FFF, NUMDL 0x3FFF, NUMDU 0x1.
	c, err := GetLogPageCommand(LogCommandEffects, BroadcastNSID, 0x1_0000_0010, 0x50000, sgl)
	if err != nil {
		t.Fatal(err)
	}
	if c.Opcode != AdminGetLogPage || c.CDW10 != 0x3fff<<16|0x05 || c.CDW11 != 0x1 ||
		c.CDW12 != 0x10 || c.CDW13 != 0x1 || c.NSID != 0xffffffff {
		t.Fatalf("fields: CDW10 0x%x CDW11 0x%x CDW12 0x%x CDW13 0x%x", c.CDW10, c.CDW11, c.CDW12, c.CDW13)
	}
	c.CDW10 |= 1<<15 | 0x2a<<8
	c.CDW11 |= 0x77 << 16
	c.CDW14 = 2 << 24
	p := c.GetLogPage()
	want := GetLogPageParams{LID: LogCommandEffects, LSP: 0x2a, RAE: true, NUMD: 0x13fff, LSI: 0x77, LPO: 0x1_0000_0010, CSI: 2}
	if p != want {
		t.Fatalf("params %+v, want %+v", p, want)
	}
	if p.Length() != 0x50000 {
		t.Errorf("Length %d", p.Length())
	}
	// The largest request does not overflow.
	if (GetLogPageParams{NUMD: math.MaxUint32}).Length() != 1<<34 {
		t.Error("Length overflows at NUMD 0xFFFFFFFF")
	}
	for _, bad := range []struct {
		off uint64
		n   uint32
	}{{0, 0}, {0, 6}, {2, 4}} {
		if _, err := GetLogPageCommand(LogSMARTHealth, 0, bad.off, bad.n, sgl); err == nil {
			t.Errorf("offset %d length %d accepted", bad.off, bad.n)
		}
	}
}

func TestSliceLog(t *testing.T) {
	log := seqBytes(20) // a 20-byte log, like the discovery log header
	got, err := SliceLog(log, 0, 8)
	if err != nil || !bytes.Equal(got, log[:8]) {
		t.Fatalf("head: %v %v", got, err)
	}
	got, err = SliceLog(log, 16, 12)
	if err != nil || !bytes.Equal(got, append(log[16:20:20], make([]byte, 8)...)) {
		t.Fatalf("tail zero-filled: % x %v", got, err)
	}
	got, err = SliceLog(log, 20, 8)
	if err != nil || !bytes.Equal(got, make([]byte, 8)) {
		t.Fatalf("at the end: % x %v", got, err)
	}
	for _, off := range []uint64{2, 24, math.MaxUint64 - 3} {
		_, err := SliceLog(log, off, 4)
		if StatusOf(err) != StatusInvalidField.WithDNR() {
			t.Errorf("offset %d: %v, want invalid field DNR", off, err)
		}
	}
}

func TestErrorLog(t *testing.T) {
	entries := []ErrorLogEntry{
		{ErrorCount: 1, SQID: 2, CID: 3, Status: StatusLBAOutOfRange.WithDNR(), Phase: true, ParameterLocation: 0x2a,
			LBA: 99, NSID: 1, VSIA: 0, TRTYPE: 1, CommandSpecific: 5, TransportSpecific: 6},
		{ErrorCount: 2},
	}
	b := MarshalErrorLog(entries)
	if len(b) != 128 || binary.LittleEndian.Uint16(b[12:]) != 0x8101 || binary.LittleEndian.Uint64(b[16:]) != 99 ||
		b[29] != 1 || binary.LittleEndian.Uint64(b[32:]) != 5 || binary.LittleEndian.Uint16(b[40:]) != 6 ||
		binary.LittleEndian.Uint64(b[64:]) != 2 {
		t.Fatalf("layout: % x", b[:64])
	}
	back, err := ParseErrorLog(b)
	if err != nil || !reflect.DeepEqual(back, entries) {
		t.Fatalf("round trip: %+v %v", back, err)
	}
	if _, err := ParseErrorLog(b[:65]); err == nil {
		t.Error("65 bytes accepted")
	}
}

func TestHealthLog(t *testing.T) {
	h := NewHealthLog()
	h.DataUnitsRead = 1000
	h.HostWriteCommands = 77
	h.PowerOnHours = 5
	h.TemperatureSensors[0] = 300
	b := h.Marshal()
	if len(b) != 512 {
		t.Fatalf("size %d", len(b))
	}
	temp := binary.LittleEndian.Uint16(b[1:])
	if temp != 308 || temp < 273 || temp > 373 {
		t.Errorf("composite temperature %d K", temp)
	}
	if b[3] != 100 || b[4] != 10 || binary.LittleEndian.Uint64(b[32:]) != 1000 ||
		binary.LittleEndian.Uint64(b[80:]) != 77 || binary.LittleEndian.Uint64(b[128:]) != 5 ||
		binary.LittleEndian.Uint16(b[200:]) != 300 {
		t.Errorf("layout: % x", b[:208])
	}
	var back HealthLog
	if err := back.Unmarshal(b); err != nil || back != h {
		t.Fatalf("round trip: %+v %v", back, err)
	}
	b[32+8] = 1 // a 128-bit counter beyond 64 bits saturates
	if err := back.Unmarshal(b); err != nil || back.DataUnitsRead != math.MaxUint64 {
		t.Errorf("saturation: %d %v", back.DataUnitsRead, err)
	}
	if err := back.Unmarshal(b[:511]); err == nil {
		t.Error("511 bytes accepted")
	}
}

func TestFirmwareSlotLog(t *testing.T) {
	f := FirmwareSlotLog{ActiveSlot: 1, NextSlot: 2, Revisions: [7]string{"0.1", "", "v3"}}
	b, err := f.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if b[0] != 0x21 || string(b[8:16]) != "0.1     " || !isZero(b[16:24]) || string(b[24:32]) != "v3      " {
		t.Fatalf("layout: % x", b[:32])
	}
	var back FirmwareSlotLog
	if err := back.Unmarshal(b); err != nil || back != f {
		t.Fatalf("round trip: %+v %v", back, err)
	}
	if _, err := (&FirmwareSlotLog{ActiveSlot: 8}).Marshal(); err == nil {
		t.Error("slot 8 accepted")
	}
	if _, err := (&FirmwareSlotLog{Revisions: [7]string{"123456789"}}).Marshal(); err == nil {
		t.Error("9-byte revision accepted")
	}
}

func TestCommandEffectsLog(t *testing.T) {
	var l CommandEffectsLog
	l.Admin[AdminIdentify] = EffectSupported
	l.IO[IOWrite] = EffectSupported | EffectLBAContentChange
	l.IO[IONPAdvise] = EffectSupported
	b := l.Marshal()
	if binary.LittleEndian.Uint32(b[4*0x06:]) != 1 || binary.LittleEndian.Uint32(b[1024+4*0x01:]) != 3 ||
		binary.LittleEndian.Uint32(b[1024+4*0x80:]) != 1 {
		t.Fatal("entries at wrong offsets")
	}
	var back CommandEffectsLog
	if err := back.Unmarshal(b); err != nil || back != l {
		t.Fatalf("round trip: %v", err)
	}
}

func TestChangedNamespaceList(t *testing.T) {
	b := MarshalChangedNamespaceList([]uint32{3, 1, 9})
	if len(b) != ChangedNamespaceListSize {
		t.Fatalf("log of %d bytes", len(b))
	}
	ids, overflow, err := ParseChangedNamespaceList(b)
	if err != nil || overflow || !slices.Equal(ids, []uint32{3, 1, 9}) {
		t.Fatalf("parsed %v overflow %v (%v)", ids, overflow, err)
	}
	// A host may read the first part only.
	if ids, _, err := ParseChangedNamespaceList(b[:8]); err != nil || !slices.Equal(ids, []uint32{3, 1}) {
		t.Fatalf("first 8 bytes: %v (%v)", ids, err)
	}
	many := make([]uint32, 1025)
	for i := range many {
		many[i] = uint32(i + 1)
	}
	if ids, overflow, err := ParseChangedNamespaceList(MarshalChangedNamespaceList(many)); err != nil || !overflow || ids != nil {
		t.Fatalf("1025 changed: %v overflow %v (%v), want the overflow entry", ids, overflow, err)
	}
	if ids, overflow, err := ParseChangedNamespaceList(MarshalChangedNamespaceList(many[:1024])); err != nil || overflow || len(ids) != 1024 {
		t.Fatalf("1024 changed: %d overflow %v (%v)", len(ids), overflow, err)
	}
	bad := MarshalChangedNamespaceList([]uint32{1, ChangedNamespaceListOverflow})
	if _, _, err := ParseChangedNamespaceList(bad); err == nil {
		t.Fatal("an overflow marker after an NSID parsed")
	}
	if _, _, err := ParseChangedNamespaceList(b[:6]); err == nil {
		t.Fatal("6 bytes parsed")
	}
}
