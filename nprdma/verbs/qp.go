//go:build cgo && !noverbs

package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/nprdma/nprdma/nprdma"
)

// wr_id bits: a receive, and the internal markers of QP.Close.
const (
	idRecv  uint64 = 1 << 63
	idDrain uint64 = 1 << 62
	idSeq   uint64 = 1<<62 - 1
)

// QP is a reliable-connected queue pair.
type QP struct {
	dev       *Device
	pd        *PD
	qp        *C.struct_ibv_qp
	num       uint32
	sendCQ    *CQ
	recvCQ    *CQ
	maxInline int
	rnrRetry  int
	rnrTimer  int // the RNR timer code this queue pair asks its peer to wait

	state atomic.Int32 // nprdma.QPState

	ctl       sync.Mutex
	id        *C.struct_rdma_cm_id // the connection, once there is one
	remoteNum uint32
	err       error
	done      chan struct{}
	cmEvents  chan cmEvent // connection set-up events
	dropped   bool         // disconnected by us

	// send queue: records by sequence number (seq % len(sring)), oldest
	// first; a completion of seq completes every record before it.
	smu        sync.Mutex
	sring      []sendRecord
	shead      uint64 // oldest outstanding
	stail      uint64 // next to post
	unsignaled int    // posted unsignaled since the last signal
	swr        [64]C.np_swr
	ssge       [64 * nprdma.MaxSGE]C.np_sge
	inl        []byte

	rmu   sync.Mutex
	rring []uint64 // receive IDs by sequence number
	rhead uint64
	rtail uint64
	rwr   [64]C.np_swr
	rsge  [64 * nprdma.MaxSGE]C.np_sge

	drainedSend, drainedRecv atomic.Bool
}

type sendRecord struct {
	id       uint64
	op       nprdma.Opcode
	length   uint32
	signaled bool // by the application
	hidden   bool // signaled by the QP itself: no completion is reported
}

