package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nprdma/nprdma/nprdma/link"

	"golang.org/x/sys/unix"
)

// Receiving. Exactly one goroutine at a time reads frames from the
// connection and delivers them to the queue pair: the link's reader
// goroutine, or a driver — a goroutine waiting on a completion queue that
// receives for itself (link.Driver, "direct completion"). A driver blocks
// in read() like a client of a raw socket does, so the packet that completes
// its work request needs no hand-off from another goroutine; the reader
// goroutine stays parked meanwhile. The reader goroutine gives the receive
// side up at its next pause when a waiter could not drive because it was
// receiving, and wakes that waiter, which then drives; it takes the receive
// side back when nobody has received for the linger time
// (WithDirectCompletion): inbound requests and acknowledgements never wait
// longer than that for the application to come back.

// Owners of the receive side.
const (
	rxReader = iota // the reader goroutine (the zero value: a new link's)
	rxNone          // nobody: the reader goroutine is parked
	rxDriver        // a goroutine in Drive
)

var (
	// errYield: the reader goroutine gives the receive side to a driver.
	errYield = errors.New("tcp: receive side given to a driver")
	// errFrozen: a driver found the provider frozen.
	errFrozen = errors.New("tcp: provider frozen")
	// errInterrupted: a driver's context ended.
	errInterrupted = errors.New("tcp: driver interrupted")
)

type rxState struct {
	mu     sync.Mutex
	owner  int
	parked bool          // the reader goroutine waits on wake (owner is rxNone)
	wake   chan struct{} // hands the receive side to the parked reader goroutine
	err    error         // a driver's terminal error, for the reader goroutine to report
	linger *time.Timer
	armed  bool          // linger is scheduled
	check  time.Duration // interval to the next linger check once backed off (0: the linger)
	freeAt int64         // nanotime the receive side last became free
	want   link.DriveWaiter
	wanted atomic.Bool   // a waiter (want) found the reader goroutine receiving
	drives atomic.Uint64 // Drive calls that received (for tests)

	// Frame state, used by whoever receives.
	h           link.Header
	lastPayload int
	boundary    bool // between frames, waiting for the next header
}

var epoch = time.Now()

func nanotime() int64 { return int64(time.Since(epoch)) }

// connReader is the connection as the frame reader reads it. A driver whose
// context ends is interrupted with a read deadline in the past; the
// deadline takes effect only between frames, where nothing is half
// delivered: in the middle of a frame the read is retried. A busy-polling
// driver's reads first spin with non-blocking reads (spin).
type connReader struct {
	nc  *net.TCPConn
	rx  *rxState
	sp  spinRead
	vec vecRead
	// stalled bounds the rest of a frame after an interruption; finishing:
	// the driver's interrupted frame is being finished under that bound
	// (until the driver stops, at the frame's end).
	stalled   time.Duration
	finishing bool
}

// spinRead is the state of a spinning read, kept here so that the RawConn
// callback (fn, a method value made once) needs no closure.
type spinRead struct {
	rc    syscall.RawConn
	fn    func(fd uintptr) bool
	until int64           // nanotime to stop spinning; 0: do not spin
	ctx   context.Context // the driver's
	p     []byte
	vec   *vecRead // set: a readv instead of a read into p
	n     int
	err   error
	got   bool          // a read returned data, the end of the stream or an error
	hits  atomic.Uint64 // reads that spinning satisfied (for tests)
}

func (c *connReader) Read(p []byte) (int, error) {
	if c.sp.until != 0 {
		if n, err, ok := c.spin(p); ok {
			return n, err
		}
	}
	for {
		n, err := c.nc.Read(p)
		if err == nil || n > 0 {
			return n, err
		}
		if err = c.deadlinePassed(err); err != nil {
			return 0, err
		}
	}
}

// deadlinePassed handles a read that returned nothing and err: nil when the
// read is to be retried (an interrupted driver in the middle of a frame),
// else the error to return.
func (c *connReader) deadlinePassed(err error) error {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	if c.rx.boundary {
		return errInterrupted
	}
	if c.finishing {
		return fmt.Errorf("%w: the peer sent nothing for %v in the middle of a frame", link.ErrPeerLost, c.stalled)
	}
	// In the middle of a frame: finish it first, within the stalled frame
	// timeout. The driver checks its context again at the next boundary
	// (and the deadline goes when it stops: interrupter).
	c.finishing = true
	c.nc.SetReadDeadline(time.Now().Add(c.stalled))
	return nil
}

