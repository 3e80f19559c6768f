package loop

import (
	"io"
	"sync"

	"github.com/nprdma/nprdma/nprdma/link"
)

// endpoint is one side of a loop link. Packets sent on it are appended to
// the peer's inbox; the peer's delivery goroutine hands them to its queue
// pair, copying payload straight from the sender's memory into the
// receiver's (one copy, as a NIC's DMA).
type endpoint struct {
	prov *Provider
	peer *endpoint

	mu     sync.Mutex
	inbox  []item
	eof    bool  // the peer closed: deliver the inbox, then end with io.EOF
	broken error // the link broke: end at once with this error
	wake   chan struct{}

	// deliverMu is held while a packet is delivered, so that the peer's end
	// can wait until no delivery still reads the peer's memory.
	deliverMu sync.Mutex
	rx        link.Receiver
	startOnce sync.Once
	pl        payload
}

type item struct {
	h    link.Header
	data [][]byte  // a payload of several segments
	one  [1][]byte // a payload of one segment
	src  link.PayloadSource
	buf  link.Releaser
}

func newPair(a, b *Provider) (*endpoint, *endpoint) {
	ea := &endpoint{prov: a, wake: make(chan struct{}, 1)}
	eb := &endpoint{prov: b, wake: make(chan struct{}, 1)}
	ea.peer, eb.peer = eb, ea
	for _, e := range []*endpoint{ea, eb} {
		e.prov.mu.Lock()
		if e.prov.crashed {
			e.broken = errCrashed
			e.peer.broken = errReset
		}
		e.prov.endpoints[e] = struct{}{}
		e.prov.mu.Unlock()
	}
	return ea, eb
}

func (e *endpoint) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Start implements link.Link.
func (e *endpoint) Start(r link.Receiver) {
	e.startOnce.Do(func() {
		e.rx = r
		go e.run()
	})
}

// Send implements link.Link: the packets go straight into the peer's
// inbox.
func (e *endpoint) Send(pkts []link.Packet) {
	p := e.peer
	p.mu.Lock()
	if p.eof || p.broken != nil {
		p.mu.Unlock()
		for i := range pkts {
			if pkts[i].Buf != nil {
				pkts[i].Buf.Release()
			}
		}
		return
	}
	for i := range pkts {
		it := item{h: pkts[i].Header, src: pkts[i].Src, buf: pkts[i].Buf}
		switch d := pkts[i].Data; len(d) {
		case 0:
		case 1:
			it.one[0] = d[0] // the common case needs no allocation
		default:
			it.data = append([][]byte(nil), d...)
		}
		p.inbox = append(p.inbox, it)
	}
	p.mu.Unlock()
	p.signal()
}

// Flush implements link.Link; Send already delivered.
func (e *endpoint) Flush() {}

// CopiesAtDelivery implements link.DeliveryCopier: the receiver copies
// payloads out of the sender's memory when it consumes them.
func (e *endpoint) CopiesAtDelivery() {}

// Close implements link.Link: the peer delivers what it has, then sees the
// end of the stream.
func (e *endpoint) Close() {
	p := e.peer
	p.mu.Lock()
	p.eof = true
	p.mu.Unlock()
	p.signal()
}

// Abort implements link.Link.
func (e *endpoint) Abort() {
	started := true
	e.startOnce.Do(func() { started = false }) // never started: never will be
	e.breakBoth(errAborted)
	if !started {
		e.prov.mu.Lock()
		delete(e.prov.endpoints, e)
		e.prov.mu.Unlock()
	}
}

func (e *endpoint) breakBoth(err error) {
	e.setBroken(err)
	e.peer.setBroken(errReset)
}

func (e *endpoint) setBroken(err error) {
	e.mu.Lock()
	if e.broken == nil {
		e.broken = err
	}
	drop := e.inbox
	e.inbox = nil
	e.mu.Unlock()
	releaseItems(drop)
	e.signal()
}

func releaseItems(items []item) {
	for i := range items {
		if items[i].buf != nil {
			items[i].buf.Release()
		}
		items[i] = item{}
	}
}

func (e *endpoint) isBroken() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.broken != nil
}

