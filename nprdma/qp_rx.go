package nprdma

import (
	"fmt"
	"time"

	"github.com/nprdma/nprdma/nprdma/link"
)

// This file is the inbound half of a queue pair: the responder (requests
// from the peer, executed by the NIC engine) and the requester's handling of
// responses. Everything here runs on the one goroutine the provider delivers
// packets on.

// Deliver is called by the provider for each inbound packet.
func (qp *softQP) Deliver(h *link.Header, p link.Payload) error {
	raceAcquire()
	err := qp.deliver(h, p)
	raceRelease()
	return err
}

func (qp *softQP) deliver(h *link.Header, p link.Payload) error {
	qp.lastRx.Store(nanotime())
	if qp.State() != QPStateRTS {
		// After a failure or a disconnect nothing executes any more.
		return discard(p, h.PayloadLen())
	}
	if h.HasAck {
		if err := qp.onPiggybackAck(h.Ack); err != nil {
			return err
		}
	}
	switch h.Kind {
	case link.PacketSend:
		return qp.onSend(h, p)
	case link.PacketWrite:
		return qp.onWrite(h, p)
	case link.PacketReadRequest:
		return qp.onReadRequest(h, p)
	case link.PacketReadResponse:
		return qp.onReadResponse(h, p)
	case link.PacketAck:
		return qp.onAck(h)
	case link.PacketNak:
		return qp.onNak(h)
	case link.PacketDisconnect:
		qp.fail(ErrPeerDisconnected, false)
		return nil
	}
	return qp.protocolError("unexpected packet kind %s", h.Kind)
}

// Idle flushes acknowledgements and responses once the inbound stream is
// drained, so one write carries every response to one read. An
// acknowledgement a request of ours already carried is not sent again.
func (qp *softQP) Idle() {
	if v := qp.takeAck(); v != 0 && qp.State() == QPStateRTS {
		qp.respond(link.Packet{Header: link.Header{Kind: link.PacketAck, Seq: uint32(v)}})
	}
	qp.link.Flush()
}

// ackPendingBit in ackOut marks an acknowledgement owed to the peer; the low
// 32 bits are the last request executed.
const ackPendingBit = 1 << 32

// owe records that the responder executed request seq and owes the peer its
// acknowledgement: a standalone ACK at the next Idle, unless a request of
// ours carries it first (see transmitLocked).
func (qp *softQP) owe(seq uint32) { qp.ackOut.Store(ackPendingBit | uint64(seq)) }

// acknowledged records that a response (READ response, NAK) acknowledges
// everything the responder executed so far.
func (qp *softQP) acknowledged() { qp.ackOut.Store(0) }

// takeAck claims the acknowledgement owed, if any (0: none). Each value is
// claimed once, by Idle or by a poster.
func (qp *softQP) takeAck() uint64 {
	if qp.ackOut.Load() == 0 {
		return 0
	}
	return qp.ackOut.Swap(0)
}

func (qp *softQP) protocolError(format string, args ...any) error {
	err := fmt.Errorf("%w: "+format, append([]any{ErrProtocol}, args...)...)
	qp.fail(err, true)
	return err
}

func discard(p link.Payload, n int) error {
	if n == 0 {
		return nil
	}
	return p.Discard(n)
}

func (qp *softQP) respond(pkts ...link.Packet) {
	qp.rs.pkts = append(qp.rs.pkts[:0], pkts...)
	qp.link.Send(qp.rs.pkts)
	clear(qp.rs.pkts)
}

// checkSeq accepts the request the responder expects. After an RNR NAK the
// requester goes back to the NAKed request, so the requests it had sent
// after it are dropped until it arrives again.
func (qp *softQP) checkSeq(h *link.Header, p link.Payload) (bool, error) {
	rs := &qp.rs
	if h.Seq == rs.expected {
		rs.nakMode = false
		return true, nil
	}
	if rs.nakMode && seqBefore(rs.expected, h.Seq) {
		return false, discard(p, h.PayloadLen())
	}
	return false, qp.protocolError("request %d out of sequence, expected %d", h.Seq, rs.expected)
}

