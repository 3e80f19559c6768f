package tcp

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nvme"
)

// pduCase is one PDU written by a Writer and read back by a Reader.
type pduCase struct {
	name  string
	role  Role // the reader's side
	write func(w *Writer)
	check func(t *testing.T, h *Header, data []byte)
}

func mustCmd(t testing.TB) nvme.Command {
	t.Helper()
	c, err := nvme.WriteCommand(1, 8, 1, 0, nvme.InCapsuleSGL(0, 4096))
	if err != nil {
		t.Fatal(err)
	}
	c.CID = 0x1234
	return c
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

func roundTripCases(t *testing.T) []pduCase {
	cmd := mustCmd(t)
	icd := pattern(4096, 1)
	data := pattern(8192, 2)
	return []pduCase{
		{"CapsuleCmd with in-capsule data", RoleController,
			func(w *Writer) { w.CapsuleCmd(&cmd, icd) },
			func(t *testing.T, h *Header, got []byte) {
				c, err := ParseCapsuleCmd(h.Bytes())
				if err != nil || c != cmd || !bytes.Equal(got, icd) {
					t.Fatalf("capsule %+v err %v, data equal %v", c, err, bytes.Equal(got, icd))
				}
			}},
		{"CapsuleCmd without data", RoleController,
			func(w *Writer) { w.CapsuleCmd(&cmd, nil) },
			func(t *testing.T, h *Header, got []byte) {
				if c, err := ParseCapsuleCmd(h.Bytes()); err != nil || c != cmd || h.DataLen != 0 || h.PDO != 0 {
					t.Fatalf("capsule %+v err %v DataLen %d PDO %d", c, err, h.DataLen, h.PDO)
				}
			}},
		{"CapsuleResp", RoleHost,
			func(w *Writer) {
				c := nvme.Completion{DW0: 7, DW1: 8, SQHD: 3, SQID: 1, CID: 0x1234, Status: nvme.StatusLBAOutOfRange.WithDNR()}
				w.CapsuleResp(&c)
			},
			func(t *testing.T, h *Header, got []byte) {
				c, err := ParseCapsuleResp(h.Bytes())
				if err != nil || c.DW0 != 7 || c.DW1 != 8 || c.SQHD != 3 || c.SQID != 1 || c.CID != 0x1234 || !errors.Is(c.Err(), nvme.StatusLBAOutOfRange) {
					t.Fatalf("completion %+v err %v", c, err)
				}
			}},
		{"H2CData", RoleController,
			func(w *Writer) { w.H2CData(&DataHeader{CCCID: 9, TTAG: 3, DATAO: 4096, Last: true}, data) },
			func(t *testing.T, h *Header, got []byte) {
				var d DataHeader
				if err := d.Unmarshal(h.Bytes()); err != nil || d != (DataHeader{CCCID: 9, TTAG: 3, DATAO: 4096, DATAL: 8192, Last: true}) || !bytes.Equal(got, data) {
					t.Fatalf("data header %+v err %v", d, err)
				}
			}},
		{"C2HData with SUCCESS", RoleHost,
			func(w *Writer) { w.C2HData(&DataHeader{CCCID: 9, Last: true, Success: true}, data) },
			func(t *testing.T, h *Header, got []byte) {
				var d DataHeader
				if err := d.Unmarshal(h.Bytes()); err != nil || !d.Last || !d.Success || d.DATAL != 8192 || !bytes.Equal(got, data) {
					t.Fatalf("data header %+v err %v", d, err)
				}
			}},
		{"R2T", RoleHost,
			func(w *Writer) { w.R2T(&R2T{CCCID: 5, TTAG: 77, R2TO: 8192, R2TL: 131072}) },
			func(t *testing.T, h *Header, got []byte) {
				var r R2T
				if err := r.Unmarshal(h.Bytes()); err != nil || r != (R2T{CCCID: 5, TTAG: 77, R2TO: 8192, R2TL: 131072}) || h.DataLen != 0 {
					t.Fatalf("r2t %+v err %v", r, err)
				}
			}},
		{"C2HTermReq", RoleHost,
			func(w *Writer) {
				w.TermReq(&TermReq{Type: TypeC2HTermReq, FES: FESDataOutOfRange, FEI: 12, Data: pattern(200, 3)})
			},
			func(t *testing.T, h *Header, got []byte) {
				var tr TermReq
				if err := tr.Unmarshal(h.Bytes(), got); err != nil || tr.FES != FESDataOutOfRange || tr.FEI != 12 ||
					!bytes.Equal(tr.Data, pattern(200, 3)[:MaxTermReqData]) || h.PLEN != MaxTermReqSize || h.Flags != 0 {
					t.Fatalf("term req %+v err %v PLEN %d", tr, err, h.PLEN)
				}
			}},
	}
}

// TestRoundTrip writes every PDU family with each combination of digests and
// data alignments and reads it back: every field survives, data lands
// whole, digests verify.
func TestRoundTrip(t *testing.T) {
	for _, dg := range []Digests{0, HeaderDigest, DataDigest, HeaderDigest | DataDigest} {
		for _, pda := range []uint8{0, 7} {
			for _, c := range roundTripCases(t) {
				t.Run(c.name+"/"+dg.String(), func(t *testing.T) {
					var buf bytes.Buffer
					w := NewWriter(&buf)
					w.Negotiated(dg, pda)
					c.write(w)
					c.write(w) // two in a row: the second starts where the first ends
					n := w.Buffered()
					if err := w.Flush(); err != nil || buf.Len() != n || w.Buffered() != 0 {
						t.Fatalf("flush: %v, %d bytes written, %d buffered", err, buf.Len(), n)
					}
					r := NewReader(&buf, c.role)
					r.Negotiated(dg, pda, Limits{InCapsuleData: 8192, MaxH2CData: 1 << 20, MaxC2HData: 1 << 20})
					for i := 0; i < 2; i++ {
						h, err := r.Next()
						if err != nil {
							t.Fatal(err)
						}
						if h.DataLen > 0 && h.Type != TypeC2HTermReq && int(h.PDO)%pdaAlignment(pda) != 0 {
							t.Fatalf("PDO %d not aligned to %d", h.PDO, pdaAlignment(pda))
						}
						got := make([]byte, h.DataLen)
						if err := r.ReadData(got); err != nil {
							t.Fatal(err)
						}
						c.check(t, h, got)
					}
					if _, err := r.Next(); err != io.EOF {
						t.Fatalf("after the PDUs: %v, want io.EOF", err)
					}
				})
			}
		}
	}
}

func TestICRoundTripAndChecks(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	w.ICReq(&ICReq{HPDA: 2, Digests: HeaderDigest | DataDigest, MAXR2T: 3})
	if err := w.Flush(); err != nil || buf.Len() != ICSize {
		t.Fatalf("flush %v, %d bytes", err, buf.Len())
	}
	r := NewReader(&buf, RoleController)
	h, err := r.Next()
	if err != nil {
		t.Fatal(err)
	}
	var req ICReq
	if err := req.Unmarshal(h.Bytes()); err != nil || req != (ICReq{HPDA: 2, Digests: HeaderDigest | DataDigest, MAXR2T: 3}) {
		t.Fatalf("ICReq %+v err %v", req, err)
	}
	if err := req.Check(h.Bytes()); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		req ICReq
		fei uint32
	}{{ICReq{PFV: 1}, 8}, {ICReq{HPDA: 32}, 10}, {ICReq{Digests: 4}, 11}} {
		var pe *ProtocolError
		if err := bad.req.Check(h.Bytes()); !errors.As(err, &pe) || pe.FES != FESUnsupportedParameter || pe.FEI != bad.fei {
			t.Errorf("%+v: %v, want unsupported parameter at %d", bad.req, err, bad.fei)
		}
	}
	resp := ICResp{Digests: HeaderDigest, MAXH2CDATA: 131072}
	if err := resp.Check(nil, HeaderDigest); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []ICResp{{PFV: 1, MAXH2CDATA: 4096}, {CPDA: 32, MAXH2CDATA: 4096}, {Digests: DataDigest, MAXH2CDATA: 4096},
		{MAXH2CDATA: 4095}, {MAXH2CDATA: 4098}} {
		if err := bad.Check(nil, 0); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	// Once negotiated, another IC PDU is a sequence error (nvmet's
	// over-long second ICReq is a CVE).
	buf.Reset()
	w.ICReq(&ICReq{})
	w.Flush()
	r.Negotiated(0, 0, Limits{})
	wantProtocolError(t, r, FESPDUSequenceError, 0)
}

func wantProtocolError(t *testing.T, r *Reader, fes FES, fei uint32) *ProtocolError {
	t.Helper()
	h, err := r.Next()
	var pe *ProtocolError
	if !errors.As(err, &pe) {
		t.Fatalf("got header %+v, error %v; want a protocol error %s at %d", h, err, fes, fei)
	}
	if pe.FES != fes || pe.FEI != fei {
		t.Fatalf("%v: want FES %s FEI %d", pe, fes, fei)
	}
	if len(pe.Header) == 0 || len(pe.Header) > MaxTermReqData {
		t.Fatalf("offending header of %d bytes", len(pe.Header))
	}
	return pe
}

// TestReaderRefuses feeds each kind of bad PDU to a controller's reader and
// checks the fatal error status and the field reported.
func TestReaderRefuses(t *testing.T) {
	cmd := mustCmd(t)
	capsule := func(dg Digests, icd []byte) []byte {
		var buf bytes.Buffer
		w := NewWriter(&buf)
		w.Negotiated(dg, 0)
		w.CapsuleCmd(&cmd, icd)
		w.Flush()
		return buf.Bytes()
	}
	h2c := func(dg Digests, n int) []byte {
		var buf bytes.Buffer
		w := NewWriter(&buf)
		w.Negotiated(dg, 0)
		w.H2CData(&DataHeader{CCCID: 1, TTAG: 1}, make([]byte, n))
		w.Flush()
		return buf.Bytes()
	}
	edit := func(b []byte, f func(b []byte)) []byte { f(b); return b }
	lim := Limits{InCapsuleData: 4096, MaxH2CData: 8192}
	for _, c := range []struct {
		name   string
		dg     Digests
		stream []byte
		fes    FES
		fei    uint32
	}{
		{"unknown type", 0, edit(capsule(0, nil), func(b []byte) { b[0] = 0x08 }), FESInvalidHeaderField, 0},
		{"type of the other direction", 0, edit(capsule(0, nil), func(b []byte) { b[0] = byte(TypeCapsuleResp) }), FESInvalidHeaderField, 0},
		{"reserved flag", 0, edit(capsule(0, nil), func(b []byte) { b[1] |= 0x10 }), FESInvalidHeaderField, 1},
		{"LAST_PDU on a capsule", 0, edit(capsule(0, nil), func(b []byte) { b[1] |= byte(FlagLast) }), FESInvalidHeaderField, 1},
		{"no header digest flag", HeaderDigest, capsule(0, nil), FESInvalidHeaderField, 1},
		{"header digest flag not negotiated", 0, capsule(HeaderDigest, nil), FESInvalidHeaderField, 1},
		{"HLEN", 0, edit(capsule(0, nil), func(b []byte) { b[2] = 24 }), FESInvalidHeaderField, 2},
		{"PDO inside the header", 0, edit(capsule(0, make([]byte, 512)), func(b []byte) { b[3] = 64 }), FESInvalidHeaderField, 3},
		{"PDO not aligned", 0, edit(capsule(0, make([]byte, 512)), func(b []byte) { b[3] = 74 }), FESInvalidHeaderField, 3},
		{"PLEN shorter than the header", 0, edit(capsule(0, nil), func(b []byte) { le.PutUint32(b[4:], 40) }), FESInvalidHeaderField, 4},
		{"no data digest flag", DataDigest, capsule(0, make([]byte, 512)), FESInvalidHeaderField, 1},
		{"in-capsule data above the queue's limit", 0, capsule(0, make([]byte, 8192)), FESDataLimitExceeded, 4},
		{"above any in-capsule limit", 0, capsule(0, make([]byte, 12288)), FESDataLimitExceeded, 4},
		{"H2CData above MAXH2CDATA", 0, h2c(0, 8196), FESDataLimitExceeded, 4},
		{"H2CData DATAL disagrees with PLEN", 0, edit(h2c(0, 512), func(b []byte) { le.PutUint32(b[16:], 511) }), FESInvalidHeaderField, 16},
		{"header digest wrong", HeaderDigest, edit(capsule(HeaderDigest, nil), func(b []byte) { b[72] ^= 1 }), FESHeaderDigestError, 0},
		{"header changed under its digest", HeaderDigest, edit(capsule(HeaderDigest, nil), func(b []byte) { b[20] ^= 1 }), FESHeaderDigestError, 0},
		{"R2T from a host", 0, edit(capsule(0, nil), func(b []byte) { b[0] = byte(TypeR2T) }), FESInvalidHeaderField, 0},
		{"ICReq on an initialized connection", 0, edit(capsule(0, nil), func(b []byte) { b[0] = byte(TypeICReq) }), FESPDUSequenceError, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := NewReader(bytes.NewReader(c.stream), RoleController)
			r.Negotiated(c.dg, 0, lim)
			wantProtocolError(t, r, c.fes, c.fei)
		})
	}
	t.Run("capsule before ICReq", func(t *testing.T) {
		r := NewReader(bytes.NewReader(capsule(0, nil)), RoleController)
		wantProtocolError(t, r, FESPDUSequenceError, 0)
	})
	t.Run("truncated PDU", func(t *testing.T) {
		b := capsule(0, make([]byte, 512))
		for _, n := range []int{3, 40, 100} {
			r := NewReader(bytes.NewReader(b[:n]), RoleController)
			r.Negotiated(0, 0, lim)
			h, err := r.Next()
			if err == nil {
				err = r.ReadData(make([]byte, h.DataLen))
			}
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("%d bytes: %v, want io.ErrUnexpectedEOF", n, err)
			}
		}
	})
}

