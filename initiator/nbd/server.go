// Package nbd serves a blockio.Backend over the Network Block Device
// protocol (fixed newstyle handshake, structured replies, FLUSH, TRIM,
// WRITE_ZEROES, FUA), normally on a unix socket, for userspace clients:
// fio's nbd engine, nbdinfo, nbdcopy, nbdfuse, qemu.
//
// Requests on one connection are served concurrently (bounded) and replies
// are written whole, one at a time, as each request completes.
package nbd

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nprdma/nprdma/initiator/blockio"
)

// Limits on what a client may send during the handshake. Option data
// carries at most a 4 KiB name plus a few fields; anything far larger is a
// misbehaving client, which the protocol lets the server disconnect.
const (
	maxOptionData = 64 << 10
	maxOptions    = 1024
	// writeGrace bounds how long a shutting-down server waits for a client
	// that does not read its replies.
	writeGrace = 10 * time.Second
)

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("nbd: server closed")

// errAbort ends a handshake the client aborted with NBD_OPT_ABORT.
var errAbort = errors.New("client aborted the handshake")

type config struct {
	exportName  string
	description string
	multiConn   bool
	readOnly    bool
	structured  bool
	maxPayload  uint32
	maxInFlight int
	logger      *slog.Logger
	registerer  prometheus.Registerer
}

// Option configures a Server.
type Option func(*config)

// WithExportName names the export (default ""). Clients asking for the
// empty (default) name get it too.
func WithExportName(name string) Option { return func(c *config) { c.exportName = name } }

// WithDescription sets the human-readable description sent with NBD_OPT_LIST
// and NBD_INFO_DESCRIPTION.
func WithDescription(text string) Option { return func(c *config) { c.description = text } }

// WithMultiConn advertises NBD_FLAG_CAN_MULTI_CONN. Set it only when the
// backend's Flush makes the writes completed on every connection durable and
// visible (true for one shared backend such as the NVMe initiator's
// namespace); clients then spread I/O over several connections.
func WithMultiConn(ok bool) Option { return func(c *config) { c.multiConn = ok } }

// WithReadOnly serves the export read-only: NBD_FLAG_READ_ONLY is set and
// writes, trims and write-zeroes fail with EPERM.
func WithReadOnly() Option { return func(c *config) { c.readOnly = true } }

// WithoutStructuredReplies refuses NBD_OPT_STRUCTURED_REPLY, so that every
// reply is a simple reply (for old clients and for tests).
func WithoutStructuredReplies() Option { return func(c *config) { c.structured = false } }

// WithMaxPayload sets the maximum block size advertised and enforced for
// READ, WRITE and WRITE_ZEROES (default 32 MiB, the most a portable client
// sends without asking).
func WithMaxPayload(n uint32) Option { return func(c *config) { c.maxPayload = n } }

// WithMaxInFlight bounds the requests served concurrently per connection
// (default 128). Reading further requests waits when the bound is reached.
func WithMaxInFlight(n int) Option { return func(c *config) { c.maxInFlight = n } }

// WithLogger logs connection events and protocol violations (default: none).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithRegisterer registers the server's metrics on reg.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(c *config) { c.registerer = reg }
}

// Server serves one export backed by a blockio.Backend.
type Server struct {
	cfg       config
	backend   blockio.Backend // accepts any alignment
	size      uint64
	preferred uint32
	metrics   *metrics

	mu     sync.Mutex
	closed bool
	groups map[*serveGroup]struct{}
	serves sync.WaitGroup
}

