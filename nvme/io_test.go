package nvme

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
)

func TestReadWriteCommands(t *testing.T) {
	sgl, _ := KeyedSGL(0x10000, 8*4096, 0x55)
	r, err := ReadCommand(1, 0x1_0000_0002, 8, 0, sgl)
	if err != nil {
		t.Fatal(err)
	}
	b := r.Marshal()
	if b[0] != 0x02 || binary.LittleEndian.Uint32(b[4:]) != 1 || binary.LittleEndian.Uint64(b[40:]) != 0x1_0000_0002 ||
		binary.LittleEndian.Uint16(b[48:]) != 7 || b[51] != 0 {
		t.Fatalf("read SQE % x", b)
	}
	w, err := WriteCommand(1, 100, MaxBlocksPerCommand, FUA|LimitedRetry, sgl)
	if err != nil {
		t.Fatal(err)
	}
	if w.CDW12 != 0xffff|1<<30|1<<31 {
		t.Fatalf("write CDW12 0x%x", w.CDW12)
	}
	p := w.BlockIO()
	if p.SLBA != 100 || p.NLB != 0xffff || p.Blocks() != 65536 || !p.FUA || !p.LimitedRetry || p.Deallocate {
		t.Fatalf("write params %+v", p)
	}
	w.CDW13 = 0x07
	if w.BlockIO().DSM != 7 {
		t.Error("DSM hints")
	}
	for _, n := range []uint32{0, MaxBlocksPerCommand + 1} {
		if _, err := ReadCommand(1, 0, n, 0, sgl); err == nil {
			t.Errorf("%d blocks accepted", n)
		}
	}
	if _, err := WriteCommand(1, 0, 1, Deallocate, sgl); err == nil {
		t.Error("deallocate on a write accepted")
	}
	wz, err := WriteZeroesCommand(2, 5, 16, Deallocate|FUA)
	if err != nil {
		t.Fatal(err)
	}
	if wz.Opcode != 0x08 || wz.CDW12 != 15|1<<25|1<<30 || wz.DPTR.Length() != 0 {
		t.Fatalf("write zeroes CDW12 0x%x", wz.CDW12)
	}
	if p := wz.BlockIO(); !p.Deallocate || !p.FUA || p.Blocks() != 16 || p.SLBA != 5 {
		t.Errorf("write zeroes params %+v", p)
	}
	f := FlushCommand(BroadcastNSID)
	if f.Opcode != 0 || f.NSID != 0xffffffff {
		t.Errorf("flush %+v", f)
	}
}

func TestCheckRange(t *testing.T) {
	const nsze = 1000
	ok := []struct{ slba, n uint64 }{{0, 1}, {999, 1}, {0, 1000}, {500, 500}}
	for _, c := range ok {
		if err := CheckLBARange(c.slba, c.n, nsze); err != nil {
			t.Errorf("[%d,+%d): %v", c.slba, c.n, err)
		}
	}
	bad := []struct{ slba, n uint64 }{{1000, 1}, {999, 2}, {0, 1001}, {^uint64(0), 2}, {1, ^uint64(0)}}
	for _, c := range bad {
		err := CheckLBARange(c.slba, c.n, nsze)
		if StatusOf(err) != StatusLBAOutOfRange.WithDNR() {
			t.Errorf("[%d,+%d): %v, want LBA out of range DNR", c.slba, c.n, err)
		}
	}
	r, _ := ReadCommand(1, 998, 3, 0, NullSGL())
	if !errors.Is(r.BlockIO().CheckRange(nsze), StatusLBAOutOfRange) {
		t.Error("BlockIO.CheckRange")
	}
}

func TestCheckTransfer(t *testing.T) {
	sgl, _ := KeyedSGL(0, 8192, 1)
	r, _ := ReadCommand(1, 0, 2, 0, sgl)
	if err := r.CheckTransfer(8192, 1<<20); err != nil {
		t.Error(err)
	}
	if err := r.CheckTransfer(8192, 0); err != nil {
		t.Error("no limit:", err)
	}
	if err := r.CheckTransfer(4096, 1<<20); StatusOf(err) != StatusDataSGLLengthInvalid.WithDNR() {
		t.Errorf("SGL too long: %v", err)
	}
	if err := r.CheckTransfer(16384, 1<<20); StatusOf(err) != StatusDataSGLLengthInvalid.WithDNR() {
		t.Errorf("SGL too short: %v", err)
	}
	if err := r.CheckTransfer(8192, 4096); StatusOf(err) != StatusInvalidField.WithDNR() {
		t.Errorf("oversized: %v", err)
	}
	r.DPTR = NullSGL()
	if err := r.CheckTransfer(8192, 0); StatusOf(err) != StatusDataSGLLengthInvalid.WithDNR() {
		t.Errorf("zero-length SGL: %v", err)
	}
}

