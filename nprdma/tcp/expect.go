package tcp

import (
	"io"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/nprdma/nprdma/nprdma/link"

	"golang.org/x/sys/unix"
)

// Reading the expected frame. A large payload whose header is read first
// costs a system call of its own (a tenth of a 128 KiB operation on
// loopback here), which a raw socket stream does not pay. A READ's
// response is a frame whose destination the requester knows before it
// arrives, and so, as a guess, is the peer's next SEND (as long as the last
// one, into the receive buffer posted first). So at a frame boundary the
// reader asks the queue pair (link.PayloadExpecter) and reads the
// expected PAD and header into its buffer and the payload into place with
// one readv. The header is checked before anything is delivered; when the
// stream held something else, what landed in the destination goes back
// into the buffer (the destination is memory the queue pair gave the
// network to write), and guessing pauses for a while.

// maxExpected caps the payload one guessed read places (and so what a wrong
// guess copies back).
const maxExpected = 1 << 20

type expectState struct {
	ex      link.PayloadExpecter // nil: the receiver names nothing
	e       link.ExpectedPayload
	sendSrc uint64 // where the last large SEND's payload sat, mod alignTo: its source's alignment
	misses  int    // wrong guesses in a row
	skip    int    // boundaries to read without guessing
	hits    atomic.Uint64
	wrong   atomic.Uint64
}

// readExpected reads at a frame boundary with an empty buffer, guessing the
// next frame when the receiver expects one. It reports whether it read:
// false means no guess, and the caller reads as usual. After it, the
// buffer holds the expected frame's PAD and header with the payload's
// first bytes already in place (handed to the payload as placed), or,
// after a wrong guess, simply the bytes that arrived.
func (l *tcpLink) readExpected() (bool, error) {
	x, rd := &l.exp, l.rd
	// As in readDirect: a source that cannot read two buffers at once is
	// read as usual.
	vr, ok := rd.src.(vectorReader)
	if x.ex == nil || !ok {
		return false, nil
	}
	if x.skip > 0 {
		x.skip--
		return false, nil
	}
	// Off a multiple of alignTo the writer may or may not have ended a write
	// here (with a PAD up to the next one): the guess would be a coin toss.
	if (rd.position()-l.origin)%alignTo != 0 || !x.ex.ExpectPayload(directRead, &x.e) {
		return false, nil
	}
	e := x.e
	x.e = link.ExpectedPayload{} // no reference kept to the destination
	h := &e.Header
	src := e.Src
	if e.SrcUnknown {
		src = x.sendSrc
	}
	pad := padFor(0, int(src)-payloadOffset(h))
	scratch := pad + payloadOffset(h)
	dst := e.Dst[:min(len(e.Dst), maxExpected)]
	rd.rewind()
	n, err := vr.readv(rd.buf[:scratch], dst)
	if err != nil {
		return true, err
	}
	rd.taken += uint64(n)
	got := min(n, scratch)
	rd.w = got
	placed := n - got
	switch {
	case placed == 0:
		// Nothing reached the destination: the buffer holds what came.
	case isExpected(rd.buf[:got], pad, h):
		l.wpayload.placed = dst[:placed]
		x.misses = 0
		x.hits.Add(1)
	default:
		rd.push(dst[:placed])
		x.misses++
		x.skip = 1<<min(x.misses, 10) - 1
		x.wrong.Add(1)
	}
	return true, nil
}

// isExpected reports whether b is a PAD frame of pad bytes (none if 0) and
// then the header of the packet want, its immediate and piggybacked
// acknowledgement aside.
func isExpected(b []byte, pad int, want *link.Header) bool {
	if pad > 0 {
		if k, err := parsePad(b); err != nil || prefixLen+k != pad {
			return false
		}
		b = b[pad:]
	}
	var h link.Header
	n, err := parseHeader(b, &h)
	return err == nil && n == len(b) && h.Kind == want.Kind && h.Seq == want.Seq && h.Len == want.Len &&
		h.Offset == want.Offset && h.Last == want.Last && h.Fill == want.Fill
}

// takePlaced moves up to len(dst) bytes of the payload that a guessed read
// already placed into dst (where they normally already are).
func (p *payload) takePlaced(dst []byte) int {
	k := min(len(dst), len(p.placed))
	if k > 0 && unsafe.SliceData(dst) != unsafe.SliceData(p.placed) {
		copy(dst, p.placed[:k])
	}
	p.dropPlaced(k)
	return k
}

// dropPlaced forgets the first k placed bytes, and the destination with the
// last of them.
func (p *payload) dropPlaced(k int) {
	p.placed = p.placed[k:]
	if len(p.placed) == 0 {
		p.placed = nil
	}
}

// vecRead is a readv of two buffers through the RawConn; fn is its
// callback, made once.
type vecRead struct {
	iov [2]unix.Iovec
	n   int
	err error
	fn  func(fd uintptr) bool
}

func (v *vecRead) once(fd uintptr) (int, error) {
	n, _, e := unix.Syscall(unix.SYS_READV, fd, uintptr(unsafe.Pointer(&v.iov[0])), uintptr(len(v.iov)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

func (v *vecRead) read(fd uintptr) bool {
	for {
		n, err := v.once(fd)
		switch err {
		case nil:
			v.n = n
			if n == 0 {
				v.err = io.EOF
			}
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		}
		v.err = os.NewSyscallError("readv", err)
		return true
	}
}

// readv reads into p, then q, with one system call, as Read reads into one
// buffer (deadlines and busy polling included). p and q are not empty.
func (c *connReader) readv(p, q []byte) (int, error) {
	v := &c.vec
	v.iov[0] = unix.Iovec{Base: unsafe.SliceData(p), Len: uint64(len(p))}
	v.iov[1] = unix.Iovec{Base: unsafe.SliceData(q), Len: uint64(len(q))}
	defer func() { v.iov = [2]unix.Iovec{} }()
	if c.sp.until != 0 {
		c.sp.vec = v
		n, err, ok := c.spin(nil)
		c.sp.vec = nil
		if ok {
			return n, err
		}
	}
	for {
		v.n, v.err = 0, nil
		err := c.sp.rc.Read(v.fn)
		n := v.n
		if err == nil {
			err = v.err
		}
		if err == nil || n > 0 {
			return n, err
		}
		if err = c.deadlinePassed(err); err != nil {
			return 0, err
		}
	}
}
