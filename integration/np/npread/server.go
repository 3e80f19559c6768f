package npread

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nprdma/nprdma/nprdma"
)

// Backend is what the slow path reads from. *swap.Region satisfies it: its
// ReadAt faults absent pages in (minor for zero pages, major from the
// backing device).
type Backend interface {
	ReadAt(p []byte, off int64) (int, error)
}

// DefaultMaxRead is the largest slow-path read unless configured otherwise.
const DefaultMaxRead = 1 << 20

// DefaultDepth is how many requests a connection may have outstanding.
const DefaultDepth = 32

// ServerOption configures a Server.
type ServerOption func(*Server)

// WithFaultCounts gives the server the backend's fault counters (for a swap
// region: Stats().MinorFaults and MajorFaults). Each read is then bracketed
// by two snapshots, under a lock so that concurrent slow-path reads do not
// blur each other, and the response carries the difference: how the pages
// were resolved. Other code faulting pages of the same backend at the same
// time is counted too.
func WithFaultCounts(f func() (minor, major uint64)) ServerOption {
	return func(s *Server) { s.faults = f }
}

// WithServerMaxRead sets the largest read served (default DefaultMaxRead);
// each connection holds one staging buffer of this size.
func WithServerMaxRead(n int) ServerOption { return func(s *Server) { s.maxRead = n } }

// WithServerDepth sets how many requests a connection may have outstanding
// (default DefaultDepth).
func WithServerDepth(n int) ServerOption { return func(s *Server) { s.depth = n } }

// WithServerBusyPoll makes each connection's completion queue spin for up
// to d before parking (nprdma.WithBusyPoll): the slow path then costs no
// goroutine wake-up on the server when a spare CPU exists.
func WithServerBusyPoll(d time.Duration) ServerOption { return func(s *Server) { s.busyPoll = d } }

// ServerStats are a server's counters.
type ServerStats struct {
	Connections uint64 // connections accepted
	Requests    uint64 // requests answered
	Errors      uint64 // requests answered with a status other than StatusOK
	Dropped     uint64 // connections dropped because the peer broke the protocol
}

// Server answers slow-path reads of an unpinned region on every connection
// it accepts: the requester names a range the one-sided READ returned as
// magic pages, the server reads it from the backend (faulting it in), RDMA
// WRITEs it into the requester's buffer and answers with a SEND. A
// connection's requests are served one at a time, in order.
type Server struct {
	mr       *nprdma.MR
	backend  Backend
	faults   func() (minor, major uint64)
	maxRead  int
	depth    int
	busyPoll time.Duration
	desc     []byte

	faultMu sync.Mutex // brackets fault-counter snapshots

	mu     sync.Mutex
	conns  map[*conn]struct{}
	closed bool
	wg     sync.WaitGroup

	connections, requests, errs, dropped atomic.Uint64
}

// NewServer returns a server for the unpinned region mr, reading through
// backend (the memory behind mr's pager). Connections are made in mr's PD.
func NewServer(mr *nprdma.MR, backend Backend, opts ...ServerOption) (*Server, error) {
	s := &Server{mr: mr, backend: backend, maxRead: DefaultMaxRead, depth: DefaultDepth, conns: map[*conn]struct{}{}}
	for _, o := range opts {
		o(s)
	}
	if mr.Magic() == 0 {
		return nil, fmt.Errorf("npread: server for region %#x: not an unpinned region (no magic page)", mr.Addr())
	}
	if s.maxRead < 1 || s.maxRead > MaxReadLimit {
		return nil, fmt.Errorf("npread: server: largest read %d outside [1, %d]", s.maxRead, MaxReadLimit)
	}
	if s.depth < 1 || s.depth > 1024 {
		return nil, fmt.Errorf("npread: server: depth %d outside [1, 1024]", s.depth)
	}
	s.desc = AppendDescriptor(nil, s.Descriptor())
	return s, nil
}