// waitThawed blocks while the provider is frozen, unless the link breaks.
// The common case, not frozen, is one atomic load: no lock, no channel.
// Wake-ups it swallows are harmless: the delivery loop looks at the inbox
// before it waits.
func (e *endpoint) waitThawed() {
	for e.prov.gate.Frozen() {
		if e.isBroken() {
			return
		}
		select {
		case <-e.prov.gate.Thawed():
			return
		case <-e.wake:
		}
	}
}

func (e *endpoint) run() {
	var batch []item
	for {
		e.waitThawed()
		e.mu.Lock()
		if e.broken != nil {
			err := e.broken
			drop := e.inbox
			e.inbox = nil
			e.mu.Unlock()
			releaseItems(drop)
			e.finish(err)
			return
		}
		if len(e.inbox) == 0 {
			eof := e.eof
			e.mu.Unlock()
			if eof {
				e.finish(io.EOF)
				return
			}
			<-e.wake
			continue
		}
		batch, e.inbox = e.inbox, batch[:0]
		e.mu.Unlock()
		for i := range batch {
			it := &batch[i]
			e.waitThawed()
			e.deliverMu.Lock()
			var err error
			if !e.isBroken() {
				e.pl = payload{data: it.data, src: it.src, srcLeft: it.h.PayloadLen()}
				if it.data == nil && it.one[0] != nil {
					e.pl.data = it.one[:]
				}
				err = e.rx.Deliver(&it.h, &e.pl)
				if err == nil && e.pl.remaining() > 0 {
					err = e.pl.Discard(e.pl.remaining())
				}
				e.pl = payload{}
			}
			e.deliverMu.Unlock()
			if it.buf != nil {
				it.buf.Release()
			}
			*it = item{}
			if err != nil {
				e.setBroken(err)
				e.peer.setBroken(errReset)
			}
		}
		batch = batch[:0]
		e.mu.Lock()
		drained := len(e.inbox) == 0 && e.broken == nil
		e.mu.Unlock()
		if drained {
			e.rx.Idle()
		}
	}
}

// finish ends the link: it waits until the peer no longer delivers a packet
// of ours (whose payload is our memory), then tells the queue pair.
func (e *endpoint) finish(err error) {
	e.Close() // our end is gone too: the peer sees the end of the stream
	e.peer.deliverMu.Lock()
	//lint:ignore SA2001 an empty critical section is the point: wait for the peer's delivery
	e.peer.deliverMu.Unlock()
	e.prov.mu.Lock()
	delete(e.prov.endpoints, e)
	e.prov.mu.Unlock()
	e.rx.LinkDown(err)
}

// payload reads a packet's payload out of the sender's gather list, or
// from its source (link.PayloadSource), which copies at this moment.
type payload struct {
	data    [][]byte
	i       int
	off     int
	src     link.PayloadSource
	srcLeft int
}

func (p *payload) remaining() int {
	if p.src != nil {
		return p.srcLeft
	}
	n := 0
	for i := p.i; i < len(p.data); i++ {
		n += len(p.data[i])
	}
	return n - p.off
}

func (p *payload) Read(dst []byte) error {
	if p.src != nil {
		if len(dst) > p.srcLeft {
			return io.ErrUnexpectedEOF
		}
		p.src.Read(dst)
		p.srcLeft -= len(dst)
		return nil
	}
	for len(dst) > 0 {
		if p.i >= len(p.data) {
			return io.ErrUnexpectedEOF
		}
		n := copy(dst, p.data[p.i][p.off:])
		dst = dst[n:]
		p.advance(n)
	}
	return nil
}

func (p *payload) Discard(n int) error {
	if p.src != nil {
		if n > p.srcLeft {
			return io.ErrUnexpectedEOF
		}
		p.src.Discard(n)
		p.srcLeft -= n
		return nil
	}
	for n > 0 {
		if p.i >= len(p.data) {
			return io.ErrUnexpectedEOF
		}
		k := min(n, len(p.data[p.i])-p.off)
		n -= k
		p.advance(k)
	}
	return nil
}

func (p *payload) advance(n int) {
	p.off += n
	for p.i < len(p.data) && p.off == len(p.data[p.i]) {
		p.i++
		p.off = 0
	}
}
