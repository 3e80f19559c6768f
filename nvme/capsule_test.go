package nvme

import (
	"bytes"
	"errors"
	"testing"
)

func mustWrite(t testing.TB, slba uint64, blocks uint32, sgl SGLDescriptor) Command {
	t.Helper()
	c, err := WriteCommand(1, slba, blocks, 0, sgl)
	if err != nil {
		t.Fatal(err)
	}
	c.CID = 42
	return c
}

func TestParseCapsuleValid(t *testing.T) {
	data := seqBytes(4096)
	w := mustWrite(t, 8, 8, InCapsuleSGL(0, 4096))
	c, icd, err := ParseCapsule(MarshalCapsule(&w, data), 8192)
	if err != nil {
		t.Fatal(err)
	}
	if c != w || !bytes.Equal(icd, data) {
		t.Fatalf("in-capsule write: command %+v, %d bytes", c, len(icd))
	}

	// Offset into the in-capsule area; trailing bytes ignored.
	w = mustWrite(t, 0, 1, InCapsuleSGL(512, 512))
	c, icd, err = ParseCapsule(MarshalCapsule(&w, data[:2048]), 8192)
	if err != nil || !bytes.Equal(icd, data[512:1024]) {
		t.Fatalf("offset ICD: %v, %d bytes", err, len(icd))
	}

	// Keyed read on the admin queue (no ICD).
	sgl, _ := KeyedSGLInvalidate(0x7f0000001000, 4096, 0x1234)
	id := IdentifyCommand(CNSController, 0, sgl)
	c, icd, err = ParseCapsule(id.Marshal(), 0)
	if err != nil || icd != nil || c != id {
		t.Fatalf("identify: %v %v", err, icd)
	}

	// A zero-length in-capsule descriptor on a read is fine: nothing moves.
	f := FlushCommand(1)
	f.DPTR = InCapsuleSGL(0, 0)
	if _, icd, err = ParseCapsule(f.Marshal(), 0); err != nil || icd != nil {
		t.Fatalf("zero-length ICD: %v", err)
	}

	// PSDT 00b is tolerated (nvmet does).
	f.Flags = 0
	if _, _, err = ParseCapsule(f.Marshal(), 0); err != nil {
		t.Fatalf("PSDT 00b: %v", err)
	}
}

func TestParseCapsuleMalformed(t *testing.T) {
	keyed, _ := KeyedSGL(0x1000, 4096, 1)
	write := func(sgl SGLDescriptor) Command { return mustWrite(t, 0, 8, sgl) }
	withFlags := func(f uint8) Command { c := write(keyed); c.Flags = f; return c }
	withSGLID := func(id uint8) Command { d := keyed; d[15] = id; return write(d) }
	read, _ := ReadCommand(1, 0, 1, 0, InCapsuleSGL(0, 512))
	read.CID = 42

	cases := []struct {
		name   string
		cmd    Command
		icd    int
		maxICD int
		want   Status
	}{
		{"ICD beyond the queue limit", write(InCapsuleSGL(0, 4096)), 4096, 1024, StatusDataSGLLengthInvalid},
		{"ICD on a queue without ICD", write(InCapsuleSGL(0, 512)), 512, 0, StatusDataSGLLengthInvalid},
		{"fused", withFlags(FlagsSGL | 1), 0, 0, StatusInvalidField},
		{"PSDT 10b", withFlags(0x80), 0, 0, StatusInvalidField},
		{"PSDT 11b", withFlags(0xc0), 0, 0, StatusInvalidField},
		{"data block address", withSGLID(0x00), 0, 0, StatusSGLDescriptorTypeInvalid},
		{"bit bucket", withSGLID(0x10), 0, 0, StatusSGLDescriptorTypeInvalid},
		{"last segment", withSGLID(0x30), 0, 0, StatusSGLDescriptorTypeInvalid},
		{"keyed, offset subtype", withSGLID(0x41), 0, 0, StatusSGLDescriptorTypeInvalid},
		{"type 6", withSGLID(0x60), 0, 0, StatusSGLDescriptorTypeInvalid},
		{"ICD for a read", read, 512, 4096, StatusInvalidField},
		{"ICD offset beyond the limit", write(InCapsuleSGL(8192, 16)), 16, 4096, StatusSGLOffsetInvalid},
		{"ICD length beyond the limit", write(InCapsuleSGL(0, 8192)), 4096, 4096, StatusDataSGLLengthInvalid},
		{"ICD length beyond the bytes present", write(InCapsuleSGL(0, 4096)), 4095, 8192, StatusDataSGLLengthInvalid},
		{"ICD offset+length beyond the bytes present", write(InCapsuleSGL(1, 4096)), 4096, 8192, StatusDataSGLLengthInvalid},
		{"ICD offset wraps", write(InCapsuleSGL(^uint64(0), 2)), 16, 8192, StatusSGLOffsetInvalid},
	}
	for _, tc := range cases {
		b := MarshalCapsule(&tc.cmd, make([]byte, tc.icd))
		c, icd, err := ParseCapsule(b, tc.maxICD)
		var se *StatusError
		if !errors.As(err, &se) {
			t.Errorf("%s: error %v, want a *StatusError", tc.name, err)
			continue
		}
		if se.Status != tc.want.WithDNR() {
			t.Errorf("%s: %v, want %v", tc.name, se.Status, tc.want.WithDNR())
		}
		if c.CID != 42 || icd != nil {
			t.Errorf("%s: CID %d (want 42 to complete it), data %d bytes", tc.name, c.CID, len(icd))
		}
	}
}

func TestParseCapsuleShort(t *testing.T) {
	for _, n := range []int{0, 1, 63} {
		_, _, err := ParseCapsule(make([]byte, n), 4096)
		if !errors.Is(err, ErrShortCapsule) || StatusOf(err) != StatusInvalidField.WithDNR() {
			t.Errorf("%d bytes: %v", n, err)
		}
	}
}

func TestICDLimit(t *testing.T) {
	if ICDLimit(4) != 0 || ICDLimit(0) != 0 || ICDLimit(260) != 4096 {
		t.Errorf("ICDLimit: %d %d %d", ICDLimit(4), ICDLimit(0), ICDLimit(260))
	}
	if IOCCSZFor(4096) != 260 || IOCCSZFor(0) != 4 {
		t.Errorf("IOCCSZFor: %d %d", IOCCSZFor(4096), IOCCSZFor(0))
	}
}