// nak refuses request seq. Every NAK but RNR is fatal for both queue pairs:
// the NAK is sent, then the link closes gracefully.
func (qp *softQP) nak(h *link.Header, p link.Payload, syn link.Syndrome, cause error) error {
	qp.acknowledged() // a NAK acknowledges everything before it
	qp.respond(link.Packet{Header: link.Header{Kind: link.PacketNak, Seq: h.Seq, Syndrome: syn}})
	if err := discard(p, h.PayloadLen()); err != nil {
		return err
	}
	if syn == link.NakRNR {
		qp.rs.nakMode = true
		qp.dev.ctr.rnrNaksSent.Add(1)
		return nil
	}
	qp.fail(cause, false)
	return nil
}

// peekRecv returns the oldest posted receive, or nil.
func (qp *softQP) peekRecv() *recvRecord {
	rq := &qp.rq
	rq.mu.Lock()
	defer rq.mu.Unlock()
	if rq.count == 0 || rq.flushed {
		return nil
	}
	return &rq.ring[rq.head]
}

func (qp *softQP) completeRecv(wc WC) {
	rq := &qp.rq
	rq.mu.Lock()
	wc.ID = rq.ring[rq.head].id
	wc.QPNum = qp.num
	qp.popRecvLocked()
	ok := qp.recvCQ.push(wc)
	rq.mu.Unlock()
	if !ok {
		qp.fail(ErrCQOverflow, false)
	}
}

func (qp *softQP) onSend(h *link.Header, p link.Payload) error {
	if ok, err := qp.checkSeq(h, p); !ok {
		return err
	}
	rec := qp.peekRecv()
	if rec == nil {
		return qp.nak(h, p, link.NakRNR, nil)
	}
	if rec.err != StatusSuccess {
		qp.completeRecv(WC{Status: rec.err, Op: OpRecv})
		return qp.nak(h, p, link.NakRemoteOperation, fmt.Errorf("%w: receive buffer of a %d-byte SEND", ErrLocalProtection, h.Len))
	}
	if uint64(h.Len) > rec.capacity {
		qp.completeRecv(WC{Status: StatusLocalLength, Op: OpRecv})
		return qp.nak(h, p, link.NakInvalidRequest, fmt.Errorf("%w: %d-byte SEND into %d bytes of receive buffers", ErrLocalLength, h.Len, rec.capacity))
	}
	if err := scatter(p, rec.segs, 0, int(h.Len)); err != nil {
		return err
	}
	qp.completeRecv(WC{Status: StatusSuccess, Op: OpRecv, ByteLen: h.Len, Imm: h.Imm, HasImm: h.HasImm})
	qp.owe(qp.rs.expected)
	qp.rs.expected++
	qp.rs.lastSend = h.Len
	return nil
}

func (qp *softQP) onWrite(h *link.Header, p link.Payload) error {
	if ok, err := qp.checkSeq(h, p); !ok {
		return err
	}
	var mr *softMR
	var off int
	if h.Len > 0 {
		// The NIC engine's check, before any byte moves. (As in verbs, a
		// zero-length WRITE names no memory and is not checked.)
		var ok bool
		if mr, off, ok = qp.remoteRegion(h.RKey, h.Addr, h.Len, AccessRemoteWrite); !ok {
			return qp.refuseWrite(h, p)
		}
	}
	if h.HasImm && qp.peekRecv() == nil {
		// WRITE_WITH_IMM consumes a receive: without one nothing is written.
		return qp.nak(h, p, link.NakRNR, nil)
	}
	if mr != nil {
		// Held while the bytes land: Deregister waits for it, so that the
		// owner may free the memory once Deregister returns.
		if !mr.beginServe() {
			return qp.refuseWrite(h, p)
		}
		err := p.Read(mr.buf[off : off+int(h.Len)])
		mr.endServe()
		if err != nil {
			return err
		}
	}
	qp.dev.ctr.writesServed.Add(1)
	qp.dev.ctr.writeBytesServed.Add(uint64(h.Len))
	if h.HasImm {
		qp.completeRecv(WC{Status: StatusSuccess, Op: OpRecvRDMAWithImm, ByteLen: h.Len, Imm: h.Imm, HasImm: true})
	}
	qp.owe(qp.rs.expected)
	qp.rs.expected++
	return nil
}

