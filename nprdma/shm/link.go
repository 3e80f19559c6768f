package shm

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/nprdma/nprdma/nprdma/link"

	"golang.org/x/sys/unix"
)

// link is one end of a queue pair's connection: a unix socket (the
// handshake, regions shared in place, and the other side's liveness) and a
// ring file mapped by both processes (the packets, one ring per direction).
type shmLink struct {
	prov   *Provider
	conn   *net.UnixConn
	dialer bool
	file   []byte // the ring file's mapping

	in  consumer // the peer's packets; used by the receiving goroutine only
	out producer // ours; guarded by wmu
	// Doorbells: inData is rung by the peer when it wrote into in while we
	// slept, outSpace when it read from out while we waited for space; we
	// ring outData and inSpace for it.
	inData, inSpace, outData, outSpace bell

	rx        link.Receiver
	startOnce sync.Once
	wg        sync.WaitGroup // the socket reader and the writer
	runDone   chan struct{}  // the receive goroutine has finished

	wmu      sync.Mutex
	pending  []outPacket // not yet wholly in the ring, oldest first
	writing  bool        // the writer goroutine runs
	dead     bool        // torn down: nothing is written any more
	ended    bool        // END queued (Close)
	endDone  bool        // END wholly in the ring
	whdr     [packetHeaderLen]byte
	finOnce  sync.Once
	finSeen  atomic.Bool // the peer's END is in its ring: its socket may close
	broken   atomic.Bool // down: waits end, nothing more is delivered
	downOnce sync.Once
	downErr  error         // why, set before broken
	down     chan struct{} // closed with broken

	shares shares  // regions shared either way (grant.go)
	pl     payload // the packet being delivered
	hdr    [packetHeaderLen]byte
	// How long the receiving goroutine and the writer spin before they
	// sleep (each used by one goroutine at a time).
	rxSpin, txSpin spinner
}

// outPacket is a packet that did not fit in the ring when it was sent.
type outPacket struct {
	hdr  [packetHeaderLen]byte
	data [][]byte
	buf  link.Releaser
	size int // header, payload, padding
	done int // bytes of it in the ring
}

func newLink(p *Provider, conn *net.UnixConn, dialer bool, file []byte, size int, bells [4]bell) *shmLink {
	l := &shmLink{prov: p, conn: conn, dialer: dialer, file: file, runDone: make(chan struct{}), down: make(chan struct{})}
	inDir, outDir := 1, 0 // the dialer writes ring 0
	if !dialer {
		inDir, outDir = 0, 1
	}
	l.in = consumer{ring: newRing(file, size, inDir)}
	l.out = producer{ring: newRing(file, size, outDir)}
	// bells: data and space of ring 0, data and space of ring 1.
	l.inData, l.inSpace = bells[2*inDir], bells[2*inDir+1]
	l.outData, l.outSpace = bells[2*outDir], bells[2*outDir+1]
	l.shares.init(p, file, dialer)
	l.pl.l = l
	l.rxSpin, l.txSpin = newSpinner(p.spin), newSpinner(p.spin)
	return l
}

// Start implements link.Link.
func (l *shmLink) Start(r link.Receiver) {
	l.startOnce.Do(func() {
		l.rx = r
		l.wg.Add(1)
		go l.readSocket()
		go l.run()
	})
}

func (l *shmLink) isBroken() bool { return l.broken.Load() }

// breakWith takes the link down for err (the first cause wins): waits end,
// the socket closes (the peer sees it go without a FIN: a lost peer).
func (l *shmLink) breakWith(err error) {
	l.downOnce.Do(func() {
		l.downErr = err
		l.broken.Store(true)
		close(l.down)
		l.conn.Close()
		l.inData.ring()
		l.outSpace.ring()
	})
}

// Send implements link.Link. Packets go straight into the ring while it
// has room and nothing waits before them; the rest is left to the writer
// goroutine, so that Send never waits for the peer.
func (l *shmLink) Send(pkts []link.Packet) {
	l.wmu.Lock()
	if l.dead || l.ended {
		l.wmu.Unlock()
		releasePackets(pkts)
		return
	}
	wrote := false
	for i := range pkts {
		p := &pkts[i]
		if len(l.pending) == 0 && l.writeWhole(p) {
			wrote = true
			if p.Buf != nil {
				p.Buf.Release()
			}
			continue
		}
		l.queue(p)
	}
	if wrote {
		l.out.publish()
	}
	l.startWriterLocked()
	l.wmu.Unlock()
}

