package nvme

import "fmt"

// MaxBlocksPerCommand is the largest block count of a Read, Write or Write
// Zeroes (NLB is 16 bits, 0's based).
const MaxBlocksPerCommand = 1 << 16

// BroadcastNSID addresses every namespace (Flush, some log pages).
const BroadcastNSID = 0xffffffff

// IOFlag selects options of the block I/O builders.
type IOFlag uint8

// I/O flags.
const (
	// FUA (force unit access, CDW12 bit 30): the data is durable when the
	// command completes (Read: read from non-volatile media).
	FUA IOFlag = 1 << iota
	// LimitedRetry (CDW12 bit 31): give up early on media errors.
	LimitedRetry
	// Deallocate (Write Zeroes DEAC, CDW12 bit 25): the range may be
	// deallocated instead of written.
	Deallocate
)

const (
	cdw12FUA  = 1 << 30
	cdw12LR   = 1 << 31
	cdw12DEAC = 1 << 25
)

// BlockIO holds the fields Read, Write, Write Zeroes and NP Advise share.
type BlockIO struct {
	SLBA uint64 // CDW11:CDW10 starting LBA
	// NLB is the block count, 0's based: CDW12 bits 15:0 for Read, Write and
	// Write Zeroes, all of CDW12 for NP Advise.
	NLB          uint32
	FUA          bool  // CDW12 bit 30
	LimitedRetry bool  // CDW12 bit 31
	Deallocate   bool  // CDW12 bit 25 (Write Zeroes DEAC)
	DSM          uint8 // CDW13 bits 7:0 dataset management hints (Read/Write)
}

// Blocks is the number of blocks, NLB+1.
func (b BlockIO) Blocks() uint64 { return uint64(b.NLB) + 1 }

// CheckRange returns LBA Out of Range (DNR) unless the blocks lie inside a
// namespace of nsze blocks.
func (b BlockIO) CheckRange(nsze uint64) error { return CheckLBARange(b.SLBA, b.Blocks(), nsze) }

// CheckLBARange returns LBA Out of Range (DNR) unless [slba, slba+blocks)
// lies inside a namespace of nsze blocks.
func CheckLBARange(slba, blocks, nsze uint64) error {
	if slba >= nsze || blocks > nsze-slba {
		return Errorf(StatusLBAOutOfRange.WithDNR(), "blocks [%d, +%d) beyond the namespace's %d blocks", slba, blocks, nsze)
	}
	return nil
}

func blockIOCommand(op Opcode, nsid uint32, slba uint64, blocks uint32, flags IOFlag, sgl SGLDescriptor) (Command, error) {
	if blocks == 0 || blocks > MaxBlocksPerCommand {
		return Command{}, fmt.Errorf("nvme: %s of %d blocks: a command moves 1 to %d blocks", ioNames[op], blocks, MaxBlocksPerCommand)
	}
	c := Command{Opcode: op, Flags: FlagsSGL, NSID: nsid, DPTR: sgl,
		CDW10: uint32(slba), CDW11: uint32(slba >> 32), CDW12: blocks - 1}
	if flags&FUA != 0 {
		c.CDW12 |= cdw12FUA
	}
	if flags&LimitedRetry != 0 {
		c.CDW12 |= cdw12LR
	}
	if flags&Deallocate != 0 {
		if op != IOWriteZeroes {
			return Command{}, fmt.Errorf("nvme: the deallocate flag applies to write zeroes, not %s", ioNames[op])
		}
		c.CDW12 |= cdw12DEAC
	}
	return c, nil
}

// ReadCommand reads blocks (1..65536) from slba of namespace nsid into the
// buffer sgl describes.
func ReadCommand(nsid uint32, slba uint64, blocks uint32, flags IOFlag, sgl SGLDescriptor) (Command, error) {
	return blockIOCommand(IORead, nsid, slba, blocks, flags, sgl)
}