// NewServer returns a server for b. Requests need not be aligned to b's
// block size: partial blocks are handled by read-modify-write
// (blockio.NewAligned), and the block size is advertised as the preferred
// size so that well-behaved clients avoid it.
func NewServer(b blockio.Backend, opts ...Option) (*Server, error) {
	cfg := config{structured: true, maxPayload: defaultMaxPayload, maxInFlight: 128}
	for _, o := range opts {
		o(&cfg)
	}
	if len(cfg.exportName) > maxStringLength || len(cfg.description) > maxStringLength {
		return nil, fmt.Errorf("nbd: export name or description longer than %d bytes", maxStringLength)
	}
	if cfg.maxPayload < 4096 || cfg.maxPayload > 1<<30 {
		return nil, fmt.Errorf("nbd: maximum payload %d outside [4096, 1 GiB]", cfg.maxPayload)
	}
	if cfg.maxInFlight < 1 {
		return nil, fmt.Errorf("nbd: maximum in-flight requests %d < 1", cfg.maxInFlight)
	}
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	if b.Size() < 0 {
		return nil, fmt.Errorf("nbd: backend size %d is negative", b.Size())
	}
	s := &Server{
		cfg:     cfg,
		backend: blockio.NewAligned(b),
		size:    uint64(b.Size()),
		groups:  make(map[*serveGroup]struct{}),
	}
	// The preferred block size must be a power of two of at least 512.
	s.preferred = minimumPreferredBlock
	for native := blockio.NativeBlockSize(b); int(s.preferred) < native && s.preferred < cfg.maxPayload; {
		s.preferred *= 2
	}
	if cfg.registerer != nil {
		m, err := newMetrics(cfg.registerer)
		if err != nil {
			return nil, err
		}
		s.metrics = m
	}
	return s, nil
}

// TransmissionFlags returns the flags advertised with the export: exactly
// the features this server implements for its configuration. structured
// says whether the connection negotiated structured replies.
func (s *Server) TransmissionFlags(structured bool) uint16 {
	flags := uint16(FlagHasFlags)
	if s.cfg.readOnly {
		flags |= FlagReadOnly | FlagCanMultiConn // nothing to flush: always safe
	} else {
		flags |= FlagSendFlush | FlagSendFUA | FlagSendTrim | FlagSendWriteZeroes
		if s.cfg.multiConn {
			flags |= FlagCanMultiConn
		}
	}
	if structured {
		flags |= FlagSendDF // every read is answered with one data chunk
	}
	return flags
}

// BlockSizes returns the advertised minimum, preferred and maximum block
// sizes.
func (s *Server) BlockSizes() (minimum, preferred, maximum uint32) {
	return 1, s.preferred, s.cfg.maxPayload
}

// serveGroup is one Serve call: its listener and the connections it
// accepted (one ServeConn call: its connection, no listener).
type serveGroup struct {
	ln       net.Listener
	mu       sync.Mutex
	stopping bool
	conns    map[*conn]struct{}
	wg       sync.WaitGroup
}

// add registers c unless the group is stopping.
func (g *serveGroup) add(c *conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopping {
		return false
	}
	g.conns[c] = struct{}{}
	g.wg.Add(1)
	return true
}

func (g *serveGroup) remove(c *conn) {
	g.mu.Lock()
	delete(g.conns, c)
	g.mu.Unlock()
	g.wg.Done()
}

// stop closes the listener and asks every connection to finish.
func (g *serveGroup) stop() {
	g.mu.Lock()
	first := !g.stopping
	g.stopping = true
	conns := make([]*conn, 0, len(g.conns))
	for c := range g.conns {
		conns = append(conns, c)
	}
	g.mu.Unlock()
	if first && g.ln != nil {
		g.ln.Close()
	}
	for _, c := range conns {
		c.shutdown()
	}
}

func (g *serveGroup) isStopping() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stopping
}

