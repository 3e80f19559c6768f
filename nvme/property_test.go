package nvme

import "testing"

func TestPropertyCommands(t *testing.T) {
	g, err := PropertyGetCommand(PropCAP, 8)
	if err != nil {
		t.Fatal(err)
	}
	b := g.Marshal()
	if b[0] != 0x7f || b[4] != 0x04 || b[40] != 1 || b[44] != 0 {
		t.Fatalf("get SQE % x", b)
	}
	p, err := g.Property()
	if err != nil || p.Size != 8 || p.Offset != PropCAP {
		t.Fatalf("get params %+v %v", p, err)
	}
	s, err := PropertySetCommand(PropCC, 4, 0x460001)
	if err != nil {
		t.Fatal(err)
	}
	b = s.Marshal()
	if b[4] != 0x00 || b[40] != 0 || b[44] != 0x14 || b[48] != 0x01 || b[50] != 0x46 {
		t.Fatalf("set SQE % x", b)
	}
	if p, err := s.Property(); err != nil || p.Size != 4 || p.Offset != PropCC || p.Value != 0x460001 {
		t.Fatalf("set params %+v %v", p, err)
	}
	s.CDW13 = 0xffff // high half of a 4-byte set is ignored
	if p, _ := s.Property(); p.Value != 0x460001 {
		t.Errorf("4-byte set value 0x%x", p.Value)
	}
	s.CDW10 = 2
	if _, err := s.Property(); StatusOf(err) != StatusInvalidField.WithDNR() {
		t.Errorf("ATTRIB 2: %v", err)
	}
	if _, err := PropertyGetCommand(PropVS, 2); err == nil {
		t.Error("2-byte property accepted")
	}
	if PropertySize(PropCAP) != 8 || PropertySize(PropCSTS) != 4 || PropertySize(0x30) != 0 {
		t.Error("PropertySize")
	}
}

func TestCAP(t *testing.T) {
	c := CAP{MQES: 1023, CQR: true, TO: 15, CSS: CSSNVM, MPSMIN: 0, MPSMAX: 4}
	v := c.Encode()
	// MQES 1023 | CQR bit16 | TO 15 <<24 | CSS bit37 | MPSMAX 4 <<52.
	want := uint64(1023) | 1<<16 | 15<<24 | 1<<37 | 4<<52
	if v != want {
		t.Fatalf("CAP 0x%016x, want 0x%016x", v, want)
	}
	if DecodeCAP(v) != c || c.MaxQueueEntries() != 1024 || c.MinPageSize() != 4096 {
		t.Errorf("decode %+v", DecodeCAP(v))
	}
	all := CAP{MQES: 0xffff, CQR: true, AMS: 3, TO: 0xff, DSTRD: 0xf, NSSRS: true, CSS: 0xff, BPS: true, MPSMIN: 0xf, MPSMAX: 0xf, CRMS: 3}
	if DecodeCAP(all.Encode()) != all {
		t.Errorf("all fields: %+v", DecodeCAP(all.Encode()))
	}
}

func TestVersionCCCSTS(t *testing.T) {
	if NewVersion(1, 3, 0) != Version1_3 || Version1_3 != 0x00010300 || Version1_3.String() != "1.3.0" ||
		Version2_0.Major() != 2 || Version1_4.Minor() != 4 {
		t.Error("version")
	}
	// What Linux writes: EN | IOSQES 6 | IOCQES 4.
	cc := DecodeCC(0x00460001)
	if !cc.EN || cc.IOSQES != 6 || cc.IOCQES != 4 || cc.CSS != 0 || cc.MPS != 0 || cc.SHN != 0 {
		t.Fatalf("CC %+v", cc)
	}
	if err := cc.CheckEnable(); err != nil {
		t.Error(err)
	}
	if cc.Encode() != 0x00460001 {
		t.Errorf("CC encode 0x%x", cc.Encode())
	}
	all := CC{EN: true, CSS: 7, MPS: 0xf, AMS: 7, SHN: 3, IOSQES: 0xf, IOCQES: 0xf, CRIME: true}
	if DecodeCC(all.Encode()) != all {
		t.Errorf("CC all fields")
	}
	for _, bad := range []CC{{EN: true, IOSQES: 7, IOCQES: 4}, {EN: true, IOSQES: 6, IOCQES: 5},
		{EN: true, IOSQES: 6, IOCQES: 4, MPS: 1}, {EN: true, IOSQES: 6, IOCQES: 4, CSS: 6}} {
		if bad.CheckEnable() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	shn := DecodeCC(0x00464001)
	if shn.SHN != ShutdownNormal {
		t.Errorf("SHN %d", shn.SHN)
	}
	st := CSTS{RDY: true, SHST: ShutdownStatusComplete}
	if st.Encode() != 0x9 || DecodeCSTS(0x9) != st {
		t.Errorf("CSTS 0x%x", st.Encode())
	}
	allS := CSTS{RDY: true, CFS: true, SHST: 3, NSSRO: true, PP: true}
	if DecodeCSTS(allS.Encode()) != allS || allS.Encode() != 0x3f {
		t.Errorf("CSTS all 0x%x", allS.Encode())
	}
}