func releasePackets(pkts []link.Packet) {
	for i := range pkts {
		if pkts[i].Buf != nil {
			pkts[i].Buf.Release()
		}
	}
}

// writeWhole writes p into the ring if it fits wholly.
func (l *shmLink) writeWhole(p *link.Packet) bool {
	n := p.PayloadLen()
	size := packetHeaderLen + paddedLen(n)
	space, err := l.out.space()
	if err != nil {
		l.breakWith(err)
		return true // dropped with the link
	}
	if space < size {
		return false
	}
	encodeHeader(l.whdr[:], &p.Header)
	l.out.put(l.whdr[:])
	for _, d := range p.Data {
		l.out.put(d)
	}
	l.out.zero(paddedLen(n) - n)
	return true
}

func (l *shmLink) queue(p *link.Packet) {
	op := outPacket{buf: p.Buf, size: packetHeaderLen + paddedLen(p.PayloadLen())}
	encodeHeader(op.hdr[:], &p.Header)
	if len(p.Data) > 0 {
		op.data = append([][]byte(nil), p.Data...)
	}
	l.pending = append(l.pending, op)
}

func (l *shmLink) startWriterLocked() {
	if len(l.pending) > 0 && !l.writing && !l.dead {
		l.writing = true
		l.wg.Add(1)
		go l.writer()
	}
}

// drainLocked writes as much of the pending packets as the ring takes and
// publishes it; it reports whether it wrote anything.
func (l *shmLink) drainLocked() (bool, error) {
	wrote := false
	for len(l.pending) > 0 {
		space, err := l.out.space()
		if err != nil {
			return wrote, err
		}
		if space == 0 {
			break
		}
		op := &l.pending[0]
		for space > 0 && op.done < op.size {
			k := l.writePart(op, space)
			op.done += k
			space -= k
			wrote = true
		}
		if op.done < op.size {
			break
		}
		if op.buf != nil {
			op.buf.Release()
		}
		if op.hdr[0] == kindEnd {
			l.endDone = true
		}
		*op = outPacket{}
		l.pending = l.pending[1:]
	}
	if len(l.pending) == 0 {
		l.pending = nil
	}
	if wrote {
		l.out.publish()
	}
	return wrote, nil
}

// writePart writes up to max bytes of op from where it stands.
func (l *shmLink) writePart(op *outPacket, max int) int {
	at := op.done
	if at < packetHeaderLen {
		k := min(max, packetHeaderLen-at)
		l.out.put(op.hdr[at : at+k])
		return k
	}
	at -= packetHeaderLen
	for _, d := range op.data {
		if at >= len(d) {
			at -= len(d)
			continue
		}
		k := min(max, len(d)-at)
		l.out.put(d[at : at+k])
		return k
	}
	// Padding.
	payload := 0
	for _, d := range op.data {
		payload += len(d)
	}
	k := min(max, op.size-packetHeaderLen-payload-at)
	l.out.zero(k)
	return k
}

// writer writes the pending packets as the peer makes room.
func (l *shmLink) writer() {
	defer l.wg.Done()
	for {
		l.wmu.Lock()
		if l.dead {
			l.writing = false
			l.wmu.Unlock()
			return
		}
		wrote, err := l.drainLocked()
		if err != nil {
			l.writing = false
			l.wmu.Unlock()
			l.breakWith(err)
			return
		}
		if len(l.pending) == 0 {
			l.writing = false
			fin := l.endDone
			l.wmu.Unlock()
			l.Flush()
			if fin {
				l.sendFin()
			}
			return
		}
		seen := atomic.LoadUint64(l.out.head)
		l.wmu.Unlock()
		if wrote {
			l.Flush()
		}
		err = await(func() (bool, error) { return atomic.LoadUint64(l.out.head) != seen, nil },
			l.isBroken, l.outSpace, l.out.txWaiting, &l.txSpin)
		if err != nil {
			l.wmu.Lock()
			l.writing = false
			l.wmu.Unlock()
			return
		}
	}
}

