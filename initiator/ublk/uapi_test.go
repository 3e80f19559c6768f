package ublk

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// The opcodes are the kernel's: UBLK_U_CMD_* and UBLK_U_IO_* as the ioctl
// macros of include/uapi/linux/ublk_cmd.h expand on x86-64.
func TestOpcodes(t *testing.T) {
	for _, c := range []struct {
		name string
		got  uint32
		want uint32
	}{
		{"UBLK_U_CMD_GET_DEV_INFO", ctrlOp(cmdGetDevInfo), 0x80207502},
		{"UBLK_U_CMD_ADD_DEV", ctrlOp(cmdAddDev), 0xc0207504},
		{"UBLK_U_CMD_DEL_DEV", ctrlOp(cmdDelDev), 0xc0207505},
		{"UBLK_U_CMD_START_DEV", ctrlOp(cmdStartDev), 0xc0207506},
		{"UBLK_U_CMD_STOP_DEV", ctrlOp(cmdStopDev), 0xc0207507},
		{"UBLK_U_CMD_SET_PARAMS", ctrlOp(cmdSetParams), 0xc0207508},
		{"UBLK_U_CMD_GET_PARAMS", ctrlOp(cmdGetParams), 0x80207509},
		{"UBLK_U_CMD_START_USER_RECOVERY", ctrlOp(cmdStartRecovery), 0xc0207510},
		{"UBLK_U_CMD_END_USER_RECOVERY", ctrlOp(cmdEndRecovery), 0xc0207511},
		{"UBLK_U_CMD_GET_FEATURES", ctrlOp(cmdGetFeatures), 0x80207513},
		{"UBLK_U_IO_FETCH_REQ", ioOp(ioFetchReq), 0xc0107520},
		{"UBLK_U_IO_COMMIT_AND_FETCH_REQ", ioOp(ioCommitAndFetchReq), 0xc0107521},
	} {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
}

func TestControlCommandLayout(t *testing.T) {
	b := bytes.Repeat([]byte{0xee}, 80)
	ctrlCmd{devID: 7, queueID: 0xffff, len: 64, addr: 0x1122334455667788, data: 4242}.put(b)
	want := make([]byte, 32)
	binary.LittleEndian.PutUint32(want[0:], 7)
	binary.LittleEndian.PutUint16(want[4:], 0xffff)
	binary.LittleEndian.PutUint16(want[6:], 64)
	binary.LittleEndian.PutUint64(want[8:], 0x1122334455667788)
	binary.LittleEndian.PutUint64(want[16:], 4242)
	if !bytes.Equal(b[:32], want) || b[32] != 0xee {
		t.Fatalf("ublksrv_ctrl_cmd:\n got %x\nwant %x (and the rest untouched)", b[:33], want)
	}
	io := make([]byte, 16)
	ioCmd{queue: 3, tag: 517, result: -5, addr: 0xabcdef}.put(io)
	if got := binary.LittleEndian; got.Uint16(io[0:]) != 3 || got.Uint16(io[2:]) != 517 || int32(got.Uint32(io[4:])) != -5 || got.Uint64(io[8:]) != 0xabcdef {
		t.Fatalf("ublksrv_io_cmd: %x", io)
	}
}

func TestDevInfoRoundTrip(t *testing.T) {
	in := DevInfo{Queues: 2, QueueDepth: 128, State: StateQuiesced, MaxIOBytes: 256 << 10, ID: 9, ServerPID: -1,
		Flags: FlagUserRecovery | FlagUserCopy, OwnerUID: 1000, OwnerGID: 100}
	b := bytes.Repeat([]byte{0xee}, devInfoSize)
	in.put(b)
	// Offsets of struct ublksrv_ctrl_dev_info.
	le := binary.LittleEndian
	if le.Uint16(b[2:]) != 128 || le.Uint32(b[8:]) != 256<<10 || le.Uint32(b[12:]) != 9 || int32(le.Uint32(b[16:])) != -1 ||
		le.Uint64(b[24:]) != FlagUserRecovery|FlagUserCopy || le.Uint64(b[32:]) != 0 || le.Uint32(b[44:]) != 100 || le.Uint64(b[56:]) != 0 {
		t.Fatalf("layout: %x", b)
	}
	out, err := parseDevInfo(b)
	if err != nil || out != in {
		t.Fatalf("round trip: %+v, %v; want %+v", out, err, in)
	}
	if _, err := parseDevInfo(b[:63]); err == nil {
		t.Fatal("63 bytes parsed")
	}
}

func TestParamsLayout(t *testing.T) {
	in := params{attrs: attrVolatileCache | attrFUA, logicalShift: 12, physicalShift: 12, optShift: 12, minShift: 12,
		maxSectors: 512, devSectors: 1 << 21, discardGranularity: 4096, maxDiscardSectors: 1 << 21, maxWriteZeroesSectors: 1 << 20,
		maxDiscardSegments: 1}
	b := bytes.Repeat([]byte{0xee}, 128)
	in.put(b)
	le := binary.LittleEndian
	// struct ublk_params: len, types; basic at 8; discard at 40.
	if le.Uint32(b[0:]) != 60 || le.Uint32(b[4:]) != paramTypeBasic|paramTypeDiscard || le.Uint32(b[8:]) != 12 ||
		!bytes.Equal(b[12:16], []byte{12, 12, 12, 12}) || le.Uint32(b[16:]) != 512 || le.Uint32(b[20:]) != 0 ||
		le.Uint64(b[24:]) != 1<<21 || le.Uint64(b[32:]) != 0 || le.Uint32(b[40:]) != 0 || le.Uint32(b[44:]) != 4096 ||
		le.Uint32(b[48:]) != 1<<21 || le.Uint32(b[52:]) != 1<<20 || le.Uint16(b[56:]) != 1 || b[60] != 0xee {
		t.Fatalf("layout: %x", b[:61])
	}
	out, err := parseParams(b[:paramsSize])
	if err != nil || out != in {
		t.Fatalf("round trip: %+v, %v; want %+v", out, err, in)
	}
	le.PutUint32(b[4:], paramTypeDiscard)
	if _, err := parseParams(b[:paramsSize]); err == nil {
		t.Fatal("parameters without the basic ones parsed")
	}
}

func TestDescAndOffsets(t *testing.T) {
	b := make([]byte, descSize)
	binary.LittleEndian.PutUint32(b[0:], opWrite|ioFlagFUA)
	binary.LittleEndian.PutUint32(b[4:], 8)
	binary.LittleEndian.PutUint64(b[8:], 1<<30)
	binary.LittleEndian.PutUint64(b[16:], 0xdead)
	if d := parseDesc(b); d != (desc{op: opWrite, flags: ioFlagFUA, sectors: 8, startSector: 1 << 30}) {
		t.Fatalf("desc %+v", d)
	}
	// UBLKSRV_IO_BUF_OFFSET + (q << UBLK_QID_OFF) + (tag << UBLK_TAG_OFF)
	if got := userCopyOffset(3, 5); got != 0x80000000+3<<41+5<<25 {
		t.Fatalf("user copy offset %#x", got)
	}
	// Each queue's descriptors start at q * round_up(4096 * 24, PAGE_SIZE).
	if descArrayOffset(2) != 2*98304 || descArraySize(128) != 4096 || descArraySize(200) != 8192 {
		t.Fatalf("descriptor array offset %d, sizes %d %d", descArrayOffset(2), descArraySize(128), descArraySize(200))
	}
	if n, err := ParseBlockPath("/dev/ublkb12"); n != 12 || err != nil {
		t.Fatalf("ParseBlockPath: %d, %v", n, err)
	}
	for _, bad := range []string{"/dev/ublkc1", "/dev/ublkb", "/dev/ublkb-1", "ublkb1"} {
		if _, err := ParseBlockPath(bad); err == nil {
			t.Errorf("ParseBlockPath(%q) accepted", bad)
		}
	}
}
