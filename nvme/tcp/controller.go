package tcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nprdma/nprdma/nvme"
)

// ErrQueueFailed is wrapped by the errors of operations on a queue whose
// connection failed or that was closed: nvme.ErrQueueFailed, shared by every
// transport binding.
var ErrQueueFailed = nvme.ErrQueueFailed

// QueueStats are a controller queue's counters.
type QueueStats struct {
	Capsules     uint64 // command capsules received
	Malformed    uint64 // answered by the binding with an error status
	DigestErrors uint64 // data digest mismatches (the command failed with Transient Transport Error)
	R2Ts         uint64 // R2T PDUs sent
	H2CData      uint64 // H2CData PDUs received
	C2HData      uint64 // C2HData PDUs sent
	Completions  uint64 // completions sent (CapsuleResp, or C2HData with SUCCESS)
	Writes       uint64 // vectored writes of the connection (each carries one or more PDUs)
}

type queueCounters struct {
	capsules, malformed, digestErrors, r2ts, h2cData, c2hData, completions, writes atomic.Uint64
}

// ControllerQueue is the controller side of one NVMe/TCP connection: it
// reads command capsules, hands each to the handler as a Request, fetches
// write data with R2T/H2CData, and sends read data (C2HData) and
// completions (CapsuleResp).
//
// One goroutine reads the connection (the receive loop); completions are
// written by the goroutines that complete commands: the first to find no
// write in progress writes everything queued, in one writev, while others
// queue behind it, so completions that come together leave together. While
// the receive loop has further PDUs buffered whole, it holds writing back
// (for up to sendBatch PDUs): the completions of commands its handler
// completes at once (a target's resident reads) then leave in one writev
// once it has read what arrived together, instead of one each.
type ControllerQueue struct {
	l       *Listener
	conn    net.Conn
	rd      *Reader
	qid     uint16
	entries int
	remote  string
	log     *slog.Logger
	handler func(*Request)
	first   *Request // the first command, read by the listener to learn the QID
	head    uint16   // SQ head, advanced per capsule (receive loop only)
	stats   queueCounters

	// The send side: out collects what is queued while another goroutine
	// writes; the writer swaps out and spare.
	smu      sync.Mutex
	written  *sync.Cond // signalled (on smu) when a batch has been written
	out      *batch
	spare    *batch
	writing  bool
	hold     bool        // the receive loop holds writing back (see loop)
	queued   uint64      // batches taken for writing (out becomes number queued+1)
	flushed  uint64      // batches written (or discarded)
	sqfcOff  atomic.Bool // SQ flow control disabled (Connect CATTR): SQHD 0xFFFF, C2HData SUCCESS
	wtimeout time.Duration

	mu          sync.Mutex
	reqs        []*Request // by slot (the R2T tag): handed out and not yet released
	free        []*Request
	outstanding int        // commands received and not yet completed
	deferred    []*Request // completed while the receive loop may still place data in them
	loopEnded   bool
	failed      error
	failedFlag  atomic.Bool
	lost        chan struct{}
	loopDone    chan struct{}
	started     atomic.Bool
	closeOnce   sync.Once
	inflight    sync.WaitGroup
}

// batch is a Writer with the requests whose buffers its PDUs reference:
// they are released once it is written.
type batch struct {
	w    *Writer
	reqs []*Request
}

// QID is the queue ID, from the queue's Connect command (0: admin, and for
// a queue whose first command was not a Connect).
func (q *ControllerQueue) QID() uint16 { return q.qid }

// Entries is the submission queue size: the Connect's SQSIZE+1, at most the
// listener's limit for the queue's type.
func (q *ControllerQueue) Entries() int { return q.entries }

// RemoteAddr is the host's address.
func (q *ControllerQueue) RemoteAddr() string { return q.remote }

// Lost is closed as soon as the connection has failed or the queue is being
// closed.
func (q *ControllerQueue) Lost() <-chan struct{} { return q.lost }

// Done is closed once the receive loop has stopped.
func (q *ControllerQueue) Done() <-chan struct{} { return q.loopDone }

// Err says why the queue stopped (nil while it runs).
func (q *ControllerQueue) Err() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.failed
}

