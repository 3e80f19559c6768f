package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"

	"github.com/nprdma/nprdma/nprdma/link"
)

// Messages on a queue pair's unix socket (SOCK_SEQPACKET: one message per
// record, descriptors passed with SCM_RIGHTS). The socket carries the
// handshake and the sharing of regions; packets travel in the ring file.
// Its end tells each side that the other is gone, whichever way it went.
//
// Every message starts with an 8-byte prefix: magic u32 "NPSH"
// (0x4853504e), version u16 = 1, type u8, reserved u8 = 0. All integers
// little endian. Then, by type (offsets from the start):
//
//	CONNECT 1  8 qpn u32, 12 pdlen u16, 14 reserved u16             16 + pdlen bytes of private data
//	ACCEPT  2  8 qpn u32, 12 pdlen u16, 14 reserved u16, 16 ring u32 20 + pdlen; descriptors: ring file, 4 doorbells
//	REJECT  3  8 pdlen u16, 10 reserved u16                           12 + pdlen
//	GRANT   4  8 slot u32, 12 rkey u32, 16 addr u64, 24 len u64, 32 page size u32,
//	           36 version shift u32, 40 magic u64, 48 present u64, 56 busy u64,
//	           64 zero u64                                            72; descriptors: data, states, access
//	REVOKE  5  8 slot u32, 12 rkey u32                                16
//	FIN     6  (nothing: the sender's END is in its ring)             8
const (
	msgMagic   = 0x4853504e
	msgVersion = 1

	msgConnect = 1
	msgAccept  = 2
	msgReject  = 3
	msgGrant   = 4
	msgRevoke  = 5
	msgFin     = 6

	msgPrefixLen = 8
	// maxMessage bounds a message (the largest is an ACCEPT with the
	// largest private data).
	maxMessage = 20 + link.MaxPrivateData
	// Descriptors a message carries.
	acceptFDs = 5
	grantFDs  = 3
)

// message is a decoded socket message.
type message struct {
	typ         byte
	qpn         uint32
	privateData []byte
	ringSize    int
	grant       grantInfo
	slot        uint32 // GRANT, REVOKE
	rkey        uint32 // REVOKE
}

// grantInfo describes a region shared in place (GRANT).
type grantInfo struct {
	rkey     uint32
	addr     uint64
	length   uint64
	pageSize int
	magic    uint64
	bits     link.StateBits
}

var errMessage = errors.New("bad socket message")

func putPrefix(b []byte, typ byte) {
	binary.LittleEndian.PutUint32(b, msgMagic)
	binary.LittleEndian.PutUint16(b[4:], msgVersion)
	b[6], b[7] = typ, 0
}

func encodeConnect(qpn uint32, pd []byte) []byte {
	b := make([]byte, 16+len(pd))
	putPrefix(b, msgConnect)
	binary.LittleEndian.PutUint32(b[8:], qpn)
	binary.LittleEndian.PutUint16(b[12:], uint16(len(pd)))
	copy(b[16:], pd)
	return b
}

func encodeAccept(qpn uint32, pd []byte, ringSize int) []byte {
	b := make([]byte, 20+len(pd))
	putPrefix(b, msgAccept)
	binary.LittleEndian.PutUint32(b[8:], qpn)
	binary.LittleEndian.PutUint16(b[12:], uint16(len(pd)))
	binary.LittleEndian.PutUint32(b[16:], uint32(ringSize))
	copy(b[20:], pd)
	return b
}

func encodeReject(pd []byte) []byte {
	b := make([]byte, 12+len(pd))
	putPrefix(b, msgReject)
	binary.LittleEndian.PutUint16(b[8:], uint16(len(pd)))
	copy(b[12:], pd)
	return b
}

func encodeGrant(slot uint32, g *grantInfo) []byte {
	b := make([]byte, 72)
	putPrefix(b, msgGrant)
	le := binary.LittleEndian
	le.PutUint32(b[8:], slot)
	le.PutUint32(b[12:], g.rkey)
	le.PutUint64(b[16:], g.addr)
	le.PutUint64(b[24:], g.length)
	le.PutUint32(b[32:], uint32(g.pageSize))
	le.PutUint32(b[36:], uint32(g.bits.VersionShift))
	le.PutUint64(b[40:], g.magic)
	le.PutUint64(b[48:], g.bits.Present)
	le.PutUint64(b[56:], g.bits.Busy)
	le.PutUint64(b[64:], g.bits.Zero)
	return b
}

func encodeRevoke(slot, rkey uint32) []byte {
	b := make([]byte, 16)
	putPrefix(b, msgRevoke)
	binary.LittleEndian.PutUint32(b[8:], slot)
	binary.LittleEndian.PutUint32(b[12:], rkey)
	return b
}