// NewQP implements nprdma.PDDriver: a queue pair in the init state
// (receives may be posted before it connects). As in verbs, an unsignaled
// send stays outstanding until a later send of the queue completes; the
// queue pair signals one now and then by itself (the completion is not
// reported), and PostSend polls the CQ when the queue looks full, so that
// a stream of unsignaled sends never fills it. RNRRetry 7 (the default)
// is "for ever" to the hardware; larger counts are capped to it.
func (pd *PD) NewQP(c nprdma.QPDriverConfig) (nprdma.QPDriver, error) {
	scq, ok1 := c.SendCQ.(*CQ)
	rcq, ok2 := c.RecvCQ.(*CQ)
	if !ok1 || !ok2 || scq.dev != pd.dev || rcq.dev != pd.dev {
		return nil, fmt.Errorf("verbs: create queue pair: completion queue of another device")
	}
	cfg := struct {
		SendCQ, RecvCQ       *CQ
		SendDepth, RecvDepth int
		MaxInline, RNRRetry  int
		RNRTimeout           time.Duration
	}{scq, rcq, c.SendDepth, c.RecvDepth, c.MaxInline, c.RNRRetry, c.RNRTimeout}
	def := func(v, d int) int {
		if v <= 0 {
			return d
		}
		return v
	}
	sdepth, rdepth := def(cfg.SendDepth, nprdma.DefaultQueueDepth), def(cfg.RecvDepth, nprdma.DefaultQueueDepth)
	inline := def(cfg.MaxInline, nprdma.DefaultMaxInline)
	if inline > nprdma.MaxInlineLimit {
		return nil, fmt.Errorf("verbs: create queue pair: max inline %d beyond %d", inline, nprdma.MaxInlineLimit)
	}
	rnr := cfg.RNRRetry
	switch {
	case rnr == 0:
		rnr = nprdma.DefaultRNRRetry
	case rnr < 0:
		rnr = 0
	case rnr > 7:
		rnr = 7
	}
	maxSGE := min(nprdma.MaxSGE, max(pd.dev.info.MaxSGE, 1))
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.closed {
		return nil, fmt.Errorf("verbs: create queue pair: protection domain %w", nprdma.ErrClosed)
	}
	// One more send and receive than asked for: the drain markers of Close.
	var q *C.struct_ibv_qp
	var e, got C.int
	if c := int(pd.dev.inlineCap.Load()); c > 0 && inline > c {
		inline = c // what the device granted before
	}
	for {
		q = C.np_create_qp(pd.pd, cfg.SendCQ.cq, cfg.RecvCQ.cq, C.int(sdepth+1), C.int(rdepth+1),
			C.int(maxSGE), C.int(maxSGE), C.int(inline), &e, &got)
		if q != nil || syscall.Errno(e) != syscall.EINVAL || inline == 0 {
			break
		}
		// The device grants less inline data than asked: take what it has.
		inline /= 2
		if inline < 32 {
			inline = 0
		}
	}
	if q == nil {
		return nil, fmt.Errorf("verbs: %s: create queue pair (send %d, receive %d): %w", pd.dev.info.Name, sdepth, rdepth, syscall.Errno(e))
	}
	if inline < def(cfg.MaxInline, nprdma.DefaultMaxInline) {
		pd.dev.inlineCap.Store(int32(max(inline, 1)))
	}
	access := C.IBV_ACCESS_LOCAL_WRITE | C.IBV_ACCESS_REMOTE_READ | C.IBV_ACCESS_REMOTE_WRITE
	if rc := C.np_qp_init(q, 1, C.int(access)); rc != 0 {
		C.np_destroy_qp(q)
		return nil, fmt.Errorf("verbs: %s: queue pair to init: %w", pd.dev.info.Name, errnoErr(rc))
	}
	qp := &QP{dev: pd.dev, pd: pd, qp: q, num: uint32(C.np_qp_num(q)), sendCQ: cfg.SendCQ, recvCQ: cfg.RecvCQ,
		maxInline: min(int(got), inline), rnrRetry: rnr, rnrTimer: rnrTimerCode(cfg.RNRTimeout), done: make(chan struct{}), cmEvents: make(chan cmEvent, 8),
		sring: make([]sendRecord, sdepth), rring: make([]uint64, rdepth)}
	if qp.maxInline > 0 {
		qp.inl = make([]byte, 64*qp.maxInline)
	}
	pd.dev.mu.Lock()
	if pd.dev.closed {
		pd.dev.mu.Unlock()
		C.np_destroy_qp(q)
		return nil, fmt.Errorf("verbs: create queue pair: device %w", nprdma.ErrClosed)
	}
	pd.dev.qps[qp] = struct{}{}
	pd.dev.mu.Unlock()
	pd.qps[qp] = struct{}{}
	pd.dev.ctr.qpsCreated.Add(1)
	pd.dev.ctr.qpsOpen.Add(1)
	qp.sendCQ.users.Add(1)
	qp.recvCQ.users.Add(1)
	qp.sendCQ.attach(qp)
	qp.recvCQ.attach(qp)
	pd.dev.hw.addQP(qp)
	return qp, nil
}

// rnrTimes are the delays of the IB RNR timer codes 1 to 31, in
// microseconds (code 0 is 655.36 ms).
var rnrTimes = [...]int{10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560,
	3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520}

// rnrTimerCode is the smallest RNR timer code that waits at least d
// (nprdma.DefaultRNRTimeout when 0).
func rnrTimerCode(d time.Duration) int {
	if d <= 0 {
		d = nprdma.DefaultRNRTimeout
	}
	for i, us := range rnrTimes {
		if time.Duration(us)*time.Microsecond >= d {
			return i + 1
		}
	}
	return 0
}

// Num is the queue pair number.
func (qp *QP) Num() uint32 { return qp.num }

// RemoteNum is the peer's queue pair number (once connected).
func (qp *QP) RemoteNum() uint32 {
	qp.ctl.Lock()
	defer qp.ctl.Unlock()
	return qp.remoteNum
}

// MaxInline is the largest inline payload the device granted.
func (qp *QP) MaxInline() int { return qp.maxInline }

// SetAccessTag implements nprdma.QPDriver: hardware does not enforce tags
// (nprdma.Caps.AccessTags).
func (qp *QP) SetAccessTag(uint64) {}

// State is the current state.
func (qp *QP) State() nprdma.QPState { return nprdma.QPState(qp.state.Load()) }

