package tcp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nprdma/nprdma/nvme"
)

// Role is the side of a connection a Reader reads for.
type Role uint8

const (
	// RoleController reads what hosts send: ICReq, then CapsuleCmd,
	// H2CData and H2CTermReq.
	RoleController Role = iota + 1
	// RoleHost reads what controllers send: ICResp, then CapsuleResp,
	// C2HData, R2T and C2HTermReq.
	RoleHost
)

// Limits bound the data of the PDUs a Reader accepts; a PDU above them is a
// *ProtocolError with FESDataLimitExceeded before any of its data is read.
type Limits struct {
	// InCapsuleData bounds the data of a CapsuleCmd (controller side): the
	// queue's in-capsule limit, raised to FabricsInCapsuleData for Fabrics
	// commands (InCapsuleLimit).
	InCapsuleData int
	// MaxH2CData bounds the data of one H2CData PDU (controller side): the
	// MAXH2CDATA the controller advertised.
	MaxH2CData int
	// MaxC2HData bounds the data of one C2HData PDU (host side): the
	// host's largest transfer. 0: no bound.
	MaxC2HData int
}

// DefaultReadBuffer is the size of a Reader's buffer: a capsule with
// in-capsule data and the PDUs behind it are read with one system call.
const DefaultReadBuffer = 32 << 10

// Header is a PDU's header as Reader.Next read and checked it: the common
// header, and the PDU-specific header in Bytes (decode it with the type's
// Unmarshal or Parse function). It is valid until the next call of Next.
type Header struct {
	CommonHeader
	// DataLen is the number of data bytes that follow (read them with
	// Reader.ReadData); 0 when the PDU carries none.
	DataLen int
	raw     [MaxHeaderSize + DigestSize]byte
}

// Bytes is the header, HLEN bytes, header digest excluded.
func (h *Header) Bytes() []byte { return h.raw[:h.HLEN] }

// Reader reads the PDUs of one connection. It is not safe for concurrent
// use: one goroutine reads a connection.
type Reader struct {
	src        *stallSource
	br         *bufio.Reader
	role       Role
	digests    Digests
	rxAlign    int // PDO alignment asked of the peer: (our PDA+1)·4
	lim        Limits
	negotiated bool
	h          Header
	pad        int // bytes of the current PDU still to read, in order
	data       int
	ddgst      int
}

// ReaderOption configures a Reader.
type ReaderOption func(*Reader)

// WithPDUTimeout bounds how long a PDU may take to arrive once its first
// byte has (default 0: unbounded). It applies when the source has
// SetReadDeadline (a net.Conn): the Reader sets a read deadline while a PDU
// is partly read and clears it while it waits for the next PDU, so an idle
// connection is never timed out, only a peer that stops in the middle of a
// PDU. The read then fails with the source's timeout error.
func WithPDUTimeout(d time.Duration) ReaderOption {
	return func(r *Reader) { r.src.timeout = d }
}

// WithReadBuffer sets the Reader's buffer size (default DefaultReadBuffer).
func WithReadBuffer(n int) ReaderOption {
	return func(r *Reader) { r.br = bufio.NewReaderSize(r.src, n) }
}

// NewReader returns a Reader of src for role. Until Negotiated it accepts
// only the connection's first PDU (ICReq for a controller, ICResp for a
// host) and termination requests.
func NewReader(src io.Reader, role Role, opts ...ReaderOption) *Reader {
	r := &Reader{src: &stallSource{r: src}, role: role, rxAlign: 4}
	if d, ok := src.(deadliner); ok {
		r.src.dl = d
	}
	for _, o := range opts {
		o(r)
	}
	if r.br == nil {
		r.br = bufio.NewReaderSize(r.src, DefaultReadBuffer)
	}
	return r
}

// Negotiated records what the ICReq/ICResp exchange settled: the digests in
// use, the PDA this side asked for (CPDA on a controller, HPDA on a host)
// and the data limits. From then on Next refuses another IC PDU.
func (r *Reader) Negotiated(d Digests, pda uint8, lim Limits) {
	r.negotiated, r.digests, r.rxAlign, r.lim = true, d, pdaAlignment(pda), lim
}