// spin reads with non-blocking reads until one returns something (ok) or
// the spin time is up or the driver's context ends (not ok, and no more
// spinning in this drive: the caller blocks as usual). A read that spins
// finds the packet as soon as the peer's write lands, with no wake-up of a
// goroutine blocked in the network poller.
func (c *connReader) spin(p []byte) (n int, err error, ok bool) {
	sp := &c.sp
	sp.p, sp.got = p, false
	rerr := sp.rc.Read(sp.fn)
	n, err, ok = sp.n, sp.err, sp.got
	sp.p, sp.n, sp.err = nil, 0, nil
	if rerr != nil || !ok {
		sp.until = 0
		return 0, nil, false
	}
	sp.hits.Add(1)
	return n, err, true
}

func (sp *spinRead) read(fd uintptr) bool {
	for i := 1; ; i++ {
		var n int
		var err error
		if sp.vec != nil {
			n, err = sp.vec.once(fd)
		} else {
			n, err = unix.Read(int(fd), sp.p)
		}
		switch {
		case err == nil:
			sp.n, sp.got = n, true
			if n == 0 {
				sp.err = io.EOF
			}
			return true
		case err == unix.EINTR:
			continue
		case err != unix.EAGAIN:
			call := "read"
			if sp.vec != nil {
				call = "readv"
			}
			sp.err, sp.got = os.NewSyscallError(call, err), true
			return true
		}
		if i%32 == 0 && (nanotime() > sp.until || sp.ctx.Err() != nil) {
			return true // not got: block as usual
		}
	}
}

func (l *tcpLink) readLoop() {
	err := l.readFrames()
	l.wmu.Lock()
	l.dead = true
	if !l.busy {
		l.pend.drop()
	}
	l.wmu.Unlock()
	l.nc.Close()
	l.prov.removeLink(l)
	l.intr.release()
	l.rx.LinkDown(err)
}

// readFrames receives as the reader goroutine until the link fails, parked
// while drivers receive.
func (l *tcpLink) readFrames() error {
	for {
		err := l.receive(nil)
		if err != errYield {
			return err
		}
		if err := l.park(); err != nil {
			return err
		}
	}
}

// drive is what receive needs to know of a driver.
type drive struct {
	ctx context.Context
	w   link.DriveWaiter
}

// receive reads frames and delivers them, as the owner of the receive side.
// The reader goroutine (d == nil) returns errYield when it gave the
// receive side up, or the error that ends the link. A driver returns nil
// once its waiter is done, errInterrupted when its context ends, errFrozen,
// or the error that ends the link. Both stop only between frames.
func (l *tcpLink) receive(d *drive) error {
	rd, r := l.rd, &l.rcv
	pl := &l.wpayload
	pl.rd = rd
	for {
		if d != nil && d.w.Done() {
			// The waiter has its completion. Responses go out now; an
			// acknowledgement owed waits for the next request of ours or
			// the next Idle, off the waiter's path.
			l.Flush()
			return nil
		}
		if rd.buffered() == 0 {
			if d == nil && r.wanted.Load() {
				l.yield()
				return errYield
			}
			// About to wait for the network: let the queue pair send its
			// acknowledgements and responses first, in one write.
			l.rx.Idle()
			if d != nil && d.ctx.Err() != nil {
				return errInterrupted
			}
			// After a large payload the next frame is likely large too:
			// read little ahead, so that its payload goes straight to its
			// destination rather than through the buffer.
			r.boundary = true
			read, err := l.readExpected()
			if !read && err == nil {
				err = rd.fillAtMost(1, readAhead(r.lastPayload))
			}
			r.boundary = false
			if err != nil {
				return err
			}
		}
		// A frozen provider delivers nothing more, even a frame that
		// arrived while its receiver waited; it stays buffered.
		if l.prov.gate.Frozen() {
			if d != nil {
				return errFrozen
			}
			if err := l.prov.waitThawed(l); err != nil {
				return err
			}
		}
		if rd.peek()[0] == framePad {
			if err := l.skipPad(); err != nil {
				return err
			}
			continue
		}
		n := headerLen(rd.peek()[0])
		if n == 0 {
			return fmt.Errorf("tcp: %w: %w: unknown frame type %d", link.ErrProtocol, errFrame, rd.peek()[0])
		}
		if rd.buffered() < n {
			l.rx.Idle()
			if err := rd.fill(n); err != nil {
				return err
			}
		}
		h := &r.h
		if _, err := parseHeader(rd.peek(), h); err != nil {
			return fmt.Errorf("tcp: %w: %w", link.ErrProtocol, err)
		}
		rd.consume(n)
		pl.remaining = h.PayloadLen()
		r.lastPayload = pl.remaining
		if h.Kind == link.PacketSend && pl.remaining >= alignPayload {
			l.exp.sendSrc = (rd.position() - uint64(len(pl.placed)) - l.origin) % alignTo
		}
		if pl.remaining > len(pl.placed)+rd.buffered() {
			l.rx.Idle() // about to wait for the payload: flush responses first
		}
		err := l.rx.Deliver(h, pl)
		if err == nil && pl.remaining > 0 {
			err = pl.Discard(pl.remaining)
		}
		if err != nil {
			return err
		}
		if pl.placed != nil {
			return fmt.Errorf("tcp: %d payload bytes placed by a guessed read were not delivered", len(pl.placed))
		}
	}
}