// Done is closed when the queue pair enters the error or closed state.
func (qp *QP) Done() <-chan struct{} { return qp.done }

// Err says why the queue pair left the ready-to-send state.
func (qp *QP) Err() error {
	qp.ctl.Lock()
	defer qp.ctl.Unlock()
	return qp.err
}

// fail moves the queue pair to the error state for cause: its work
// requests are flushed by the device, and the peer is told (a disconnect),
// so that its queue pair fails too, as the soft NIC's does.
func (qp *QP) fail(cause error) {
	qp.ctl.Lock()
	st := qp.State()
	if st == nprdma.QPStateClosed || st == nprdma.QPStateError {
		qp.ctl.Unlock()
		return
	}
	qp.setErrorLocked(cause)
	qp.errorAndDisconnectLocked()
	qp.ctl.Unlock()
}

// errorAndDisconnectLocked moves the device's queue pair to the error state
// and disconnects its id. It runs under ctl: Close destroys both once it has
// set the closed state under ctl, and a connection manager event that fails
// the queue pair can arrive while Close runs in another goroutine.
func (qp *QP) errorAndDisconnectLocked() {
	C.np_qp_error(qp.qp)
	if qp.id != nil {
		C.np_disconnect(qp.id)
	}
}

// failByCompletion is fail for an error completion. A queue pair that
// already failed because its peer disconnected takes this cause instead:
// the peer disconnects when its own queue pair fails, and that can arrive
// before the completion that says why (a request of ours it refused).
func (qp *QP) failByCompletion(cause error) {
	qp.ctl.Lock()
	if qp.State() == nprdma.QPStateError && !qp.dropped && errors.Is(qp.err, nprdma.ErrPeerDisconnected) {
		qp.err = fmt.Errorf("verbs: qp %d: %w", qp.num, cause)
		qp.ctl.Unlock()
		return
	}
	qp.ctl.Unlock()
	qp.fail(cause)
}

func (qp *QP) setErrorLocked(cause error) {
	if qp.err == nil {
		qp.err = fmt.Errorf("verbs: qp %d: %w", qp.num, cause)
	}
	qp.state.Store(int32(nprdma.QPStateError))
	select {
	case <-qp.done:
	default:
		close(qp.done)
	}
}

// Disconnect ends the connection: both queue pairs enter the error state
// and their outstanding work requests complete with StatusWRFlushed.
func (qp *QP) Disconnect() error {
	qp.ctl.Lock()
	switch st := qp.State(); st {
	case nprdma.QPStateRTS:
	case nprdma.QPStateError, nprdma.QPStateClosed:
		qp.ctl.Unlock()
		return nil
	default:
		qp.ctl.Unlock()
		return fmt.Errorf("verbs: disconnect qp %d: %w (state %s)", qp.num, nprdma.ErrNotConnected, st)
	}
	qp.dropped = true
	qp.setErrorLocked(nprdma.ErrDisconnected)
	qp.errorAndDisconnectLocked()
	qp.ctl.Unlock()
	return nil
}

// Close destroys the queue pair. Outstanding work requests complete with
// StatusWRFlushed before it returns (their completions are in the CQs),
// and none follows. A connected peer sees a disconnect.
func (qp *QP) Close() error {
	qp.ctl.Lock()
	if qp.State() == nprdma.QPStateClosed {
		qp.ctl.Unlock()
		return nil
	}
	if qp.err == nil {
		qp.err = fmt.Errorf("verbs: qp %d: %w", qp.num, nprdma.ErrClosed)
	}
	qp.state.Store(int32(nprdma.QPStateClosed))
	select {
	case <-qp.done:
	default:
		close(qp.done)
	}
	id := qp.id
	qp.id = nil
	qp.ctl.Unlock()
	qp.drain()
	if id != nil {
		qp.dev.forget(id)
		C.np_destroy_id(id)
	}
	qp.dev.hw.removeQP(qp)
	qp.sendCQ.detach(qp)
	qp.recvCQ.detach(qp)
	qp.sendCQ.users.Add(-1)
	qp.recvCQ.users.Add(-1)
	var err error
	if rc := C.np_destroy_qp(qp.qp); rc != 0 {
		err = fmt.Errorf("verbs: destroy qp %d: %w", qp.num, errnoErr(rc))
	}
	qp.pd.mu.Lock()
	delete(qp.pd.qps, qp)
	qp.pd.mu.Unlock()
	qp.dev.mu.Lock()
	delete(qp.dev.qps, qp)
	qp.dev.mu.Unlock()
	qp.dev.ctr.qpsOpen.Add(-1)
	return err
}

