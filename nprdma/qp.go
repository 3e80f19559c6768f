package nprdma

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nprdma/nprdma/nprdma/link"
)

// Defaults for zero fields of QPConfig (api.go).
const (
	DefaultQueueDepth = 128
	DefaultMaxInline  = 256
	DefaultRNRRetry   = 7
	DefaultRNRTimeout = time.Millisecond
	DefaultTimeout    = 10 * time.Second
	// MaxInlineLimit bounds QPConfig.MaxInline.
	MaxInlineLimit = 4096
)

// softQP is a reliable-connected queue pair of the software NIC: work
// requests execute in order and exactly once, or complete with an error and
// move the QP to the error state, after which every outstanding and later
// work request completes with StatusWRFlushed.
type softQP struct {
	dev    *softDevice
	pd     *softPD
	num    uint32
	sendCQ *softCQ
	recvCQ *softCQ

	maxInline  int
	rnrRetry   int
	rnrTimeout time.Duration
	timeout    time.Duration
	linger     time.Duration

	ctl         sync.Mutex // state transitions and the link
	state       atomic.Int32
	link        link.Link
	linkClosing bool
	remoteNum   uint32
	err         error
	done        chan struct{}
	linkDown    chan struct{}
	lingerTimer *time.Timer

	sq sendQueue
	rq recvQueue
	rs responder // owned by the goroutine delivering packets
	// ackOut is the acknowledgement the responder owes the peer (see owe):
	// written by the delivering goroutine, claimed by it at Idle or by a
	// poster that piggybacks it on a request.
	ackOut atomic.Uint64

	accessTag      atomic.Uint64             // see SetAccessTag
	copyAtDelivery bool                      // the link is a DeliveryCopier (set before it starts)
	driver         atomic.Pointer[driverRef] // the link, if a waiter may receive on it
	// localReader and sharer are the link, if it implements them (set
	// before the QP enters RTS, never changed).
	localReader link.LocalReader
	sharer      link.RegionSharer
	shares      regionShares // regions offered to the peer (see share.go)

	lastRx   atomic.Int64 // nanotime of the last packet from the peer
	timer    *time.Timer  // peer-silence timeout
	rnrTimer *time.Timer
}

// driverRef holds a link that implements Driver.
type driverRef struct{ link.Driver }

type sendQueue struct {
	mu         sync.Mutex
	ring       []sendRecord
	head       int
	count      int    // records outstanding
	sent       int    // of which transmitted (from head)
	sentReqs   int    // of those, requests sent to the peer (not local)
	locals     int    // records executed here (LocalReader), outstanding
	nextSeq    uint32 // sequence number of the next posted request
	flushed    bool   // the QP failed and the queue was flushed
	rnrWait    bool   // waiting RNRTimeout before retransmitting
	timerArmed bool
	busySince  int64
	pkts       []link.Packet
	wcs        []WC
}

type sendRecord struct {
	id        uint64
	op        Opcode
	signaled  bool
	seq       uint32
	length    uint32
	imm       uint32
	raddr     uint64
	rkey      uint32
	segs      [][]byte
	inline    []byte
	inlineSeg [1][]byte
	err       Status // a local error found at post time
	rnrTries  int
	received  uint32 // READ: bytes placed so far
	// local: a READ the requester executed itself when it was posted
	// (LocalReader). It has no sequence number and is never sent; it
	// completes, successfully, once every record before it has.
	local bool
}

type recvQueue struct {
	mu      sync.Mutex
	ring    []recvRecord
	head    int
	count   int
	flushed bool
}

type recvRecord struct {
	id       uint64
	segs     [][]byte
	capacity uint64
	err      Status
}

type responder struct {
	expected uint32 // sequence number of the next request
	lastSend uint32 // length of the last SEND received (the next one's guess)
	nakMode  bool   // an RNR NAK was sent: drop requests until expected returns
	pkts     []link.Packet
	refs     [][]byte
	runs     []readRun
}