// SetLimits changes the data limits (a controller learns the queue's
// in-capsule limit from its Connect).
func (r *Reader) SetLimits(lim Limits) { r.lim = lim }

// Buffered is the number of bytes read from the source and not yet consumed.
func (r *Reader) Buffered() int { return r.br.Buffered() }

// NextBuffered reports whether the next PDU (after what is left of the
// current one) is buffered whole, so that reading it will not wait for the
// source.
func (r *Reader) NextBuffered() bool {
	skip := r.pad + r.data + r.ddgst
	n := r.br.Buffered() - skip
	if n < CommonHeaderSize {
		return false
	}
	b, err := r.br.Peek(skip + CommonHeaderSize)
	if err != nil {
		return false
	}
	return int64(n) >= int64(le.Uint32(b[skip+offPLEN:]))
}

// Next reads the next PDU's header, skipping what is left of the previous
// PDU's data. It checks the common header in the order the fields come
// (type, flags, HLEN, PDO, PLEN), the data length against the limits, and
// the header digest; a violation is a *ProtocolError. A termination
// request is returned like any PDU (its data is the offending header).
// Errors of the source (io.EOF, a timeout) are returned as they are.
func (r *Reader) Next() (*Header, error) {
	if err := r.Discard(); err != nil {
		return nil, err
	}
	// Waiting for a PDU is not a stall; its first byte starts one.
	r.src.inPDU = false
	if _, err := r.br.Peek(1); err != nil {
		return nil, err
	}
	r.src.startPDU()
	h := &r.h
	if _, err := io.ReadFull(r.br, h.raw[:CommonHeaderSize]); err != nil {
		return nil, unexpectedEOF(err)
	}
	_ = h.CommonHeader.Unmarshal(h.raw[:CommonHeaderSize])
	h.DataLen = 0
	hd, err := r.checkCommonHeader(h)
	if err != nil {
		return nil, err
	}
	if _, err := io.ReadFull(r.br, h.raw[CommonHeaderSize:int(h.HLEN)+hd]); err != nil {
		return nil, unexpectedEOF(err)
	}
	if hd > 0 {
		if want, got := Digest(h.raw[:h.HLEN]), le.Uint32(h.raw[h.HLEN:]); want != got {
			return nil, protocolErrorf(FESHeaderDigestError, 0, h.Type, h.Bytes(), "header digest 0x%08x, the header's CRC32C is 0x%08x", got, want)
		}
	}
	if err := r.checkHeader(h); err != nil {
		return nil, err
	}
	if r.pad+r.data+r.ddgst == 0 {
		r.src.inPDU = false
	}
	return h, nil
}