// Stats returns the queue's counters.
func (q *ControllerQueue) Stats() QueueStats {
	s := &q.stats
	return QueueStats{Capsules: s.capsules.Load(), Malformed: s.malformed.Load(), DigestErrors: s.digestErrors.Load(),
		R2Ts: s.r2ts.Load(), H2CData: s.h2cData.Load(), C2HData: s.c2hData.Load(), Completions: s.completions.Load(),
		Writes: s.writes.Load()}
}

// Start runs the receive loop, handing every well-formed command to h on
// it (h must not block). Malformed capsules are answered by the binding
// itself; protocol errors end the connection with a C2HTermReq.
func (q *ControllerQueue) Start(h func(*Request)) {
	if !q.started.CompareAndSwap(false, true) {
		return
	}
	q.handler = h
	go q.loop()
}

// Close tears the queue down: the connection is closed, commands still
// executing complete into nothing. It returns once the receive loop has
// stopped.
func (q *ControllerQueue) Close() error {
	q.fail(fmt.Errorf("queue %d from %s: %w: closed by the controller", q.qid, q.remote, ErrQueueFailed))
	if q.started.Load() {
		<-q.loopDone
	} else {
		q.closeOnce.Do(func() {
			if r := q.first; r != nil {
				q.first = nil
				r.Fail(nvme.Errorf(nvme.StatusAbortedSQDeleted, "queue %d closed before it started", q.qid))
			}
			q.teardown()
			close(q.loopDone)
		})
	}
	return nil
}

// Wait waits until every command handed out has released its buffers.
func (q *ControllerQueue) Wait() { q.inflight.Wait() }

// fail records err as the reason the queue stops (the first one counts) and
// closes the connection, which ends the receive loop.
func (q *ControllerQueue) fail(err error) {
	q.mu.Lock()
	first := q.failed == nil
	if first {
		q.failed = err
		q.failedFlag.Store(true)
		close(q.lost)
	}
	q.mu.Unlock()
	if first {
		q.conn.Close()
	}
}

// sendBatch bounds how many PDUs the receive loop handles while it holds
// writing back: the completions of the first ones wait for the last.
const sendBatch = 16

func (q *ControllerQueue) loop() {
	defer close(q.loopDone)
	if q.first != nil {
		r := q.first
		q.first = nil
		q.handler(r)
	}
	held := 0
	for !q.failedFlag.Load() {
		// Hold writing back only while the next PDU is here already:
		// before the loop may wait for the host, everything queued goes.
		held++
		hold := held < sendBatch && q.rd.NextBuffered()
		if !hold {
			held = 0
		}
		q.holdSends(hold)
		h, err := q.rd.Next()
		if err == nil {
			switch h.Type {
			case TypeCapsuleCmd:
				var r *Request
				if r, err = q.onCapsule(h); r != nil {
					q.handler(r)
				}
			case TypeH2CData:
				err = q.onH2CData(h)
			case TypeH2CTermReq:
				err = q.onTermReq(h)
			}
		}
		if err != nil {
			q.holdSends(false)
			q.readFailed(err)
			break
		}
	}
	q.holdSends(false)
	q.closeOnce.Do(q.teardown)
}

// readFailed ends the connection after a read error: a protocol error is
// reported to the host with a C2HTermReq first, and logged.
func (q *ControllerQueue) readFailed(err error) {
	var pe *ProtocolError
	if errors.As(err, &pe) && pe.Type != TypeH2CTermReq {
		q.log.Warn("nvme/tcp: protocol error: terminating the connection", "qid", q.qid, "from", q.remote,
			"fes", pe.FES.String(), "fei", pe.FEI, "err", pe.Detail)
		q.terminate(pe)
	} else if !q.failedFlag.Load() && !errors.Is(err, ErrTermReq) {
		q.log.Info("nvme/tcp: connection lost", "qid", q.qid, "from", q.remote, "err", err)
	}
	q.fail(fmt.Errorf("queue %d from %s: %w: %w", q.qid, q.remote, ErrQueueFailed, err))
}

// terminate sends the C2HTermReq that reports pe, behind what is queued,
// and returns once it is written (bounded by the write timeout): the
// connection is closed next.
func (q *ControllerQueue) terminate(pe *ProtocolError) {
	tr := pe.TermReq(TypeC2HTermReq)
	seq := q.send(nil, func(w *Writer) { w.TermReq(&tr) })
	q.smu.Lock()
	for q.flushed < seq {
		q.written.Wait()
	}
	q.smu.Unlock()
}