// Descriptor is what the server tells each requester when it accepts.
func (s *Server) Descriptor() Descriptor {
	return Descriptor{Addr: s.mr.Addr(), Length: uint64(s.mr.Len()), RKey: s.mr.RKey(),
		PageSize: uint32(s.mr.PageSize()), Magic: s.mr.Magic(), MaxRead: uint32(s.maxRead)}
}

// Stats returns a snapshot of the server's counters.
func (s *Server) Stats() ServerStats {
	return ServerStats{Connections: s.connections.Load(), Requests: s.requests.Load(),
		Errors: s.errs.Load(), Dropped: s.dropped.Load()}
}

// Serve accepts connections on ln until ctx ends (then it returns nil) or
// accepting fails. Connections outlive Serve until Close.
func (s *Server) Serve(ctx context.Context, ln *nprdma.Listener) error {
	for {
		req, err := ln.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if err := s.accept(req); err != nil {
			if errors.Is(err, nprdma.ErrClosed) {
				return err
			}
			// One failed connection does not stop the server.
			continue
		}
	}
}

// Close ends every connection (their queue pairs are closed, as if the
// server process died) and waits for their goroutines. Serve must have
// returned or must not be called again.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.cancel()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// conn is one accepted connection and its resources.
type conn struct {
	s       *Server
	qp      *nprdma.QP
	cq      *nprdma.CQ
	recvMem []byte
	recvMR  *nprdma.MR
	stage   []byte
	stageMR *nprdma.MR
	wrs     [2]nprdma.SendWR // answer's WRITE and SEND, reused
	sge     [1]nprdma.SGE    // the WRITE's gather list
	ctx     context.Context
	cancel  context.CancelFunc
}