// Serve accepts connections on ln until ctx is done or Close is called, then
// shuts down gracefully: it stops accepting, stops reading new requests,
// lets the requests in flight complete and send their replies, closes the
// connections (one still in use after a flush of the backend, logging a
// warning that names its client), and returns once they are gone. It
// closes ln. Serve may be called for several listeners at once (a unix
// socket and a loopback TCP port).
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	g := &serveGroup{ln: ln, conns: make(map[*conn]struct{})}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.groups[g] = struct{}{}
	s.serves.Add(1)
	s.mu.Unlock()

	stopOnCancel := context.AfterFunc(ctx, g.stop)
	defer func() {
		stopOnCancel()
		g.stop()
		g.wg.Wait()
		s.mu.Lock()
		delete(s.groups, g)
		s.mu.Unlock()
		s.serves.Done()
	}()

	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if g.isStopping() {
				return nil
			}
			if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
				errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.ENOBUFS) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.cfg.logger.Warn("nbd: accept failed; retrying", "addr", ln.Addr(), "err", err, "backoff", backoff)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("nbd: accept on %s: %w", ln.Addr(), err)
		}
		backoff = 0
		c := s.newConn(nc, nc, nc)
		if !g.add(c) {
			nc.Close()
			continue
		}
		go func() {
			defer g.remove(c)
			c.serve()
		}()
	}
}

// ServeConn serves one connection made elsewhere, from its handshake on:
// the end of a socket pair whose other end the kernel's NBD client is
// handed once Handshake has run on it, say. It returns nil when the
// connection ends (the client disconnected, or ctx ended or Close was
// called: the same graceful shutdown as Serve's), or the error that broke
// it. It closes nc.
func (s *Server) ServeConn(ctx context.Context, nc net.Conn) error {
	g := &serveGroup{conns: make(map[*conn]struct{})}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		nc.Close()
		return ErrServerClosed
	}
	s.groups[g] = struct{}{}
	s.serves.Add(1)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.groups, g)
		s.mu.Unlock()
		s.serves.Done()
	}()
	stopOnCancel := context.AfterFunc(ctx, g.stop)
	defer stopOnCancel()
	c := s.newConn(nc, nc, nc)
	if !g.add(c) {
		nc.Close()
		return ErrServerClosed
	}
	defer g.remove(c)
	return c.serve()
}

// Close shuts every Serve call down gracefully (see Serve) and waits for
// them. Serving again afterwards fails with ErrServerClosed.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	groups := make([]*serveGroup, 0, len(s.groups))
	for g := range s.groups {
		groups = append(groups, g)
	}
	s.mu.Unlock()
	for _, g := range groups {
		g.stop()
	}
	s.serves.Wait()
	return nil
}

// conn is one client connection.
type conn struct {
	s      *Server
	nc     net.Conn // nil when serving a plain stream (fuzzing)
	r      *bufio.Reader
	w      io.Writer
	closer io.Closer
	log    *slog.Logger

	stopping atomic.Bool

	// Negotiated during the handshake.
	structured bool
	noZeroes   bool
	flags      uint16

	out      outbox
	inflight sync.WaitGroup
}

// outbox collects replies. Whoever finds it idle becomes the writer and
// sends everything queued, including replies queued while it writes, so
// that under load many replies leave in one writev.
type outbox struct {
	mu      sync.Mutex
	queue   net.Buffers
	release []*[]byte // payload buffers to recycle once written
	writing bool
	err     error
}

func (s *Server) newConn(nc net.Conn, rw io.ReadWriter, closer io.Closer) *conn {
	c := &conn{s: s, nc: nc, r: bufio.NewReaderSize(rw, 64<<10), w: rw, closer: closer, log: s.cfg.logger}
	if nc != nil {
		c.log = c.log.With("client", clientName(nc))
	}
	return c
}

// clientName names the client of nc for the log: its TCP address or, as the
// clients of a unix socket have no address, its process (SO_PEERCRED) and
// the socket.
func clientName(nc net.Conn) string {
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		return fmt.Sprint(nc.RemoteAddr())
	}
	if a, ok := uc.RemoteAddr().(*net.UnixAddr); ok && a != nil && a.Name != "" && a.Name != "@" {
		return a.Name // a client that bound its socket
	}
	local := fmt.Sprint(uc.LocalAddr())
	raw, err := uc.SyscallConn()
	if err != nil {
		return "unix:" + local
	}
	var cred *syscall.Ucred
	raw.Control(func(fd uintptr) {
		cred, err = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	})
	if err != nil || cred == nil {
		return "unix:" + local
	}
	return fmt.Sprintf("pid %d (uid %d) on unix:%s", cred.Pid, cred.Uid, local)
}