// teardown runs once the receive loop has stopped: the connection is closed,
// commands waiting for host data are woken (their requests are released
// when they complete), and those completed meanwhile are released.
func (q *ControllerQueue) teardown() {
	q.fail(fmt.Errorf("queue %d from %s: %w", q.qid, q.remote, ErrQueueFailed))
	q.mu.Lock()
	q.loopEnded = true
	var waiting []*Request
	for _, r := range q.reqs {
		if r != nil && r.awaiting {
			r.awaiting = false
			waiting = append(waiting, r)
		}
	}
	deferred := q.deferred
	q.deferred = nil
	q.mu.Unlock()
	err := q.transportError("host data", q.Err())
	for _, r := range waiting {
		r.dataDone(err)
	}
	for _, r := range deferred {
		r.release()
	}
	q.l.live.Add(-1)
}

// onCapsule reads a command capsule and returns its request to hand out,
// or nil when the binding completed it itself (a malformed capsule, a data
// digest mismatch).
func (q *ControllerQueue) onCapsule(h *Header) (*Request, error) {
	r, err := q.newRequest(h)
	if err != nil {
		return nil, err
	}
	if h.DataLen > 0 {
		if err := q.rd.ReadData(r.capsule[nvme.SQESize : nvme.SQESize+h.DataLen]); err != nil {
			if !errors.Is(err, ErrDataDigest) {
				q.releaseUnsent(r)
				return nil, err
			}
			q.stats.digestErrors.Add(1)
			r.Fail(nvme.Errorf(nvme.StatusTransientTransportError, "queue %d: in-capsule data: %v", q.qid, err))
			return nil, nil
		}
	}
	q.stats.capsules.Add(1)
	cmd, icd, perr := nvme.ParseCapsule(r.capsule[:nvme.SQESize+h.DataLen], InCapsuleLimit(&r.Cmd, q.icdLimit()))
	r.Cmd, r.icd = cmd, icd
	if perr == nil && cmd.DPTR.Keyed() && cmd.DPTR.Length() > 0 {
		perr = nvme.Errorf(nvme.StatusSGLDescriptorTypeInvalid.WithDNR(), "keyed SGL %s: NVMe/TCP moves data in PDUs", cmd.DPTR)
	}
	if perr != nil {
		q.stats.malformed.Add(1)
		r.Fail(perr)
		return nil, nil
	}
	return r, nil
}

// icdLimit is the queue's in-capsule data limit.
func (q *ControllerQueue) icdLimit() int {
	if q.qid == 0 {
		return FabricsInCapsuleData
	}
	return q.l.cfg.icd
}

// newRequest takes a slot for the capsule whose header h is: a released
// Request when there is one. A host with more commands outstanding than its
// queue holds breaks the sequence of the protocol.
func (q *ControllerQueue) newRequest(h *Header) (*Request, error) {
	q.mu.Lock()
	if q.outstanding >= q.entries {
		n := q.outstanding
		q.mu.Unlock()
		return nil, protocolErrorf(FESPDUSequenceError, 0, TypeCapsuleCmd, h.Bytes(),
			"a command beyond the %d the queue holds (%d outstanding)", q.entries, n)
	}
	q.outstanding++
	var r *Request
	if n := len(q.free); n > 0 {
		r = q.free[n-1]
		q.free = q.free[:n-1]
	} else {
		if len(q.reqs) > 0xffff {
			q.mu.Unlock()
			return nil, protocolErrorf(FESPDUSequenceError, 0, TypeCapsuleCmd, h.Bytes(), "no command slot free")
		}
		r = &Request{q: q, slot: len(q.reqs), done: make(chan error, 1)}
		q.reqs = append(q.reqs, nil)
	}
	q.reqs[r.slot] = r
	q.mu.Unlock()
	q.inflight.Add(1)
	q.head++
	if int(q.head) == q.entries {
		q.head = 0
	}
	r.sqhd = q.head
	if r.capsule == nil {
		r.capsule = make([]byte, nvme.SQESize+max(q.l.cfg.icd, FabricsInCapsuleData))
	}
	copy(r.capsule, h.raw[CommonHeaderSize:CapsuleCmdHeaderSize])
	_ = r.Cmd.Unmarshal(r.capsule[:nvme.SQESize])
	r.icd, r.data, r.dataLen, r.awaiting, r.got, r.dataErr = nil, nil, 0, false, 0, nil
	select {
	case <-r.done:
	default:
	}
	r.state.Store(reqExecuting)
	return r, nil
}

