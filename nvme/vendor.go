package nvme

import (
	"fmt"
	"math/bits"
)

// The NP extension: two commands in vendor specific opcode space that let an
// nprdma initiator read a namespace with one-sided RDMA READs straight out
// of the target's unpinned memory region, and the target's instance in
// Identify Controller's vendor specific area. Stock hosts never send the
// commands and ignore the area. See docs/nvme.md for the protocol.

// NPInstance tells a host whether the target restarted between two of its
// sessions and whether that restart may have lost writes: a target that
// stops without a clean shutdown loses what it acknowledged but had not
// flushed (its volatile write cache), and nothing else. Identify
// Controller @3072 (20 bytes, little-endian):
//
//	@0  u64 BootID: random, fixed for the life of the target process; 0: not reported
//	@8  u64 UncleanStarts: how many times the target started after a run that
//	        did not shut down cleanly (counted in its data directory)
//	@16 u32 Flags (NPInstanceTracked)
type NPInstance struct {
	BootID        uint64
	UncleanStarts uint64
	Flags         uint32
}

// NPInstanceTracked: UncleanStarts is kept durably. Without it (a target
// with no data directory) a host cannot tell a clean restart from a crash.
const NPInstanceTracked uint32 = 1 << 0

func (p *NPInstance) marshal(b []byte) {
	le.PutUint64(b[0:], p.BootID)
	le.PutUint64(b[8:], p.UncleanStarts)
	le.PutUint32(b[16:], p.Flags)
}

func (p *NPInstance) unmarshal(b []byte) {
	p.BootID = le.Uint64(b[0:])
	p.UncleanStarts = le.Uint64(b[8:])
	p.Flags = le.Uint32(b[16:])
}

// RestartedSince reports whether the target of instance p is another
// process than that of prev, and if so whether it may have lost writes
// acknowledged to prev and not flushed: it started after an unclean stop
// since prev, or it cannot tell. Instances not reported (BootID 0) never
// count as a restart.
func (p NPInstance) RestartedSince(prev NPInstance) (restarted, mayHaveLost bool) {
	if p.BootID == 0 || prev.BootID == 0 || p.BootID == prev.BootID {
		return false, false
	}
	tracked := p.Flags&NPInstanceTracked != 0 && prev.Flags&NPInstanceTracked != 0
	return true, !tracked || p.UncleanStarts != prev.UncleanStarts
}

// NPControllerRef names one controller of a target process, for the host
// that made it. Identify Controller @3096 (u64, vendor specific) carries the
// controller's token: random, never 0, fixed for the controller's life, so
// that a reused CNTLID does not name it. A host that gives up on a controller
// whose connection failed names it in the Connect of the admin queue that
// replaces it (ConnectData.Replaces, @768, vendor specific: @0 u64 Token,
// @8 u16 CNTLID); the target then tears the named controller down and fences
// its queues before the new controller serves anything, even when it has not
// noticed the failure itself (a silent link). It acts only on a controller of
// the same subsystem, host NQN and host ID whose token matches; anything else
// is ignored, as stock targets ignore the field.
type NPControllerRef struct {
	Token  uint64 // 0: none
	CNTLID uint16
}

func (r *NPControllerRef) marshal(b []byte) {
	le.PutUint64(b[0:], r.Token)
	le.PutUint16(b[8:], r.CNTLID)
}

func (r *NPControllerRef) unmarshal(b []byte) {
	r.Token = le.Uint64(b[0:])
	r.CNTLID = le.Uint16(b[8:])
}

// Region descriptor formats: 1, the namespace mapped linearly in an
// unpinned region (the software NIC); 2, a frame table (frames.go: real
// RDMA devices).
const (
	RegionDescriptorFormat1 = 1
	RegionDescriptorFormat2 = 2
)

// RegionDescriptorSize is the size of a format 1 region descriptor, and the
// exact data transfer of NP Get Region Descriptor.
const RegionDescriptorSize = 64

// Region descriptor flags.
const (
	// RegionRemoteRead: the region may be read with one-sided RDMA READs
	// using RKey.
	RegionRemoteRead uint16 = 1 << 0
	// RegionUnpinned: pages may be absent; a READ then returns the magic
	// page and the host must reread those blocks with a Read command.
	RegionUnpinned uint16 = 1 << 1
	// RegionAdvise: the controller accepts NP Advise for this namespace.
	RegionAdvise uint16 = 1 << 2
)

