package ublk

// The kernel's ublk interface (include/uapi/linux/ublk_cmd.h): control
// commands on /dev/ublk-control, I/O commands on /dev/ublkcN, the I/O
// descriptors the driver writes into the queue's shared memory, and their
// encodings. Little-endian, as the structures are native on the only
// architecture this project builds for here (amd64).

import (
	"encoding/binary"
	"fmt"
)

// Control commands (the number of _IOWR('u', nr, struct ublksrv_ctrl_cmd)).
const (
	cmdGetDevInfo    = 0x02
	cmdAddDev        = 0x04
	cmdDelDev        = 0x05
	cmdStartDev      = 0x06
	cmdStopDev       = 0x07
	cmdSetParams     = 0x08
	cmdGetParams     = 0x09
	cmdStartRecovery = 0x10
	cmdEndRecovery   = 0x11
	cmdGetFeatures   = 0x13
)

// I/O commands (_IOWR('u', nr, struct ublksrv_io_cmd)).
const (
	ioFetchReq          = 0x20
	ioCommitAndFetchReq = 0x21
)

// ioctl encoding of the commands: UBLK_F_CMD_IOCTL_ENCODE.
const (
	iocRead  = 2
	iocWrite = 1
)

func ioc(dir, nr, size uint32) uint32 { return dir<<30 | size<<16 | uint32('u')<<8 | nr }

// ctrlOp is the opcode of a control command: _IOWR for all but the
// getters, which are _IOR.
func ctrlOp(nr uint32) uint32 {
	switch nr {
	case cmdGetDevInfo, cmdGetParams, cmdGetFeatures:
		return ioc(iocRead, nr, ctrlCmdSize)
	}
	return ioc(iocRead|iocWrite, nr, ctrlCmdSize)
}

func ioOp(nr uint32) uint32 { return ioc(iocRead|iocWrite, nr, ioCmdSize) }

// Feature flags (ublksrv_ctrl_dev_info.flags, UBLK_F_*).
const (
	FlagSupportZeroCopy     = 1 << 0
	FlagNeedGetData         = 1 << 2
	FlagUserRecovery        = 1 << 3
	FlagUserRecoveryReissue = 1 << 4
	FlagUnprivileged        = 1 << 5
	FlagCmdIoctlEncode      = 1 << 6
	FlagUserCopy            = 1 << 7
)

// Device states (ublksrv_ctrl_dev_info.state).
const (
	StateDead     = 0
	StateLive     = 1
	StateQuiesced = 2
)

// I/O operations and flags of a descriptor (ublksrv_io_desc.op_flags: op
// in bits 0-7, flags above).
const (
	opRead        = 0
	opWrite       = 1
	opFlush       = 2
	opDiscard     = 3
	opWriteZeroes = 5

	ioFlagFUA     = 1 << 13
	ioFlagNoUnmap = 1 << 15
)

// Results of a fetch (the completion's res): a request is there, or the
// device is going away and the command is aborted (-ENODEV).
const (
	ioResOK    = 0
	ioResAbort = -19
)

// Parameter types and basic attributes (struct ublk_params).
const (
	paramTypeBasic   = 1 << 0
	paramTypeDiscard = 1 << 1

	attrVolatileCache = 1 << 2
	attrFUA           = 1 << 3
)

// Where the driver's per-queue descriptor arrays and (with UBLK_F_USER_COPY)
// the requests' data are found in /dev/ublkcN.
const (
	maxQueueDepth = 4096
	descSize      = 24
	ioBufOffset   = 0x80000000
	ioBufBits     = 25 // a request's data: at most 32 MiB
	tagBits       = 16
	qidOffset     = ioBufBits + tagBits
)

// descArrayOffset is the mmap offset of queue q's descriptors: each queue
// has room for the largest depth, rounded up to whole pages.
func descArrayOffset(q int) int64 {
	return int64(q) * int64(roundUp(maxQueueDepth*descSize, pageSize))
}

// descArraySize is the size of a queue's descriptor array as mapped.
func descArraySize(depth int) int { return roundUp(depth*descSize, pageSize) }

// userCopyOffset is where, in /dev/ublkcN, the data of request tag of queue
// q is read (a write's) or written (a read's) with UBLK_F_USER_COPY.
func userCopyOffset(q, tag int) int64 {
	return ioBufOffset + int64(q)<<qidOffset + int64(tag)<<ioBufBits
}

const pageSize = 4096

func roundUp(n, to int) int { return (n + to - 1) / to * to }

// ctrlCmd is struct ublksrv_ctrl_cmd, the command area of a control
// command.
type ctrlCmd struct {
	devID   uint32
	queueID uint16 // 0xffff: not for a queue
	len     uint16 // of the buffer at addr
	addr    uint64
	data    uint64
}

const ctrlCmdSize = 32

func (c ctrlCmd) put(b []byte) {
	le := binary.LittleEndian
	le.PutUint32(b[0:], c.devID)
	le.PutUint16(b[4:], c.queueID)
	le.PutUint16(b[6:], c.len)
	le.PutUint64(b[8:], c.addr)
	le.PutUint64(b[16:], c.data)
	clear(b[24:ctrlCmdSize]) // dev_path_len, pad, reserved
}