// onH2CData places the data of an H2CData PDU in the buffer of the command
// whose R2T it answers.
func (q *ControllerQueue) onH2CData(h *Header) error {
	var d DataHeader
	_ = d.Unmarshal(h.Bytes())
	q.stats.h2cData.Add(1)
	q.mu.Lock()
	var r *Request
	if int(d.TTAG) < len(q.reqs) {
		r = q.reqs[d.TTAG]
	}
	ok := r != nil && r.awaiting
	q.mu.Unlock()
	switch {
	case !ok:
		return protocolErrorf(FESInvalidHeaderField, offDataTTAG, TypeH2CData, h.Bytes(), "TTAG %d names no R2T outstanding", d.TTAG)
	case d.CCCID != r.Cmd.CID:
		return protocolErrorf(FESInvalidHeaderField, offDataCCCID, TypeH2CData, h.Bytes(), "CCCID %d, the R2T was for command %d", d.CCCID, r.Cmd.CID)
	case d.DATAO != uint32(r.got) || uint64(d.DATAO)+uint64(d.DATAL) > uint64(len(r.data)):
		return protocolErrorf(FESDataOutOfRange, offDataDATAO, TypeH2CData, h.Bytes(),
			"data [%d, +%d): %d of %d bytes arrived", d.DATAO, d.DATAL, r.got, len(r.data))
	}
	err := q.rd.ReadData(r.data[d.DATAO : d.DATAO+d.DATAL])
	if err != nil && !errors.Is(err, ErrDataDigest) {
		return err
	}
	if err != nil {
		q.stats.digestErrors.Add(1)
		r.dataErr = nvme.Errorf(nvme.StatusTransientTransportError, "queue %d: H2CData: %v", q.qid, err)
	}
	r.got += int(d.DATAL)
	if r.got == len(r.data) {
		q.mu.Lock()
		r.awaiting = false
		q.mu.Unlock()
		r.dataDone(r.dataErr)
	} else if d.Last {
		return protocolErrorf(FESPDUSequenceError, 0, TypeH2CData, h.Bytes(), "LAST_PDU after %d of %d bytes", r.got, len(r.data))
	}
	return nil
}

func (q *ControllerQueue) onTermReq(h *Header) error {
	data := make([]byte, h.DataLen)
	_ = q.rd.ReadData(data)
	var tr TermReq
	_ = tr.Unmarshal(h.Bytes(), data)
	q.log.Warn("nvme/tcp: the host terminated the connection", "qid", q.qid, "from", q.remote,
		"fes", tr.FES.String(), "fei", tr.FEI)
	return fmt.Errorf("%w: %s", ErrTermReq, &tr)
}

// send queues the PDUs add writes (for request r, whose buffers they may
// reference; nil for none) and writes everything queued unless another
// goroutine is writing, which then writes them, or the receive loop holds
// writing back, and then writes them when it stops holding. It returns the
// number of the batch they are in: written once q.flushed reaches it.
func (q *ControllerQueue) send(r *Request, add func(w *Writer)) uint64 {
	q.smu.Lock()
	add(q.out.w)
	if r != nil {
		q.out.reqs = append(q.out.reqs, r)
	}
	seq := q.queued + 1
	if q.writing || q.hold {
		q.smu.Unlock()
		return seq
	}
	q.writeLocked()
	return seq
}

// holdSends sets whether the receive loop holds writing back; when it
// stops, what was queued meanwhile is written unless another goroutine is
// writing.
func (q *ControllerQueue) holdSends(hold bool) {
	q.smu.Lock()
	q.hold = hold
	if hold || q.writing || q.out.w.Buffered() == 0 && len(q.out.reqs) == 0 {
		q.smu.Unlock()
		return
	}
	q.writeLocked()
}

// writeLocked writes everything queued, and what is queued while it writes,
// then returns with smu released. Called with smu held and nobody writing.
func (q *ControllerQueue) writeLocked() {
	q.writing = true
	for q.out.w.Buffered() > 0 || len(q.out.reqs) > 0 {
		b := q.out
		q.out, q.spare = q.spare, nil
		q.queued++
		q.smu.Unlock()
		var err error
		if q.failedFlag.Load() {
			b.w.discard()
		} else {
			_ = q.conn.SetWriteDeadline(time.Now().Add(q.wtimeout))
			err = b.w.Flush()
			q.stats.writes.Add(1)
		}
		for i, r := range b.reqs {
			r.release()
			b.reqs[i] = nil
		}
		b.reqs = b.reqs[:0]
		if err != nil {
			q.fail(fmt.Errorf("queue %d from %s: %w: write: %w", q.qid, q.remote, ErrQueueFailed, err))
		}
		q.smu.Lock()
		q.spare = b
		q.flushed++
		q.written.Broadcast()
	}
	q.writing = false
	q.smu.Unlock()
}