// RegionDescriptor tells a host where a namespace lives in the target's
// registered memory (64 bytes, little-endian). Format 1:
//
//	@0  u16 Format (1)
//	@2  u16 Flags (RegionRemoteRead | RegionUnpinned | RegionAdvise)
//	@4  u32 PageSize: granularity of residency, a power of two
//	@8  u64 Address: IOVA of LBA 0 in the region
//	@16 u64 Length: bytes (NSZE * LBASize)
//	@24 u32 RKey: remote key of the region, READ access only
//	@28 u32 LBASize: bytes per logical block, a power of two
//	@32 u64 Magic: the magic page is this value repeated over a page; never 0
//	@40 reserved, zero (24 bytes)
//
// LBA n lives at Address + n*LBASize. Format 2, a frame table (frames.go):
//
//	@0  u16 Format (2)
//	@2  u16 Flags (RegionRemoteRead | RegionAdvise)
//	@4  u32 PageSize: bytes of data per frame, the LBA size
//	@8  u64 Address: IOVA of frame 0
//	@16 u64 Length: bytes of the namespace (NSZE * LBASize)
//	@24 u32 RKey: remote key of the frames and the table, READ access only
//	@28 u32 LBASize
//	@32 u64 TableAddress: IOVA of bucket 0
//	@40 u32 Frames
//	@44 u32 Buckets: a power of two
//	@48 u64 Seed: of the checksums and the bucket hash
//	@56 u32 FrameSize: FrameHeaderSize + LBASize
//	@60 reserved, zero
type RegionDescriptor struct {
	Format   uint16
	Flags    uint16
	PageSize uint32
	Address  uint64
	Length   uint64
	RKey     uint32
	LBASize  uint32
	Magic    uint64 // format 1

	// Format 2.
	TableAddress uint64
	Frames       uint32
	Buckets      uint32
	Seed         uint64
	FrameSize    uint32
}

func (d *RegionDescriptor) check() error {
	switch {
	case d.Format != RegionDescriptorFormat1 && d.Format != RegionDescriptorFormat2:
		return fmt.Errorf("format %d, want %d or %d", d.Format, RegionDescriptorFormat1, RegionDescriptorFormat2)
	case d.PageSize < 512 || d.PageSize > 1<<30 || bits.OnesCount32(d.PageSize) != 1:
		return fmt.Errorf("page size %d is not a power of two in [512, 1 GiB]", d.PageSize)
	case d.LBASize < 512 || d.LBASize > 1<<20 || bits.OnesCount32(d.LBASize) != 1:
		return fmt.Errorf("LBA size %d is not a power of two in [512, 1 MiB]", d.LBASize)
	case d.Length == 0 || d.Length%uint64(d.LBASize) != 0:
		return fmt.Errorf("length %d is not a positive multiple of the LBA size %d", d.Length, d.LBASize)
	case d.Format == RegionDescriptorFormat2:
		return d.checkFrames()
	case d.Address+d.Length < d.Address:
		return fmt.Errorf("region [0x%x, +%d) wraps the address space", d.Address, d.Length)
	case d.Magic == 0:
		return fmt.Errorf("magic is 0: zero pages would all look like faults")
	}
	return nil
}

// Marshal returns the 64-byte descriptor; it fails on a descriptor
// ParseRegionDescriptor would reject.
func (d *RegionDescriptor) Marshal() ([]byte, error) {
	if err := d.check(); err != nil {
		return nil, fmt.Errorf("nvme: region descriptor: %w", err)
	}
	b := make([]byte, RegionDescriptorSize)
	le.PutUint16(b[0:], d.Format)
	le.PutUint16(b[2:], d.Flags)
	le.PutUint32(b[4:], d.PageSize)
	le.PutUint64(b[8:], d.Address)
	le.PutUint64(b[16:], d.Length)
	le.PutUint32(b[24:], d.RKey)
	le.PutUint32(b[28:], d.LBASize)
	if d.Format == RegionDescriptorFormat2 {
		le.PutUint64(b[32:], d.TableAddress)
		le.PutUint32(b[40:], d.Frames)
		le.PutUint32(b[44:], d.Buckets)
		le.PutUint64(b[48:], d.Seed)
		le.PutUint32(b[56:], d.FrameSize)
		return b, nil
	}
	le.PutUint64(b[32:], d.Magic)
	return b, nil
}

