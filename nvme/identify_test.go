package nvme

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"slices"
	"testing"
)

func sampleController() IdentifyController {
	return IdentifyController{
		VID: 0x1b36, SSVID: 0x1af4,
		SN: "NPRDMA0001", MN: "nprdma target", FR: "0.1",
		RAB: 6, IEEE: [3]byte{1, 2, 3}, CMIC: CMICMultiController,
		MDTS: 5, CNTLID: 0x0102, VER: uint32(Version1_3),
		RTD3R: 11, RTD3E: 12, OAES: 1 << 8, CTRATT: 1, RRLS: 3, CNTRLTYPE: ControllerTypeIO,
		FGUID: [16]byte{15: 0xfe}, CRDT: [3]uint16{10, 20, 30},
		OACS: 0x0004, ACL: 3, AERL: 3, FRMW: 0x03, LPA: LPAExtendedData | LPACommandEffects, ELPE: 63, NPSS: 0,
		AVSCC: 1, APSTA: 0, WCTEMP: 343, CCTEMP: 353, KAS: 10,
		ANATT: 10, ANACAP: 0x47, ANAGRPMAX: 1, NANAGRPID: 1,
		SQES: SQESFabrics, CQES: CQESFabrics, MAXCMD: 128, NN: 4,
		ONCS: ONCSDatasetManagement | ONCSWriteZeroes, FUSES: 0, FNA: 0, VWC: VWCPresent | VWCFlushBroadcastUnsupported,
		AWUN: 7, AWUPF: 0, NVSCC: 1, NWPC: 0, ACWU: 0,
		SGLS: SGLSSupported | SGLSKeyedDataBlock | SGLSOffset, MNAN: 4,
		SUBNQN: "nqn.2024-01.io.nprdma:subsys1",
		IOCCSZ: 260, IORCSZ: 1, ICDOFF: 0, FCATT: 0, MSDBD: 1, OFCS: 0,
		PSD0:    PowerStateDescriptor{MP: 0x9c4, Flags: 0, ENLAT: 16, EXLAT: 4, RRT: 0, RRL: 0, RWT: 0, RWL: 0},
		NP:      NPInstance{BootID: 0x1122334455667788, UncleanStarts: 3, Flags: NPInstanceTracked},
		NPToken: 0x99aabbccddeeff01,
	}
}

