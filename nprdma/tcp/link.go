package tcp

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/nprdma/nprdma/nprdma/link"

	"golang.org/x/sys/unix"
)

// link is one queue pair's TCP connection.
//
// Writing: whoever has packets to send (a poster, the reader goroutine
// answering a request, a timer) writes them itself with one non-blocking
// writev when the socket is idle; packets queued meanwhile by others go out
// in the same writev or the next (flat combining). When the socket would
// block, the rest is handed to a goroutine that waits for it, so no caller —
// and never the reader goroutine — waits for the peer.
//
// Reading: one goroutine at a time reads frames and hands them to the
// queue pair, the link's reader goroutine or a waiter that drives the link
// (receive.go); payloads are read straight into their destination
// (registered memory).
type tcpLink struct {
	prov *Provider
	nc   *net.TCPConn
	rc   syscall.RawConn
	rd   *reader
	cr   *connReader // rd's source
	rx   link.Receiver
	rcv  rxState
	intr interrupter

	wmu      sync.Mutex
	pend     *wbatch       // queued, not yet being written
	spare    *wbatch       // a drained batch, kept for its buffers
	busy     bool          // someone is writing
	closing  bool          // Close: shut the write side down once drained
	closed   atomic.Bool   // closing, readable without wmu
	acksSent atomic.Uint64 // standalone ACK frames queued (for tests)
	shut     bool
	dead     bool
	iov      []unix.Iovec
	wpayload payload
	exp      expectState
	origin   uint64 // the reader's position where data frames begin (after the handshake)

	startOnce sync.Once
	abortCh   chan struct{} // closed by abort
	w         writeState
	writeFn   func(fd uintptr) bool
}

type wseg struct {
	off, n int    // header bytes hdr[off:off+n] when data is nil
	data   []byte // payload
}

type wbatch struct {
	hdr  []byte
	segs []wseg
	rels []link.Releaser
	size int // bytes queued
	// write position
	seg, segOff int
}

func (b *wbatch) empty() bool { return b.seg >= len(b.segs) }

func (b *wbatch) reset() {
	for i := range b.rels {
		b.rels[i].Release()
		b.rels[i] = nil
	}
	clear(b.segs)
	b.hdr, b.segs, b.rels = b.hdr[:0], b.segs[:0], b.rels[:0]
	b.seg, b.segOff, b.size = 0, 0, 0
}

// appendHeaderBytes queues the bytes hdr[off:] just appended to b.hdr.
func (b *wbatch) appendHeaderBytes(off int) {
	n := len(b.hdr) - off
	if k := len(b.segs) - 1; k >= 0 && b.segs[k].data == nil && b.segs[k].off+b.segs[k].n == off {
		b.segs[k].n += n // adjacent headers share an iovec
	} else {
		b.segs = append(b.segs, wseg{off: off, n: n})
	}
	b.size += n
}

// pad queues a PAD frame that brings the batch's size to want (mod
// alignTo), if one is needed.
func (b *wbatch) pad(want int) {
	if k := padFor(b.size, want); k > 0 {
		off := len(b.hdr)
		b.hdr = appendPad(b.hdr, k)
		b.appendHeaderBytes(off)
	}
}

func (b *wbatch) drop() {
	b.reset()
}

func newLink(p *Provider, nc *net.TCPConn, rd *reader) (*tcpLink, error) {
	rc, err := nc.SyscallConn()
	if err != nil {
		return nil, err
	}
	nc.SetNoDelay(true)
	if p.socketReceiveBuffer > 0 {
		nc.SetReadBuffer(p.socketReceiveBuffer)
	}
	l := &tcpLink{prov: p, nc: nc, rc: rc, rd: rd, iov: make([]unix.Iovec, 0, 64), abortCh: make(chan struct{}), pend: new(wbatch), spare: new(wbatch)}
	l.writeFn = l.writeSocket
	l.rcv.wake = make(chan struct{}, 1)
	l.cr = &connReader{nc: nc, rx: &l.rcv, stalled: p.stalledFrame}
	l.cr.sp.rc, l.cr.sp.fn = rc, l.cr.sp.read
	l.cr.vec.fn = l.cr.vec.read
	rd.src = l.cr
	l.origin = rd.position()
	if !p.addLink(l) {
		nc.Close()
		return nil, errCrashed
	}
	return l, nil
}