// shutdown makes the connection stop reading requests; requests in flight
// still complete and reply.
func (c *conn) shutdown() {
	c.stopping.Store(true)
	if c.nc != nil {
		now := time.Now()
		c.nc.SetReadDeadline(now)
		c.nc.SetWriteDeadline(now.Add(writeGrace))
	}
}

// serve runs the connection's handshake and transmission; it returns the
// error that broke it (nil: the client left, or the server shut it down).
func (c *conn) serve() error {
	defer c.closer.Close()
	if err := c.negotiate(); err != nil {
		switch {
		case errors.Is(err, errAbort):
			c.s.metrics.handshake("abort")
			return nil
		case c.stopping.Load():
			c.s.metrics.handshake("shutdown")
			return nil
		}
		c.s.metrics.handshake("error")
		c.log.Info("nbd: handshake failed", "err", err)
		return err
	}
	c.s.metrics.handshake("transmission")
	c.s.metrics.connected(1)
	defer c.s.metrics.connected(-1)
	err := c.transmit()
	switch {
	case err != nil && c.stopping.Load():
		c.closeForShutdown()
		return nil
	case err != nil:
		c.log.Info("nbd: connection dropped", "err", err)
	}
	return err
}

// closeForShutdown is the end of a connection the server's shutdown cut
// while the client was still connected: the client gets no warning in the
// protocol, so the log names it. Its requests in flight have replied; a
// flush makes the writes they acknowledged durable before the connection
// closes (serve closes it on return).
func (c *conn) closeForShutdown() {
	if c.s.cfg.readOnly {
		c.log.Warn("nbd: server shutting down: closing a connected client's connection")
		return
	}
	c.log.Warn("nbd: server shutting down: closing a connected client's connection after a flush")
	if err := c.s.backend.Flush(); err != nil {
		c.log.Warn("nbd: flush before closing the client's connection failed", "err", err)
	}
}

// negotiate runs the fixed newstyle handshake up to the transmission phase.
func (c *conn) negotiate() error {
	greeting := make([]byte, 0, 18)
	greeting = binary.BigEndian.AppendUint64(greeting, magicInit)
	greeting = binary.BigEndian.AppendUint64(greeting, magicOption)
	greeting = binary.BigEndian.AppendUint16(greeting, flagFixedNewstyle|flagNoZeroes)
	if _, err := c.w.Write(greeting); err != nil {
		return fmt.Errorf("send greeting: %w", err)
	}
	var clientFlags [4]byte
	if _, err := io.ReadFull(c.r, clientFlags[:]); err != nil {
		return fmt.Errorf("read client flags: %w", err)
	}
	cf := binary.BigEndian.Uint32(clientFlags[:])
	if cf&^(flagCFixedNewstyle|flagCNoZeroes) != 0 {
		return fmt.Errorf("client flags %#x include unknown bits", cf)
	}
	c.noZeroes = cf&flagCNoZeroes != 0

	hdr := make([]byte, optionHeaderSize)
	for range maxOptions {
		if _, err := io.ReadFull(c.r, hdr); err != nil {
			return fmt.Errorf("read option header: %w", err)
		}
		h, err := decodeOptionHeader(hdr)
		if err != nil {
			return err
		}
		if h.Length > maxOptionData {
			return fmt.Errorf("option %d carries %d bytes (limit %d)", h.Option, h.Length, maxOptionData)
		}
		data := make([]byte, h.Length)
		if _, err := io.ReadFull(c.r, data); err != nil {
			return fmt.Errorf("read option %d data: %w", h.Option, err)
		}
		done, err := c.option(h.Option, data)
		if err != nil || done {
			return err
		}
	}
	return fmt.Errorf("more than %d options", maxOptions)
}