var epoch = time.Now()

func nanotime() int64 { return int64(time.Since(epoch)) }

// NewQP creates a queue pair in the init state. Post receives, then Connect
// or accept a ConnRequest with it.
func (pd *softPD) NewQP(cfg QPDriverConfig) (QPDriver, error) {
	scq, ok1 := cfg.SendCQ.(*softCQ)
	rcq, ok2 := cfg.RecvCQ.(*softCQ)
	if !ok1 || !ok2 || scq.dev != pd.dev || rcq.dev != pd.dev {
		return nil, fmt.Errorf("nprdma: create queue pair: completion queue of another device")
	}
	if cfg.MaxInline > MaxInlineLimit {
		return nil, fmt.Errorf("nprdma: create queue pair: max inline %d beyond %d", cfg.MaxInline, MaxInlineLimit)
	}
	def := func(v, d int) int {
		if v <= 0 {
			return d
		}
		return v
	}
	qp := &softQP{
		dev:        pd.dev,
		pd:         pd,
		sendCQ:     scq,
		recvCQ:     rcq,
		maxInline:  def(cfg.MaxInline, DefaultMaxInline),
		rnrRetry:   cfg.RNRRetry,
		rnrTimeout: cfg.RNRTimeout,
		timeout:    cfg.Timeout,
		done:       make(chan struct{}),
		linkDown:   make(chan struct{}),
	}
	if qp.rnrRetry == 0 {
		qp.rnrRetry = DefaultRNRRetry
	} else if qp.rnrRetry < 0 {
		qp.rnrRetry = 0
	}
	if qp.rnrTimeout <= 0 {
		qp.rnrTimeout = DefaultRNRTimeout
	}
	if qp.timeout == 0 {
		qp.timeout = DefaultTimeout
	}
	qp.linger = 2 * time.Second
	if qp.timeout > 0 && qp.timeout < qp.linger {
		qp.linger = qp.timeout
	}
	qp.sq.ring = make([]sendRecord, def(cfg.SendDepth, DefaultQueueDepth))
	qp.rq.ring = make([]recvRecord, def(cfg.RecvDepth, DefaultQueueDepth))
	pd.mu.Lock()
	if pd.closed {
		pd.mu.Unlock()
		return nil, fmt.Errorf("nprdma: create queue pair: protection domain %w", ErrClosed)
	}
	if err := pd.dev.addQP(qp); err != nil {
		pd.mu.Unlock()
		return nil, err
	}
	qp.num = pd.dev.nextQPN.Add(1)
	pd.qps[qp] = struct{}{}
	pd.mu.Unlock()
	qp.sendCQ.users.Add(1)
	qp.recvCQ.users.Add(1)
	qp.sendCQ.attach(qp)
	qp.recvCQ.attach(qp)
	return qp, nil
}

// Num is the queue pair number, reported in completions.
func (qp *softQP) Num() uint32 { return qp.num }

// MaxInline is the largest inline payload.
func (qp *softQP) MaxInline() int { return qp.maxInline }

// RemoteNum is the peer's queue pair number (once connected).
func (qp *softQP) RemoteNum() uint32 {
	qp.ctl.Lock()
	defer qp.ctl.Unlock()
	return qp.remoteNum
}

// State is the current state.
func (qp *softQP) State() QPState { return QPState(qp.state.Load()) }

// SetAccessTag sets the tag the NIC engine compares with a tagged region's
// (WithAccessTag) when a peer names its rkey on this queue pair. It may be
// changed at any time; requests already validated are not affected.
func (qp *softQP) SetAccessTag(tag uint64) { qp.accessTag.Store(tag) }

// AccessTag is the queue pair's access tag (0 unless set).
func (qp *softQP) AccessTag() uint64 { return qp.accessTag.Load() }

// PD is the queue pair's protection domain.
func (qp *softQP) PD() *softPD { return qp.pd }