// Start implements link.Link.
func (l *tcpLink) Start(r link.Receiver) {
	l.startOnce.Do(func() {
		l.rx = r
		l.exp.ex, _ = r.(link.PayloadExpecter)
		go l.readLoop()
	})
}

// Send implements link.Link: it encodes the headers and queues the
// payload slices, without copying them.
func (l *tcpLink) Send(pkts []link.Packet) {
	l.wmu.Lock()
	if l.dead || l.closing {
		l.wmu.Unlock()
		for i := range pkts {
			if pkts[i].Buf != nil {
				pkts[i].Buf.Release()
			}
		}
		return
	}
	b := l.pend
	for i := range pkts {
		p := &pkts[i]
		if p.Kind == link.PacketAck {
			l.acksSent.Add(1)
		}
		if n := p.PayloadLen(); n >= alignPayload && len(p.Data) > 0 && len(p.Data[0]) > 0 {
			// The payload starts where its source does, mod alignTo.
			src := int(uintptr(unsafe.Pointer(unsafe.SliceData(p.Data[0]))))
			b.pad(src - payloadOffset(&p.Header))
		}
		off := len(b.hdr)
		b.hdr = appendHeader(b.hdr, &p.Header)
		b.appendHeaderBytes(off)
		for _, d := range p.Data {
			if len(d) > 0 {
				b.segs = append(b.segs, wseg{data: d})
				b.size += len(d)
			}
		}
		if p.Buf != nil {
			b.rels = append(b.rels, p.Buf)
		}
	}
	l.wmu.Unlock()
}

// Flush implements link.Link.
func (l *tcpLink) Flush() {
	l.wmu.Lock()
	if l.busy || l.dead {
		l.wmu.Unlock()
		return
	}
	if len(l.pend.segs) == 0 {
		l.shutdownIfDoneLocked()
		l.wmu.Unlock()
		return
	}
	l.busy = true
	for {
		b := l.takePendingLocked()
		l.wmu.Unlock()
		b.pad(0) // every write a multiple of alignTo: the next one starts aligned
		done, err := l.write(b, false)
		if err != nil {
			l.writeFailed(b, err)
			return
		}
		if !done {
			// The socket is full: a goroutine of the link's own waits.
			go l.drain(b)
			return
		}
		if !l.writtenLocking(b) {
			return
		}
	}
}

// drain writes b, waiting for the socket, and then everything queued. b
// is the link's spare batch, which nobody else touches while busy is set.
func (l *tcpLink) drain(b *wbatch) {
	for {
		if _, err := l.write(b, true); err != nil {
			l.writeFailed(b, err)
			return
		}
		if !l.writtenLocking(b) {
			return
		}
		b = l.takePendingLocked()
		l.wmu.Unlock()
		b.pad(0)
	}
}

// takePendingLocked swaps the queued batch for the spare one and returns
// it, to write once wmu is released.
func (l *tcpLink) takePendingLocked() *wbatch {
	b := l.pend
	l.pend, l.spare = l.spare, b
	return b
}

// writtenLocking is the end of a batch's write: it takes wmu and, when
// nothing more is queued (or the link died), ends the writer's turn and
// releases wmu, false. True: more is queued, wmu is held.
func (l *tcpLink) writtenLocking(b *wbatch) bool {
	b.reset()
	l.wmu.Lock()
	if len(l.pend.segs) == 0 || l.dead {
		if l.dead {
			l.pend.drop()
		}
		l.busy = false
		l.shutdownIfDoneLocked()
		l.wmu.Unlock()
		return false
	}
	return true
}

func (l *tcpLink) writeFailed(b *wbatch, err error) {
	b.drop()
	l.wmu.Lock()
	l.busy = false
	l.pend.drop()
	l.wmu.Unlock()
	l.abort(fmt.Errorf("tcp: write: %w", err))
}

func (l *tcpLink) shutdownIfDoneLocked() {
	if l.closing && !l.shut && !l.dead {
		l.shut = true
		l.nc.CloseWrite()
	}
}

