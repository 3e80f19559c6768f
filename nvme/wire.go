package nvme

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

var le = binary.LittleEndian

// putPadded writes s into dst, padded with spaces, as the Identify ASCII
// fields (SN, MN, FR) require.
func putPadded(dst []byte, s, field string) error {
	if len(s) > len(dst) {
		return fmt.Errorf("nvme: %s %q is %d bytes, the field holds %d", field, s, len(s), len(dst))
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return fmt.Errorf("nvme: %s %q: byte %d (0x%02x) is not printable ASCII", field, s, i, s[i])
		}
	}
	n := copy(dst, s)
	for i := n; i < len(dst); i++ {
		dst[i] = ' '
	}
	return nil
}

// getPadded reads a space-padded ASCII field. Trailing NULs are trimmed too:
// some controllers pad with them.
func getPadded(b []byte) string {
	return string(bytes.TrimRight(b, " \x00"))
}

// putCString writes s NUL-terminated into dst (the NQN fields). The last byte
// of the field is always NUL.
func putCString(dst []byte, s, field string) error {
	if len(s) > len(dst)-1 {
		return fmt.Errorf("nvme: %s is %d bytes, the field holds at most %d", field, len(s), len(dst)-1)
	}
	if i := bytes.IndexByte([]byte(s), 0); i >= 0 {
		return fmt.Errorf("nvme: %s contains a NUL byte at %d", field, i)
	}
	n := copy(dst, s)
	clear(dst[n:])
	return nil
}

// getCString reads a NUL-terminated field. The last byte is treated as NUL
// whatever it holds (force-termination, as nvmet does), so an unterminated
// field yields at most len(b)-1 bytes.
func getCString(b []byte) string {
	b = b[:len(b)-1]
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