// Done is closed when the QP enters the error or closed state.
func (qp *softQP) Done() <-chan struct{} { return qp.done }

// Err says why the QP left the ready-to-send state (nil before). It wraps
// one of ErrDisconnected, ErrPeerDisconnected, ErrPeerLost, ErrTimeout,
// ErrRemoteAccess, ErrRemoteRequest, ErrRemoteOperation, ErrRNRRetryExceeded,
// ErrLocalProtection, ErrLocalLength, ErrProtocol, ErrCQOverflow, ErrClosed.
func (qp *softQP) Err() error {
	qp.ctl.Lock()
	defer qp.ctl.Unlock()
	return qp.err
}

// Connect connects the QP to the listener at addr, sending privateData, and
// returns the private data the peer accepted with. A rejection is returned
// as *RejectError. A QP connects at most once; after a failed Connect it is
// in the error state.
func (qp *softQP) Connect(ctx context.Context, addr string, privateData []byte) ([]byte, error) {
	if len(privateData) > MaxPrivateData {
		return nil, fmt.Errorf("nprdma: connect qp %d to %s: %d bytes of private data, at most %d", qp.num, addr, len(privateData), MaxPrivateData)
	}
	if err := qp.beginConnect(); err != nil {
		return nil, err
	}
	lk, hello, err := qp.dev.prov.Dial(ctx, addr, link.Hello{QPNum: qp.num, PrivateData: privateData})
	if err != nil {
		qp.connectFailed()
		var rej *RejectError
		if errors.As(err, &rej) {
			return nil, rej
		}
		return nil, fmt.Errorf("nprdma: connect qp %d to %s: %w", qp.num, addr, err)
	}
	if err := qp.establish(lk, hello.QPNum); err != nil {
		return nil, err
	}
	return hello.PrivateData, nil
}

func (qp *softQP) beginConnect() error {
	qp.ctl.Lock()
	defer qp.ctl.Unlock()
	if st := qp.State(); st != QPStateInit {
		return fmt.Errorf("nprdma: connect qp %d: state is %s, not init", qp.num, st)
	}
	qp.state.Store(int32(QPStateConnecting))
	return nil
}

// connectFailed moves a QP whose connection failed to the error state and
// flushes the receives posted in advance.
func (qp *softQP) connectFailed() {
	qp.ctl.Lock()
	if qp.State() == QPStateConnecting {
		qp.setErrorLocked(fmt.Errorf("nprdma: qp %d: %w", qp.num, ErrNotConnected))
	}
	qp.ctl.Unlock()
	qp.flushQueues(nil)
	qp.closeLinkDown()
}

func (qp *softQP) establish(lk link.Link, remote uint32) error {
	qp.ctl.Lock()
	if qp.State() != QPStateConnecting {
		st := qp.State()
		qp.ctl.Unlock()
		lk.Abort()
		return fmt.Errorf("nprdma: qp %d became %s while connecting: %w", qp.num, st, ErrClosed)
	}
	qp.link = lk
	qp.remoteNum = remote
	if d, ok := lk.(link.Driver); ok {
		qp.driver.Store(&driverRef{d})
	}
	_, qp.copyAtDelivery = lk.(link.DeliveryCopier)
	qp.localReader, _ = lk.(link.LocalReader)
	qp.sharer, _ = lk.(link.RegionSharer)
	qp.state.Store(int32(QPStateRTS))
	lk.Start(qp)
	qp.ctl.Unlock()
	return nil
}

func (qp *softQP) setErrorLocked(cause error) {
	if qp.err == nil {
		qp.err = cause
	}
	qp.state.Store(int32(QPStateError))
	select {
	case <-qp.done:
	default:
		close(qp.done)
	}
}