// write writes b from its position with writev. Non-blocking, it returns
// done=false once the socket would block; blocking, it waits for the
// socket instead. Only the one writer (see busy) calls it.
func (l *tcpLink) write(b *wbatch, blocking bool) (done bool, err error) {
	w := &l.w
	w.b, w.blocking, w.done, w.err = b, blocking, false, nil
	rerr := l.rc.Write(l.writeFn) // a method value made once: no allocation here
	w.b = nil
	if w.err != nil {
		return false, w.err
	}
	if rerr != nil {
		return false, rerr
	}
	return w.done, nil
}

// writeState is the argument of writeSocket, kept in the link so that the
// RawConn callback needs no closure.
type writeState struct {
	b        *wbatch
	blocking bool
	done     bool
	err      error
}

func (l *tcpLink) writeSocket(fd uintptr) bool {
	w := &l.w
	b := w.b
	for !b.empty() {
		iov := l.iov[:0]
		seg, off := b.seg, b.segOff
		for ; seg < len(b.segs) && len(iov) < 1024; seg++ {
			s := b.segs[seg]
			p := s.data
			if p == nil {
				p = b.hdr[s.off : s.off+s.n]
			}
			p = p[off:]
			off = 0
			iov = append(iov, unix.Iovec{Base: unsafe.SliceData(p), Len: uint64(len(p))})
		}
		l.iov = iov[:0]
		n, _, e := unix.Syscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(unsafe.SliceData(iov))), uintptr(len(iov)))
		clear(iov)
		switch e {
		case 0:
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return !w.blocking // false: wait until writable, then again
		default:
			w.err = e
			return true
		}
		b.advance(int(n))
	}
	w.done = true
	return true
}

func (b *wbatch) advance(n int) {
	for n > 0 {
		s := b.segs[b.seg]
		size := s.n
		if s.data != nil {
			size = len(s.data)
		}
		k := min(n, size-b.segOff)
		b.segOff += k
		n -= k
		if b.segOff == size {
			b.seg++
			b.segOff = 0
		}
	}
}

// Close implements link.Link: queued packets go out, then the write side
// shuts down; the reader goes on until the peer closes too.
func (l *tcpLink) Close() {
	l.wmu.Lock()
	l.closing = true
	l.closed.Store(true)
	if !l.busy && len(l.pend.segs) == 0 {
		l.shutdownIfDoneLocked()
	}
	l.wmu.Unlock()
	if !l.busyNow() {
		l.Flush()
	}
	l.wakeReader() // the peer's end of stream must be read
}

func (l *tcpLink) busyNow() bool {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return l.busy
}

// Abort implements link.Link: the connection is reset at once.
func (l *tcpLink) Abort() {
	started := true
	l.startOnce.Do(func() { started = false }) // a link never started never will be
	l.abort(errAborted)
	if !started {
		l.prov.removeLink(l)
	}
}

func (l *tcpLink) abort(err error) {
	l.wmu.Lock()
	if l.dead {
		l.wmu.Unlock()
		return
	}
	l.dead = true
	if !l.busy {
		l.pend.drop()
	}
	close(l.abortCh)
	l.wmu.Unlock()
	l.nc.SetLinger(0) // reset, as the death of the process would
	l.nc.Close()
}

var (
	errAborted = errors.New("tcp: link aborted")
	errCrashed = errors.New("tcp: provider crashed")
)

// payload is the payload of the frame being delivered, read from the
// socket straight into the destination.
type payload struct {
	rd        *reader
	remaining int
	// placed: the payload's first bytes, which a guessed read put in place
	// (readExpected); they come before anything buffered.
	placed []byte
}

func (p *payload) Read(dst []byte) error {
	if len(dst) > p.remaining {
		return fmt.Errorf("tcp: reading %d payload bytes, %d left", len(dst), p.remaining)
	}
	p.remaining -= len(dst)
	dst = dst[p.takePlaced(dst):]
	if len(dst) == 0 {
		return nil
	}
	return p.rd.readFull(dst)
}

func (p *payload) Discard(n int) error {
	if n > p.remaining {
		return fmt.Errorf("tcp: discarding %d payload bytes, %d left", n, p.remaining)
	}
	p.remaining -= n
	k := min(n, len(p.placed))
	p.dropPlaced(k)
	return p.rd.discard(n - k)
}

// reader is a buffered reader that reads large payloads directly into their
// destination.
type reader struct {
	src   io.Reader
	buf   []byte
	home  []byte // buf as made; a wrong guess may lend a larger one (push)
	r, w  int
	taken uint64 // bytes taken from src
}

