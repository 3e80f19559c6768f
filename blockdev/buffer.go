package blockdev

import "unsafe"

// AlignedBuffer returns a zeroed n-byte slice whose first byte is aligned to
// PageSize, as O_DIRECT requires. It lives on the Go heap (which does not move
// objects), so it needs no explicit release.
func AlignedBuffer(n int) []byte {
	if n == 0 {
		return []byte{}
	}
	raw := make([]byte, n+PageSize)
	shift := (PageSize - int(uintptr(unsafe.Pointer(&raw[0]))%PageSize)) % PageSize
	return raw[shift : shift+n : shift+n]
}

// IsAligned reports whether p starts at a multiple of align bytes.
func IsAligned(p []byte, align int) bool {
	if len(p) == 0 {
		return true
	}
	return uintptr(unsafe.Pointer(&p[0]))%uintptr(align) == 0
}