// fail moves the QP to the error state for cause and shuts its link down:
// gracefully (packets already queued, such as a NAK, still reach the peer)
// or abruptly. The queues are flushed when the link reports it is down.
// fail takes no queue lock, so it may be called with one held.
func (qp *softQP) fail(cause error, abort bool) {
	qp.ctl.Lock()
	if st := qp.State(); st == QPStateRTS || st == QPStateConnecting || st == QPStateInit {
		qp.setErrorLocked(fmt.Errorf("nprdma: qp %d: %w", qp.num, cause))
	}
	lk := qp.link
	first := !qp.linkClosing
	qp.linkClosing = true
	if lk != nil && !abort && first {
		qp.lingerTimer = time.AfterFunc(qp.linger, lk.Abort)
	}
	qp.ctl.Unlock()
	if lk == nil {
		return
	}
	if abort {
		lk.Abort()
	} else if first {
		lk.Close()
	}
}

// Disconnect tells the peer the connection is over (its QP enters the error
// state with ErrPeerDisconnected) and moves this QP to the error state;
// every outstanding work request on both sides completes with
// StatusWRFlushed.
func (qp *softQP) Disconnect() error {
	qp.ctl.Lock()
	st, lk := qp.State(), qp.link
	switch st {
	case QPStateRTS:
		// Enter the error state before the peer can hear of it: its answer
		// (closing the link) must not find this QP still ready to send.
		qp.setErrorLocked(fmt.Errorf("nprdma: qp %d: %w", qp.num, ErrDisconnected))
	case QPStateError, QPStateClosed:
		qp.ctl.Unlock()
		return nil
	default:
		qp.ctl.Unlock()
		return fmt.Errorf("nprdma: disconnect qp %d: %w (state %s)", qp.num, ErrNotConnected, st)
	}
	qp.ctl.Unlock()
	lk.Send([]link.Packet{{Header: link.Header{Kind: link.PacketDisconnect}}})
	qp.fail(ErrDisconnected, false)
	return nil
}

// Close destroys the QP. A connected QP's link is cut at once (the peer sees
// a lost peer, as when a process dies); outstanding work requests complete
// with StatusWRFlushed before Close returns, and no completion follows.
func (qp *softQP) Close() error {
	qp.ctl.Lock()
	if qp.State() == QPStateClosed {
		qp.ctl.Unlock()
		return nil
	}
	if qp.err == nil {
		qp.err = fmt.Errorf("nprdma: qp %d: %w", qp.num, ErrClosed)
	}
	qp.state.Store(int32(QPStateClosed))
	select {
	case <-qp.done:
	default:
		close(qp.done)
	}
	lk := qp.link
	qp.linkClosing = true
	qp.ctl.Unlock()
	if lk != nil {
		lk.Abort()
		<-qp.linkDown
	} else {
		qp.flushQueues(nil)
		qp.closeLinkDown()
	}
	qp.stopTimers()
	qp.forgetShares()
	qp.sendCQ.detach(qp)
	qp.recvCQ.detach(qp)
	qp.sendCQ.users.Add(-1)
	qp.recvCQ.users.Add(-1)
	qp.pd.mu.Lock()
	delete(qp.pd.qps, qp)
	qp.pd.mu.Unlock()
	qp.dev.removeQP(qp)
	return nil
}

func (qp *softQP) closeLinkDown() {
	qp.ctl.Lock()
	defer qp.ctl.Unlock()
	select {
	case <-qp.linkDown:
	default:
		close(qp.linkDown)
	}
}

func (qp *softQP) stopTimers() {
	qp.ctl.Lock()
	if qp.lingerTimer != nil {
		qp.lingerTimer.Stop()
	}
	qp.ctl.Unlock()
	qp.sq.mu.Lock()
	if qp.timer != nil {
		qp.timer.Stop()
	}
	if qp.rnrTimer != nil {
		qp.rnrTimer.Stop()
	}
	qp.sq.timerArmed = false
	qp.sq.mu.Unlock()
}

