package tcp

import (
	"io"
	"net"
	"slices"

	"github.com/nprdma/nprdma/nvme"
)

// Writer encodes PDUs into a batch and writes the batch with Flush, in one
// vectored write (writev on a net.Conn): headers, digests and padding are
// encoded into a buffer of the Writer's, data slices are referenced, not
// copied, so they must not change until Flush returns. It is not safe for
// concurrent use.
type Writer struct {
	w       io.Writer
	digests Digests
	align   int // data alignment the peer asked for: (its PDA+1)·4
	hdrs    []byte
	segs    []segment
	bufs    net.Buffers
	n       int
}

// segment is a range of hdrs, or a data slice.
type segment struct {
	lo, hi int
	data   []byte
}

// NewWriter returns a Writer to w, with no digests until Negotiated.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: w, align: 4}
}

// Negotiated records the digests in use and the PDA the peer asked for
// (HPDA for a controller's Writer, CPDA for a host's): the data of the PDUs
// written from then on starts at a multiple of (pda+1)·4 bytes.
func (w *Writer) Negotiated(d Digests, pda uint8) {
	w.digests, w.align = d, pdaAlignment(pda)
}

// Buffered is the number of bytes waiting for Flush.
func (w *Writer) Buffered() int { return w.n }

// header adds the header of a PDU of type t that carries dataLen bytes of
// data: the common header, the PDU-specific header that fill writes, the
// header digest (when the type has one and it is in use) and the padding
// before the data.
func (w *Writer) header(t PDUType, flags Flags, dataLen int, fill func(b []byte)) {
	hlen := HeaderSize(t)
	hd := hasHeaderDigest(t) && w.digests&HeaderDigest != 0
	dd := carriesData(t) && dataLen > 0 && w.digests&DataDigest != 0
	pdo, plen := 0, hlen
	if hd {
		flags |= FlagHDGST
		plen += DigestSize
	}
	if dataLen > 0 {
		if t == TypeH2CTermReq || t == TypeC2HTermReq {
			plen += dataLen // the offending header follows directly, PDO 0
		} else {
			pdo = dataOffset(hlen, hd, w.align)
			plen = pdo + dataLen
		}
	}
	if dd {
		flags |= FlagDDGST
		plen += DigestSize
	}
	lo := len(w.hdrs)
	end := lo + hlen
	if hd {
		end += DigestSize
	}
	if pdo > 0 {
		end = lo + pdo
	}
	w.hdrs = slices.Grow(w.hdrs, end-lo)[:end]
	b := w.hdrs[lo:end]
	clear(b)
	ch := CommonHeader{Type: t, Flags: flags, HLEN: uint8(hlen), PDO: uint8(pdo), PLEN: uint32(plen)}
	ch.MarshalTo(b)
	fill(b[:hlen])
	if hd {
		le.PutUint32(b[hlen:], Digest(b[:hlen]))
	}
	w.addHdr(lo, end)
}

// addHdr adds hdrs[lo:hi] to the batch, merged with the segment before
// when that one ends where it starts.
func (w *Writer) addHdr(lo, hi int) {
	w.n += hi - lo
	if k := len(w.segs) - 1; k >= 0 && w.segs[k].data == nil && w.segs[k].hi == lo {
		w.segs[k].hi = hi
		return
	}
	w.segs = append(w.segs, segment{lo: lo, hi: hi})
}

// addData adds data (and its digest when data digests are in use).
func (w *Writer) addData(data []byte, digest bool) {
	if len(data) == 0 {
		return
	}
	w.n += len(data)
	w.segs = append(w.segs, segment{data: data})
	if digest && w.digests&DataDigest != 0 {
		lo := len(w.hdrs)
		w.hdrs = le.AppendUint32(w.hdrs, Digest(data))
		w.addHdr(lo, lo+DigestSize)
	}
}

// ICReq adds an ICReq.
func (w *Writer) ICReq(p *ICReq) {
	w.header(TypeICReq, 0, 0, func(b []byte) { p.MarshalTo(b) })
}

// ICResp adds an ICResp.
func (w *Writer) ICResp(p *ICResp) {
	w.header(TypeICResp, 0, 0, func(b []byte) { p.MarshalTo(b) })
}

// CapsuleCmd adds a command capsule with icd as its in-capsule data (nil:
// none). The caller sets c.DPTR: nvme.InCapsuleSGL(0, len(icd)) with data,
// nvme.TransportSGL(n) for data moved by R2T/H2CData or C2HData.
func (w *Writer) CapsuleCmd(c *nvme.Command, icd []byte) {
	w.header(TypeCapsuleCmd, 0, len(icd), func(b []byte) { c.MarshalTo(b[CommonHeaderSize:]) })
	w.addData(icd, true)
}

// CapsuleResp adds a response capsule.
func (w *Writer) CapsuleResp(c *nvme.Completion) {
	w.header(TypeCapsuleResp, 0, 0, func(b []byte) { c.MarshalTo(b[CommonHeaderSize:]) })
}

// H2CData adds an H2CData PDU carrying data (d.DATAL is set to len(data)).
func (w *Writer) H2CData(d *DataHeader, data []byte) { w.dataPDU(TypeH2CData, d, data) }

// C2HData adds a C2HData PDU carrying data (d.DATAL is set to len(data)).
func (w *Writer) C2HData(d *DataHeader, data []byte) { w.dataPDU(TypeC2HData, d, data) }

func (w *Writer) dataPDU(t PDUType, d *DataHeader, data []byte) {
	d.DATAL = uint32(len(data))
	w.header(t, d.flags(), len(data), func(b []byte) { d.marshalPSH(b) })
	w.addData(data, true)
}

// R2T adds an R2T.
func (w *Writer) R2T(r *R2T) {
	w.header(TypeR2T, 0, 0, func(b []byte) { r.marshalPSH(b) })
}

// TermReq adds a termination request of type t.Type, with at most
// MaxTermReqData bytes of t.Data.
func (w *Writer) TermReq(t *TermReq) {
	data := t.Data
	if len(data) > MaxTermReqData {
		data = data[:MaxTermReqData]
	}
	w.header(t.Type, 0, len(data), func(b []byte) { t.marshalPSH(b) })
	w.addData(data, false)
}

// discard empties the batch without writing it.
func (w *Writer) discard() {
	clear(w.segs)
	w.segs, w.hdrs, w.n = w.segs[:0], w.hdrs[:0], 0
}

// Flush writes the batch with one vectored write and empties it, also when
// the write fails (the connection is then of no further use).
func (w *Writer) Flush() error {
	if len(w.segs) == 0 {
		return nil
	}
	bufs := w.bufs[:0]
	for _, s := range w.segs {
		if s.data != nil {
			bufs = append(bufs, s.data)
		} else {
			bufs = append(bufs, w.hdrs[s.lo:s.hi])
		}
	}
	w.bufs = bufs
	_, err := bufs.WriteTo(w.w) // consumes a copy of the slice header
	clear(w.bufs)               // drop the references to the callers' data
	w.discard()
	return err
}
