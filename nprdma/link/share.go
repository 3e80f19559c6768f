package link

import (
	"encoding/binary"
	"math/bits"
	"os"
)

// What links that share memory with the peer (nprdma/shm) implement.

// LocalReader is implemented by links whose peer lets this side read some of
// its unpinned regions in place (nprdma/shm: the peer's memory is mapped
// here). A READ of such a region is then executed by the requester itself
// when it is posted: page by page under the pager's seqlock, the magic page
// in place of every page that could not be read, exactly what the peer's
// NIC engine would have delivered; no packet is sent and the peer's CPU
// takes no part. Its completion still comes in posting order.
type LocalReader interface {
	// ReadLocal copies [addr, addr+len) of the peer's region rkey into the
	// concatenation of dst (whose lengths sum to len). ok is false, with dst
	// unspecified, when the link cannot: the region is not shared with it,
	// the range is not inside it, or the share was revoked. The READ then
	// goes to the peer like any other, whose NIC engine decides.
	ReadLocal(rkey uint32, addr uint64, dst [][]byte) (r LocalRead, ok bool)
}

// LocalRead is what a READ executed by the requester (LocalReader) did.
type LocalRead struct {
	Pages int // pages of the region touched
	Magic int // of which delivered as the magic page
}

// RegionSharer is implemented by links that can let the peer read an
// unpinned region in place (nprdma/shm). The queue pair offers the link a
// region the first time the peer's READ of it passes the NIC engine's
// checks on this queue pair (key, protection domain, access tag, right,
// bounds), if the region's pager is a SharedPager.
type RegionSharer interface {
	// ShareRegion passes the region to the peer. The returned revoke, called
	// when the region is deregistered, must make sure that no READ the peer
	// executes in place completes successfully after it returns (a fence the
	// peer checks after every copy); it may be called after the link is
	// down. ok is false when the link declines.
	ShareRegion(r SharedRegion) (revoke func(), ok bool)
}

// SharedRegion is an unpinned region a link passes to its peer.
type SharedRegion struct {
	RKey     uint32
	Addr     uint64 // the region's address, as the peer names it in READs
	Len      int
	PageSize int
	Magic    uint64
	// Data, States and Access come from the pager (SharedPager.ShareFiles);
	// the link passes them on and keeps no reference once ShareRegion
	// returns.
	Data, States, Access *os.File
	Bits                 StateBits
}

// StateBits locates the fields of a pager's page state word that a reader
// in another process checks.
type StateBits struct {
	Present, Busy, Zero uint64 // masks
	VersionShift        uint   // the version is the word shifted right by this
}

// FillMagic writes into dst the bytes the magic page holds from region
// offset at on (byte k of a page is byte k mod 8 of magic, little endian):
// what a READ delivers for a part of a page it could not read. A provider
// that executes READs itself (LocalReader) uses it, and the NIC engine.
func FillMagic(dst []byte, magic uint64, at int) {
	p := bits.RotateLeft64(magic, -8*(at%8))
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		binary.LittleEndian.PutUint64(dst[i:], p)
	}
	for k := 0; i < len(dst); i, k = i+1, k+1 {
		dst[i] = byte(p >> (8 * k))
	}
}