// refuseWrite answers a WRITE whose region check failed.
func (qp *softQP) refuseWrite(h *link.Header, p link.Payload) error {
	qp.dev.ctr.remoteAccessErrors.Add(1)
	return qp.nak(h, p, link.NakRemoteAccess, fmt.Errorf("%w: peer's WRITE of %d bytes at %#x with rkey %#x refused", ErrRemoteAccess, h.Len, h.Addr, h.RKey))
}

func (qp *softQP) onReadRequest(h *link.Header, p link.Payload) error {
	if ok, err := qp.checkSeq(h, p); !ok {
		return err
	}
	if h.Len > MaxMessageSize {
		return qp.nak(h, p, link.NakInvalidRequest, fmt.Errorf("%w: peer's READ of %d bytes exceeds %d", ErrRemoteRequest, h.Len, MaxMessageSize))
	}
	var mr *softMR
	var off int
	if h.Len > 0 {
		var ok bool
		mr, off, ok = qp.remoteRegion(h.RKey, h.Addr, h.Len, AccessRemoteRead)
		// The copy out of an unpinned region holds it (see Deregister):
		// here, or, on a link that copies at delivery, in unpinnedSource
		// when the requester consumes the response.
		if ok && mr.pager != nil && !qp.copyAtDelivery && !mr.beginServe() {
			ok = false // deregistered since the lookup
		}
		if !ok {
			qp.dev.ctr.remoteAccessErrors.Add(1)
			return qp.nak(h, p, link.NakRemoteAccess, fmt.Errorf("%w: peer's READ of %d bytes at %#x with rkey %#x refused", ErrRemoteAccess, h.Len, h.Addr, h.RKey))
		}
	}
	qp.acknowledged() // the response acknowledges everything before it
	qp.rs.expected++
	if mr != nil && mr.pager != nil && qp.sharer != nil {
		qp.offerRegion(mr)
	}
	qp.serveRead(h.Seq, mr, off, int(h.Len))
	if mr != nil && mr.pager != nil && !qp.copyAtDelivery {
		mr.endServe()
	}
	return nil
}

// requester side -------------------------------------------------------------

// headSeqLocked is the sequence number of the oldest outstanding request.
// Records executed here (local READs) have none and are not counted.
func (qp *softQP) headSeqLocked() uint32 { return qp.sq.nextSeq - uint32(qp.sq.count-qp.sq.locals) }

// ackThroughLocked completes, as successes, the k oldest requests sent to
// the peer, which must all be SENDs or WRITEs (a READ completes only by its
// response), and the local READs before and right after them.
func (qp *softQP) ackThroughLocked(k int) error {
	sq := &qp.sq
	if k > sq.sentReqs {
		return fmt.Errorf("acknowledges %d requests, only %d transmitted", k, sq.sentReqs)
	}
	for i := 0; i < k; {
		rec := &sq.ring[sq.head]
		if !rec.local {
			if rec.op == OpRead {
				return fmt.Errorf("acknowledges READ %d without its response", rec.seq)
			}
			i++
		}
		qp.completeHeadLocked(StatusSuccess)
	}
	qp.completeLocalsLocked()
	return nil
}

// completeLocalsLocked completes the local READs at the head of the send
// queue: every record before them has completed.
func (qp *softQP) completeLocalsLocked() {
	sq := &qp.sq
	for sq.count > 0 && sq.ring[sq.head].local && !sq.flushed {
		qp.completeHeadLocked(StatusSuccess)
	}
}

func (qp *softQP) onAck(h *link.Header) error {
	sq := &qp.sq
	sq.mu.Lock()
	head := qp.headSeqLocked()
	if sq.count == 0 || seqBefore(h.Seq, head) {
		sq.mu.Unlock()
		return qp.protocolError("ACK %d with nothing outstanding from %d", h.Seq, head)
	}
	err := qp.ackThroughLocked(int(h.Seq-head) + 1)
	qp.pushSendLocked()
	if err == nil {
		qp.settleHeadLocked()
	}
	sq.mu.Unlock()
	if err != nil {
		return qp.protocolError("ACK %d %v", h.Seq, err)
	}
	return nil
}

