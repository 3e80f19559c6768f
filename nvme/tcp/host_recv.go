package tcp

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/internal/turns"
)

// leader is the queue as it leads (turns.Leader).
type leader HostQueue

// Lead reads and handles the controller's PDUs until s is done or the queue
// fails (returning nil either way: s is then finished), or until ctx ends
// while the connection has no PDU started (returning ctx's error: the
// caller gives up on s and another goroutine takes over the reading).
func (l *leader) Lead(ctx context.Context, s *turns.Slot) error {
	q := (*HostQueue)(l)
	cancelable := ctx.Done() != nil && q.raw != nil
	for !s.Finished() {
		if q.Err() != nil {
			q.finishAll()
			continue
		}
		if cancelable && q.rd.Buffered() == 0 {
			if err := q.waitReadable(ctx); err != nil {
				if cerr := ctx.Err(); cerr != nil {
					return cerr
				}
				q.fail(err, true)
				continue
			}
		}
		h, err := q.rd.Next()
		if err == nil {
			err = q.handle(h)
		}
		if err != nil {
			q.fail(q.terminate(err), true)
		}
	}
	return nil
}

// waitReadable waits until the connection has something to read (or has
// ended), consuming nothing, so that ctx may end the wait between PDUs
// without losing the stream's place.
func (q *HostQueue) waitReadable(ctx context.Context) error {
	interrupted := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		q.conn.SetReadDeadline(time.Unix(1, 0))
		close(interrupted)
	})
	defer func() {
		if !stop() {
			<-interrupted
			q.conn.SetReadDeadline(time.Time{})
		}
	}()
	for {
		var perr error
		err := q.raw.Read(func(fd uintptr) bool {
			var b [1]byte
			_, _, perr = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			return perr != syscall.EAGAIN
		})
		switch {
		case err == nil:
			return nil // data, the end of the stream or an error: Next reads it
		case errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() == nil:
			// The Reader's stall bound of the last PDU, left set while idle.
			q.conn.SetReadDeadline(time.Time{})
		default:
			return err
		}
	}
}

// handle handles one PDU the controller sent. An error is fatal to the
// queue: a *ProtocolError is reported to the controller (terminate).
func (q *HostQueue) handle(h *Header) error {
	switch h.Type {
	case TypeCapsuleResp:
		cqe, err := ParseCapsuleResp(h.Bytes())
		if err != nil {
			return err
		}
		c := q.inFlight(cqe.CID)
		if c == nil {
			return protocolErrorf(FESInvalidHeaderField, CommonHeaderSize+offCQECID, h.Type, h.Bytes(), "completion of CID %d, which is not in flight", cqe.CID)
		}
		q.complete(c, cqe)
	case TypeC2HData:
		return q.c2hData(h)
	case TypeR2T:
		return q.r2t(h)
	case TypeC2HTermReq:
		return q.termReceived(h)
	default: // the Reader lets only the types above through once initialized
		return protocolErrorf(FESPDUSequenceError, offType, h.Type, h.Bytes(), "unexpected on an initialized connection")
	}
	return nil
}

// offCQECID is the offset of the CID in a completion.
const offCQECID = 12

// inFlight is the command with CID cid, nil if none is in flight (a CID
// of a command the submitter gave up on is still in flight).
func (q *HostQueue) inFlight(cid uint16) *call {
	if int(cid) >= len(q.calls) {
		return nil
	}
	c := q.calls[cid]
	if c.Finished() {
		return nil
	}
	return c
}

// complete finishes c with cqe, unless the transfer went wrong on this
// side: a data digest mismatch (Data Transfer Error, as Linux reports it)
// or a read that got less data than it asked for.
func (q *HostQueue) complete(c *call, cqe nvme.Completion) {
	switch {
	case c.local != 0:
		cqe.Status = c.local
	case cqe.Status.OK() && c.out != nil && c.moved != c.length:
		cqe.Status = nvme.StatusDataTransferError
	}
	q.mu.Lock()
	c.cqe = cqe
	q.finishLocked(c, nil)
	q.mu.Unlock()
}