// directRead: a payload remainder at least this large skips the buffer.
const directRead = 32 << 10

func newReader(src io.Reader, size int) *reader {
	buf := make([]byte, size)
	return &reader{src: src, buf: buf, home: buf}
}

// position is the stream offset of the next byte to be consumed.
func (r *reader) position() uint64 { return r.taken - uint64(r.w-r.r) }

// rewind starts an empty buffer over at its beginning, in the buffer it was
// made with.
func (r *reader) rewind() {
	r.r, r.w = 0, 0
	r.buf = r.home
}

// push appends b, bytes taken from the stream elsewhere, to the buffered
// ones, in a larger buffer if they do not fit.
func (r *reader) push(b []byte) {
	if len(r.buf)-r.w < len(b) {
		buf := make([]byte, max(len(r.home), r.w-r.r+len(b)))
		r.w = copy(buf, r.buf[r.r:r.w])
		r.r, r.buf = 0, buf
	}
	r.w += copy(r.buf[r.w:], b)
}

func (r *reader) buffered() int { return r.w - r.r }
func (r *reader) peek() []byte  { return r.buf[r.r:r.w] }
func (r *reader) consume(n int) { r.r += n }

// readAhead is how much the reader asks the socket for at a frame boundary,
// given the size of the last payload.
func readAhead(lastPayload int) int {
	if lastPayload >= directRead {
		return 4 << 10
	}
	return 0 // the whole buffer
}

// fillAtMost is fill, reading at most limit bytes ahead (0: no limit).
func (r *reader) fillAtMost(n, limit int) error {
	if limit <= 0 || r.w-r.r >= n {
		return r.fill(n)
	}
	if r.r == r.w {
		r.rewind()
	}
	full := r.buf
	if end := r.w + max(limit, n); end < len(r.buf) {
		r.buf = r.buf[:end]
	}
	err := r.fill(n)
	r.buf = full
	return err
}

// fill reads until at least n bytes are buffered. More than the buffer holds
// is an error, not a wait: reading into no room would return nothing for
// ever.
func (r *reader) fill(n int) error {
	if n > len(r.buf) {
		return fmt.Errorf("%w: %d bytes needed at once, more than the %d-byte read buffer", errFrame, n, len(r.buf))
	}
	if r.r == r.w {
		r.rewind()
	}
	if len(r.buf)-r.r < n {
		copy(r.buf, r.buf[r.r:r.w])
		r.w -= r.r
		r.r = 0
	}
	for r.w-r.r < n {
		k, err := r.src.Read(r.buf[r.w:])
		r.w += k
		r.taken += uint64(k)
		if err != nil {
			if r.w-r.r >= n {
				return nil
			}
			if err == io.EOF && r.w-r.r > 0 {
				return io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

func (r *reader) readFull(dst []byte) error {
	k := copy(dst, r.buf[r.r:r.w])
	r.r += k
	dst = dst[k:]
	for len(dst) > 0 {
		if len(dst) >= directRead {
			return r.readDirect(dst)
		}
		if err := r.fill(1); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		k := copy(dst, r.buf[r.r:r.w])
		r.r += k
		dst = dst[k:]
	}
	return nil
}

// vectorReader reads into two buffers with one system call (connReader).
type vectorReader interface {
	readv(p, q []byte) (int, error)
}

// readDirect reads dst straight from the source, the buffer being empty,
// and with the same system call up to readAhead's bytes of what follows
// into the buffer: with operations queued, the next frame's header comes
// with this payload rather than with a read of its own.
func (r *reader) readDirect(dst []byte) error {
	v, ok := r.src.(vectorReader)
	if !ok {
		k, err := io.ReadFull(r.src, dst)
		r.taken += uint64(k)
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	r.rewind()
	ahead := r.buf[:min(len(r.buf), readAhead(len(dst)))]
	for len(dst) > 0 {
		n, err := v.readv(dst, ahead)
		r.taken += uint64(n)
		k := min(n, len(dst))
		dst, r.w = dst[k:], n-k
		if err != nil && len(dst) > 0 {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

func (r *reader) discard(n int) error {
	for n > 0 {
		if r.r == r.w {
			if err := r.fill(1); err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return err
			}
		}
		k := min(n, r.w-r.r)
		r.r += k
		n -= k
	}
	return nil
}
