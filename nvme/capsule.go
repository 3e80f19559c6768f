package nvme

import (
	"errors"
	"fmt"
)

// ErrShortCapsule is wrapped by the error ParseCapsule returns for fewer than
// 64 bytes. There is no command identifier to complete, so the transport
// binding drops such a capsule (and counts it) instead of answering.
var ErrShortCapsule = errors.New("capsule shorter than a submission queue entry")

// ICDLimit is the in-capsule data an I/O queue accepts when Identify
// Controller advertises ioccsz (in 16-byte units, SQE included).
func ICDLimit(ioccsz uint32) int {
	if ioccsz < SQESize/16 {
		return 0
	}
	return int(ioccsz)*16 - SQESize
}

// IOCCSZFor is the IOCCSZ value that advertises icd bytes of in-capsule data
// (rounded down to 16 bytes).
func IOCCSZFor(icd int) uint32 { return uint32((SQESize + icd) / 16) }

// MarshalCapsule returns the SQE followed by icd, the in-capsule data. The
// caller sets c.DPTR (InCapsuleSGL(0, len(icd)) for a write carried in the
// capsule).
func MarshalCapsule(c *Command, icd []byte) []byte {
	b := make([]byte, SQESize+len(icd))
	c.MarshalTo(b)
	copy(b[SQESize:], icd)
	return b
}

// ParseCapsule decodes a command capsule: the 64-byte SQE followed by up to
// maxICD bytes of in-capsule data (0 on queues without in-capsule data). It
// returns the command and, when SGL1 is an in-capsule descriptor, the data it
// describes (a subslice of b); bytes after the described range are ignored.
//
// Malformed input gives a *StatusError with the status to complete the
// command with, DNR set:
//
//   - fewer than 64 bytes: Invalid Field, wrapping ErrShortCapsule (no CID:
//     drop it);
//   - more than maxICD bytes after the SQE: Data SGL Length Invalid;
//   - fused commands or a PSDT other than 00b/01b: Invalid Field;
//   - an SGL1 form not supported (see SGLDescriptor.Validate): SGL Descriptor
//     Type Invalid;
//   - in-capsule data for a command that does not move data from host to
//     controller: Invalid Field;
//   - in-capsule offset beyond maxICD: SGL Offset Invalid;
//   - in-capsule offset+length beyond maxICD or the bytes present: Data SGL
//     Length Invalid.
//
// For 64 bytes or more the command is returned with the error, so that the
// caller can complete it by CID.
func ParseCapsule(b []byte, maxICD int) (Command, []byte, error) {
	var c Command
	if len(b) < SQESize {
		return c, nil, &StatusError{
			Status: StatusInvalidField.WithDNR(),
			Detail: fmt.Sprintf("capsule of %d bytes", len(b)),
			Err:    ErrShortCapsule,
		}
	}
	_ = c.Unmarshal(b[:SQESize])
	icd := b[SQESize:]
	if maxICD < 0 {
		maxICD = 0
	}
	if len(icd) > maxICD {
		return c, nil, Errorf(StatusDataSGLLengthInvalid.WithDNR(),
			"capsule carries %d bytes of in-capsule data, the queue accepts %d", len(icd), maxICD)
	}
	if c.Flags&FlagsFuseMask != 0 {
		return c, nil, Errorf(StatusInvalidField.WithDNR(), "fused command (flags 0x%02x) not supported", c.Flags)
	}
	if psdt := c.Flags & FlagsPSDTMask; psdt != 0 && psdt != FlagsSGL {
		return c, nil, Errorf(StatusInvalidField.WithDNR(), "PSDT %db (flags 0x%02x): fabrics commands use SGL1", psdt>>6, c.Flags)
	}
	if err := c.DPTR.Validate(); err != nil {
		return c, nil, err
	}
	if !c.DPTR.InCapsule() {
		return c, nil, nil
	}
	off, n := c.DPTR.Address(), uint64(c.DPTR.Length())
	if n == 0 {
		return c, nil, nil
	}
	if d := c.Direction(); d != HostToController {
		return c, nil, Errorf(StatusInvalidField.WithDNR(), "in-capsule data for opcode 0x%02x, which moves %s", uint8(c.Opcode), d)
	}
	if off > uint64(maxICD) {
		return c, nil, Errorf(StatusSGLOffsetInvalid.WithDNR(), "in-capsule offset %d beyond the queue's limit of %d bytes", off, maxICD)
	}
	if off+n > uint64(maxICD) {
		return c, nil, Errorf(StatusDataSGLLengthInvalid.WithDNR(),
			"in-capsule data [%d, +%d) beyond the queue's limit of %d bytes", off, n, maxICD)
	}
	if off+n > uint64(len(icd)) {
		return c, nil, Errorf(StatusDataSGLLengthInvalid.WithDNR(),
			"in-capsule data [%d, +%d) beyond the %d bytes the capsule carries", off, n, len(icd))
	}
	return c, icd[off : off+n], nil
}
