package nvme

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

func TestConnectCommand(t *testing.T) {
	sgl := InCapsuleSGL(0, ConnectDataSize)
	c := ConnectCommand(ConnectParams{QID: 3, SQSIZE: 127, CATTR: CATTRDisableSQFlowControl, KATO: 5000}, sgl)
	b := c.Marshal()
	if b[0] != 0x7f || b[4] != 0x01 || binary.LittleEndian.Uint16(b[40:]) != 0 ||
		binary.LittleEndian.Uint16(b[42:]) != 3 || binary.LittleEndian.Uint16(b[44:]) != 127 ||
		b[46] != 0x04 || binary.LittleEndian.Uint32(b[48:]) != 5000 || b[39] != 0x01 {
		t.Fatalf("connect SQE: % x", b)
	}
	var d Command
	_ = d.Unmarshal(b)
	p := d.Connect()
	if !d.IsFabrics() || d.FabricsType() != FabricsConnect || p.QID != 3 || p.SQSIZE != 127 ||
		p.QueueEntries() != 128 || p.CATTR != 4 || p.KATO != 5000 || p.RECFMT != 0 {
		t.Fatalf("params %+v", p)
	}
}

func TestConnectData(t *testing.T) {
	host := UUID{0: 0xaa, 15: 0xbb}
	d := ConnectData{HostID: host, CNTLID: DynamicControllerID,
		SubNQN: "nqn.2024-01.io.nprdma:disk", HostNQN: HostNQNFromUUID(host)}
	b, err := d.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 1024 || b[0] != 0xaa || b[15] != 0xbb || binary.LittleEndian.Uint16(b[16:]) != 0xffff ||
		!strings.HasPrefix(string(b[256:]), d.SubNQN+"\x00") || !strings.HasPrefix(string(b[512:]), d.HostNQN+"\x00") ||
		!isZero(b[768:]) {
		t.Fatalf("layout wrong")
	}
	var back ConnectData
	if err := back.Unmarshal(b); err != nil || back != d {
		t.Fatalf("round trip %+v %v", back, err)
	}
	// The vendor specific reference to a replaced controller, @768.
	d.Replaces = NPControllerRef{Token: 0x0102030405060708, CNTLID: 0x0a0b}
	if b, err = d.Marshal(); err != nil {
		t.Fatal(err)
	}
	if binary.LittleEndian.Uint64(b[768:]) != 0x0102030405060708 || binary.LittleEndian.Uint16(b[776:]) != 0x0a0b || !isZero(b[778:]) {
		t.Fatalf("Replaces layout wrong: % x", b[768:780])
	}
	if err := back.Unmarshal(b); err != nil || back != d {
		t.Fatalf("round trip with Replaces %+v %v", back, err)
	}
	d.Replaces = NPControllerRef{}

	// Unterminated NQN fields are force-terminated at byte 255.
	full := bytes.Repeat([]byte{'x'}, 256)
	copy(b[256:512], full)
	copy(b[512:768], full)
	if err := back.Unmarshal(b); err != nil || len(back.SubNQN) != 255 || len(back.HostNQN) != 255 {
		t.Fatalf("force-termination: %d/%d bytes, %v", len(back.SubNQN), len(back.HostNQN), err)
	}
	if err := back.Unmarshal(b[:1000]); StatusOf(err) != StatusDataSGLLengthInvalid.WithDNR() {
		t.Errorf("short data: %v", err)
	}
	d.SubNQN = string(full)
	if _, err := d.Marshal(); err == nil {
		t.Error("256-byte NQN marshalled")
	}
	d.SubNQN = "a\x00b"
	if _, err := d.Marshal(); err == nil {
		t.Error("NQN with NUL marshalled")
	}
}

func TestConnectResponse(t *testing.T) {
	r := ConnectResponse{CNTLID: 0x1234, AuthRequired: true}
	if r.DW0() != 0x0002_1234 || DecodeConnectResponse(r.DW0()) != r {
		t.Errorf("DW0 0x%x", r.DW0())
	}
	err := ConnectInvalidParameter(true, ConnectDataOffsetSubNQN, "subsystem %q not found", "nqn.x")
	if err.Status != StatusConnectInvalidParameters.WithDNR() || err.Result != 0x0001_0100 {
		t.Fatalf("status %v result 0x%x", err.Status, err.Result)
	}
	if DecodeInvalidParameter(err.Result) != (InvalidParameter{InData: true, Offset: 256}) {
		t.Error("decode IPO/IATTR")
	}
	if DecodeInvalidParameter(ConnectOffsetSQSIZE) != (InvalidParameter{Offset: 44}) {
		t.Error("SQE offset")
	}
	if !strings.Contains(err.Error(), `subsystem "nqn.x" not found`) {
		t.Errorf("detail lost: %v", err)
	}
}

func TestCMPrivateData(t *testing.T) {
	req := CMRequest{QID: 2, HRQSIZE: 128, HSQSIZE: 127, CNTLID: 5}
	b := req.Marshal()
	if len(b) != 32 || !bytes.Equal(b[:10], []byte{0, 0, 2, 0, 128, 0, 127, 0, 5, 0}) || !isZero(b[10:]) {
		t.Fatalf("request layout % x", b)
	}
	got, err := ParseCMRequest(append(b, make([]byte, 24)...)) // padded private data
	if err != nil || got != req {
		t.Fatalf("request round trip %+v %v", got, err)
	}
	_, err = ParseCMRequest(b[:31])
	if rej, ok := err.(*CMRejectError); !ok || rej.Status != CMRejectInvalidLength {
		t.Errorf("short request: %v", err)
	}
	b[0] = 1
	_, err = ParseCMRequest(b)
	if rej, ok := err.(*CMRejectError); !ok || rej.Status != CMRejectInvalidRECFMT {
		t.Errorf("RECFMT 1: %v", err)
	}

	acc := CMAccept{CRQSIZE: 128}
	ab := acc.Marshal()
	if len(ab) != 32 || ab[2] != 128 {
		t.Fatalf("accept layout % x", ab)
	}
	if a, err := ParseCMAccept(ab); err != nil || a != acc {
		t.Fatalf("accept round trip %+v %v", a, err)
	}
	if _, err := ParseCMAccept(ab[:8]); err == nil {
		t.Error("short accept parsed")
	}

	rej := CMReject{Status: CMRejectInvalidHSQSIZE}
	rb := rej.Marshal()
	if !bytes.Equal(rb, []byte{0, 0, 4, 0}) {
		t.Fatalf("reject layout % x", rb)
	}
	if r, err := ParseCMReject(rb); err != nil || r != rej {
		t.Fatalf("reject round trip %+v %v", r, err)
	}
	if _, err := ParseCMReject(rb[:3]); err == nil {
		t.Error("3-byte reject parsed")
	}
	if e := rej.Err().Error(); !strings.Contains(e, "invalid HSQSIZE (4)") {
		t.Errorf("reject error %q", e)
	}
}