// drain moves the queue pair to the error state with a marker behind the
// work requests of each queue, and polls the CQs until both markers are
// flushed: every work request posted before them has completed by then.
// The receive marker goes in before the move (rxe processes a user queue
// pair's receive queue only at the move: receives post without a system
// call), the send marker after it (posted while connected, it would be
// sent).
func (qp *QP) drain() {
	var w C.np_swr
	var bad C.int
	var sg C.np_sge
	w.wr_id = C.uint64_t(idDrain | idRecv)
	qp.rmu.Lock()
	if C.np_post_recv(qp.qp, &w, 1, &sg, &bad) != 0 {
		qp.drainedRecv.Store(true)
	}
	qp.rmu.Unlock()
	C.np_qp_error(qp.qp)
	w.wr_id = C.uint64_t(idDrain)
	w.opcode = C.IBV_WR_SEND
	qp.smu.Lock()
	if C.np_post_send(qp.qp, &w, 1, &sg, nil, &bad) != 0 {
		qp.drainedSend.Store(true)
	}
	qp.smu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	if !qp.sendCQ.drainUntil(func() bool { return qp.drainedSend.Load() && (qp.recvCQ != qp.sendCQ || qp.drainedRecv.Load()) }, deadline) ||
		!qp.recvCQ.drainUntil(qp.drainedRecv.Load, deadline) {
		qp.dev.log.Warn("verbs: queue pair closed before its flushed completions came", "qp", qp.num)
	}
}

// checkSendWR applies nprdma's rules for a work request.
func (qp *QP) checkSendWR(wr *nprdma.SendWR) error {
	switch wr.Op {
	case nprdma.OpSend, nprdma.OpSendWithImm, nprdma.OpWrite, nprdma.OpWriteWithImm, nprdma.OpRead, nprdma.OpSendWithInv:
	default:
		return fmt.Errorf("verbs: post send on qp %d: work request %d: opcode %s: %w", qp.num, wr.ID, wr.Op, nprdma.ErrInvalidWorkRequest)
	}
	if len(wr.SG) > nprdma.MaxSGE || len(wr.SG) > qp.dev.info.MaxSGE {
		return fmt.Errorf("verbs: post send on qp %d: work request %d: %d SGEs, at most %d: %w", qp.num, wr.ID, len(wr.SG), min(nprdma.MaxSGE, qp.dev.info.MaxSGE), nprdma.ErrInvalidWorkRequest)
	}
	if wr.Inline {
		if wr.Op == nprdma.OpRead {
			return fmt.Errorf("verbs: post send on qp %d: work request %d: inline READ: %w", qp.num, wr.ID, nprdma.ErrInvalidWorkRequest)
		}
		if n := inlineLen(wr); n > qp.maxInline {
			return fmt.Errorf("verbs: post send on qp %d: work request %d: %d inline bytes, at most %d: %w", qp.num, wr.ID, n, qp.maxInline, nprdma.ErrInvalidWorkRequest)
		}
	}
	return nil
}

func inlineLen(wr *nprdma.SendWR) int {
	if wr.InlineData != nil {
		return len(wr.InlineData)
	}
	n := 0
	for _, s := range wr.SG {
		n += int(s.Length)
	}
	return n
}

var wrOpcodes = [...]C.uint32_t{
	nprdma.OpSend:         C.IBV_WR_SEND,
	nprdma.OpSendWithImm:  C.IBV_WR_SEND_WITH_IMM,
	nprdma.OpWrite:        C.IBV_WR_RDMA_WRITE,
	nprdma.OpWriteWithImm: C.IBV_WR_RDMA_WRITE_WITH_IMM,
	nprdma.OpRead:         C.IBV_WR_RDMA_READ,
	nprdma.OpSendWithInv:  C.IBV_WR_SEND_WITH_INV,
}

