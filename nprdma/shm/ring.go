package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/nprdma/nprdma/nprdma/link"
)

// The ring file: one memfd per queue pair, created and sealed by the
// listener's side and mapped shared by both processes.
//
//	[0, 4096)            control page: the two directions' indices and flags,
//	                     then the fence words of regions shared in place
//	[4096, 4096+R)       ring 0: dialer → listener
//	[4096+R, 4096+2R)    ring 1: listener → dialer
//
// Each ring is a byte stream (single producer, single consumer) of packets:
// a 48-byte header (packetHeaderLen), the payload, and padding to 8 bytes.
// tail counts the bytes the producer has written, head those the consumer
// has read; both only grow, and tail−head ≤ R. The peer can write anything
// into the memory it shares, so every index and header read from it is
// checked before use, and read once.

const (
	controlSize = 4096
	// dirStride separates the two directions' control blocks; within one,
	// the fields sit on separate cache lines: tail (the producer's), head
	// (the consumer's), consumer sleeping, producer waiting.
	dirStride     = 256
	offTail       = 0
	offHead       = 64
	offRxSleeping = 128
	offTxWaiting  = 192
	// Fence words (uint32, one per region shared in place; 0 live, 1
	// revoked): each side owns half of [fenceBase, controlSize) for the
	// regions it shares.
	fenceBase  = 1024
	fenceSlots = (controlSize - fenceBase) / 4 / 2

	// DefaultRingSize is the bytes of each direction's ring.
	DefaultRingSize = 1 << 20
	minRingSize     = 64 << 10
	maxRingSize     = 64 << 20
)

// ringFileSize is the size of a ring file with rings of n bytes.
func ringFileSize(n int) int { return controlSize + 2*n }

// ring is one direction of a ring file as one side sees it.
type ring struct {
	data                  []byte // R bytes, R a power of two
	mask                  uint64
	tail, head            *uint64
	rxSleeping, txWaiting *uint32
}

func newRing(file []byte, size, dir int) ring {
	c := unsafe.Pointer(&file[dir*dirStride])
	return ring{
		data:       file[controlSize+dir*size : controlSize+(dir+1)*size : controlSize+(dir+1)*size],
		mask:       uint64(size - 1),
		tail:       (*uint64)(unsafe.Add(c, offTail)),
		head:       (*uint64)(unsafe.Add(c, offHead)),
		rxSleeping: (*uint32)(unsafe.Add(c, offRxSleeping)),
		txWaiting:  (*uint32)(unsafe.Add(c, offTxWaiting)),
	}
}

// fences returns the fence words the side that dialed (dialer) or
// listened owns, in file.
func fences(file []byte, dialer bool) []uint32 {
	off := fenceBase
	if !dialer {
		off += fenceSlots * 4
	}
	return unsafe.Slice((*uint32)(unsafe.Pointer(&file[off])), fenceSlots)
}

var errRingIndex = errors.New("ring indices out of bounds")

// producer is the writing end of a ring; pos is its own tail (the copy in
// shared memory is only ever written from it).
type producer struct {
	ring
	pos uint64
}

// space is how many bytes may be written now.
func (p *producer) space() (int, error) {
	h := atomic.LoadUint64(p.head)
	used := p.pos - h
	if used > uint64(len(p.data)) {
		return 0, fmt.Errorf("%w: %w: head %d, tail %d", link.ErrProtocol, errRingIndex, h, p.pos)
	}
	return len(p.data) - int(used), nil
}

// put copies b at the tail; the caller checked the space. It does not
// publish.
func (p *producer) put(b []byte) {
	for len(b) > 0 {
		at := p.pos & p.mask
		n := copy(p.data[at:], b)
		b = b[n:]
		p.pos += uint64(n)
	}
}

// zero writes n zero bytes (padding).
func (p *producer) zero(n int) {
	for n > 0 {
		at := p.pos & p.mask
		k := min(n, len(p.data)-int(at))
		clear(p.data[at : at+uint64(k)])
		n -= k
		p.pos += uint64(k)
	}
}

// publish makes what was put visible to the consumer.
func (p *producer) publish() { atomic.StoreUint64(p.tail, p.pos) }

// consumer is the reading end of a ring; pos is its own head.
type consumer struct {
	ring
	pos uint64
}

// available is how many bytes may be read now.
func (c *consumer) available() (int, error) {
	t := atomic.LoadUint64(c.tail)
	n := t - c.pos
	if n > uint64(len(c.data)) {
		return 0, fmt.Errorf("%w: %w: head %d, tail %d", link.ErrProtocol, errRingIndex, c.pos, t)
	}
	return int(n), nil
}

// take copies len(dst) bytes from the head (the caller checked they are
// there) and does not release them.
func (c *consumer) take(dst []byte) {
	for len(dst) > 0 {
		at := c.pos & c.mask
		n := copy(dst, c.data[at:])
		dst = dst[n:]
		c.pos += uint64(n)
	}
}

// release gives what was taken back to the producer.
func (c *consumer) release() { atomic.StoreUint64(c.head, c.pos) }