// checkCommonHeader validates h's common header and sets how much data,
// padding and digest follow; it returns the length of the header digest.
func (r *Reader) checkCommonHeader(h *Header) (hdgst int, err error) {
	t := h.Type
	hdr := h.raw[:CommonHeaderSize]
	fail := func(fes FES, fei uint32, format string, args ...any) (int, error) {
		return 0, protocolErrorf(fes, fei, t, hdr, format, args...)
	}
	known := HeaderSize(t) != 0
	if !known || t.FromHost() != (r.role == RoleController) {
		return fail(FESInvalidHeaderField, offType, "not a PDU this side receives")
	}
	term := t == TypeH2CTermReq || t == TypeC2HTermReq
	ic := t == TypeICReq || t == TypeICResp
	switch {
	case term:
	case !r.negotiated && !ic:
		return fail(FESPDUSequenceError, offType, "before the connection is initialized")
	case r.negotiated && ic:
		return fail(FESPDUSequenceError, offType, "on an initialized connection")
	}
	if h.Flags&^validFlags(t) != 0 {
		return fail(FESInvalidHeaderField, offFlags, "flags 0x%02x", uint8(h.Flags))
	}
	if h.Flags&(FlagSuccess|FlagLast) == FlagSuccess {
		return fail(FESInvalidHeaderField, offFlags, "SUCCESS without LAST_PDU")
	}
	if int(h.HLEN) != HeaderSize(t) {
		return fail(FESInvalidHeaderField, offHLEN, "HLEN %d, want %d", h.HLEN, HeaderSize(t))
	}
	if hasHeaderDigest(t) && r.digests&HeaderDigest != 0 {
		hdgst = DigestSize
	}
	if (h.Flags&FlagHDGST != 0) != (hdgst > 0) {
		return fail(FESInvalidHeaderField, offFlags, "HDGST flag %v with header digests %v", h.Flags&FlagHDGST != 0, hdgst > 0)
	}
	full := uint32(h.HLEN) + uint32(hdgst)
	r.pad, r.data, r.ddgst = 0, 0, 0
	switch {
	case ic:
		if h.PDO != 0 {
			return fail(FESInvalidHeaderField, offPDO, "PDO %d", h.PDO)
		}
		if h.PLEN != ICSize {
			return fail(FESInvalidHeaderField, offPLEN, "PLEN %d, want %d", h.PLEN, ICSize)
		}
	case term:
		// The offending header follows the request's header directly.
		if h.PDO != 0 && uint32(h.PDO) != full {
			return fail(FESInvalidHeaderField, offPDO, "PDO %d", h.PDO)
		}
		if h.PLEN < full || h.PLEN > MaxTermReqSize {
			return fail(FESInvalidHeaderField, offPLEN, "PLEN %d outside [%d, %d]", h.PLEN, full, MaxTermReqSize)
		}
		r.data = int(h.PLEN - full)
	case !carriesData(t):
		if h.PDO != 0 {
			return fail(FESInvalidHeaderField, offPDO, "PDO %d on a PDU without data", h.PDO)
		}
		if h.PLEN != full {
			return fail(FESInvalidHeaderField, offPLEN, "PLEN %d, want %d", h.PLEN, full)
		}
	case h.PLEN == full:
		// No data: PDO 0 (or pointing at the end), the DDGST flag ignored.
		if h.PDO != 0 && uint32(h.PDO) != full {
			return fail(FESInvalidHeaderField, offPDO, "PDO %d on a PDU without data", h.PDO)
		}
	default:
		if h.PLEN < full {
			return fail(FESInvalidHeaderField, offPLEN, "PLEN %d shorter than the header", h.PLEN)
		}
		if uint32(h.PDO) < full || uint32(h.PDO) > h.PLEN || int(h.PDO)%r.rxAlign != 0 {
			return fail(FESInvalidHeaderField, offPDO, "PDO %d: not a multiple of %d in [%d, PLEN %d]", h.PDO, r.rxAlign, full, h.PLEN)
		}
		dd := 0
		if r.digests&DataDigest != 0 {
			dd = DigestSize
		}
		if (h.Flags&FlagDDGST != 0) != (dd > 0) {
			return fail(FESInvalidHeaderField, offFlags, "DDGST flag %v with data digests %v", h.Flags&FlagDDGST != 0, dd > 0)
		}
		n := int64(h.PLEN) - int64(h.PDO) - int64(dd)
		if n < 0 || (n == 0 && dd > 0) {
			return fail(FESInvalidHeaderField, offPLEN, "PLEN %d leaves no room for data after PDO %d", h.PLEN, h.PDO)
		}
		if limit := r.dataLimit(t); limit > 0 && n > int64(limit) {
			return fail(FESDataLimitExceeded, offPLEN, "%d bytes of data, the limit is %d", n, limit)
		}
		if n > 0 {
			r.pad, r.data, r.ddgst = int(uint32(h.PDO)-full), int(n), dd
		}
	}
	h.DataLen = r.data
	return hdgst, nil
}

// dataLimit is the most data a PDU of type t may carry before its header
// is read (a CapsuleCmd is checked again against its command's limit).
func (r *Reader) dataLimit(t PDUType) int {
	switch t {
	case TypeCapsuleCmd:
		return max(r.lim.InCapsuleData, FabricsInCapsuleData)
	case TypeH2CData:
		return r.lim.MaxH2CData
	case TypeC2HData:
		return r.lim.MaxC2HData
	}
	return 0
}