// PostSend posts work requests. It never waits for the network; a
// malformed request or a full queue fails the whole call and posts
// nothing.
func (qp *QP) PostSend(wrs ...nprdma.SendWR) error {
	for len(wrs) > len(qp.swr) {
		if err := qp.PostSend(wrs[:len(qp.swr)]...); err != nil {
			return err
		}
		wrs = wrs[len(qp.swr):]
	}
	for i := range wrs {
		if err := qp.checkSendWR(&wrs[i]); err != nil {
			return err
		}
	}
	switch st := qp.State(); st {
	case nprdma.QPStateInit, nprdma.QPStateConnecting:
		return fmt.Errorf("verbs: post send on qp %d: %w (state %s)", qp.num, nprdma.ErrNotConnected, st)
	case nprdma.QPStateClosed:
		return fmt.Errorf("verbs: post send on qp %d: %w", qp.num, nprdma.ErrClosed)
	}
	qp.smu.Lock()
	defer qp.smu.Unlock()
	if out := qp.stail - qp.shead; int(out)+len(wrs) > len(qp.sring) {
		// Unsignaled requests stay outstanding until a later completion
		// of the queue is polled: poll the CQ (into its stash) and look
		// again, so that the application need not.
		qp.smu.Unlock()
		qp.sendCQ.reap()
		qp.smu.Lock()
		if out := qp.stail - qp.shead; int(out)+len(wrs) > len(qp.sring) {
			return fmt.Errorf("verbs: post send on qp %d: %d outstanding + %d new > depth %d: %w", qp.num, out, len(wrs), len(qp.sring), nprdma.ErrQueueFull)
		}
	}
	nsge, inl := 0, 0
	for i := range wrs {
		wr := &wrs[i]
		seq := qp.stail + uint64(i)
		rec := &qp.sring[seq%uint64(len(qp.sring))]
		*rec = sendRecord{id: wr.ID, op: wr.Op, signaled: wr.Signaled}
		w := &qp.swr[i]
		w.wr_id = C.uint64_t(seq)
		w.opcode = wrOpcodes[wr.Op]
		w.flags = 0
		w.imm = C.uint32_t(wr.Imm)
		if wr.Op == nprdma.OpSendWithInv {
			w.imm = C.uint32_t(wr.InvalidateRKey)
		}
		w.raddr, w.rkey = C.uint64_t(wr.RemoteAddr), C.uint32_t(wr.RKey)
		w.first = C.uint32_t(nsge)
		if wr.Inline {
			w.flags |= C.IBV_SEND_INLINE
			start := inl
			if wr.InlineData != nil {
				inl += copy(qp.inl[inl:], wr.InlineData)
			} else {
				for _, s := range wr.SG {
					b, ok := qp.pd.localBytes(s)
					if !ok {
						return fmt.Errorf("verbs: post send on qp %d: work request %d: inline SGE %#x+%d outside every region of lkey %#x: %w",
							qp.num, wr.ID, s.Addr, s.Length, s.LKey, nprdma.ErrInvalidWorkRequest)
					}
					inl += copy(qp.inl[inl:], b)
				}
			}
			rec.length = uint32(inl - start)
			w.nsge = 0
			if inl > start {
				qp.ssge[nsge] = C.np_sge{addr: C.uint64_t(start), length: C.uint32_t(inl - start)}
				nsge++
				w.nsge = 1
			}
		} else {
			for _, s := range wr.SG {
				qp.ssge[nsge] = C.np_sge{addr: C.uint64_t(s.Addr), length: C.uint32_t(s.Length), lkey: C.uint32_t(s.LKey)}
				nsge++
				rec.length += s.Length
			}
			w.nsge = C.uint32_t(len(wr.SG))
		}
		if wr.Signaled {
			w.flags |= C.IBV_SEND_SIGNALED
			qp.unsignaled = 0
		} else if qp.unsignaled++; qp.unsignaled >= len(qp.sring)/2 {
			w.flags |= C.IBV_SEND_SIGNALED
			rec.hidden = true
			qp.unsignaled = 0
		}
	}
	var inlPtr *C.uint8_t
	if inl > 0 {
		inlPtr = (*C.uint8_t)(unsafe.Pointer(&qp.inl[0]))
	}
	var bad C.int
	rc := C.np_post_send(qp.qp, &qp.swr[0], C.int(len(wrs)), &qp.ssge[0], inlPtr, &bad)
	qp.stail += uint64(bad)
	if rc != 0 {
		return fmt.Errorf("verbs: post send on qp %d: request %d of %d refused: %w", qp.num, int(bad)+1, len(wrs), errnoErr(rc))
	}
	return nil
}