// Packet headers in a ring. All integers little endian.
//
//	0 kind u8 (link.PacketKind 1..7, or kindEnd), 1 flags u8, 2 syndrome u8,
//	3 reserved u8, 4 seq u32, 8 len u32, 12 imm u32, 16 rkey u32,
//	20 offset u32, 24 addr u64, 32 pattern u64, 40 ack u32, 44 reserved u32
//
// then PayloadLen() payload bytes, then zeros up to a multiple of 8.
const (
	packetHeaderLen = 48
	// kindEnd ends the stream: the sender closed its link gracefully.
	kindEnd = 8

	flagImm  = 1 << 0
	flagLast = 1 << 1
	flagFill = 1 << 2
	flagAck  = 1 << 3
)

// encodeHeader writes h into b (packetHeaderLen bytes); kind kindEnd is the
// end of the stream.
func encodeHeader(b []byte, h *link.Header) {
	_ = b[packetHeaderLen-1]
	clear(b[:packetHeaderLen])
	b[0] = byte(h.Kind)
	var f byte
	if h.HasImm {
		f |= flagImm
	}
	if h.Last {
		f |= flagLast
	}
	if h.Fill {
		f |= flagFill
	}
	if h.HasAck {
		f |= flagAck
	}
	b[1] = f
	b[2] = byte(h.Syndrome)
	le := binary.LittleEndian
	le.PutUint32(b[4:], h.Seq)
	le.PutUint32(b[8:], h.Len)
	le.PutUint32(b[12:], h.Imm)
	le.PutUint32(b[16:], h.RKey)
	le.PutUint32(b[20:], h.Offset)
	le.PutUint64(b[24:], h.Addr)
	le.PutUint64(b[32:], h.Pattern)
	le.PutUint32(b[40:], h.Ack)
}

var errHeader = errors.New("bad packet header")

// decodeHeader parses a header written by a peer, refusing anything
// encodeHeader would not produce for a valid packet. end reports the end
// of the stream.
func decodeHeader(b []byte, h *link.Header) (end bool, err error) {
	if len(b) < packetHeaderLen {
		return false, fmt.Errorf("%w: %d bytes", errHeader, len(b))
	}
	le := binary.LittleEndian
	kind, f, syn := b[0], b[1], link.Syndrome(b[2])
	if b[3] != 0 || le.Uint32(b[44:]) != 0 {
		return false, fmt.Errorf("%w: reserved bytes set", errHeader)
	}
	*h = link.Header{
		Kind: link.PacketKind(kind), Seq: le.Uint32(b[4:]), Len: le.Uint32(b[8:]), Imm: le.Uint32(b[12:]),
		RKey: le.Uint32(b[16:]), Offset: le.Uint32(b[20:]), Addr: le.Uint64(b[24:]), Pattern: le.Uint64(b[32:]),
		Ack: le.Uint32(b[40:]), Syndrome: syn,
		HasImm: f&flagImm != 0, Last: f&flagLast != 0, Fill: f&flagFill != 0, HasAck: f&flagAck != 0,
	}
	// Which flags and fields each kind may carry; everything else must be 0.
	var flags byte
	var fields uint8 // 1 len, 2 imm, 4 rkey+addr, 8 offset, 16 pattern, 32 ack
	switch kind {
	case byte(link.PacketSend):
		flags, fields = flagImm|flagAck, 1|2|32
	case byte(link.PacketWrite):
		flags, fields = flagImm|flagAck, 1|2|4|32
	case byte(link.PacketReadRequest):
		flags, fields = flagAck, 1|4|32
	case byte(link.PacketReadResponse):
		flags, fields = flagLast|flagFill, 1|8
		if h.Fill {
			fields |= 16
		}
	case byte(link.PacketAck), byte(link.PacketDisconnect), kindEnd:
	case byte(link.PacketNak):
		if syn < link.NakRNR || syn > link.NakRemoteOperation {
			return false, fmt.Errorf("%w: NAK syndrome %d", errHeader, syn)
		}
	default:
		return false, fmt.Errorf("%w: kind %d", errHeader, kind)
	}
	if kind != byte(link.PacketNak) && syn != 0 {
		return false, fmt.Errorf("%w: syndrome %d on kind %d", errHeader, syn, kind)
	}
	if f&^flags != 0 {
		return false, fmt.Errorf("%w: flags %#x on kind %d", errHeader, f, kind)
	}
	if f&flagImm == 0 {
		fields &^= 2
	}
	if f&flagAck == 0 {
		fields &^= 32
	}
	zeroUnless := func(bit uint8, v uint64, name string) error {
		if fields&bit == 0 && v != 0 {
			return fmt.Errorf("%w: %s %d on kind %d", errHeader, name, v, kind)
		}
		return nil
	}
	if err := errors.Join(zeroUnless(1, uint64(h.Len), "len"), zeroUnless(2, uint64(h.Imm), "imm"),
		zeroUnless(4, uint64(h.RKey)|h.Addr, "rkey/addr"), zeroUnless(8, uint64(h.Offset), "offset"),
		zeroUnless(16, h.Pattern, "pattern"), zeroUnless(32, uint64(h.Ack), "ack")); err != nil {
		return false, err
	}
	if h.Len > link.MaxMessageSize || (kind == byte(link.PacketReadResponse) && uint64(h.Offset)+uint64(h.Len) > link.MaxMessageSize) {
		return false, fmt.Errorf("%w: length %d at offset %d beyond %d", errHeader, h.Len, h.Offset, link.MaxMessageSize)
	}
	return kind == kindEnd, nil
}

// paddedLen is n rounded up to 8.
func paddedLen(n int) int { return (n + 7) &^ 7 }