// TestDataDigestMismatchKeepsStreamInStep: a wrong data digest fails that
// PDU's data only; the next PDU reads normally.
func TestDataDigestMismatchKeepsStreamInStep(t *testing.T) {
	cmd := mustCmd(t)
	var buf bytes.Buffer
	w := NewWriter(&buf)
	w.Negotiated(HeaderDigest|DataDigest, 0)
	w.CapsuleCmd(&cmd, pattern(4096, 4))
	w.CapsuleCmd(&cmd, pattern(4096, 5))
	w.Flush()
	b := buf.Bytes()
	b[76+100] ^= 0xff // in the first capsule's data
	r := NewReader(bytes.NewReader(b), RoleController)
	r.Negotiated(HeaderDigest|DataDigest, 0, Limits{InCapsuleData: 8192})
	h, err := r.Next()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.ReadData(make([]byte, h.DataLen)); !errors.Is(err, ErrDataDigest) {
		t.Fatalf("corrupted data: %v, want ErrDataDigest", err)
	}
	h, err = r.Next()
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, h.DataLen)
	if err := r.ReadData(got); err != nil || !bytes.Equal(got, pattern(4096, 5)) {
		t.Fatalf("second capsule: %v", err)
	}
}

// TestNextSkipsUnreadData: a PDU whose data the caller does not read is
// skipped by the next Next.
func TestNextSkipsUnreadData(t *testing.T) {
	cmd := mustCmd(t)
	var buf bytes.Buffer
	w := NewWriter(&buf)
	w.CapsuleCmd(&cmd, pattern(1000, 1))
	w.R2T(&R2T{})
	w.CapsuleCmd(&cmd, nil)
	w.Flush()
	r := NewReader(&buf, RoleController)
	r.Negotiated(0, 0, Limits{InCapsuleData: 4096})
	if h, err := r.Next(); err != nil || h.DataLen != 1000 {
		t.Fatalf("%v %+v", err, h)
	}
	// The R2T is refused (a controller does not receive one) only after
	// the capsule's data was skipped exactly.
	wantProtocolError(t, r, FESInvalidHeaderField, 0)
}