// flushQueues completes every outstanding work request after the QP failed.
// cause decides the status of the oldest send: StatusRetryExceeded when the
// peer was lost or silent, StatusBadResponse after a protocol violation,
// StatusWRFlushed otherwise (and for every later one).
func (qp *softQP) flushQueues(cause error) {
	head := StatusWRFlushed
	switch {
	case errors.Is(cause, ErrPeerLost), errors.Is(cause, ErrTimeout):
		head = StatusRetryExceeded
	case errors.Is(cause, ErrProtocol):
		head = StatusBadResponse
	}
	sq := &qp.sq
	sq.mu.Lock()
	if !sq.flushed {
		sq.flushed = true
		for sq.count > 0 {
			st := StatusWRFlushed
			if sq.sent > 0 && !sq.ring[sq.head].local {
				st, head = head, StatusWRFlushed
			}
			qp.completeHeadLocked(st)
		}
		sq.rnrWait = false
		qp.pushSendLocked()
	}
	sq.mu.Unlock()

	rq := &qp.rq
	rq.mu.Lock()
	if !rq.flushed {
		rq.flushed = true
		var wcs []WC
		for rq.count > 0 {
			rec := &rq.ring[rq.head]
			wcs = append(wcs, WC{ID: rec.id, Status: StatusWRFlushed, Op: OpRecv, QPNum: qp.num})
			qp.popRecvLocked()
		}
		if len(wcs) > 0 {
			qp.recvCQ.push(wcs...)
		}
	}
	rq.mu.Unlock()
}

// LinkDown is called by the provider once the link is gone.
func (qp *softQP) LinkDown(err error) {
	qp.ctl.Lock()
	if qp.State() == QPStateRTS {
		if errors.Is(err, ErrProtocol) {
			qp.setErrorLocked(fmt.Errorf("nprdma: qp %d: %w", qp.num, err))
		} else {
			qp.setErrorLocked(fmt.Errorf("nprdma: qp %d: %w: %v", qp.num, ErrPeerLost, err))
		}
	}
	cause := qp.err
	if qp.lingerTimer != nil {
		qp.lingerTimer.Stop()
	}
	qp.ctl.Unlock()
	qp.flushQueues(cause)
	qp.stopTimers()
	qp.closeLinkDown()
}

// --- posting ---------------------------------------------------------------

func (qp *softQP) checkSendWR(wr *SendWR) error {
	switch wr.Op {
	case OpSend, OpSendWithImm, OpWrite, OpWriteWithImm, OpRead:
	default:
		return fmt.Errorf("nprdma: post send on qp %d: work request %d: opcode %s: %w", qp.num, wr.ID, wr.Op, ErrInvalidWorkRequest)
	}
	if len(wr.SG) > MaxSGE {
		return fmt.Errorf("nprdma: post send on qp %d: work request %d: %d SGEs, at most %d: %w", qp.num, wr.ID, len(wr.SG), MaxSGE, ErrInvalidWorkRequest)
	}
	if wr.Inline {
		if wr.Op == OpRead {
			return fmt.Errorf("nprdma: post send on qp %d: work request %d: inline READ: %w", qp.num, wr.ID, ErrInvalidWorkRequest)
		}
		n := len(wr.InlineData)
		if wr.InlineData == nil {
			n = 0
			for _, s := range wr.SG {
				n += int(s.Length)
			}
		}
		if n > qp.maxInline {
			return fmt.Errorf("nprdma: post send on qp %d: work request %d: %d inline bytes, at most %d: %w", qp.num, wr.ID, n, qp.maxInline, ErrInvalidWorkRequest)
		}
	}
	return nil
}