func encodeFin() []byte {
	b := make([]byte, msgPrefixLen)
	putPrefix(b, msgFin)
	return b
}

// decodeMessage parses a message from the peer that came with nfds
// descriptors, checking everything a receiver relies on.
func decodeMessage(b []byte, nfds int) (message, error) {
	var m message
	if len(b) < msgPrefixLen {
		return m, fmt.Errorf("%w: %d bytes", errMessage, len(b))
	}
	le := binary.LittleEndian
	if le.Uint32(b) != msgMagic || le.Uint16(b[4:]) != msgVersion || b[7] != 0 {
		return m, fmt.Errorf("%w: not an nprdma shm message of version %d", errMessage, msgVersion)
	}
	m.typ = b[6]
	size := func(n, fds int) error {
		if len(b) != n || nfds != fds {
			return fmt.Errorf("%w: type %d of %d bytes with %d descriptors", errMessage, m.typ, len(b), nfds)
		}
		return nil
	}
	withPD := func(at, lenAt int) error {
		if len(b) < at {
			return fmt.Errorf("%w: type %d of %d bytes", errMessage, m.typ, len(b))
		}
		n := int(le.Uint16(b[lenAt:]))
		if n > link.MaxPrivateData || le.Uint16(b[lenAt+2:]) != 0 || at+n != len(b) {
			return fmt.Errorf("%w: %d bytes of private data in a message of %d", errMessage, n, len(b))
		}
		m.privateData = append([]byte(nil), b[at:]...)
		return nil
	}
	switch m.typ {
	case msgConnect:
		if err := withPD(16, 12); err != nil {
			return m, err
		}
		m.qpn = le.Uint32(b[8:])
		return m, size(16+len(m.privateData), 0)
	case msgAccept:
		if err := withPD(20, 12); err != nil {
			return m, err
		}
		m.qpn = le.Uint32(b[8:])
		m.ringSize = int(le.Uint32(b[16:]))
		if m.ringSize < minRingSize || m.ringSize > maxRingSize || bits.OnesCount(uint(m.ringSize)) != 1 {
			return m, fmt.Errorf("%w: ring size %d", errMessage, m.ringSize)
		}
		return m, size(20+len(m.privateData), acceptFDs)
	case msgReject:
		if err := withPD(12, 8); err != nil {
			return m, err
		}
		return m, size(12+len(m.privateData), 0)
	case msgGrant:
		if err := size(72, grantFDs); err != nil {
			return m, err
		}
		g := &m.grant
		m.slot, g.rkey = le.Uint32(b[8:]), le.Uint32(b[12:])
		g.addr, g.length = le.Uint64(b[16:]), le.Uint64(b[24:])
		g.pageSize, g.bits.VersionShift = int(le.Uint32(b[32:])), uint(le.Uint32(b[36:]))
		g.magic = le.Uint64(b[40:])
		g.bits.Present, g.bits.Busy, g.bits.Zero = le.Uint64(b[48:]), le.Uint64(b[56:]), le.Uint64(b[64:])
		switch {
		case m.slot >= fenceSlots:
			return m, fmt.Errorf("%w: grant slot %d", errMessage, m.slot)
		case g.pageSize < 8 || g.pageSize > 1<<20 || bits.OnesCount(uint(g.pageSize)) != 1:
			return m, fmt.Errorf("%w: page size %d", errMessage, g.pageSize)
		case g.length == 0 || g.length%uint64(g.pageSize) != 0 || g.length > 1<<50 || g.addr+g.length < g.addr:
			return m, fmt.Errorf("%w: region [%#x, +%d)", errMessage, g.addr, g.length)
		case g.magic == 0:
			return m, fmt.Errorf("%w: magic 0", errMessage)
		case g.bits.Present == 0 || g.bits.Busy == 0 || g.bits.VersionShift == 0 || g.bits.VersionShift > 63 ||
			(g.bits.Present|g.bits.Busy|g.bits.Zero)>>g.bits.VersionShift != 0 ||
			g.bits.Present&g.bits.Busy != 0 || g.bits.Zero&(g.bits.Present|g.bits.Busy) != 0:
			return m, fmt.Errorf("%w: state bits %+v", errMessage, g.bits)
		}
		return m, nil
	case msgRevoke:
		if err := size(16, 0); err != nil {
			return m, err
		}
		m.slot, m.rkey = le.Uint32(b[8:]), le.Uint32(b[12:])
		if m.slot >= fenceSlots {
			return m, fmt.Errorf("%w: grant slot %d", errMessage, m.slot)
		}
		return m, nil
	case msgFin:
		return m, size(msgPrefixLen, 0)
	}
	return m, fmt.Errorf("%w: unknown type %d", errMessage, m.typ)
}