func TestDatasetManagement(t *testing.T) {
	ranges := []DSMRange{{Attributes: 1, Blocks: 8, SLBA: 0x1_0000_0000}, {Blocks: 1, SLBA: 7}}
	b, err := MarshalDSMRanges(ranges)
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}
	if len(b) != 32 || !bytes.Equal(b[:16], want) {
		t.Fatalf("layout % x", b[:16])
	}
	c, err := DeallocateCommand(1, len(ranges), InCapsuleSGL(0, uint32(len(b))))
	if err != nil {
		t.Fatal(err)
	}
	p := c.DatasetManagement()
	if c.Opcode != 0x09 || p.NR != 1 || p.Ranges() != 2 || p.Attributes != DSMDeallocate || p.DataLength() != 32 {
		t.Fatalf("params %+v", p)
	}
	back, err := ParseDSMRanges(b, p.Ranges())
	if err != nil || !reflect.DeepEqual(back, ranges) {
		t.Fatalf("round trip %+v %v", back, err)
	}
	if _, err := ParseDSMRanges(b[:31], 2); StatusOf(err) != StatusDataSGLLengthInvalid.WithDNR() {
		t.Errorf("short data: %v", err)
	}
	if _, err := ParseDSMRanges(b, 0); StatusOf(err) != StatusInvalidField.WithDNR() {
		t.Errorf("0 ranges: %v", err)
	}
	if _, err := MarshalDSMRanges(make([]DSMRange, 257)); err == nil {
		t.Error("257 ranges marshalled")
	}
	if _, err := DatasetManagementCommand(1, 0, 0, NullSGL()); err == nil {
		t.Error("0 ranges accepted")
	}
	if err := (DSMRange{Blocks: 8, SLBA: 996}).CheckRange(1000); StatusOf(err) != StatusLBAOutOfRange.WithDNR() {
		t.Errorf("range check: %v", err)
	}
	if err := (DSMRange{Blocks: 0, SLBA: 1000}).CheckRange(1000); err != nil {
		t.Errorf("empty range at the end: %v", err)
	}
}

func TestCheckReadWrite(t *testing.T) {
	const nsze, lba, mdts = 1000, 4096, 64 << 10
	sgl := func(n uint32) SGLDescriptor { d, _ := KeyedSGL(0x1000, n, 1); return d }
	cases := []struct {
		name   string
		slba   uint64
		blocks uint32
		sglLen uint32
		want   Status
	}{
		{"ok", 0, 16, 16 * lba, StatusSuccess},
		{"last block", 999, 1, lba, StatusSuccess},
		{"out of range", 999, 2, 2 * lba, StatusLBAOutOfRange.WithDNR()},
		{"slba beyond the end", 5000, 1, lba, StatusLBAOutOfRange.WithDNR()},
		{"oversized", 0, 17, 17 * lba, StatusInvalidField.WithDNR()},
		{"zero-length SGL", 0, 1, 0, StatusDataSGLLengthInvalid.WithDNR()},
		{"SGL one block short", 0, 2, lba, StatusDataSGLLengthInvalid.WithDNR()},
	}
	for _, tc := range cases {
		c, err := ReadCommand(1, tc.slba, tc.blocks, 0, sgl(tc.sglLen))
		if err != nil {
			t.Fatal(err)
		}
		b, err := c.CheckReadWrite(nsze, lba, mdts)
		if got := StatusOf(err); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
		if b.SLBA != tc.slba || b.Blocks() != uint64(tc.blocks) {
			t.Errorf("%s: fields %+v", tc.name, b)
		}
	}
}

func TestInvalidOpcode(t *testing.T) {
	c := Command{Opcode: 0x7e, CID: 9}
	err := InvalidOpcode(&c, false)
	if err.Status != StatusInvalidOpcode.WithDNR() || err.Error() != "nvme: I/O opcode 0x7e not supported: invalid command opcode (SCT 0 SC 0x01, DNR)" {
		t.Errorf("%v", err)
	}
	f := newFabrics(FabricsAuthSend)
	if e := InvalidOpcode(&f, true); e.Status != StatusInvalidOpcode.WithDNR() {
		t.Errorf("fabrics: %v", e)
	}
}