// option answers one option. done is true when the transmission phase
// begins.
func (c *conn) option(opt uint32, data []byte) (done bool, err error) {
	cfg := &c.s.cfg
	switch opt {
	case OptExportName:
		if !c.s.exportMatches(string(data)) {
			// This option cannot return an error: the protocol says close.
			return false, fmt.Errorf("NBD_OPT_EXPORT_NAME for unknown export %q", data)
		}
		c.flags = c.s.TransmissionFlags(c.structured)
		reply := binary.BigEndian.AppendUint64(nil, c.s.size)
		reply = binary.BigEndian.AppendUint16(reply, c.flags)
		if !c.noZeroes {
			reply = append(reply, make([]byte, exportNameZeroPadding)...)
		}
		_, err := c.w.Write(reply)
		return err == nil, err

	case OptAbort:
		c.optionReply(opt, RepAck, nil)
		return false, errAbort

	case OptList:
		if len(data) != 0 {
			return false, c.optionError(opt, RepErrInvalid, "NBD_OPT_LIST takes no data")
		}
		if err := c.optionReply(opt, RepServer, appendServerReply(nil, cfg.exportName, cfg.description)); err != nil {
			return false, err
		}
		return false, c.optionReply(opt, RepAck, nil)

	case OptInfo, OptGo:
		req, err := decodeInfoRequest(data)
		if err != nil {
			return false, c.optionError(opt, RepErrInvalid, err.Error())
		}
		if !c.s.exportMatches(req.Name) {
			return false, c.optionError(opt, RepErrUnknown,
				fmt.Sprintf("unknown export %q (this server exports %q)", req.Name, cfg.exportName))
		}
		flags := c.s.TransmissionFlags(c.structured)
		if err := c.optionReply(opt, RepInfo, appendInfoExport(nil, c.s.size, flags)); err != nil {
			return false, err
		}
		// Sent even when not requested (the protocol allows it): the
		// constraints are the defaults apart from the preferred size, so
		// a client that ignores them is still served correctly.
		minimum, preferred, maximum := c.s.BlockSizes()
		if err := c.optionReply(opt, RepInfo, appendInfoBlockSize(nil, minimum, preferred, maximum)); err != nil {
			return false, err
		}
		for _, info := range req.Infos {
			var reply []byte
			switch {
			case info == InfoName:
				reply = appendInfoString(nil, InfoName, cfg.exportName)
			case info == InfoDescription && cfg.description != "":
				reply = appendInfoString(nil, InfoDescription, cfg.description)
			default:
				continue
			}
			if err := c.optionReply(opt, RepInfo, reply); err != nil {
				return false, err
			}
		}
		if err := c.optionReply(opt, RepAck, nil); err != nil {
			return false, err
		}
		if opt == OptGo {
			c.flags = flags
			return true, nil
		}
		return false, nil

	case OptStructuredReply:
		switch {
		case len(data) != 0:
			return false, c.optionError(opt, RepErrInvalid, "NBD_OPT_STRUCTURED_REPLY takes no data")
		case !cfg.structured:
			return false, c.optionError(opt, RepErrUnsup, "structured replies are disabled on this server")
		case c.structured:
			return false, c.optionError(opt, RepErrInvalid, "structured replies already negotiated")
		}
		c.structured = true
		return false, c.optionReply(opt, RepAck, nil)

	case OptStartTLS:
		return false, c.optionError(opt, RepErrUnsup, "TLS is not supported; use a unix socket or loopback")
	}
	return false, c.optionError(opt, RepErrUnsup, fmt.Sprintf("option %d is not supported", opt))
}

func (s *Server) exportMatches(name string) bool {
	return name == "" || name == s.cfg.exportName
}

func (c *conn) optionReply(opt, typ uint32, data []byte) error {
	_, err := c.w.Write(appendOptionReply(nil, opt, typ, data))
	return err
}

func (c *conn) optionError(opt, typ uint32, msg string) error {
	if len(msg) > maxStringLength {
		msg = msg[:maxStringLength]
	}
	return c.optionReply(opt, typ, []byte(msg))
}

// handoffAfter: requests that take less than this (on average) are cheaper
// to finish on the goroutine that read them than to hand the reading to
// another goroutine, a wake-up of 40-60 µs when it lands on the other vCPU
// of the machines this runs on.
const handoffAfter = 20 * time.Microsecond