// onPiggybackAck handles the acknowledgement a request from the peer
// carries. Unlike an ACK packet it may be stale: the peer's poster may have
// claimed it before a response that acknowledged more overtook it on the
// wire. A stale one changes nothing; one that covers a request never
// transmitted, or a READ without its response, is a protocol violation.
func (qp *softQP) onPiggybackAck(ack uint32) error {
	sq := &qp.sq
	sq.mu.Lock()
	head := qp.headSeqLocked()
	if seqBefore(ack, head) {
		sq.mu.Unlock()
		return nil
	}
	err := qp.ackThroughLocked(int(ack-head) + 1)
	qp.pushSendLocked()
	if err == nil {
		qp.settleHeadLocked()
	}
	sq.mu.Unlock()
	if err != nil {
		return qp.protocolError("piggybacked ACK %d %v", ack, err)
	}
	return nil
}

func (qp *softQP) onNak(h *link.Header) error {
	sq := &qp.sq
	sq.mu.Lock()
	head := qp.headSeqLocked()
	if sq.count == 0 || seqBefore(h.Seq, head) || int(h.Seq-head) >= sq.sentReqs {
		sq.mu.Unlock()
		return qp.protocolError("NAK %d for no transmitted request (oldest %d)", h.Seq, head)
	}
	if err := qp.ackThroughLocked(int(h.Seq - head)); err != nil {
		qp.pushSendLocked()
		sq.mu.Unlock()
		return qp.protocolError("NAK %d %v", h.Seq, err)
	}
	rec := &sq.ring[sq.head]
	var st Status
	var cause error
	switch h.Syndrome {
	case link.NakRNR:
		rec.rnrTries++
		qp.dev.ctr.rnrRetries.Add(1)
		if rec.rnrTries <= qp.rnrRetry {
			// Go back N: the responder dropped everything after this
			// request; send it all again after the RNR timer.
			sq.sent, sq.sentReqs = 0, 0
			sq.rnrWait = true
			if qp.rnrTimer == nil {
				qp.rnrTimer = time.AfterFunc(qp.rnrTimeout, qp.onRNRTimer)
			} else {
				qp.rnrTimer.Reset(qp.rnrTimeout)
			}
			qp.pushSendLocked()
			sq.mu.Unlock()
			return nil
		}
		st, cause = StatusRNRRetryExceeded, fmt.Errorf("%w: request %d refused %d times", ErrRNRRetryExceeded, h.Seq, rec.rnrTries)
	case link.NakRemoteAccess:
		st, cause = StatusRemoteAccess, fmt.Errorf("%w: %s of %d bytes at %#x with rkey %#x refused by the peer", ErrRemoteAccess, rec.op, rec.length, rec.raddr, rec.rkey)
	case link.NakInvalidRequest:
		st, cause = StatusRemoteInvalidRequest, fmt.Errorf("%w: %s of %d bytes refused by the peer", ErrRemoteRequest, rec.op, rec.length)
	case link.NakRemoteOperation:
		st, cause = StatusRemoteOperation, fmt.Errorf("%w: %s of %d bytes failed at the peer", ErrRemoteOperation, rec.op, rec.length)
	default:
		qp.pushSendLocked()
		sq.mu.Unlock()
		return qp.protocolError("NAK with unknown syndrome %d", h.Syndrome)
	}
	qp.completeHeadLocked(st)
	qp.pushSendLocked()
	sq.mu.Unlock()
	qp.fail(cause, false)
	return nil
}