func (s *Server) accept(req *nprdma.ConnRequest) error {
	pd := s.mr.PD()
	dev := pd.Device()
	c := &conn{s: s}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	ok := false
	defer func() {
		if !ok {
			req.Reject(nil)
			c.release()
		}
	}()
	var cqOpts []nprdma.CQOption
	if s.busyPoll > 0 {
		cqOpts = append(cqOpts, nprdma.WithBusyPoll(s.busyPoll))
	}
	// Every receive and every signaled response may be in the queue at once.
	c.cq = dev.NewCQ(2*s.depth+2, cqOpts...)
	var err error
	if c.qp, err = pd.NewQP(nprdma.QPConfig{SendCQ: c.cq, SendDepth: 2*s.depth + 2, RecvDepth: s.depth}); err != nil {
		return err
	}
	if c.recvMem, err = nprdma.AllocBuffer(max(4096, s.depth*RequestSize)); err != nil {
		return err
	}
	if c.recvMR, err = pd.Register(c.recvMem, nprdma.AccessLocalWrite); err != nil {
		return err
	}
	if c.stage, err = nprdma.AllocBuffer(s.maxRead); err != nil {
		return err
	}
	if c.stageMR, err = pd.Register(c.stage, nprdma.AccessLocalWrite); err != nil {
		return err
	}
	for slot := 0; slot < s.depth; slot++ {
		if err := c.postRecv(slot); err != nil {
			return err
		}
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("npread: server: %w", nprdma.ErrClosed)
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	if err := req.Accept(c.qp, s.desc); err != nil {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		s.wg.Done()
		return err
	}
	ok = true
	s.connections.Add(1)
	go c.serve()
	return nil
}

func (c *conn) postRecv(slot int) error {
	return c.qp.PostRecv(nprdma.RecvWR{ID: uint64(slot), SG: []nprdma.SGE{c.recvMR.SGE(slot*RequestSize, RequestSize)}})
}

// release frees what accept allocated: the queue pair first, so that no
// transfer can still touch the memory that goes next.
func (c *conn) release() {
	if c.qp != nil {
		c.qp.Close()
	}
	if c.cq != nil {
		c.cq.Close()
	}
	for _, mr := range []*nprdma.MR{c.recvMR, c.stageMR} {
		if mr != nil {
			mr.Deregister()
		}
	}
	for _, b := range [][]byte{c.recvMem, c.stage} {
		if b != nil {
			nprdma.FreeBuffer(b)
		}
	}
	c.cancel()
}

// serve runs the connection: requests are decoded as they arrive and served
// in order; the staging buffer is reused once the previous response's
// completion shows that the WRITE before it was delivered.
func (c *conn) serve() {
	s := c.s
	defer func() {
		c.release()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		s.wg.Done()
	}()
	// Stop waiting when the server closes or the peer goes away.
	go func() {
		select {
		case <-c.qp.Done():
			c.cancel()
		case <-c.ctx.Done():
		}
	}()
	wcs := make([]nprdma.WC, 2*s.depth+2)
	var pending []Request
	stageBusy := false
	var resp [ResponseSize]byte
	for {
		n, err := c.cq.Wait(c.ctx, wcs)
		if err != nil {
			return
		}
		for _, wc := range wcs[:n] {
			if wc.Status != nprdma.StatusSuccess {
				return // the queue pair failed; everything else is flushed
			}
			switch wc.Op {
			case nprdma.OpRecv:
				slot := int(wc.ID)
				q, err := DecodeRequest(c.recvMem[slot*RequestSize : slot*RequestSize+int(wc.ByteLen)])
				if err != nil {
					// A peer that breaks the protocol loses its connection.
					s.dropped.Add(1)
					c.qp.Disconnect()
					return
				}
				if err := c.postRecv(slot); err != nil {
					return
				}
				pending = append(pending, q)
			case nprdma.OpSend:
				stageBusy = false
			}
		}
		for !stageBusy && len(pending) > 0 {
			q := pending[0]
			// Shift rather than reslice, so the slice never creeps forward
			// and reallocates (at most depth requests wait).
			pending = pending[:copy(pending, pending[1:])]
			if err := c.answer(q, resp[:0]); err != nil {
				return
			}
			stageBusy = true
		}
	}
}

// answer reads the request's range into the staging buffer and posts the
// RDMA WRITE of the data and the response SEND behind it.
func (c *conn) answer(q Request, resp []byte) error {
	s := c.s
	r := Response{Tag: q.Tag, Len: q.Len}
	wrs := c.wrs[:0]
	switch {
	case int(q.Len) > s.maxRead:
		r.Status = StatusInvalid
	case q.Off > uint64(s.mr.Len()) || uint64(q.Len) > uint64(s.mr.Len())-q.Off:
		r.Status = StatusOutOfRange
	default:
		buf := c.stage[:q.Len]
		var err error
		if s.faults != nil {
			s.faultMu.Lock()
			minor0, major0 := s.faults()
			_, err = s.backend.ReadAt(buf, int64(q.Off))
			minor1, major1 := s.faults()
			s.faultMu.Unlock()
			r.MinorFaults, r.MajorFaults = uint32(minor1-minor0), uint32(major1-major0)
		} else {
			_, err = s.backend.ReadAt(buf, int64(q.Off))
		}
		if err != nil {
			r.Status = StatusReadError
			break
		}
		c.sge[0] = c.stageMR.SGE(0, int(q.Len))
		wrs = append(wrs, nprdma.SendWR{ID: q.Tag, Op: nprdma.OpWrite, SG: c.sge[:], RemoteAddr: q.DestAddr, RKey: q.DestRKey})
	}
	if r.Status != StatusOK {
		s.errs.Add(1)
		r.Len = 0
	}
	s.requests.Add(1)
	wrs = append(wrs, nprdma.SendWR{ID: q.Tag, Op: nprdma.OpSend, Inline: true, InlineData: AppendResponse(resp, r), Signaled: true})
	return c.qp.PostSend(wrs...)
}