// skipPad consumes the PAD frame at the reader's position.
func (l *tcpLink) skipPad() error {
	rd := l.rd
	if rd.buffered() < prefixLen {
		l.rx.Idle()
		if err := rd.fill(prefixLen); err != nil {
			return err
		}
	}
	k, err := parsePad(rd.peek())
	if err != nil {
		return fmt.Errorf("tcp: %w: %w", link.ErrProtocol, err)
	}
	rd.consume(prefixLen)
	if k > rd.buffered() {
		l.rx.Idle()
	}
	return rd.discard(k)
}

// yield gives the receive side up (the reader goroutine is about to park)
// and wakes the waiter that wanted it. Responses go out first; an
// acknowledgement owed waits for the driver.
func (l *tcpLink) yield() {
	r := &l.rcv
	r.mu.Lock()
	w := r.want
	r.want = nil
	r.wanted.Store(false)
	r.owner, r.parked, r.freeAt = rxNone, true, nanotime()
	l.armLingerLocked()
	r.mu.Unlock()
	l.Flush()
	if w != nil {
		w.Wake()
	}
}

// park waits, as the reader goroutine that gave the receive side up, until
// it is handed back: the linger time passed without a driver, the link
// broke, or a driver failed (its error is returned).
func (l *tcpLink) park() error {
	r := &l.rcv
	select {
	case <-r.wake:
	case <-l.abortCh:
		r.mu.Lock()
		if r.owner == rxNone {
			r.owner, r.parked = rxReader, false
			r.mu.Unlock()
			break
		}
		r.mu.Unlock()
		<-r.wake // a driver hands it back as soon as it sees the link down
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	err := r.err
	r.err = nil
	return err
}

// handBackLocked gives the free receive side back to the parked reader
// goroutine.
func (l *tcpLink) handBackLocked() {
	r := &l.rcv
	if r.owner != rxNone || !r.parked {
		return
	}
	r.owner, r.parked = rxReader, false
	r.wake <- struct{}{} // never blocks: one token per park
}

// maxLingerBackoff bounds how far apart the linger checks get while
// drivers keep coming back: 32 × the linger.
const maxLingerBackoff = 32

// Linger checks. Each check is a timer firing: a goroutine, and often the
// wake-up of an idle thread on the other vCPU. While drivers keep coming
// back — a waiter receives, returns with its completion, posts and waits
// again — a check every linger finds the receive side in use or just
// left, on the order of once per 128 KiB operation at depth 8, each
// costing about one more read, epoll wait and context switch. So a check
// that finds drivers coming back doubles the interval to the next (up to
// maxLingerBackoff × the linger); the first check after the receive side
// goes free is a linger away, and a hand-back starts over.

// maxLingerCheck is the longest interval between checks for linger.
func maxLingerCheck(linger time.Duration) time.Duration {
	if linger > math.MaxInt64/(2*maxLingerBackoff) {
		return linger // too long to back off without overflowing
	}
	return maxLingerBackoff * linger
}

func (l *tcpLink) armLingerLocked() {
	r := &l.rcv
	if r.armed {
		return
	}
	r.armed = true
	d := max(r.check, l.prov.linger)
	if r.linger == nil {
		r.linger = time.AfterFunc(d, l.onLinger)
	} else {
		r.linger.Reset(d)
	}
}

// onLinger hands the receive side back to the reader goroutine once it has
// been free for the linger time, and backs the checks off while drivers
// keep coming back.
func (l *tcpLink) onLinger() {
	r := &l.rcv
	r.mu.Lock()
	defer r.mu.Unlock()
	r.armed = false
	linger := l.prov.linger
	backedOff := r.check > linger
	idle := time.Duration(nanotime() - r.freeAt)
	if r.owner == rxNone && idle >= linger {
		r.check = 0
		r.want = nil
		r.wanted.Store(false)
		l.handBackLocked()
		return
	}
	if r.owner == rxReader {
		r.check = 0 // taken back otherwise (a freeze, the link going down)
		return
	}
	r.check = 2 * min(max(r.check, linger), maxLingerCheck(linger)/2)
	if r.owner == rxDriver {
		return // it arms the timer again when it leaves
	}
	// Free, but a driver left less than the linger ago.
	r.armed = true
	if backedOff {
		r.linger.Reset(r.check)
	} else {
		r.linger.Reset(linger - idle)
	}
}

// wakeReader hands a free receive side back to the reader goroutine now
// (the link is closing: the peer's end of stream must be read).
func (l *tcpLink) wakeReader() {
	l.rcv.mu.Lock()
	l.handBackLocked()
	l.rcv.mu.Unlock()
}

func (l *tcpLink) isDown() bool {
	select {
	case <-l.abortCh:
		return true
	default:
		return false
	}
}

// interrupter ends a driver's blocking read when its context ends, with a
// read deadline in the past (connReader turns it into errInterrupted
// between frames). It watches one context at a time and keeps watching it
// between Drive calls, since waiters tend to pass the same context every
// time: registering with the context costs allocations and locks.
type interrupter struct {
	mu       sync.Mutex
	ctx      context.Context // the context watched
	stop     func() bool     // unregisters the watch
	active   bool            // a driver with ctx is receiving
	deadline bool            // the deadline was set for it
}

// arm makes the end of ctx interrupt the driver that is about to receive.
func (in *interrupter) arm(l *tcpLink, ctx context.Context) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.ctx != ctx {
		if in.stop != nil {
			in.stop()
		}
		in.ctx = ctx
		in.stop = context.AfterFunc(ctx, func() { in.fire(l, ctx) })
	}
	in.active = true
}