// PostSend posts work requests to the send queue. It never waits for the
// network. A malformed request or a full queue fails the whole call and
// posts nothing; errors found while executing (keys, bounds, the peer)
// complete the request with an error status.
func (qp *softQP) PostSend(wrs ...SendWR) error {
	for i := range wrs {
		if err := qp.checkSendWR(&wrs[i]); err != nil {
			return err
		}
	}
	// READs the link can execute here are done before the queue is locked,
	// so that a copy holds up no other poster: bit i of local says wrs[i]
	// was. (A READ posted to a queue found full after its copy has written
	// its destination, as a failed READ may.)
	var local uint64
	if qp.State() == QPStateRTS && qp.localReader != nil {
		for i := range wrs[:min(len(wrs), 64)] {
			if wrs[i].Op == OpRead && qp.readLocal(&wrs[i]) {
				local |= 1 << i
			}
		}
	}
	sq := &qp.sq
	sq.mu.Lock()
	st := qp.State()
	switch st {
	case QPStateInit, QPStateConnecting:
		sq.mu.Unlock()
		return fmt.Errorf("nprdma: post send on qp %d: %w (state %s)", qp.num, ErrNotConnected, st)
	case QPStateClosed:
		sq.mu.Unlock()
		return fmt.Errorf("nprdma: post send on qp %d: %w", qp.num, ErrClosed)
	}
	if sq.flushed {
		for i := range wrs {
			sq.wcs = append(sq.wcs, WC{ID: wrs[i].ID, Status: StatusWRFlushed, Op: wrs[i].Op, QPNum: qp.num})
		}
		qp.pushSendLocked()
		sq.mu.Unlock()
		return nil
	}
	if outstanding := sq.count; outstanding+len(wrs) > len(sq.ring) {
		sq.mu.Unlock()
		return fmt.Errorf("nprdma: post send on qp %d: %d outstanding + %d new > depth %d: %w", qp.num, outstanding, len(wrs), len(sq.ring), ErrQueueFull)
	}
	if sq.count == 0 {
		sq.busySince = nanotime()
	}
	for i := range wrs {
		qp.enqueueLocked(&wrs[i], i < 64 && local&(1<<i) != 0)
	}
	qp.armTimeoutLocked()
	raceRelease()
	sent := qp.transmitLocked()
	if sq.locals > 0 {
		qp.completeLocalsLocked()
		qp.pushSendLocked()
	}
	qp.settleHeadLocked()
	lk := qp.link
	sq.mu.Unlock()
	if sent {
		lk.Flush()
	}
	return nil
}

func (qp *softQP) enqueueLocked(wr *SendWR, local bool) {
	sq := &qp.sq
	rec := &sq.ring[(sq.head+sq.count)%len(sq.ring)]
	sq.count++
	rec.id, rec.op, rec.signaled = wr.ID, wr.Op, wr.Signaled
	rec.local = local
	if local {
		rec.seq = 0 // never sent
		sq.locals++
	} else {
		rec.seq = sq.nextSeq
		sq.nextSeq++
	}
	rec.imm, rec.raddr, rec.rkey = wr.Imm, wr.RemoteAddr, wr.RKey
	rec.err, rec.rnrTries, rec.received = StatusSuccess, 0, 0
	if wr.Inline {
		if rec.inline == nil {
			rec.inline = make([]byte, 0, qp.maxInline)
		}
		rec.inline = rec.inline[:0]
		if wr.InlineData != nil {
			rec.inline = append(rec.inline, wr.InlineData...)
		} else {
			for _, s := range wr.SG {
				b, st := qp.pd.localSlice(s, false)
				if st != StatusSuccess {
					rec.err = st
					break
				}
				rec.inline = append(rec.inline, b...)
			}
		}
		rec.inlineSeg[0] = rec.inline
		rec.segs = rec.inlineSeg[:]
		rec.length = uint32(len(rec.inline))
		return
	}
	rec.segs = rec.segs[:0]
	var total uint64
	for _, s := range wr.SG {
		b, st := qp.pd.localSlice(s, wr.Op == OpRead)
		if st != StatusSuccess {
			rec.err = st
			break
		}
		if len(b) > 0 {
			rec.segs = append(rec.segs, b)
		}
		total += uint64(len(b))
	}
	if rec.err == StatusSuccess && total > MaxMessageSize {
		rec.err = StatusLocalLength
	}
	rec.length = uint32(min(total, MaxMessageSize))
}