// chunks is a source that returns its parts one per Read.
type chunks [][]byte

func (c *chunks) Read(p []byte) (int, error) {
	if len(*c) == 0 {
		return 0, io.EOF
	}
	n := copy(p, (*c)[0])
	if (*c)[0] = (*c)[0][n:]; len((*c)[0]) == 0 {
		*c = (*c)[1:]
	}
	return n, nil
}

// TestNextBuffered: NextBuffered says whether the PDU after the current one
// (past its unread data, padding and digest) is buffered whole, without
// reading the source.
func TestNextBuffered(t *testing.T) {
	for _, dg := range []Digests{0, HeaderDigest | DataDigest} {
		cmd := mustCmd(t)
		var buf bytes.Buffer
		w := NewWriter(&buf)
		w.Negotiated(dg, 0)
		w.CapsuleCmd(&cmd, pattern(1000, 1))
		w.Flush()
		first := buf.Len()
		w.CapsuleCmd(&cmd, nil)
		w.Flush()
		stream := buf.Bytes()
		src := chunks{stream[:first+10], stream[first+10:]}
		r := NewReader(&src, RoleController)
		r.Negotiated(dg, 0, Limits{InCapsuleData: 4096})
		if r.NextBuffered() {
			t.Fatalf("%v: NextBuffered before anything was read", dg)
		}
		if h, err := r.Next(); err != nil || h.DataLen != 1000 {
			t.Fatalf("%v: %v %+v", dg, err, h)
		}
		if r.NextBuffered() {
			t.Fatalf("%v: NextBuffered with 10 bytes of the second capsule read", dg)
		}
		if len(src) != 1 {
			t.Fatalf("%v: NextBuffered read the source", dg)
		}
		if _, err := r.Next(); err != nil { // skips the first capsule's data
			t.Fatal(err)
		}
		if r.NextBuffered() {
			t.Fatalf("%v: NextBuffered at the end of the stream", dg)
		}

		src = chunks{stream}
		r = NewReader(&src, RoleController)
		r.Negotiated(dg, 0, Limits{InCapsuleData: 4096})
		if _, err := r.Next(); err != nil {
			t.Fatal(err)
		}
		if !r.NextBuffered() {
			t.Fatalf("%v: the second capsule is buffered whole behind the first's data, NextBuffered says no", dg)
		}
		if err := r.ReadData(make([]byte, 1000)); err != nil || !r.NextBuffered() {
			t.Fatalf("%v: after the first capsule's data: %v, NextBuffered %v", dg, err, r.NextBuffered())
		}
	}
}

// TestStallTimeout: a peer that stops in the middle of a PDU is timed out;
// one that is idle between PDUs is not.
func TestStallTimeout(t *testing.T) {
	host, ctrl := net.Pipe()
	defer host.Close()
	defer ctrl.Close()
	r := NewReader(ctrl, RoleController, WithPDUTimeout(100*time.Millisecond))
	r.Negotiated(0, 0, Limits{InCapsuleData: 4096})
	cmd := mustCmd(t)
	var buf bytes.Buffer
	w := NewWriter(&buf)
	w.CapsuleCmd(&cmd, nil)
	w.Flush()
	pdu := buf.Bytes()
	go func() {
		time.Sleep(300 * time.Millisecond) // idle: longer than the timeout
		host.Write(pdu)
		host.Write(pdu[:20]) // then half a PDU, and nothing more
	}()
	if _, err := r.Next(); err != nil {
		t.Fatalf("idle connection timed out: %v", err)
	}
	_, err := r.Next()
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("stalled PDU: %v, want a deadline error", err)
	}
}