func TestIdentifyControllerOffsets(t *testing.T) {
	id := sampleController()
	b, err := id.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != IdentifySize {
		t.Fatalf("size %d", len(b))
	}
	u16 := func(o int) uint16 { return binary.LittleEndian.Uint16(b[o:]) }
	u32 := func(o int) uint32 { return binary.LittleEndian.Uint32(b[o:]) }
	checks := []struct {
		field string
		got   uint64
		want  uint64
	}{
		{"VID @0", uint64(u16(0)), 0x1b36},
		{"SSVID @2", uint64(u16(2)), 0x1af4},
		{"RAB @72", uint64(b[72]), 6},
		{"CMIC @76", uint64(b[76]), 2},
		{"MDTS @77", uint64(b[77]), 5},
		{"CNTLID @78", uint64(u16(78)), 0x0102},
		{"VER @80", uint64(u32(80)), 0x00010300},
		{"OAES @92", uint64(u32(92)), 0x100},
		{"CTRATT @96", uint64(u32(96)), 1},
		{"CNTRLTYPE @111", uint64(b[111]), 1},
		{"CRDT1 @128", uint64(u16(128)), 10},
		{"CRDT3 @132", uint64(u16(132)), 30},
		{"OACS @256", uint64(u16(256)), 4},
		{"ACL @258", uint64(b[258]), 3},
		{"AERL @259", uint64(b[259]), 3},
		{"FRMW @260", uint64(b[260]), 3},
		{"LPA @261", uint64(b[261]), 6},
		{"ELPE @262", uint64(b[262]), 63},
		{"WCTEMP @266", uint64(u16(266)), 343},
		{"CCTEMP @268", uint64(u16(268)), 353},
		{"KAS @320", uint64(u16(320)), 10},
		{"ANATT @342", uint64(b[342]), 10},
		{"ANACAP @343", uint64(b[343]), 0x47},
		{"ANAGRPMAX @344", uint64(u32(344)), 1},
		{"SQES @512", uint64(b[512]), 0x66},
		{"CQES @513", uint64(b[513]), 0x44},
		{"MAXCMD @514", uint64(u16(514)), 128},
		{"NN @516", uint64(u32(516)), 4},
		{"ONCS @520", uint64(u16(520)), 0x0c},
		{"VWC @525", uint64(b[525]), 0x05},
		{"AWUN @526", uint64(u16(526)), 7},
		{"NVSCC @530", uint64(b[530]), 1},
		{"SGLS @536", uint64(u32(536)), 1 | 4 | 1<<20},
		{"MNAN @540", uint64(u32(540)), 4},
		{"IOCCSZ @1792", uint64(u32(1792)), 260},
		{"IORCSZ @1796", uint64(u32(1796)), 1},
		{"ICDOFF @1800", uint64(u16(1800)), 0},
		{"MSDBD @1803", uint64(b[1803]), 1},
		{"PSD0.MP @2048", uint64(u16(2048)), 0x9c4},
		{"PSD0.ENLAT @2052", uint64(u32(2052)), 16},
		{"PSD0.EXLAT @2056", uint64(u32(2056)), 4},
		{"NP.BootID @3072", binary.LittleEndian.Uint64(b[3072:]), 0x1122334455667788},
		{"NP.UncleanStarts @3080", binary.LittleEndian.Uint64(b[3080:]), 3},
		{"NP.Flags @3088", uint64(u32(3088)), 1},
		{"NPToken @3096", binary.LittleEndian.Uint64(b[3096:]), 0x99aabbccddeeff01},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = 0x%x, want 0x%x", c.field, c.got, c.want)
		}
	}
	if got := string(b[4:24]); got != "NPRDMA0001          " {
		t.Errorf("SN @4 = %q, want space padded", got)
	}
	if got := string(b[24:64]); got != "nprdma target"+string(bytes.Repeat([]byte{' '}, 27)) {
		t.Errorf("MN @24 = %q", got)
	}
	if got := string(b[64:72]); got != "0.1     " {
		t.Errorf("FR @64 = %q", got)
	}
	if !bytes.Equal(b[73:76], []byte{1, 2, 3}) || b[127] != 0xfe {
		t.Errorf("IEEE @73 % x, FGUID[15] @127 %x", b[73:76], b[127])
	}
	nqn := "nqn.2024-01.io.nprdma:subsys1"
	if got := string(b[768 : 768+len(nqn)]); got != nqn || !isZero(b[768+len(nqn):1024]) {
		t.Errorf("SUBNQN @768 = %q, not NUL-terminated and zero-filled", got)
	}

	var back IdentifyController
	if err := back.Unmarshal(b); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, id) {
		t.Errorf("round trip:\n got %+v\nwant %+v", back, id)
	}
}

func TestIdentifyControllerRejects(t *testing.T) {
	id := sampleController()
	id.SN = "this serial number is too long"
	if _, err := id.Marshal(); err == nil {
		t.Error("21+ byte SN accepted")
	}
	id = sampleController()
	id.MN = "bad\x01model"
	if _, err := id.Marshal(); err == nil {
		t.Error("non-printable MN accepted")
	}
	id = sampleController()
	id.SUBNQN = string(bytes.Repeat([]byte{'a'}, 256))
	if _, err := id.Marshal(); err == nil {
		t.Error("256-byte SUBNQN accepted (no room for NUL)")
	}
	if err := id.Unmarshal(make([]byte, 4095)); err == nil {
		t.Error("4095-byte structure accepted")
	}
}

func TestMDTS(t *testing.T) {
	id := IdentifyController{MDTS: 5}
	if id.MaxTransfer(4096) != 128<<10 {
		t.Errorf("MDTS 5 = %d bytes", id.MaxTransfer(4096))
	}
	if (&IdentifyController{}).MaxTransfer(4096) != 0 {
		t.Error("MDTS 0 is not unlimited")
	}
	for _, c := range []struct {
		max  int64
		want uint8
	}{{128 << 10, 5}, {1 << 20, 8}, {8192, 1}, {12288, 1}} {
		got, err := MDTSFor(c.max, 4096)
		if err != nil || got != c.want {
			t.Errorf("MDTSFor(%d) = %d, %v; want %d", c.max, got, err, c.want)
		}
	}
	if _, err := MDTSFor(4096, 4096); err == nil {
		t.Error("MDTSFor(one page) should fail: MDTS 0 means unlimited")
	}
}