// checkHeader checks what the PDU-specific header says about the data.
func (r *Reader) checkHeader(h *Header) error {
	switch h.Type {
	case TypeCapsuleCmd:
		if r.data == 0 {
			return nil
		}
		var c nvme.Command
		_ = c.Unmarshal(h.raw[CommonHeaderSize:CapsuleCmdHeaderSize])
		if limit := InCapsuleLimit(&c, r.lim.InCapsuleData); r.data > limit {
			return protocolErrorf(FESDataLimitExceeded, offPLEN, h.Type, h.Bytes(),
				"%d bytes of in-capsule data for %s, the queue accepts %d", r.data, c.Name(false), limit)
		}
	case TypeH2CData, TypeC2HData:
		if datal := le.Uint32(h.raw[offDataDATAL:]); datal != uint32(r.data) {
			return protocolErrorf(FESInvalidHeaderField, offDataDATAL, h.Type, h.Bytes(),
				"DATAL %d but the PDU carries %d bytes", datal, r.data)
		}
	}
	return nil
}

// ReadData reads the current PDU's data into dst, which must be exactly
// Header.DataLen bytes, and checks its digest: a mismatch is an error
// wrapping ErrDataDigest, after which the stream is still in step.
func (r *Reader) ReadData(dst []byte) error {
	if len(dst) != r.data {
		return fmt.Errorf("nvme/tcp: reading %d bytes of data, the PDU has %d", len(dst), r.data)
	}
	if err := r.skip(r.pad); err != nil {
		return err
	}
	r.pad = 0
	if _, err := io.ReadFull(r.br, dst); err != nil {
		return unexpectedEOF(err)
	}
	r.data = 0
	if r.ddgst > 0 {
		var b [DigestSize]byte
		if _, err := io.ReadFull(r.br, b[:]); err != nil {
			return unexpectedEOF(err)
		}
		r.ddgst = 0
		r.src.inPDU = false
		if want, got := Digest(dst), le.Uint32(b[:]); want != got {
			return fmt.Errorf("%w: %s of %d bytes: digest 0x%08x, the data's CRC32C is 0x%08x", ErrDataDigest, r.h.Type, len(dst), got, want)
		}
		return nil
	}
	r.src.inPDU = false
	return nil
}

// Discard skips what is left of the current PDU's data.
func (r *Reader) Discard() error {
	if n := r.pad + r.data + r.ddgst; n > 0 {
		r.pad, r.data, r.ddgst = 0, 0, 0
		if err := r.skip(n); err != nil {
			return err
		}
		r.src.inPDU = false
	}
	return nil
}

func (r *Reader) skip(n int) error {
	if n == 0 {
		return nil
	}
	if _, err := r.br.Discard(n); err != nil {
		return unexpectedEOF(err)
	}
	return nil
}

// unexpectedEOF: a stream that ends inside a PDU did not end cleanly.
func unexpectedEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

type deadliner interface{ SetReadDeadline(time.Time) error }

// stallSource sets a read deadline on its source while a PDU is partly read
// (see WithPDUTimeout). It touches the deadline only when a read of the
// source is needed: at most once per PDU, and once when it goes idle.
type stallSource struct {
	r       io.Reader
	dl      deadliner
	timeout time.Duration
	inPDU   bool // a PDU has begun and is not read whole
	armed   bool // a deadline is set for the current PDU
	set     bool // a deadline is set at all
}

func (s *stallSource) startPDU() { s.inPDU, s.armed = true, false }

func (s *stallSource) Read(p []byte) (int, error) {
	if s.dl != nil && s.timeout > 0 {
		switch {
		case s.inPDU && !s.armed:
			s.armed, s.set = true, true
			_ = s.dl.SetReadDeadline(time.Now().Add(s.timeout))
		case !s.inPDU && s.set:
			s.set = false
			_ = s.dl.SetReadDeadline(time.Time{})
		}
	}
	return s.r.Read(p)
}