// localBytes resolves an SGE against the PD's regions (inline payloads
// named by SGEs are copied at post time).
func (pd *PD) localBytes(s nprdma.SGE) ([]byte, bool) {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	for mr := range pd.mrs {
		if mr.LKey() != s.LKey || s.Addr < mr.addr {
			continue
		}
		off := s.Addr - mr.addr
		if off > uint64(len(mr.buf)) || uint64(s.Length) > uint64(len(mr.buf))-off {
			return nil, false
		}
		return mr.buf[off : off+uint64(s.Length)], true
	}
	return nil, false
}

// PostRecv posts receive work requests (before connecting too).
func (qp *QP) PostRecv(wrs ...nprdma.RecvWR) error {
	for len(wrs) > len(qp.rwr) {
		if err := qp.PostRecv(wrs[:len(qp.rwr)]...); err != nil {
			return err
		}
		wrs = wrs[len(qp.rwr):]
	}
	for i := range wrs {
		if len(wrs[i].SG) > nprdma.MaxSGE || len(wrs[i].SG) > qp.dev.info.MaxSGE {
			return fmt.Errorf("verbs: post recv on qp %d: work request %d: %d SGEs, at most %d: %w", qp.num, wrs[i].ID, len(wrs[i].SG), min(nprdma.MaxSGE, qp.dev.info.MaxSGE), nprdma.ErrInvalidWorkRequest)
		}
	}
	if qp.State() == nprdma.QPStateClosed {
		return fmt.Errorf("verbs: post recv on qp %d: %w", qp.num, nprdma.ErrClosed)
	}
	qp.rmu.Lock()
	defer qp.rmu.Unlock()
	if out := qp.rtail - qp.rhead; int(out)+len(wrs) > len(qp.rring) {
		return fmt.Errorf("verbs: post recv on qp %d: %d outstanding + %d new > depth %d: %w", qp.num, out, len(wrs), len(qp.rring), nprdma.ErrQueueFull)
	}
	nsge := 0
	for i := range wrs {
		seq := qp.rtail + uint64(i)
		qp.rring[seq%uint64(len(qp.rring))] = wrs[i].ID
		w := &qp.rwr[i]
		w.wr_id = C.uint64_t(idRecv | seq)
		w.first = C.uint32_t(nsge)
		w.nsge = C.uint32_t(len(wrs[i].SG))
		for _, s := range wrs[i].SG {
			qp.rsge[nsge] = C.np_sge{addr: C.uint64_t(s.Addr), length: C.uint32_t(s.Length), lkey: C.uint32_t(s.LKey)}
			nsge++
		}
	}
	var bad C.int
	rc := C.np_post_recv(qp.qp, &qp.rwr[0], C.int(len(wrs)), &qp.rsge[0], &bad)
	qp.rtail += uint64(bad)
	if rc != 0 {
		return fmt.Errorf("verbs: post recv on qp %d: request %d of %d refused: %w", qp.num, int(bad)+1, len(wrs), errnoErr(rc))
	}
	if qp.State() == nprdma.QPStateError {
		// A receive posted in the error state completes flushed; rxe
		// processes a user queue pair's receive queue only when the state
		// is set (receives post without a system call): set it again.
		C.np_qp_error(qp.qp)
	}
	return nil
}