// WriteCommand writes blocks (1..65536) at slba from the buffer (or the
// in-capsule data) sgl describes. FUA makes it write-through.
func WriteCommand(nsid uint32, slba uint64, blocks uint32, flags IOFlag, sgl SGLDescriptor) (Command, error) {
	return blockIOCommand(IOWrite, nsid, slba, blocks, flags, sgl)
}

// WriteZeroesCommand zeroes blocks (1..65536) at slba; with Deallocate the
// target may deallocate them instead (they read back as zeroes either way).
func WriteZeroesCommand(nsid uint32, slba uint64, blocks uint32, flags IOFlag) (Command, error) {
	return blockIOCommand(IOWriteZeroes, nsid, slba, blocks, flags, NullSGL())
}

// FlushCommand makes every completed write to nsid durable.
func FlushCommand(nsid uint32) Command {
	return Command{Opcode: IOFlush, Flags: FlagsSGL, NSID: nsid, DPTR: NullSGL()}
}

// BlockIO decodes the block I/O fields of c. For NP Advise NLB is the whole
// of CDW12; for the other commands its low 16 bits.
func (c *Command) BlockIO() BlockIO {
	b := BlockIO{
		SLBA:         uint64(c.CDW10) | uint64(c.CDW11)<<32,
		NLB:          c.CDW12 & 0xffff,
		FUA:          c.CDW12&cdw12FUA != 0,
		LimitedRetry: c.CDW12&cdw12LR != 0,
		DSM:          uint8(c.CDW13),
	}
	if c.Opcode == IOWriteZeroes {
		b.Deallocate = c.CDW12&cdw12DEAC != 0
	}
	if c.Opcode == IONPAdvise {
		b = BlockIO{SLBA: b.SLBA, NLB: c.CDW12}
	}
	return b
}

// CheckTransfer validates the data transfer of a command that moves want
// bytes, with a controller limit of maxTransfer bytes (0: none):
//
//   - want > maxTransfer: Invalid Field in Command (DNR), as MDTS requires;
//   - SGL1 length != want: Data SGL Length Invalid (DNR) (too short or too
//     long, as nvmet; this also catches a zero-length SGL).
func (c *Command) CheckTransfer(want, maxTransfer uint64) error {
	if maxTransfer > 0 && want > maxTransfer {
		return Errorf(StatusInvalidField.WithDNR(), "transfer of %d bytes exceeds the controller's limit of %d", want, maxTransfer)
	}
	if got := uint64(c.DPTR.Length()); got != want {
		return Errorf(StatusDataSGLLengthInvalid.WithDNR(), "SGL describes %d bytes, the command moves %d", got, want)
	}
	return nil
}

// CheckReadWrite validates a Read or Write on the controller side against a
// namespace of nsze blocks of lbaSize bytes and a transfer limit (0: none),
// and returns its fields. The statuses, all DNR: Invalid Field in Command
// for a transfer above the limit, Data SGL Length Invalid for an SGL whose
// length is not (NLB+1)*lbaSize, LBA Out of Range for blocks beyond nsze.
func (c *Command) CheckReadWrite(nsze uint64, lbaSize int, maxTransfer uint64) (BlockIO, error) {
	b := c.BlockIO()
	if err := c.CheckTransfer(b.Blocks()*uint64(lbaSize), maxTransfer); err != nil {
		return b, err
	}
	return b, b.CheckRange(nsze)
}

// DSM attribute bits (CDW11 of Dataset Management).
const (
	DSMIntegralRead  uint32 = 1 << 0 // IDR
	DSMIntegralWrite uint32 = 1 << 1 // IDW
	DSMDeallocate    uint32 = 1 << 2 // AD
)

// DSMRangeSize is the size of one Dataset Management range.
const DSMRangeSize = 16

// MaxDSMRanges is the largest number of ranges in one command.
const MaxDSMRanges = 256

// DSMRange is one 16-byte Dataset Management range.
type DSMRange struct {
	Attributes uint32 // @0 context attributes
	Blocks     uint32 // @4 length in logical blocks (1's based)
	SLBA       uint64 // @8 starting LBA
}

