package nvme

import (
	"bytes"
	"errors"
	"testing"
)

// seqBytes returns n bytes 1, 2, 3... so that every offset is distinguishable.
func seqBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i + 1)
	}
	return b
}

func TestCommandOffsets(t *testing.T) {
	var c Command
	if err := c.Unmarshal(seqBytes(SQESize)); err != nil {
		t.Fatal(err)
	}
	if c.Opcode != 0x01 || c.Flags != 0x02 || c.CID != 0x0403 || c.NSID != 0x08070605 ||
		c.CDW2 != 0x0c0b0a09 || c.CDW3 != 0x100f0e0d || c.MPTR != 0x1817161514131211 ||
		c.DPTR[0] != 25 || c.DPTR[15] != 40 ||
		c.CDW10 != 0x2c2b2a29 || c.CDW11 != 0x302f2e2d || c.CDW12 != 0x34333231 ||
		c.CDW13 != 0x38373635 || c.CDW14 != 0x3c3b3a39 || c.CDW15 != 0x403f3e3d {
		t.Fatalf("fields at wrong offsets: %+v", c)
	}
	if got := c.Marshal(); !bytes.Equal(got, seqBytes(SQESize)) {
		t.Fatalf("round trip:\n got %x\nwant %x", got, seqBytes(SQESize))
	}
	if err := c.Unmarshal(make([]byte, 63)); err == nil {
		t.Error("63-byte SQE accepted")
	}
}

func TestDirections(t *testing.T) {
	cases := []struct {
		c    Command
		want DataDirection
	}{
		{Command{Opcode: IORead}, ControllerToHost},
		{Command{Opcode: IOWrite}, HostToController},
		{Command{Opcode: IOFlush}, NoData},
		{Command{Opcode: IODatasetManagement}, HostToController},
		{Command{Opcode: AdminIdentify}, ControllerToHost},
		{Command{Opcode: AdminGetLogPage}, ControllerToHost},
		{Command{Opcode: AdminNPGetRegionDescriptor}, ControllerToHost},
		{Command{Opcode: IONPAdvise}, NoData},
		{newFabrics(FabricsConnect), HostToController},
		{newFabrics(FabricsPropertyGet), NoData},
		{newFabrics(FabricsPropertySet), NoData},
		{newFabrics(FabricsAuthReceive), ControllerToHost},
	}
	for _, tc := range cases {
		if got := tc.c.Direction(); got != tc.want {
			t.Errorf("%s: direction %v, want %v", tc.c.Name(tc.c.Opcode >= 0xc0 || tc.c.Opcode == AdminIdentify), got, tc.want)
		}
	}
}

func TestCommandNames(t *testing.T) {
	read := Command{Opcode: IORead}
	if read.Name(false) != "read" || read.Name(true) != "get-log-page" {
		t.Errorf("opcode 0x02: %q / %q", read.Name(false), read.Name(true))
	}
	conn := newFabrics(FabricsConnect)
	if conn.Name(true) != "fabrics-connect" || conn.Name(false) != "fabrics-connect" {
		t.Errorf("connect: %q", conn.Name(true))
	}
	if n := (&Command{Opcode: 0x7e}).Name(false); n != "io-0x7e" {
		t.Errorf("unknown io opcode: %q", n)
	}
	if n := (&Command{Opcode: 0x7e}).Name(true); n != "admin-0x7e" {
		t.Errorf("unknown admin opcode: %q", n)
	}
	f := newFabrics(0x33)
	if n := f.Name(true); n != "fabrics-0x33" {
		t.Errorf("unknown fabrics type: %q", n)
	}
}

func TestCompletionRoundTrip(t *testing.T) {
	c := Completion{DW0: 0x11223344, DW1: 0x55667788, SQHD: 7, SQID: 3, CID: 0xbeef,
		Status: StatusLBAOutOfRange.WithDNR(), Phase: true}
	b := c.Marshal()
	want := []byte{0x44, 0x33, 0x22, 0x11, 0x88, 0x77, 0x66, 0x55, 7, 0, 3, 0, 0xef, 0xbe, 0x01, 0x81}
	if !bytes.Equal(b, want) {
		t.Fatalf("wire form\n got % x\nwant % x", b, want)
	}
	var d Completion
	if err := d.Unmarshal(b); err != nil || d != c {
		t.Fatalf("round trip: %+v, %v", d, err)
	}
	if d.Result64() != 0x5566778811223344 {
		t.Errorf("Result64 = 0x%x", d.Result64())
	}
	err := d.Err()
	var se *StatusError
	if !errors.As(err, &se) || se.Status != StatusLBAOutOfRange.WithDNR() || se.Result != 0x11223344 {
		t.Fatalf("Err() = %v", err)
	}
	if (&Completion{Phase: true}).Err() != nil {
		t.Error("successful completion with phase set reports an error")
	}
	if err := d.Unmarshal(b[:15]); err == nil {
		t.Error("15-byte CQE accepted")
	}

	var e Completion
	e.SetError(ConnectInvalidParameter(true, ConnectDataOffsetHostNQN, "host not allowed"))
	if e.Status != StatusConnectInvalidParameters.WithDNR() || e.DW0 != 1<<16|512 {
		t.Errorf("SetError: status %v DW0 0x%x", e.Status, e.DW0)
	}
}