// complete turns a hardware completion of this queue pair into the
// application's (ok false for an internal one) and fails the queue pair on
// an error. It runs under the CQ's lock.
func (qp *QP) complete(w *C.np_wc) (nprdma.WC, bool) {
	id := uint64(w.wr_id)
	st, cause := statusOf(int(w.status))
	if id&idDrain != 0 {
		if id&idRecv != 0 {
			qp.drainedRecv.Store(true)
		} else {
			qp.drainedSend.Store(true)
		}
		return nprdma.WC{}, false
	}
	if cause != nil {
		qp.failByCompletion(fmt.Errorf("%w: %s", cause, C.GoString(C.np_wc_status_str(C.int(w.status)))))
	} else if st == nprdma.StatusWRFlushed && qp.State() == nprdma.QPStateRTS {
		// The device moved the queue pair to the error state without an
		// error completion (Soft-RoCE reports some local errors as flushes).
		qp.fail(fmt.Errorf("%w: work flushed while connected", errDevice))
	}
	if id&idRecv != 0 {
		seq := id & idSeq
		qp.rmu.Lock()
		if seq < qp.rhead || seq >= qp.rtail {
			qp.rmu.Unlock()
			return nprdma.WC{}, false
		}
		wc := nprdma.WC{ID: qp.rring[seq%uint64(len(qp.rring))], Status: st, Op: nprdma.OpRecv, QPNum: qp.num}
		qp.rhead = seq + 1
		qp.rmu.Unlock()
		if st == nprdma.StatusSuccess {
			wc.ByteLen = uint32(w.byte_len)
			if w.opcode == C.IBV_WC_RECV_RDMA_WITH_IMM {
				wc.Op = nprdma.OpRecvRDMAWithImm
			}
			if w.flags&C.IBV_WC_WITH_IMM != 0 {
				wc.HasImm, wc.Imm = true, uint32(w.imm)
			}
			if w.flags&C.IBV_WC_WITH_INV != 0 {
				wc.Invalidated, wc.InvalidatedRKey = true, uint32(w.imm)
			}
		}
		return wc, true
	}
	seq := id & idSeq
	qp.smu.Lock()
	defer qp.smu.Unlock()
	if seq < qp.shead || seq >= qp.stail {
		return nprdma.WC{}, false
	}
	rec := qp.sring[seq%uint64(len(qp.sring))]
	qp.shead = seq + 1
	if st == nprdma.StatusSuccess && (rec.hidden || !rec.signaled) {
		return nprdma.WC{}, false
	}
	wc := nprdma.WC{ID: rec.id, Status: st, Op: rec.op, QPNum: qp.num}
	if st == nprdma.StatusSuccess {
		wc.ByteLen = rec.length
	}
	return wc, true
}

// statusOf maps a verbs completion status to nprdma's, and to the reason
// the queue pair fails (nil for success and flushes).
func statusOf(s int) (nprdma.Status, error) {
	switch s {
	case C.IBV_WC_SUCCESS:
		return nprdma.StatusSuccess, nil
	case C.IBV_WC_WR_FLUSH_ERR:
		return nprdma.StatusWRFlushed, nil
	case C.IBV_WC_LOC_LEN_ERR:
		return nprdma.StatusLocalLength, nprdma.ErrLocalLength
	case C.IBV_WC_LOC_PROT_ERR, C.IBV_WC_LOC_ACCESS_ERR, C.IBV_WC_LOC_QP_OP_ERR, C.IBV_WC_MW_BIND_ERR:
		return nprdma.StatusLocalProtection, nprdma.ErrLocalProtection
	case C.IBV_WC_REM_ACCESS_ERR:
		return nprdma.StatusRemoteAccess, nprdma.ErrRemoteAccess
	case C.IBV_WC_REM_INV_REQ_ERR:
		return nprdma.StatusRemoteInvalidRequest, nprdma.ErrRemoteRequest
	case C.IBV_WC_REM_OP_ERR:
		return nprdma.StatusRemoteOperation, nprdma.ErrRemoteOperation
	case C.IBV_WC_RNR_RETRY_EXC_ERR:
		return nprdma.StatusRNRRetryExceeded, nprdma.ErrRNRRetryExceeded
	case C.IBV_WC_RETRY_EXC_ERR:
		return nprdma.StatusRetryExceeded, nprdma.ErrPeerLost
	case C.IBV_WC_BAD_RESP_ERR:
		return nprdma.StatusBadResponse, nprdma.ErrProtocol
	}
	return nprdma.StatusDeviceError, errDevice
}