func TestIdentifyNamespaceOffsets(t *testing.T) {
	ns := IdentifyNamespace{
		NSZE: 0x0102030405060708, NCAP: 0x1112131415161718, NUSE: 0x2122232425262728,
		NSFEAT: NSFEATThinProvisioning, NLBAF: 1, FLBAS: 1, MC: 0, NMIC: 1,
		DLFEAT: DLFEATReadZeroes | DLFEATWriteZeroesDeallocate, NOIOB: 32, NPWG: 7, NPDG: 7, NOWS: 31,
		ANAGRPID: 1, NSATTR: 0, NVMSETID: 2, ENDGID: 3,
		NGUID:  [16]byte{0: 0xaa, 15: 0xbb},
		EUI64:  [8]byte{0: 0xcc, 7: 0xdd},
		NVMCAP: [16]byte{0: 1},
	}
	ns.LBAF[0] = LBAFormat{LBADS: 9}
	ns.LBAF[1] = LBAFormat{LBADS: 12, RP: 0}
	b, err := ns.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	u64 := func(o int) uint64 { return binary.LittleEndian.Uint64(b[o:]) }
	u32 := func(o int) uint32 { return binary.LittleEndian.Uint32(b[o:]) }
	u16 := func(o int) uint16 { return binary.LittleEndian.Uint16(b[o:]) }
	checks := []struct {
		field     string
		got, want uint64
	}{
		{"NSZE @0", u64(0), 0x0102030405060708},
		{"NCAP @8", u64(8), 0x1112131415161718},
		{"NUSE @16", u64(16), 0x2122232425262728},
		{"NSFEAT @24", uint64(b[24]), 1},
		{"NLBAF @25", uint64(b[25]), 1},
		{"FLBAS @26", uint64(b[26]), 1},
		{"NMIC @30", uint64(b[30]), 1},
		{"DLFEAT @33", uint64(b[33]), 9},
		{"NOIOB @46", uint64(u16(46)), 32},
		{"NVMCAP @48", uint64(b[48]), 1},
		{"NPWG @64", uint64(u16(64)), 7},
		{"NPDG @68", uint64(u16(68)), 7},
		{"NOWS @72", uint64(u16(72)), 31},
		{"ANAGRPID @92", uint64(u32(92)), 1},
		{"NVMSETID @100", uint64(u16(100)), 2},
		{"ENDGID @102", uint64(u16(102)), 3},
		{"NGUID @104", uint64(b[104]), 0xaa},
		{"NGUID[15] @119", uint64(b[119]), 0xbb},
		{"EUI64 @120", uint64(b[120]), 0xcc},
		{"EUI64[7] @127", uint64(b[127]), 0xdd},
		{"LBAF0 @128 (LBADS 9 in bits 23:16)", uint64(u32(128)), 9 << 16},
		{"LBAF1 @132 (LBADS 12)", uint64(u32(132)), 12 << 16},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = 0x%x, want 0x%x", c.field, c.got, c.want)
		}
	}
	var back IdentifyNamespace
	if err := back.Unmarshal(b); err != nil || !reflect.DeepEqual(back, ns) {
		t.Fatalf("round trip: %v\n got %+v\nwant %+v", err, back, ns)
	}
	if bs, err := back.BlockSize(); err != nil || bs != 4096 {
		t.Errorf("BlockSize = %d, %v", bs, err)
	}
	ns.FLBAS = 2
	if _, err := ns.Marshal(); err == nil {
		t.Error("FLBAS beyond NLBAF accepted")
	}
	var zero IdentifyNamespace
	if err := zero.Unmarshal(make([]byte, IdentifySize)); err != nil || zero.NSZE != 0 {
		t.Errorf("inactive namespace: %v", err)
	}
	if _, err := zero.BlockSize(); err == nil {
		t.Error("all-zero namespace has a block size")
	}
}