// Flush implements link.Link: it wakes the peer if it sleeps. It looks
// at the ring under wmu: a queue pair may flush a link that went down (and
// unmapped its ring) before the queue pair heard of it.
func (l *shmLink) Flush() {
	l.wmu.Lock()
	sleeps := !l.dead && atomic.LoadUint32(l.out.rxSleeping) != 0
	l.wmu.Unlock()
	if sleeps {
		l.outData.ring()
	}
}

// Close implements link.Link: END follows what is queued, then a FIN on
// the socket tells the peer that the socket's end is not a crash.
func (l *shmLink) Close() {
	l.wmu.Lock()
	if l.dead || l.ended {
		l.wmu.Unlock()
		return
	}
	l.ended = true
	end := link.Packet{Header: link.Header{Kind: kindEnd}}
	if len(l.pending) == 0 && l.writeWhole(&end) {
		l.out.publish()
		l.endDone = true
	} else {
		l.queue(&end)
	}
	fin := l.endDone
	l.startWriterLocked()
	l.wmu.Unlock()
	l.Flush()
	if fin {
		l.sendFin()
	}
}

func (l *shmLink) sendFin() {
	l.finOnce.Do(func() { sendMsg(l.conn, encodeFin()) })
}

// Abort implements link.Link.
func (l *shmLink) Abort() {
	started := true
	l.startOnce.Do(func() { started = false }) // never started: never will be
	l.breakWith(errAborted)
	if !started {
		l.release()
	}
}

var (
	errAborted = errors.New("shm: link aborted")
	errCrashed = errors.New("shm: provider crashed")
	errLost    = fmt.Errorf("%w: the peer's socket closed without FIN (the process ended)", link.ErrPeerLost)
)

// readSocket serves the socket: regions the peer shares and revokes, its
// FIN, and its end.
func (l *shmLink) readSocket() {
	defer l.wg.Done()
	buf := make([]byte, maxMessage+1)
	for {
		b, files, err := recvMsg(l.conn, buf, grantFDs)
		if err != nil {
			if l.finSeen.Load() {
				return // the peer closed gracefully: its END is in the ring
			}
			if errors.Is(err, errMessage) {
				err = fmt.Errorf("%w: %w", link.ErrProtocol, err)
			} else {
				err = errLost
			}
			l.breakWith(err)
			return
		}
		m, err := decodeMessage(b, len(files))
		if err == nil {
			switch m.typ {
			case msgGrant:
				err = l.shares.accept(l.prov, m, files)
				files = nil
			case msgRevoke:
				l.shares.revoked(m.slot, m.rkey)
			case msgFin:
				l.finSeen.Store(true)
			default:
				err = fmt.Errorf("%w: message type %d after the handshake", errMessage, m.typ)
			}
		}
		closeFiles(files)
		if err != nil {
			l.breakWith(fmt.Errorf("%w: %w", link.ErrProtocol, err))
			return
		}
	}
}

// run receives until the link ends, then tears it down.
func (l *shmLink) run() {
	err := l.receive()
	l.teardown(err)
}

// receive delivers the peer's packets in order until its END (io.EOF) or
// the link breaks.
func (l *shmLink) receive() error {
	var h link.Header
	for {
		n, err := l.in.available()
		if err != nil {
			return err
		}
		if n == 0 {
			// About to wait: acknowledgements and responses go first.
			l.rx.Idle()
		}
		if err := l.readIn(l.hdr[:]); err != nil {
			return err
		}
		// A frozen provider delivers nothing more, even a packet that
		// arrived while it waited.
		if l.prov.gate.Frozen() {
			if err := l.waitThawed(); err != nil {
				return err
			}
		}
		end, err := decodeHeader(l.hdr[:], &h)
		if err != nil {
			return fmt.Errorf("%w: %w", link.ErrProtocol, err)
		}
		if end {
			return io.EOF
		}
		plen := h.PayloadLen()
		if n, _ := l.in.available(); n < plen {
			l.rx.Idle()
		}
		l.pl.remaining = plen
		err = l.rx.Deliver(&h, &l.pl)
		if err == nil && l.pl.remaining > 0 {
			err = l.pl.Discard(l.pl.remaining)
		}
		if err == nil {
			err = l.skipIn(paddedLen(plen) - plen)
		}
		if err != nil {
			return err
		}
	}
}