// ParseRegionDescriptor decodes and checks a 64-byte descriptor: page and
// LBA sizes powers of two, a non-empty length that is a multiple of the LBA
// size; for format 1 a region that does not wrap and a non-zero magic; for
// format 2 a frame table that fits the address space and its encoding.
func ParseRegionDescriptor(b []byte) (RegionDescriptor, error) {
	if len(b) != RegionDescriptorSize {
		return RegionDescriptor{}, fmt.Errorf("nvme: region descriptor is %d bytes, want %d", len(b), RegionDescriptorSize)
	}
	d := RegionDescriptor{
		Format:   le.Uint16(b[0:]),
		Flags:    le.Uint16(b[2:]),
		PageSize: le.Uint32(b[4:]),
		Address:  le.Uint64(b[8:]),
		Length:   le.Uint64(b[16:]),
		RKey:     le.Uint32(b[24:]),
		LBASize:  le.Uint32(b[28:]),
	}
	if d.Format == RegionDescriptorFormat2 {
		d.TableAddress, d.Frames, d.Buckets = le.Uint64(b[32:]), le.Uint32(b[40:]), le.Uint32(b[44:])
		d.Seed, d.FrameSize = le.Uint64(b[48:]), le.Uint32(b[56:])
	} else {
		d.Magic = le.Uint64(b[32:])
	}
	if err := d.check(); err != nil {
		return RegionDescriptor{}, fmt.Errorf("nvme: region descriptor: %w", err)
	}
	return d, nil
}

// Blocks is the namespace size in logical blocks.
func (d *RegionDescriptor) Blocks() uint64 { return d.Length / uint64(d.LBASize) }

// BlockAddress is the remote address of block lba, or false if lba is
// beyond the region.
func (d *RegionDescriptor) BlockAddress(lba uint64) (uint64, bool) {
	if lba >= d.Blocks() {
		return 0, false
	}
	return d.Address + lba*uint64(d.LBASize), true
}

// NPGetRegionDescriptorCommand asks for the region descriptor of namespace
// nsid; sgl describes a RegionDescriptorSize buffer. CDW10 bits 7:0 hold
// the highest format the host reads: 2, both formats of this package. A
// controller answers in a format no higher.
func NPGetRegionDescriptorCommand(nsid uint32, sgl SGLDescriptor) Command {
	return Command{Opcode: AdminNPGetRegionDescriptor, Flags: FlagsSGL, NSID: nsid, DPTR: sgl, CDW10: RegionDescriptorFormat2}
}

// RegionDescriptorFormat is the highest format NP Get Region Descriptor
// asks for.
func (c *Command) RegionDescriptorFormat() uint8 { return uint8(c.CDW10) }

// CheckNPGetRegionDescriptor validates NP Get Region Descriptor on the
// controller side: a format other than 1 or 2 is Invalid Field in Command,
// an SGL length other than RegionDescriptorSize is Data SGL Length Invalid
// (both DNR). Whether the namespace exists and is exported, and in which
// format, stays with the caller.
func (c *Command) CheckNPGetRegionDescriptor() error {
	if f := c.RegionDescriptorFormat(); f != RegionDescriptorFormat1 && f != RegionDescriptorFormat2 {
		return Errorf(StatusInvalidField.WithDNR(), "region descriptor format %d not supported", f)
	}
	return c.CheckTransfer(RegionDescriptorSize, 0)
}

// MaxAdviseBlocks is the largest block count of one NP Advise (NLB is all
// 32 bits of CDW12, 0's based).
const MaxAdviseBlocks = 1 << 32

// NPAdviseCommand asks the target to make blocks of namespace nsid starting
// at slba resident (prefetch). It moves no data and completes once the work
// is queued.
func NPAdviseCommand(nsid uint32, slba uint64, blocks uint64) (Command, error) {
	if blocks == 0 || blocks > MaxAdviseBlocks {
		return Command{}, fmt.Errorf("nvme: np advise of %d blocks: a command covers 1 to %d", blocks, uint64(MaxAdviseBlocks))
	}
	return Command{Opcode: IONPAdvise, Flags: FlagsSGL, NSID: nsid, DPTR: NullSGL(),
		CDW10: uint32(slba), CDW11: uint32(slba >> 32), CDW12: uint32(blocks - 1)}, nil
}