func (qp *softQP) onReadResponse(h *link.Header, p link.Payload) error {
	sq := &qp.sq
	sq.mu.Lock()
	head := qp.headSeqLocked()
	if sq.count == 0 || seqBefore(h.Seq, head) || int(h.Seq-head) >= sq.sentReqs {
		sq.mu.Unlock()
		return qp.protocolError("READ response %d for no transmitted request (oldest %d)", h.Seq, head)
	}
	err := qp.ackThroughLocked(int(h.Seq - head))
	qp.pushSendLocked()
	rec := &sq.ring[sq.head]
	if err == nil && rec.op != OpRead {
		err = fmt.Errorf("answers %s %d", rec.op, rec.seq)
	}
	if err == nil && (h.Offset != rec.received || h.Len > rec.length-rec.received) {
		err = fmt.Errorf("segment [%d, +%d) of a %d-byte READ with %d bytes received", h.Offset, h.Len, rec.length, rec.received)
	}
	sq.mu.Unlock()
	if err != nil {
		return qp.protocolError("READ response %d %v", h.Seq, err)
	}
	// Only this goroutine completes records, so rec stays ours while the
	// payload lands in its buffers without the lock.
	if h.Fill {
		fillPattern(rec.segs, int(h.Offset), int(h.Len), h.Pattern)
	} else if err := scatter(p, rec.segs, int(h.Offset), int(h.Len)); err != nil {
		return err
	}
	rec.received += h.Len
	if !h.Last {
		return nil
	}
	if rec.received != rec.length {
		return qp.protocolError("READ response %d ends after %d of %d bytes", h.Seq, rec.received, rec.length)
	}
	sq.mu.Lock()
	qp.completeHeadLocked(StatusSuccess)
	qp.completeLocalsLocked()
	qp.pushSendLocked()
	qp.settleHeadLocked()
	sq.mu.Unlock()
	return nil
}

// ExpectPayload implements PayloadExpecter. A READ's response is expected
// when the READ is the oldest request outstanding (no acknowledgement of an
// earlier one is due first): its whole rest in one segment, as a pinned
// region answers. Otherwise the peer's next SEND, as long as the last one,
// into the receive buffer posted first.
func (qp *softQP) ExpectPayload(least int, e *link.ExpectedPayload) bool {
	if qp.State() != QPStateRTS {
		return false
	}
	if qp.expectReadResponse(least, e) {
		return true
	}
	n := qp.rs.lastSend
	if int(n) < least || qp.rs.nakMode {
		return false
	}
	rec := qp.peekRecv()
	if rec == nil || rec.err != StatusSuccess || uint64(n) > rec.capacity || len(rec.segs) == 0 {
		return false
	}
	*e = link.ExpectedPayload{Header: link.Header{Kind: link.PacketSend, Seq: qp.rs.expected, Len: n}, SrcUnknown: true,
		Dst: rec.segs[0][:min(len(rec.segs[0]), int(n))]}
	return true
}

func (qp *softQP) expectReadResponse(least int, e *link.ExpectedPayload) bool {
	sq := &qp.sq
	sq.mu.Lock()
	defer sq.mu.Unlock()
	if sq.count == 0 || sq.sent == 0 {
		return false
	}
	rec := &sq.ring[sq.head]
	rest := rec.length - rec.received
	if rec.op != OpRead || rec.local || rec.err != StatusSuccess || int(rest) < least {
		return false
	}
	off := int(rec.received)
	for _, s := range rec.segs {
		if off < len(s) {
			*e = link.ExpectedPayload{Header: link.Header{Kind: link.PacketReadResponse, Seq: rec.seq, Len: rest, Offset: rec.received, Last: true},
				Src: rec.raddr + uint64(rec.received), Dst: s[off:min(len(s), off+int(rest))]}
			return true
		}
		off -= len(s)
	}
	return false
}

// scatter reads n payload bytes into the concatenation of segs, starting at
// byte off of it.
func scatter(p link.Payload, segs [][]byte, off, n int) error {
	for _, s := range segs {
		if n == 0 {
			return nil
		}
		if off >= len(s) {
			off -= len(s)
			continue
		}
		k := min(len(s)-off, n)
		if err := p.Read(s[off : off+k]); err != nil {
			return err
		}
		off, n = 0, n-k
	}
	return nil
}

// fillPattern writes n bytes at byte off of segs, byte j being byte j%8 of
// pattern (little endian).
func fillPattern(segs [][]byte, off, n int, pattern uint64) {
	j := 0
	for _, s := range segs {
		if n == 0 {
			return
		}
		if off >= len(s) {
			off -= len(s)
			continue
		}
		k := min(len(s)-off, n)
		fillPhase(s[off:off+k], pattern, j)
		j += k
		off, n = 0, n-k
	}
}