// c2hData places a C2HData PDU's data. The controller sends a read's data
// in order; with SUCCESS on the last PDU no CapsuleResp follows.
func (q *HostQueue) c2hData(h *Header) error {
	var d DataHeader
	if err := d.Unmarshal(h.Bytes()); err != nil {
		return err
	}
	fail := func(fes FES, fei uint32, format string, args ...any) error {
		return protocolErrorf(fes, fei, h.Type, h.Bytes(), format, args...)
	}
	c := q.inFlight(d.CCCID)
	switch {
	case c == nil:
		return fail(FESInvalidHeaderField, offDataCCCID, "data for CID %d, which is not in flight", d.CCCID)
	case c.out == nil:
		return fail(FESInvalidHeaderField, offDataCCCID, "data for CID %d, which reads none", d.CCCID)
	case d.DATAO != uint32(c.moved):
		return fail(FESDataOutOfRange, offDataDATAO, "DATAO %d, the next byte of the read is %d", d.DATAO, c.moved)
	case uint64(d.DATAO)+uint64(d.DATAL) > uint64(c.length):
		return fail(FESDataOutOfRange, offDataDATAL, "DATAL %d at %d beyond the read's %d bytes", d.DATAL, d.DATAO, c.length)
	case d.Success && !d.Last:
		return fail(FESInvalidHeaderField, offFlags, "SUCCESS without LAST_PDU")
	case d.Success && int(d.DATAO+d.DATAL) != c.length:
		return fail(FESInvalidHeaderField, offFlags, "SUCCESS after %d of the read's %d bytes", d.DATAO+d.DATAL, c.length)
	}
	err := q.rd.ReadData(c.out[d.DATAO : d.DATAO+d.DATAL])
	switch {
	case errors.Is(err, ErrDataDigest):
		c.local = nvme.StatusDataTransferError // the stream is in step: only the command fails
	case err != nil:
		return err
	}
	c.moved += int(d.DATAL)
	if d.Success {
		q.complete(c, nvme.Completion{CID: d.CCCID})
	}
	return nil
}

// r2t answers an R2T with the range of the write's data it asks for, in
// H2CData PDUs of at most MAXH2CDATA bytes. The host allows one R2T per
// command at a time (MAXR2T 0), so the ranges come in order.
func (q *HostQueue) r2t(h *Header) error {
	var r R2T
	if err := r.Unmarshal(h.Bytes()); err != nil {
		return err
	}
	fail := func(fes FES, fei uint32, format string, args ...any) error {
		return protocolErrorf(fes, fei, h.Type, h.Bytes(), format, args...)
	}
	c := q.inFlight(r.CCCID)
	switch {
	case c == nil:
		return fail(FESInvalidHeaderField, offR2TCCCID, "R2T for CID %d, which is not in flight", r.CCCID)
	case c.in == nil:
		return fail(FESInvalidHeaderField, offR2TCCCID, "R2T for CID %d, which has no data to send outside its capsule", r.CCCID)
	case r.R2TO != uint32(c.moved):
		return fail(FESDataOutOfRange, offR2TR2TO, "R2TO %d, the next byte of the write is %d", r.R2TO, c.moved)
	case r.R2TL == 0 || uint64(r.R2TO)+uint64(r.R2TL) > uint64(c.length):
		return fail(FESDataOutOfRange, offR2TR2TL, "R2TL %d at %d outside the write's %d bytes", r.R2TL, r.R2TO, c.length)
	}
	end := int(r.R2TO) + int(r.R2TL)
	c.moved = end
	q.wmu.Lock()
	if q.ended {
		q.wmu.Unlock()
		return nil
	}
	for off := int(r.R2TO); off < end; {
		n := min(end-off, q.maxH2C)
		d := DataHeader{CCCID: r.CCCID, TTAG: r.TTAG, DATAO: uint32(off), Last: off+n == end}
		q.w.H2CData(&d, c.in[off:off+n])
		off += n
	}
	if err := q.flushLocked(); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	return nil
}

// termReceived reads a C2HTermReq: the controller is closing the
// connection.
func (q *HostQueue) termReceived(h *Header) error {
	data := make([]byte, h.DataLen)
	if err := q.rd.ReadData(data); err != nil {
		return err
	}
	var t TermReq
	if err := t.Unmarshal(h.Bytes(), data); err != nil {
		return err
	}
	return fmt.Errorf("%w: %s", ErrTermReq, &t)
}

// termReqTimeout bounds the write of a termination request.
const termReqTimeout = time.Second

// terminate turns an error of the stream into the queue's failure cause;
// a protocol error of the controller's is reported to it first with an
// H2CTermReq (the connection is closed right after).
func (q *HostQueue) terminate(err error) error {
	var pe *ProtocolError
	switch {
	case errors.As(err, &pe):
		// Written before the connection is closed: after any write under
		// way (which may carry it), within a bound.
		t := pe.TermReq(TypeH2CTermReq)
		q.conn.SetWriteDeadline(time.Now().Add(termReqTimeout))
		q.wmu.Lock()
		q.w.TermReq(&t)
		q.ended = true
		for q.flushing {
			q.flushed.Wait()
		}
		q.flushLocked()
		return fmt.Errorf("protocol error of the controller: %w", err)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("%w: %w", errStalled, err)
	}
	return err
}