// aloneUpTo: a request that is the only one in flight is served by the
// goroutine that read it unless requests have been taking longer than this
// on average (a backend that waits for a device, or for a lost target to
// come back): then a request the client sends meanwhile would wait that long
// to be read.
const aloneUpTo = time.Millisecond

// transmit serves requests until the client disconnects, a protocol error
// occurs or the server shuts down; it returns after every request in
// flight has replied.
//
// Leader/follower: the worker holding the read lock reads a request. It
// executes the request still holding the lock when nothing else is in
// flight or waiting to be read (a client at queue depth 1: handing over
// would only wake a goroutine to wait for a request that is not coming) and
// it is a READ or a WRITE without FUA (the others wait for the device),
// unless requests have been slow (aloneUpTo); and also while requests have
// been completing quickly (an average below handoffAfter), so a fast
// backend serves a connection from one goroutine with no wake-ups at all.
// Otherwise it first passes the lock to a follower (started if none is
// queued, up to maxInFlight), which reads the next request meanwhile:
// requests run concurrently as soon as a client has more than one in
// flight. A request the client sends while a lone one is served waits for
// it; a timer to hand over a lone request that turns out slow would cost a
// thread wake-up per request, what serving it here saves.
func (c *conn) transmit() error {
	r := &requestReader{c: c, hdr: make([]byte, requestSize), workers: 1}
	r.avgNanos.Store(int64(handoffAfter))
	r.done.Add(1)
	go r.work()
	r.done.Wait()
	return r.err
}

// requestReader hands the right to read the next request from worker to
// worker.
type requestReader struct {
	c        *conn
	hdr      []byte
	mu       sync.Mutex // held by the worker that may read the next request
	stopped  bool       // under mu: no more requests
	err      error      // under mu: why
	workers  int        // under mu
	waiting  atomic.Int32
	busy     atomic.Int32 // requests read and not yet replied to
	avgNanos atomic.Int64 // moving average of request durations
	done     sync.WaitGroup
}

func (r *requestReader) work() {
	defer r.done.Done()
	locked := false
	for {
		if !locked {
			r.waiting.Add(1)
			r.mu.Lock()
			r.waiting.Add(-1)
			locked = true
		}
		if r.stopped {
			r.mu.Unlock()
			return
		}
		req, payload, answered, err := r.c.readRequest(r.hdr)
		if err != nil || req.Type == CmdDisc {
			r.stopped = true // the others finish their requests and leave
			if !errors.Is(err, io.EOF) {
				r.err = err // EOF: the client hung up
			}
			r.mu.Unlock()
			return
		}
		if answered {
			continue
		}
		avg := time.Duration(r.avgNanos.Load())
		alone := r.busy.Load() == 0 && r.c.r.Buffered() == 0 && avg < aloneUpTo &&
			(req.Type == CmdRead || req.Type == CmdWrite && req.Flags&CmdFlagFUA == 0)
		if !alone && avg >= handoffAfter {
			if r.waiting.Load() == 0 && r.workers < r.c.s.cfg.maxInFlight {
				r.workers++
				r.done.Add(1)
				go r.work()
			}
			r.mu.Unlock()
			locked = false
			r.c.s.metrics.handoff()
		}
		r.busy.Add(1)
		start := time.Now()
		r.c.handle(req, payload, &r.busy)
		// Exponential moving average over about 8 requests; concurrent
		// updates may lose one another, which only slows adaptation.
		avg = time.Duration(r.avgNanos.Load())
		r.avgNanos.Store(int64(avg + (time.Since(start)-avg)/8))
	}
}

