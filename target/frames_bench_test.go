package target

import (
	"encoding/binary"
	"testing"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nvme"
)

// BenchmarkFrameInstall is the cost of keeping a second copy: a block read
// two-sided copied into a frame with its checksum (docs/np-rdma.md §11).
func BenchmarkFrameInstall(b *testing.B) {
	dev := nprdma.NewDevice(loop.New(), nprdma.WithPinning(false))
	defer dev.Close()
	m, err := newFrameMirror(dev.AllocPD(), 64<<20, 1<<20)
	if err != nil {
		b.Fatal(err)
	}
	defer m.close()
	data := make([]byte, BlockSize)
	gens := make([]uint64, 1)
	b.SetBytes(BlockSize)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		blk := uint64(i) % (1 << 20)
		m.gens(blk, gens)
		m.install(blk, data, gens)
		if i%2 == 1 {
			m.invalidate(blk, 1) // the next install of it copies again
		}
	}
}

// BenchmarkFrameCheck is the host's side: validating a frame it read.
func BenchmarkFrameCheck(b *testing.B) {
	fr := make([]byte, frameSize)
	binary.LittleEndian.PutUint64(fr[nvme.FrameTagOffset:], 3)
	binary.LittleEndian.PutUint64(fr[nvme.FrameVersionOffset:], 2)
	binary.LittleEndian.PutUint64(fr[nvme.FrameSumOffset:], nvme.FrameChecksum(1, 2, 2, fr[nvme.FrameHeaderSize:]))
	b.SetBytes(BlockSize)
	for i := 0; i < b.N; i++ {
		if _, ok := nvme.CheckFrame(1, 2, fr); !ok {
			b.Fatal("a valid frame refused")
		}
	}
}