func TestActiveNamespaceList(t *testing.T) {
	b := ActiveNamespaceList([]uint32{7, 3, 0, 5, 3, 0xffffffff, 1}, 3)
	if len(b) != IdentifySize {
		t.Fatalf("size %d", len(b))
	}
	if binary.LittleEndian.Uint32(b[0:]) != 5 || binary.LittleEndian.Uint32(b[4:]) != 7 || !isZero(b[8:]) {
		t.Fatalf("list after 3: % x", b[:16])
	}
	ids, err := ParseNamespaceList(b)
	if err != nil || !slices.Equal(ids, []uint32{5, 7}) {
		t.Fatalf("parse: %v %v", ids, err)
	}
	// More than 1024: the first 1024, ascending.
	var many []uint32
	for i := uint32(2000); i > 0; i-- {
		many = append(many, i)
	}
	ids, err = ParseNamespaceList(ActiveNamespaceList(many, 0))
	if err != nil || len(ids) != 1024 || ids[0] != 1 || ids[1023] != 1024 {
		t.Fatalf("1024 cap: %d ids, %v", len(ids), err)
	}
	bad := make([]byte, IdentifySize)
	binary.LittleEndian.PutUint32(bad[0:], 9)
	binary.LittleEndian.PutUint32(bad[4:], 9)
	if _, err := ParseNamespaceList(bad); err == nil {
		t.Error("non-ascending list accepted")
	}
}

func TestNamespaceDescriptors(t *testing.T) {
	ids := NamespaceIDs{NGUID: [16]byte{0: 1, 15: 2}, UUID: UUID{0: 3, 15: 4}, HasCSI: true}
	b, err := ids.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	// NGUID: NIDT 2, NIDL 16 @0, value @4; UUID: NIDT 3, NIDL 16 @20, value @24; CSI: NIDT 4 NIDL 1 @40.
	if b[0] != 2 || b[1] != 16 || b[4] != 1 || b[19] != 2 ||
		b[20] != 3 || b[21] != 16 || b[24] != 3 || b[39] != 4 ||
		b[40] != 4 || b[41] != 1 || b[44] != 0 || !isZero(b[45:]) {
		t.Fatalf("layout: % x", b[:48])
	}
	var back NamespaceIDs
	if err := back.Unmarshal(b); err != nil || back != ids {
		t.Fatalf("round trip: %+v %v", back, err)
	}
	if _, err := (&NamespaceIDs{}).Marshal(); err == nil {
		t.Error("an all-zero identifier list was produced")
	}
	// An unknown type is skipped by its length.
	u := make([]byte, IdentifySize)
	copy(u, []byte{9, 3, 0, 0, 0xa, 0xb, 0xc, 1, 8, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8})
	if err := back.Unmarshal(u); err != nil || back.EUI64 != [8]byte{1, 2, 3, 4, 5, 6, 7, 8} {
		t.Fatalf("skip unknown: %+v %v", back, err)
	}
	wrongLen := make([]byte, IdentifySize)
	copy(wrongLen, []byte{2, 8})
	if err := back.Unmarshal(wrongLen); err == nil {
		t.Error("NGUID of length 8 accepted")
	}
	overrun := make([]byte, IdentifySize)
	for off := 0; off < 3840; off += 256 {
		overrun[off], overrun[off+1] = 9, 252 // unknown type, skipped
	}
	overrun[3840], overrun[3841] = 9, 255 // ends at 4099
	if err := back.Unmarshal(overrun); err == nil {
		t.Error("descriptor running past the end accepted")
	}
}

func TestIdentifyCommand(t *testing.T) {
	sgl, _ := KeyedSGL(0x1000, IdentifySize, 9)
	c := IdentifyCommand(CNSActiveNamespaces, 12, sgl)
	b := c.Marshal()
	if b[0] != 0x06 || b[1] != 0x40 || binary.LittleEndian.Uint32(b[4:]) != 12 || b[40] != 0x02 {
		t.Fatalf("identify SQE: % x", b)
	}
	c.CDW10 |= 0x0005 << 16
	c.CDW11 = 0x02<<24 | 0x0007
	p := c.Identify()
	if p.CNS != CNSActiveNamespaces || p.CNTID != 5 || p.CSI != 2 || p.CNSSpecificID != 7 {
		t.Errorf("params %+v", p)
	}
}