// readRequest reads the next request and a write's payload. An oversized
// write is answered here, its payload skipped, and comes back answered.
func (c *conn) readRequest(hdr []byte) (req Request, payload *[]byte, answered bool, err error) {
	if _, err := io.ReadFull(c.r, hdr); err != nil {
		if errors.Is(err, io.EOF) {
			return Request{}, nil, false, io.EOF
		}
		return Request{}, nil, false, fmt.Errorf("read request: %w", err)
	}
	req, err = DecodeRequest(hdr)
	if err != nil || req.Type != CmdWrite {
		return req, nil, false, err
	}
	if req.Length > c.s.cfg.maxPayload {
		if _, err := io.CopyN(io.Discard, c.r, int64(req.Length)); err != nil {
			return req, nil, false, fmt.Errorf("skip oversized write payload: %w", err)
		}
		c.s.metrics.request(req.Type, EINVAL)
		c.replyError(req, EINVAL, fmt.Sprintf("write of %d bytes exceeds the maximum block size %d", req.Length, c.s.cfg.maxPayload))
		return req, nil, true, nil
	}
	payload = getBuffer(int(req.Length))
	if _, err := io.ReadFull(c.r, *payload); err != nil {
		putBuffer(payload)
		return req, nil, false, fmt.Errorf("read write payload: %w", err)
	}
	return req, payload, false, nil
}

// handle serves one request and sends its reply. It takes the request off
// busy just before the reply goes: a client at queue depth 1 sends its next
// request as soon as it has the reply, and whoever reads that one must find
// nothing else in flight.
func (c *conn) handle(req Request, payload *[]byte, busy *atomic.Int32) {
	if payload != nil {
		defer putBuffer(payload)
	}
	errno, msg := c.validate(req)
	var data *[]byte
	if errno == 0 {
		data, errno, msg = c.execute(req, payload)
	}
	c.s.metrics.request(req.Type, errno) // before the reply: a client may look right after
	busy.Add(-1)
	switch {
	case errno != 0:
		c.replyError(req, errno, msg)
	case req.Type == CmdRead:
		c.replyData(req, data)
	default:
		c.replyOK(req)
	}
}

// validate checks a request against the protocol and the export.
func (c *conn) validate(req Request) (errno uint32, msg string) {
	name := CommandName(req.Type)
	allowed := uint16(0)
	if c.flags&FlagSendFUA != 0 {
		allowed |= CmdFlagFUA // valid on every command once negotiated
	}
	switch req.Type {
	case CmdRead:
		if c.structured {
			allowed |= CmdFlagDF
		}
	case CmdWrite, CmdTrim, CmdWriteZeroes:
		if c.s.cfg.readOnly {
			return EPERM, name + " on a read-only export"
		}
		if req.Type == CmdWriteZeroes {
			allowed |= CmdFlagNoHole
		}
	case CmdFlush:
		if c.s.cfg.readOnly {
			return EINVAL, "FLUSH was not advertised on a read-only export"
		}
	default:
		return EINVAL, name + " is not supported"
	}
	if req.Flags&^allowed != 0 {
		return EINVAL, fmt.Sprintf("flags %#x are not valid for %s", req.Flags&^allowed, name)
	}
	if req.Type == CmdFlush {
		return 0, ""
	}
	if req.Type != CmdTrim && req.Length > c.s.cfg.maxPayload {
		return EINVAL, fmt.Sprintf("%s of %d bytes exceeds the maximum block size %d", name, req.Length, c.s.cfg.maxPayload)
	}
	if req.Offset > c.s.size || uint64(req.Length) > c.s.size-req.Offset {
		errno := uint32(EINVAL)
		if req.Type == CmdWrite || req.Type == CmdWriteZeroes {
			errno = ENOSPC
		}
		return errno, fmt.Sprintf("%s [%d, +%d) goes beyond the end of the export (%d bytes)", name, req.Offset, req.Length, c.s.size)
	}
	return 0, ""
}