// transmitLocked hands every record not yet transmitted to the link, up to
// the first one with a local error; it reports whether it sent anything.
func (qp *softQP) transmitLocked() bool {
	sq := &qp.sq
	if sq.rnrWait || qp.State() != QPStateRTS {
		return false
	}
	pkts := sq.pkts[:0]
	for sq.sent < sq.count {
		rec := &sq.ring[(sq.head+sq.sent)%len(sq.ring)]
		if rec.err != StatusSuccess {
			break
		}
		sq.sent++
		if rec.local {
			continue // executed when posted
		}
		pkts = append(pkts, rec.packet())
		sq.sentReqs++
	}
	if len(pkts) == 0 {
		return false
	}
	// The first request carries the acknowledgement the responder owes, so
	// a request/response exchange needs no ACK packet in either direction.
	if v := qp.takeAck(); v != 0 {
		pkts[0].HasAck, pkts[0].Ack = true, uint32(v)
	}
	qp.link.Send(pkts)
	clear(pkts)
	sq.pkts = pkts[:0]
	return true
}

func (rec *sendRecord) packet() link.Packet {
	p := link.Packet{Header: link.Header{Seq: rec.seq, Len: rec.length}}
	switch rec.op {
	case OpSend, OpSendWithImm:
		p.Kind = link.PacketSend
		p.Data = rec.segs
	case OpWrite, OpWriteWithImm:
		p.Kind = link.PacketWrite
		p.RKey, p.Addr = rec.rkey, rec.raddr
		p.Data = rec.segs
	case OpRead:
		p.Kind = link.PacketReadRequest
		p.RKey, p.Addr = rec.rkey, rec.raddr
	}
	if rec.op.hasImm() {
		p.HasImm, p.Imm = true, rec.imm
	}
	return p
}

// settleHeadLocked completes a record with a local error once every record
// before it completed, and fails the QP (as verbs does on a local error).
func (qp *softQP) settleHeadLocked() {
	sq := &qp.sq
	if sq.count == 0 || sq.sent > 0 || sq.flushed {
		return
	}
	rec := &sq.ring[sq.head]
	if rec.err == StatusSuccess {
		return
	}
	st := rec.err
	qp.completeHeadLocked(st)
	qp.pushSendLocked()
	cause := ErrLocalProtection
	if st == StatusLocalLength {
		cause = ErrLocalLength
	}
	qp.fail(cause, false)
}

// completeHeadLocked removes the oldest send record and queues its
// completion (always for errors, for successes if signaled).
func (qp *softQP) completeHeadLocked(st Status) {
	sq := &qp.sq
	rec := &sq.ring[sq.head]
	if st != StatusSuccess || rec.signaled {
		wc := WC{ID: rec.id, Status: st, Op: rec.op, QPNum: qp.num}
		if st == StatusSuccess {
			wc.ByteLen = rec.length
		}
		sq.wcs = append(sq.wcs, wc)
	}
	clear(rec.segs)
	rec.inlineSeg[0] = nil
	sq.head = (sq.head + 1) % len(sq.ring)
	sq.count--
	if sq.sent > 0 {
		sq.sent--
		if !rec.local {
			sq.sentReqs--
		}
	}
	if rec.local {
		rec.local = false
		sq.locals--
	}
	if sq.count == 0 {
		sq.busySince = 0
	}
}

func (qp *softQP) pushSendLocked() {
	sq := &qp.sq
	if len(sq.wcs) == 0 {
		return
	}
	ok := qp.sendCQ.push(sq.wcs...)
	sq.wcs = sq.wcs[:0]
	if !ok {
		qp.fail(ErrCQOverflow, false)
	}
}