// DSMParams are the Dataset Management fields.
type DSMParams struct {
	NR         uint8  // CDW10 bits 7:0: number of ranges, 0's based
	Attributes uint32 // CDW11: DSMIntegralRead | DSMIntegralWrite | DSMDeallocate
}

// Ranges is the number of ranges, NR+1.
func (p DSMParams) Ranges() int { return int(p.NR) + 1 }

// DataLength is the number of bytes of range data the command carries.
func (p DSMParams) DataLength() uint64 { return uint64(p.Ranges()) * DSMRangeSize }

// DatasetManagementCommand builds a Dataset Management command for ranges
// (1..256) ranges with attributes attrs; sgl describes the ranges*16 bytes
// of range data (in the capsule when it fits).
func DatasetManagementCommand(nsid uint32, ranges int, attrs uint32, sgl SGLDescriptor) (Command, error) {
	if ranges < 1 || ranges > MaxDSMRanges {
		return Command{}, fmt.Errorf("nvme: dataset management of %d ranges: a command carries 1 to %d", ranges, MaxDSMRanges)
	}
	return Command{Opcode: IODatasetManagement, Flags: FlagsSGL, NSID: nsid, DPTR: sgl,
		CDW10: uint32(ranges - 1), CDW11: attrs}, nil
}

// DeallocateCommand is Dataset Management with the deallocate attribute:
// trim the ranges.
func DeallocateCommand(nsid uint32, ranges int, sgl SGLDescriptor) (Command, error) {
	return DatasetManagementCommand(nsid, ranges, DSMDeallocate, sgl)
}

// DatasetManagement decodes the Dataset Management fields of c.
func (c *Command) DatasetManagement() DSMParams {
	return DSMParams{NR: uint8(c.CDW10), Attributes: c.CDW11}
}

// MarshalDSMRanges encodes 1..256 ranges.
func MarshalDSMRanges(ranges []DSMRange) ([]byte, error) {
	if len(ranges) < 1 || len(ranges) > MaxDSMRanges {
		return nil, fmt.Errorf("nvme: %d dataset management ranges: a command carries 1 to %d", len(ranges), MaxDSMRanges)
	}
	b := make([]byte, len(ranges)*DSMRangeSize)
	for i, r := range ranges {
		p := b[i*DSMRangeSize:]
		le.PutUint32(p[0:], r.Attributes)
		le.PutUint32(p[4:], r.Blocks)
		le.PutUint64(p[8:], r.SLBA)
	}
	return b, nil
}

// ParseDSMRanges decodes the n (1..256) ranges of a Dataset Management
// command from its data. Data shorter than n ranges is Data SGL Length
// Invalid (DNR); bytes past the n ranges are ignored.
func ParseDSMRanges(b []byte, n int) ([]DSMRange, error) {
	if n < 1 || n > MaxDSMRanges {
		return nil, Errorf(StatusInvalidField.WithDNR(), "%d dataset management ranges: a command carries 1 to %d", n, MaxDSMRanges)
	}
	if len(b) < n*DSMRangeSize {
		return nil, Errorf(StatusDataSGLLengthInvalid.WithDNR(), "dataset management data is %d bytes, %d ranges need %d", len(b), n, n*DSMRangeSize)
	}
	ranges := make([]DSMRange, n)
	for i := range ranges {
		p := b[i*DSMRangeSize:]
		ranges[i] = DSMRange{Attributes: le.Uint32(p[0:]), Blocks: le.Uint32(p[4:]), SLBA: le.Uint64(p[8:])}
	}
	return ranges, nil
}

// CheckRange returns LBA Out of Range (DNR) unless the range lies inside a
// namespace of nsze blocks. A range of 0 blocks is valid and empty.
func (r DSMRange) CheckRange(nsze uint64) error {
	if r.Blocks == 0 {
		if r.SLBA > nsze {
			return Errorf(StatusLBAOutOfRange.WithDNR(), "empty range at block %d beyond the namespace's %d blocks", r.SLBA, nsze)
		}
		return nil
	}
	return CheckLBARange(r.SLBA, uint64(r.Blocks), nsze)
}