// releaseUnsent releases a request that was never handed out.
func (q *ControllerQueue) releaseUnsent(r *Request) {
	q.mu.Lock()
	q.outstanding--
	q.mu.Unlock()
	r.state.Store(reqDone)
	r.release()
}

// Request is one command received on a ControllerQueue. Its methods may be
// called from any goroutine; Complete (or Fail) must be called exactly once,
// after which the queue reuses it: keep no reference to it.
type Request struct {
	// Cmd is the command (valid until Complete).
	Cmd nvme.Command

	q        *ControllerQueue
	slot     int // the R2T tag
	sqhd     uint16
	capsule  []byte // the SQE and the in-capsule data
	icd      []byte
	data     []byte // host data fetched with R2T, or data for the host
	dataLen  int
	awaiting bool // an R2T is outstanding (guarded by q.mu)
	got      int  // bytes of it arrived (receive loop only)
	dataErr  error
	done     chan error
	state    atomic.Int32
}

const (
	reqExecuting int32 = iota
	reqDone
)

// Command is the command (valid until Complete).
func (r *Request) Command() *nvme.Command { return &r.Cmd }

// InCapsuleData is the data the capsule carried (nil if none).
func (r *Request) InCapsuleData() []byte { return r.icd }

// HostData returns the data the command moves from the host: the in-capsule
// data, or the data its transport SGL describes, asked for with one R2T and
// received in H2CData PDUs, waited for at most timeout. A host that does
// not send it in time has stalled: the queue is closed and the error is
// context.DeadlineExceeded. A data digest mismatch is Transient Transport
// Error. A command without data gives nil. Valid until Complete.
func (r *Request) HostData(timeout time.Duration) ([]byte, error) {
	if r.icd != nil {
		return r.icd, nil
	}
	sgl := r.Cmd.DPTR
	n := int(sgl.Length())
	if n == 0 {
		return nil, nil
	}
	q := r.q
	if !sgl.Transport() {
		return nil, nvme.Errorf(nvme.StatusSGLDescriptorTypeInvalid.WithDNR(), "SGL %s does not describe data to transfer", sgl)
	}
	if n > q.l.cfg.maxTransfer {
		return nil, nvme.Errorf(nvme.StatusDataSGLLengthInvalid.WithDNR(), "SGL of %d bytes beyond the transfer limit of %d", n, q.l.cfg.maxTransfer)
	}
	if r.data != nil {
		return nil, fmt.Errorf("nvme/tcp: command %d: host data fetched twice", r.Cmd.CID)
	}
	r.data = q.l.pool.get(n)
	q.mu.Lock()
	if q.failed != nil {
		q.mu.Unlock()
		return nil, q.transportError("R2T", q.Err())
	}
	r.awaiting = true
	q.mu.Unlock()
	r2t := R2T{CCCID: r.Cmd.CID, TTAG: uint16(r.slot), R2TL: uint32(n)}
	q.stats.r2ts.Add(1)
	_ = q.send(nil, func(w *Writer) { w.R2T(&r2t) })
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case err := <-r.done:
		if err != nil {
			return nil, err
		}
		return r.data, nil
	case <-t.C:
		q.log.Warn("nvme/tcp: the host did not send a write's data in time: closing the queue", "qid", q.qid,
			"from", q.remote, "cid", r.Cmd.CID, "bytes", n, "timeout", timeout)
		q.fail(fmt.Errorf("queue %d from %s: %w: no H2CData for %v", q.qid, q.remote, ErrQueueFailed, timeout))
		return nil, context.DeadlineExceeded
	}
}

// dataDone ends HostData's wait.
func (r *Request) dataDone(err error) {
	select {
	case r.done <- err:
	default:
	}
}

func (q *ControllerQueue) transportError(op string, err error) error {
	return nvme.Errorf(nvme.StatusTransientTransportError, "queue %d: %s: %w", q.qid, op, errors.Join(ErrQueueFailed, err))
}