// DevInfo is struct ublksrv_ctrl_dev_info: a device as ADD_DEV creates it
// and GET_DEV_INFO reports it.
type DevInfo struct {
	Queues     uint16 // nr_hw_queues
	QueueDepth uint16
	State      uint16 // StateDead, StateLive, StateQuiesced
	MaxIOBytes uint32 // max_io_buf_bytes
	ID         uint32 // dev_id
	ServerPID  int32  // ublksrv_pid: the process serving it (-1: none)
	Flags      uint64 // Flag*
	OwnerUID   uint32
	OwnerGID   uint32
}

const devInfoSize = 64

func (d DevInfo) put(b []byte) {
	le := binary.LittleEndian
	clear(b[:devInfoSize])
	le.PutUint16(b[0:], d.Queues)
	le.PutUint16(b[2:], d.QueueDepth)
	le.PutUint16(b[4:], d.State)
	le.PutUint32(b[8:], d.MaxIOBytes)
	le.PutUint32(b[12:], d.ID)
	le.PutUint32(b[16:], uint32(d.ServerPID))
	le.PutUint64(b[24:], d.Flags)
	le.PutUint32(b[40:], d.OwnerUID)
	le.PutUint32(b[44:], d.OwnerGID)
}

func parseDevInfo(b []byte) (DevInfo, error) {
	if len(b) < devInfoSize {
		return DevInfo{}, fmt.Errorf("ublk: device info of %d bytes, want %d", len(b), devInfoSize)
	}
	le := binary.LittleEndian
	return DevInfo{
		Queues: le.Uint16(b[0:]), QueueDepth: le.Uint16(b[2:]), State: le.Uint16(b[4:]),
		MaxIOBytes: le.Uint32(b[8:]), ID: le.Uint32(b[12:]), ServerPID: int32(le.Uint32(b[16:])),
		Flags: le.Uint64(b[24:]), OwnerUID: le.Uint32(b[40:]), OwnerGID: le.Uint32(b[44:]),
	}, nil
}

// params is the part of struct ublk_params this server sets: the basic and
// discard parameters (GET_PARAMS reads the same part back).
type params struct {
	attrs                                           uint32
	logicalShift, physicalShift, optShift, minShift uint8
	maxSectors                                      uint32
	devSectors                                      uint64
	discardGranularity, maxDiscardSectors           uint32
	maxWriteZeroesSectors                           uint32
	maxDiscardSegments                              uint16
}

// paramsSize covers the header (len, types), basic (32 bytes) and discard
// (20 bytes) parameters.
const paramsSize = 8 + 32 + 20

func (p params) put(b []byte) {
	le := binary.LittleEndian
	clear(b[:paramsSize])
	le.PutUint32(b[0:], paramsSize)
	le.PutUint32(b[4:], paramTypeBasic|paramTypeDiscard)
	// basic
	le.PutUint32(b[8:], p.attrs)
	b[12], b[13], b[14], b[15] = p.logicalShift, p.physicalShift, p.optShift, p.minShift
	le.PutUint32(b[16:], p.maxSectors)
	le.PutUint32(b[20:], 0) // chunk_sectors
	le.PutUint64(b[24:], p.devSectors)
	le.PutUint64(b[32:], 0) // virt_boundary_mask
	// discard
	le.PutUint32(b[40:], 0) // discard_alignment
	le.PutUint32(b[44:], p.discardGranularity)
	le.PutUint32(b[48:], p.maxDiscardSectors)
	le.PutUint32(b[52:], p.maxWriteZeroesSectors)
	le.PutUint16(b[56:], p.maxDiscardSegments)
}

func parseParams(b []byte) (params, error) {
	le := binary.LittleEndian
	if len(b) < paramsSize || le.Uint32(b[0:]) < 40 || le.Uint32(b[4:])&paramTypeBasic == 0 {
		return params{}, fmt.Errorf("ublk: parameters without the basic ones (%d bytes)", len(b))
	}
	p := params{
		attrs: le.Uint32(b[8:]), logicalShift: b[12], physicalShift: b[13], optShift: b[14], minShift: b[15],
		maxSectors: le.Uint32(b[16:]), devSectors: le.Uint64(b[24:]),
	}
	if le.Uint32(b[4:])&paramTypeDiscard != 0 {
		p.discardGranularity, p.maxDiscardSectors = le.Uint32(b[44:]), le.Uint32(b[48:])
		p.maxWriteZeroesSectors, p.maxDiscardSegments = le.Uint32(b[52:]), le.Uint16(b[56:])
	}
	return p, nil
}

// ioCmd is struct ublksrv_io_cmd, the command area of an I/O command.
type ioCmd struct {
	queue, tag uint16
	result     int32  // of COMMIT_AND_FETCH_REQ: bytes, or -errno
	addr       uint64 // the request's buffer (0 with UBLK_F_USER_COPY)
}

const ioCmdSize = 16

func (c ioCmd) put(b []byte) {
	le := binary.LittleEndian
	le.PutUint16(b[0:], c.queue)
	le.PutUint16(b[2:], c.tag)
	le.PutUint32(b[4:], uint32(c.result))
	le.PutUint64(b[8:], c.addr)
}

// desc is struct ublksrv_io_desc: a request as the driver describes it.
type desc struct {
	op          uint8
	flags       uint32 // op_flags without the op: ioFlag*
	sectors     uint32 // of 512 bytes
	startSector uint64
}

func parseDesc(b []byte) desc {
	le := binary.LittleEndian
	of := le.Uint32(b[0:])
	return desc{op: uint8(of), flags: of >> 8 << 8, sectors: le.Uint32(b[4:]), startSector: le.Uint64(b[8:])}
}
