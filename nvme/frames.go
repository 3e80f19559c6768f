package nvme

import (
	"fmt"
	"hash/crc32"
	"math/bits"
)

// The NP frame table: how a target on a real RDMA device lets hosts read
// a namespace one-sided although it cannot register the namespace's memory
// (a NIC reads only pinned or on-demand-paged memory; docs/np-rdma.md).
// The target keeps copies of blocks in frames of a pinned pool, registered
// once, and a hash table saying which frame holds which block; a host reads
// the table and the frames with RDMA READs and accepts a frame only if it
// proves itself the block's current content. The region descriptor of
// format 2 (RegionDescriptorFormat2) says where both are.
//
// A frame is FrameHeaderSize bytes of header and the block's LBASize bytes:
//
//	@0  u64 Tag: block+1 (0: the frame is empty)
//	@8  u64 Version: even while the frame is stable, odd while the target changes it
//	@16 u64 Sum: FrameChecksum(Seed, block, Version, data)
//	@24 reserved (40 bytes)
//	@64 data
//
// A bucket is FrameBucketSize bytes: FrameBucketEntries u64 entries, each
// FrameEntry(block, frame) or 0. Block b is looked for in bucket
// FrameBucket(Seed, b, Buckets). The table is a hint: what proves a frame
// is its header and checksum.
//
// The target changes a frame with CPU stores only: Version odd, then Tag and
// the data, then Sum, then Version even (one more). It empties a frame the
// same way with Tag 0, before it acknowledges any write of the block. A
// host accepts a frame read with one RDMA READ only if Version is even, Tag
// is the block's, and Sum matches what it computes over the data it read:
// a READ that overlapped a change (sampling some cache lines before it and
// some after, in any order) sees an odd version or a checksum that does
// not match, except with a probability of about 2^-64 (the checksum is two
// 32-bit CRCs of different polynomials, seeded per target start).

// Sizes of the frame table.
const (
	FrameHeaderSize    = 64
	FrameBucketSize    = 64
	FrameBucketEntries = FrameBucketSize / 8
	// MaxFrames is the most frames a table can address (24 bits).
	MaxFrames = 1<<24 - 1
	// MaxFrameBlock bounds the blocks a table can name (40 bits).
	MaxFrameBlock = 1<<40 - 2
)

// Offsets of a frame header's fields.
const (
	FrameTagOffset     = 0
	FrameVersionOffset = 8
	FrameSumOffset     = 16
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// FrameChecksum is the checksum of data as the content of block at version
// v.
func FrameChecksum(seed, block, v uint64, data []byte) uint64 {
	var h [16]byte
	le.PutUint64(h[0:], block)
	le.PutUint64(h[8:], v)
	lo := crc32.Update(uint32(seed), castagnoli, h[:])
	lo = crc32.Update(lo, castagnoli, data)
	hi := crc32.Update(uint32(seed>>32), crc32.IEEETable, h[:])
	hi = crc32.Update(hi, crc32.IEEETable, data)
	return uint64(hi)<<32 | uint64(lo)
}

// FrameBucket is the bucket of block in a table of buckets buckets (a
// power of two).
func FrameBucket(seed, block uint64, buckets uint32) uint32 {
	x := block ^ seed
	// The splitmix64 finalizer: every bit of the block moves the bucket.
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return uint32(x) & (buckets - 1)
}

// FrameEntry is a bucket entry saying that frame holds block (block at
// most MaxFrameBlock, frame at most MaxFrames).
func FrameEntry(block uint64, frame uint32) uint64 { return (block+1)<<24 | uint64(frame) }

// ParseFrameEntry decodes a bucket entry; ok is false for an empty one.
func ParseFrameEntry(e uint64) (block uint64, frame uint32, ok bool) {
	if e>>24 == 0 {
		return 0, 0, false
	}
	return e>>24 - 1, uint32(e & MaxFrames), true
}

// FindInBucket returns the frame a bucket's bytes name for block.
func FindInBucket(bucket []byte, block uint64) (uint32, bool) {
	for i := 0; i+8 <= len(bucket) && i < FrameBucketSize; i += 8 {
		if b, f, ok := ParseFrameEntry(le.Uint64(bucket[i:])); ok && b == block {
			return f, true
		}
	}
	return 0, false
}

// CheckFrame returns the block's data from a frame read with one RDMA READ
// (FrameHeaderSize + the block's size bytes), or false when the frame does
// not prove itself block's current content: empty, another block's, being
// changed, or torn.
func CheckFrame(seed, block uint64, frame []byte) ([]byte, bool) {
	if len(frame) <= FrameHeaderSize {
		return nil, false
	}
	tag := le.Uint64(frame[FrameTagOffset:])
	v := le.Uint64(frame[FrameVersionOffset:])
	if tag != block+1 || v&1 != 0 {
		return nil, false
	}
	data := frame[FrameHeaderSize:]
	if le.Uint64(frame[FrameSumOffset:]) != FrameChecksum(seed, block, v, data) {
		return nil, false
	}
	return data, true
}

// checkFrames validates the format 2 fields of a region descriptor.
func (d *RegionDescriptor) checkFrames() error {
	switch {
	case d.Frames == 0 || d.Frames > MaxFrames:
		return fmt.Errorf("%d frames, want 1 to %d", d.Frames, MaxFrames)
	case d.Buckets == 0 || bits.OnesCount32(d.Buckets) != 1:
		return fmt.Errorf("%d buckets is not a power of two", d.Buckets)
	case d.PageSize != d.LBASize:
		return fmt.Errorf("frame data of %d bytes for blocks of %d", d.PageSize, d.LBASize)
	case d.FrameSize != FrameHeaderSize+d.LBASize:
		return fmt.Errorf("frames of %d bytes, want %d", d.FrameSize, FrameHeaderSize+d.LBASize)
	case d.Length/uint64(d.LBASize) > MaxFrameBlock:
		return fmt.Errorf("%d blocks: a frame table names at most %d", d.Length/uint64(d.LBASize), uint64(MaxFrameBlock))
	case d.Address+uint64(d.Frames)*uint64(d.FrameSize) < d.Address:
		return fmt.Errorf("frames at 0x%x wrap the address space", d.Address)
	case d.TableAddress+uint64(d.Buckets)*FrameBucketSize < d.TableAddress:
		return fmt.Errorf("table at 0x%x wraps the address space", d.TableAddress)
	}
	return nil
}

// FrameAddress is the remote address of frame f.
func (d *RegionDescriptor) FrameAddress(f uint32) uint64 {
	return d.Address + uint64(f)*uint64(d.FrameSize)
}

// BucketAddress is the remote address of bucket i.
func (d *RegionDescriptor) BucketAddress(i uint32) uint64 {
	return d.TableAddress + uint64(i)*FrameBucketSize
}
