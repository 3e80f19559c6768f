package nvme

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

func sampleFrames() RegionDescriptor {
	return RegionDescriptor{Format: RegionDescriptorFormat2, Flags: RegionRemoteRead, PageSize: 4096,
		Address: 0x7f00_0000_0000, Length: 1 << 30, RKey: 0x1234, LBASize: 4096,
		TableAddress: 0x7f10_0000_0000, Frames: 1000, Buckets: 512, Seed: 0xfeed_f00d_dead_beef, FrameSize: FrameHeaderSize + 4096}
}

func TestFrameDescriptorRoundTrip(t *testing.T) {
	d := sampleFrames()
	b, err := d.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseRegionDescriptor(b)
	if err != nil || got != d {
		t.Fatalf("round trip: %+v, %v; want %+v", got, err, d)
	}
	if got.FrameAddress(2) != d.Address+2*4160 || got.BucketAddress(3) != d.TableAddress+3*64 {
		t.Fatalf("addresses %#x %#x", got.FrameAddress(2), got.BucketAddress(3))
	}
	for name, bad := range map[string]func(*RegionDescriptor){
		"no frames":        func(d *RegionDescriptor) { d.Frames = 0 },
		"too many frames":  func(d *RegionDescriptor) { d.Frames = MaxFrames + 1 },
		"buckets not pow2": func(d *RegionDescriptor) { d.Buckets = 500 },
		"frame size":       func(d *RegionDescriptor) { d.FrameSize = 4096 },
		"data size":        func(d *RegionDescriptor) { d.PageSize = 8192 },
		"frames wrap":      func(d *RegionDescriptor) { d.Address = ^uint64(0) - 100 },
		"table wraps":      func(d *RegionDescriptor) { d.TableAddress = ^uint64(0) - 100 },
		"too many blocks":  func(d *RegionDescriptor) { d.Length = (MaxFrameBlock + 2) * 4096 },
		"format":           func(d *RegionDescriptor) { d.Format = 3 },
	} {
		d := sampleFrames()
		bad(&d)
		if _, err := d.Marshal(); err == nil {
			t.Errorf("%s: marshalled", name)
		}
	}
}

func TestFrameEntryAndBucket(t *testing.T) {
	for _, c := range []struct {
		block uint64
		frame uint32
	}{{0, 0}, {1, 1}, {MaxFrameBlock, MaxFrames}, {12345, 678}} {
		b, f, ok := ParseFrameEntry(FrameEntry(c.block, c.frame))
		if !ok || b != c.block || f != c.frame {
			t.Errorf("entry %+v: %d %d %v", c, b, f, ok)
		}
	}
	if _, _, ok := ParseFrameEntry(0); ok {
		t.Error("empty entry parsed")
	}
	bucket := make([]byte, FrameBucketSize)
	le.PutUint64(bucket[16:], FrameEntry(42, 7))
	le.PutUint64(bucket[56:], FrameEntry(43, 9))
	if f, ok := FindInBucket(bucket, 43); !ok || f != 9 {
		t.Errorf("block 43: %d %v", f, ok)
	}
	if _, ok := FindInBucket(bucket, 44); ok {
		t.Error("block 44 found")
	}
	// The hash spreads consecutive blocks over the buckets.
	used := map[uint32]int{}
	for b := uint64(0); b < 4096; b++ {
		used[FrameBucket(99, b, 1024)]++
	}
	if len(used) < 900 {
		t.Errorf("4096 consecutive blocks use %d of 1024 buckets", len(used))
	}
}

// A frame is accepted only whole, stable, of its block and version: every
// mix of two versions' cache lines, an odd version, another block's tag and
// an empty frame are refused.
func TestCheckFrame(t *testing.T) {
	const seed, block = 77, 1234
	frame := func(tag, v uint64, data []byte) []byte {
		f := make([]byte, FrameHeaderSize+len(data))
		le.PutUint64(f[FrameTagOffset:], tag)
		le.PutUint64(f[FrameVersionOffset:], v)
		le.PutUint64(f[FrameSumOffset:], FrameChecksum(seed, tag-1, v, data))
		copy(f[FrameHeaderSize:], data)
		return f
	}
	rng := rand.New(rand.NewPCG(1, 2))
	old, new := make([]byte, 4096), make([]byte, 4096)
	for i := range old {
		old[i], new[i] = byte(rng.Uint32()), byte(rng.Uint32())
	}
	fo, fn := frame(block+1, 4, old), frame(block+1, 6, new)
	if d, ok := CheckFrame(seed, block, fo); !ok || !bytes.Equal(d, old) {
		t.Fatal("a stable frame refused")
	}
	if _, ok := CheckFrame(seed, block+1, fo); ok {
		t.Error("another block's frame accepted")
	}
	if _, ok := CheckFrame(seed+1, block, fo); ok {
		t.Error("a frame of another seed accepted")
	}
	odd := frame(block+1, 5, old)
	if _, ok := CheckFrame(seed, block, odd); ok {
		t.Error("a frame being changed accepted")
	}
	if _, ok := CheckFrame(seed, block, make([]byte, FrameHeaderSize+4096)); ok {
		t.Error("an empty frame accepted")
	}
	// Torn reads: any set of the 65 cache lines from the new frame, the
	// rest from the old one.
	for i := 0; i < 2000; i++ {
		mix := append([]byte(nil), fo...)
		n := 0
		for line := 0; line < len(mix)/64; line++ {
			if rng.IntN(2) == 0 {
				copy(mix[line*64:], fn[line*64:(line+1)*64])
				n++
			}
		}
		if n == 0 || n == len(mix)/64 {
			continue
		}
		if _, ok := CheckFrame(seed, block, mix); ok {
			t.Fatalf("a frame torn between two versions (%d lines new) accepted", n)
		}
	}
}