// PostRecv posts receive work requests. They may be posted before the QP
// connects (and should be, or the first SENDs meet RNR NAKs).
func (qp *softQP) PostRecv(wrs ...RecvWR) error {
	for i := range wrs {
		if len(wrs[i].SG) > MaxSGE {
			return fmt.Errorf("nprdma: post recv on qp %d: work request %d: %d SGEs, at most %d: %w", qp.num, wrs[i].ID, len(wrs[i].SG), MaxSGE, ErrInvalidWorkRequest)
		}
	}
	rq := &qp.rq
	rq.mu.Lock()
	defer rq.mu.Unlock()
	if qp.State() == QPStateClosed {
		return fmt.Errorf("nprdma: post recv on qp %d: %w", qp.num, ErrClosed)
	}
	if rq.flushed {
		wcs := make([]WC, len(wrs))
		for i := range wrs {
			wcs[i] = WC{ID: wrs[i].ID, Status: StatusWRFlushed, Op: OpRecv, QPNum: qp.num}
		}
		qp.recvCQ.push(wcs...)
		return nil
	}
	if rq.count+len(wrs) > len(rq.ring) {
		return fmt.Errorf("nprdma: post recv on qp %d: %d outstanding + %d new > depth %d: %w", qp.num, rq.count, len(wrs), len(rq.ring), ErrQueueFull)
	}
	for i := range wrs {
		rec := &rq.ring[(rq.head+rq.count)%len(rq.ring)]
		rq.count++
		rec.id, rec.err, rec.capacity = wrs[i].ID, StatusSuccess, 0
		rec.segs = rec.segs[:0]
		for _, s := range wrs[i].SG {
			b, st := qp.pd.localSlice(s, true)
			if st != StatusSuccess {
				rec.err = st
				break
			}
			if len(b) > 0 {
				rec.segs = append(rec.segs, b)
			}
			rec.capacity += uint64(len(b))
		}
	}
	return nil
}

func (qp *softQP) popRecvLocked() {
	rq := &qp.rq
	rec := &rq.ring[rq.head]
	clear(rec.segs)
	rq.head = (rq.head + 1) % len(rq.ring)
	rq.count--
}

// --- timers ----------------------------------------------------------------

func (qp *softQP) armTimeoutLocked() {
	if qp.timeout <= 0 || qp.sq.timerArmed {
		return
	}
	qp.sq.timerArmed = true
	if qp.timer == nil {
		qp.timer = time.AfterFunc(qp.timeout, qp.onTimeout)
	} else {
		qp.timer.Reset(qp.timeout)
	}
}

// onTimeout checks for a silent peer: work outstanding and nothing received
// for qp.timeout.
func (qp *softQP) onTimeout() {
	sq := &qp.sq
	sq.mu.Lock()
	if sq.count == 0 || sq.flushed || !sq.timerArmed {
		sq.timerArmed = false
		sq.mu.Unlock()
		return
	}
	now := nanotime()
	last := max(sq.busySince, qp.lastRx.Load())
	idle := time.Duration(now - last)
	if sq.rnrWait || idle < qp.timeout {
		wait := qp.timeout - idle
		if sq.rnrWait || wait <= 0 {
			wait = qp.timeout
		}
		qp.timer.Reset(wait)
		sq.mu.Unlock()
		return
	}
	sq.timerArmed = false
	sq.mu.Unlock()
	qp.fail(fmt.Errorf("%w: nothing from the peer for %v with work outstanding", ErrTimeout, idle.Round(time.Millisecond)), true)
}

func (qp *softQP) onRNRTimer() {
	sq := &qp.sq
	sq.mu.Lock()
	if !sq.rnrWait {
		sq.mu.Unlock()
		return
	}
	sq.rnrWait = false
	sent := qp.transmitLocked()
	lk := qp.link
	sq.mu.Unlock()
	if sent {
		lk.Flush()
	}
}