// cause is the error a wait that was stopped reports.
func (l *shmLink) cause(err error) error {
	if errors.Is(err, errStop) && l.isBroken() {
		return l.downErr
	}
	return err
}

// awaitIn waits for the peer to write into the inbound ring.
func (l *shmLink) awaitIn() error {
	err := await(func() (bool, error) {
		n, err := l.in.available()
		return n > 0, err
	}, l.isBroken, l.inData, l.in.rxSleeping, &l.rxSpin)
	return l.cause(err)
}

// readIn fills dst from the inbound ring, waiting for the peer as needed,
// and gives the room back as it goes.
func (l *shmLink) readIn(dst []byte) error { return l.consumeIn(dst, len(dst)) }

// skipIn consumes n bytes of the inbound ring unread.
func (l *shmLink) skipIn(n int) error { return l.consumeIn(nil, n) }

// consumeIn takes n bytes from the inbound ring, into dst unless it is nil.
func (l *shmLink) consumeIn(dst []byte, n int) error {
	for n > 0 {
		if l.isBroken() {
			return l.downErr
		}
		a, err := l.in.available()
		if err != nil {
			return err
		}
		if a == 0 {
			if err := l.awaitIn(); err != nil {
				return err
			}
			continue
		}
		k := min(a, n)
		if dst != nil {
			l.in.take(dst[:k])
			dst = dst[k:]
		} else {
			l.in.pos += uint64(k)
		}
		n -= k
		l.releaseIn()
	}
	return nil
}

func (l *shmLink) releaseIn() {
	l.in.release()
	if atomic.LoadUint32(l.in.txWaiting) != 0 {
		l.inSpace.ring()
	}
}

// waitThawed blocks while the provider is frozen, unless the link breaks.
func (l *shmLink) waitThawed() error {
	for l.prov.gate.Frozen() {
		select {
		case <-l.prov.gate.Thawed():
		case <-l.down:
		}
		if l.isBroken() {
			return l.downErr
		}
	}
	return nil
}

// teardown ends the link after receiving stopped: it stops writing, closes
// the socket (after END and FIN if the peer ended gracefully, as a closed
// TCP connection answers the peer's), lets go of shared regions, unmaps
// the ring and tells the queue pair.
func (l *shmLink) teardown(err error) {
	if err == io.EOF && !l.isBroken() {
		l.Close()
	}
	l.wmu.Lock()
	l.dead = true
	pending := l.pending
	l.pending = nil
	l.wmu.Unlock()
	for i := range pending {
		if pending[i].buf != nil {
			pending[i].buf.Release()
		}
	}
	l.breakWith(err)
	l.wg.Wait()
	l.release()
	close(l.runDone)
	l.rx.LinkDown(err)
}

// release frees what the link holds: shared regions (once nobody reads
// them), the ring file, the doorbells.
func (l *shmLink) release() {
	l.shares.close()
	l.wmu.Lock()
	l.dead = true // nothing touches the ring after this
	l.wmu.Unlock()
	if l.file != nil {
		unix.Munmap(l.file)
		l.file = nil
	}
	for _, b := range []bell{l.inData, l.inSpace, l.outData, l.outSpace} {
		b.close()
	}
	l.prov.removeLink(l)
}

// payload is the payload of the packet being delivered, read straight out
// of the ring.
type payload struct {
	l         *shmLink
	remaining int
}

func (p *payload) Read(dst []byte) error {
	if len(dst) > p.remaining {
		return io.ErrUnexpectedEOF
	}
	if err := p.l.readIn(dst); err != nil {
		return err
	}
	p.remaining -= len(dst)
	return nil
}

func (p *payload) Discard(n int) error {
	if n > p.remaining {
		return io.ErrUnexpectedEOF
	}
	if err := p.l.skipIn(n); err != nil {
		return err
	}
	p.remaining -= n
	return nil
}