func (in *interrupter) fire(l *tcpLink, ctx context.Context) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.active && in.ctx == ctx && !in.deadline {
		in.deadline = true
		l.nc.SetReadDeadline(time.Unix(1, 0))
	}
}

// disarm ends the watch of the driver that stopped receiving, clearing a
// deadline it left.
func (in *interrupter) disarm(l *tcpLink) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.active = false
	if in.deadline {
		in.deadline = false
		l.nc.SetReadDeadline(time.Time{})
	}
	if in.ctx != nil && in.ctx.Err() != nil {
		in.stop() // ended: nothing more to watch
		in.ctx, in.stop = nil, nil
	}
}

// release stops watching (the link is down).
func (in *interrupter) release() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.stop != nil {
		in.stop()
	}
	in.ctx, in.stop = nil, nil
}

// Drive implements link.Driver.
func (l *tcpLink) Drive(ctx context.Context, w link.DriveWaiter) bool {
	if l.prov.linger <= 0 {
		return false
	}
	r := &l.rcv
	r.mu.Lock()
	if r.owner != rxNone || l.prov.gate.Frozen() || l.isDown() || l.closed.Load() {
		switch r.owner {
		case rxReader:
			// Ask the reader goroutine to give the receive side up at its
			// next pause and to wake this waiter then.
			r.want = w
			r.wanted.Store(true)
		case rxNone:
			// Frozen or going down while nobody receives: the reader
			// goroutine must take over (it waits for the thaw, or reads
			// the end of the stream), or nobody would until the linger.
			l.handBackLocked()
		}
		r.mu.Unlock()
		return false
	}
	r.owner = rxDriver
	r.mu.Unlock()
	r.drives.Add(1)

	watched := ctx.Done() != nil
	if watched {
		l.intr.arm(l, ctx)
	}
	sp := &l.cr.sp
	if d := w.BusyPoll(); d > 0 {
		sp.until, sp.ctx = nanotime()+int64(d), ctx
	}
	err := l.receive(&drive{ctx: ctx, w: w})
	sp.until, sp.ctx = 0, nil
	l.cr.finishing = false // a driver interrupted mid-frame stops once it is finished
	if watched {
		l.intr.disarm(l)
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	r.owner, r.freeAt = rxNone, nanotime()
	switch err {
	case nil, errInterrupted:
		if l.isDown() || l.closed.Load() {
			l.handBackLocked()
		} else {
			l.armLingerLocked()
		}
		return true
	case errFrozen:
		l.handBackLocked() // it waits for the thaw
		return false
	default:
		// The link failed: the reader goroutine reports it and tears the
		// link down, as when it fails itself.
		r.err = err
		l.handBackLocked()
		return false
	}
}

var _ io.Reader = (*connReader)(nil)
