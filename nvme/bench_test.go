package nvme

import "testing"

// Benchmarks of the per-command codec work on the data path (not timing
// assertions: see docs/nvme.md for a reading).

func BenchmarkParseCapsuleKeyedRead(b *testing.B) {
	sgl, _ := KeyedSGLInvalidate(0x7f0000001000, 4096, 0x1234)
	c, _ := ReadCommand(1, 8, 1, 0, sgl)
	capsule := c.Marshal()
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := ParseCapsule(capsule, 8192); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseCapsuleInCapsuleWrite(b *testing.B) {
	c, _ := WriteCommand(1, 8, 1, 0, InCapsuleSGL(0, 4096))
	capsule := MarshalCapsule(&c, make([]byte, 4096))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := ParseCapsule(capsule, 8192); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCompletionMarshalTo(b *testing.B) {
	c := Completion{CID: 1, SQID: 1, SQHD: 5}
	buf := make([]byte, CQESize)
	b.ReportAllocs()
	for b.Loop() {
		c.MarshalTo(buf)
	}
}