// execute runs a valid request against the backend. A read returns its
// data in a pooled buffer that the reply takes over; a failure returns the
// error to report.
func (c *conn) execute(req Request, payload *[]byte) (data *[]byte, errno uint32, msg string) {
	b := c.s.backend
	off, length := int64(req.Offset), int64(req.Length)
	fua := req.Flags&CmdFlagFUA != 0
	var err error
	switch req.Type {
	case CmdRead:
		data = getBuffer(int(length))
		if length > 0 {
			if _, err = b.ReadAt(*data, off); err != nil {
				putBuffer(data)
				data = nil
			}
		}
	case CmdWrite:
		if length > 0 {
			if fua {
				_, err = b.WriteAtFUA(*payload, off)
			} else {
				_, err = b.WriteAt(*payload, off)
			}
		}
	case CmdFlush:
		err = b.Flush()
	case CmdTrim, CmdWriteZeroes:
		if length > 0 {
			if req.Type == CmdTrim {
				err = b.Trim(off, length)
			} else {
				err = b.WriteZeroes(off, length)
			}
		}
		if err == nil && fua {
			err = b.Flush() // the backend has no FUA variant of these
		}
	}
	if err != nil {
		return nil, nbdErrno(err), fmt.Sprintf("%s [%d, +%d): %v", CommandName(req.Type), off, length, err)
	}
	return data, 0, ""
}

// nbdErrno maps a backend error to the protocol's error values.
func nbdErrno(err error) uint32 {
	switch blockio.Errno(err) {
	case syscall.EPERM, syscall.EROFS, syscall.EACCES:
		return EPERM
	case syscall.ENOSPC, syscall.EDQUOT, syscall.EFBIG:
		return ENOSPC
	case syscall.EINVAL:
		return EINVAL
	case syscall.ENOMEM:
		return ENOMEM
	case syscall.ESHUTDOWN:
		return ESHUTDOWN
	}
	return EIO
}

func (c *conn) replyOK(req Request) {
	c.send(net.Buffers{appendSimpleReply(nil, 0, req.Cookie)}, nil)
}

// replyData sends a read's data, which is in buf; the reply owns buf.
func (c *conn) replyData(req Request, buf *[]byte) {
	data := *buf
	if !c.structured {
		c.send(net.Buffers{appendSimpleReply(nil, 0, req.Cookie), data}, buf)
		return
	}
	if len(data) == 0 {
		c.send(net.Buffers{appendChunkHeader(nil, ReplyFlagDone, ReplyTypeNone, req.Cookie, 0)}, buf)
		return
	}
	// One data chunk, marked final: the data is complete before sending
	// starts, so no error can follow it.
	hdr := appendChunkHeader(nil, ReplyFlagDone, ReplyTypeOffsetData, req.Cookie, uint32(8+len(data)))
	hdr = binary.BigEndian.AppendUint64(hdr, req.Offset)
	c.send(net.Buffers{hdr, data}, buf)
}

func (c *conn) replyError(req Request, errno uint32, msg string) {
	if c.structured {
		c.send(net.Buffers{appendErrorChunk(nil, req.Cookie, errno, msg)}, nil)
		return
	}
	c.send(net.Buffers{appendSimpleReply(nil, errno, req.Cookie)}, nil)
}

// send queues one whole reply; release (if not nil) is recycled once the
// reply is written. After a write error the connection is dead: it is
// closed so that the reader stops too, and later replies are dropped.
func (c *conn) send(bufs net.Buffers, release *[]byte) {
	o := &c.out
	o.mu.Lock()
	if o.err != nil {
		o.mu.Unlock()
		putBuffer(release)
		return
	}
	o.queue = append(o.queue, bufs...)
	if release != nil {
		o.release = append(o.release, release)
	}
	if o.writing {
		o.mu.Unlock() // the active writer sends it
		return
	}
	o.writing = true
	for len(o.queue) > 0 && o.err == nil {
		queue, recycle := o.queue, o.release
		o.queue, o.release = nil, nil
		o.mu.Unlock()
		_, err := queue.WriteTo(c.w)
		for _, b := range recycle {
			putBuffer(b)
		}
		o.mu.Lock()
		if err != nil {
			o.err = err
			c.log.Info("nbd: send reply", "err", err)
			c.closer.Close()
		}
	}
	for _, b := range o.release {
		putBuffer(b)
	}
	o.queue, o.release = nil, nil
	o.writing = false
	o.mu.Unlock()
}