// DataBuffer returns an n-byte buffer whose content Complete sends to the
// host in C2HData (for commands that return data). Valid until Complete.
func (r *Request) DataBuffer(n int) ([]byte, error) {
	q := r.q
	if n <= 0 || n > q.l.cfg.maxTransfer {
		return nil, nvme.Errorf(nvme.StatusDataSGLLengthInvalid.WithDNR(), "transfer of %d bytes outside [1, %d]", n, q.l.cfg.maxTransfer)
	}
	if r.data != nil {
		q.mu.Lock()
		awaiting := r.awaiting
		q.mu.Unlock()
		if awaiting {
			return nil, fmt.Errorf("nvme/tcp: command %d: data buffer while host data is awaited", r.Cmd.CID)
		}
		q.l.pool.put(r.data)
	}
	r.data, r.dataLen = q.l.pool.get(n), n
	return r.data, nil
}

// Fail completes the command with the status err maps to (nvme.StatusOf;
// a *nvme.StatusError's Result goes into DW0).
func (r *Request) Fail(err error) error {
	var c nvme.Completion
	c.SetError(err)
	return r.Complete(c)
}

// Complete sends the completion c (its CID, SQID and SQHD are filled in)
// and, when c is a success and a data buffer was set, first the data in a
// C2HData PDU. When the host disabled SQ flow control and c carries nothing
// but success, the C2HData's SUCCESS flag stands for the CapsuleResp.
func (r *Request) Complete(c nvme.Completion) error {
	if !r.state.CompareAndSwap(reqExecuting, reqDone) {
		return fmt.Errorf("nvme/tcp: command %d completed twice", r.Cmd.CID)
	}
	q := r.q
	c.CID, c.SQID, c.SQHD = r.Cmd.CID, q.qid, r.sqhd
	if q.sqfcOff.Load() {
		c.SQHD = 0xffff
	}
	var data []byte
	if c.Status.OK() && r.dataLen > 0 {
		sgl := r.Cmd.DPTR
		if !sgl.Transport() || int(sgl.Length()) < r.dataLen {
			c = nvme.Completion{CID: c.CID, SQID: c.SQID, SQHD: c.SQHD}
			c.SetError(nvme.Errorf(nvme.StatusDataSGLLengthInvalid.WithDNR(), "SGL %s cannot take %d bytes", sgl, r.dataLen))
		} else {
			data = r.data[:r.dataLen]
		}
	}
	if c.Status.OK() && r.Cmd.IsFabrics() && r.Cmd.FabricsType() == nvme.FabricsConnect && r.Cmd.Connect().CATTR&nvme.CATTRDisableSQFlowControl != 0 {
		// From this completion on: nvmet answers the Connect itself with
		// SQHD 0xFFFF.
		q.sqfcOff.Store(true)
		c.SQHD = 0xffff
	}
	q.mu.Lock()
	q.outstanding--
	failed := q.failed
	q.mu.Unlock()
	if failed != nil {
		r.release()
		return q.transportError("complete", failed)
	}
	success := data != nil && q.sqfcOff.Load() && c.DW0 == 0 && c.DW1 == 0
	// Counted before the host can see the completion.
	if data != nil {
		q.stats.c2hData.Add(1)
	}
	q.stats.completions.Add(1)
	q.send(r, func(w *Writer) {
		if data != nil {
			d := DataHeader{CCCID: c.CID, Last: true, Success: success}
			w.C2HData(&d, data)
		}
		if !success {
			w.CapsuleResp(&c)
		}
	})
	return nil
}

// release gives the request's buffers back and its slot to a later command;
// for a request whose data the receive loop may still be placing (a write
// whose host stalled), once the loop has stopped.
func (r *Request) release() {
	q := r.q
	q.mu.Lock()
	if r.awaiting && !q.loopEnded {
		q.deferred = append(q.deferred, r)
		q.mu.Unlock()
		return
	}
	r.awaiting = false
	q.mu.Unlock()
	if r.data != nil {
		q.l.pool.put(r.data)
		r.data = nil
	}
	r.icd = nil
	q.mu.Lock()
	if q.reqs[r.slot] == r {
		q.reqs[r.slot] = nil
		q.free = append(q.free, r)
	}
	q.mu.Unlock()
	q.inflight.Done()
}
