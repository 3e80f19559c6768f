package tcp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/nprdma/nprdma/nvme"
)

// The fuzz target of the PDU decoder. Its committed seed corpus lives in
// testdata/fuzz/FuzzReader (regenerate it with
// NPRDMA_WRITE_FUZZ_SEEDS=1 go test -run TestWriteFuzzSeeds ./nvme/tcp).

const fuzzLimit = 64 << 10

// FuzzReader reads an arbitrary stream as one side of a connection (the
// controller's, or the host's), from the initial exchange or from an
// initialized connection, with the digests and alignment the input picks.
// The reader never panics; when NextBuffered says the next PDU is buffered
// whole, Next reads nothing more from the source; it never accepts a PDU whose data is above the
// limits, whose header disagrees with its type, or whose header digest is
// wrong; every refusal is a *ProtocolError with a defined FES and at most
// 128 bytes of offending header, or an error of the stream; a PDU it
// accepts decodes, and written again by a Writer it reads back the same.
func FuzzReader(f *testing.F) {
	for _, s := range readerSeeds() {
		f.Add(s.stream, s.mode)
	}
	f.Fuzz(func(t *testing.T, stream []byte, mode uint8) {
		role := RoleController
		if mode&1 != 0 {
			role = RoleHost
		}
		dg := Digests(mode>>1) & (HeaderDigest | DataDigest)
		negotiated := mode&8 != 0
		pda := (mode >> 4) & 3
		lim := Limits{InCapsuleData: 4096, MaxH2CData: fuzzLimit, MaxC2HData: fuzzLimit}
		src := &countingReader{r: bytes.NewReader(stream)}
		r := NewReader(src, role, WithReadBuffer(64))
		if negotiated {
			r.Negotiated(dg, pda, lim)
		}
		for i := 0; i < 64; i++ {
			buffered, reads := r.NextBuffered(), src.reads
			h, err := r.Next()
			if buffered && src.reads != reads {
				t.Fatalf("NextBuffered said the next PDU was buffered, and Next read the source (%v)", err)
			}
			if err != nil {
				var pe *ProtocolError
				switch {
				case errors.As(err, &pe):
					if pe.FES < FESInvalidHeaderField || pe.FES > FESUnsupportedParameter || len(pe.Header) > MaxTermReqData {
						t.Fatalf("protocol error %v with %d header bytes", pe, len(pe.Header))
					}
				case err != io.EOF && err != io.ErrUnexpectedEOF:
					t.Fatalf("error %v", err)
				}
				return
			}
			if int(h.HLEN) != HeaderSize(h.Type) || h.Type.FromHost() != (role == RoleController) {
				t.Fatalf("accepted %s with HLEN %d as %v", h.Type, h.HLEN, role)
			}
			if h.DataLen > fuzzLimit || (h.Type == TypeCapsuleCmd && h.DataLen > FabricsInCapsuleData) {
				t.Fatalf("accepted %s with %d bytes of data", h.Type, h.DataLen)
			}
			data := make([]byte, h.DataLen)
			derr := r.ReadData(data)
			if derr != nil && !errors.Is(derr, ErrDataDigest) && derr != io.ErrUnexpectedEOF {
				t.Fatalf("data: %v", derr)
			}
			checkRewrite(t, h, data, dg, pda)
			if !negotiated && (h.Type == TypeICReq || h.Type == TypeICResp) {
				r.Negotiated(dg, pda, lim)
				negotiated = true
			}
			if derr != nil && !errors.Is(derr, ErrDataDigest) {
				return
			}
		}
	})
}

// countingReader counts the reads of its source.
type countingReader struct {
	r     io.Reader
	reads int
}

func (c *countingReader) Read(p []byte) (int, error) {
	c.reads++
	return c.r.Read(p)
}

// checkRewrite decodes an accepted PDU, writes it again and reads it back:
// the decoded values must be the same.
func checkRewrite(t *testing.T, h *Header, data []byte, dg Digests, pda uint8) {
	t.Helper()
	var buf bytes.Buffer
	w := NewWriter(&buf)
	if h.Type != TypeICReq && h.Type != TypeICResp {
		w.Negotiated(dg, pda)
	}
	var want string
	switch h.Type {
	case TypeICReq:
		var p ICReq
		mustDecode(t, p.Unmarshal(h.Bytes()))
		_ = p.Check(h.Bytes())
		w.ICReq(&p)
		want = fmt.Sprint(p)
	case TypeICResp:
		var p ICResp
		mustDecode(t, p.Unmarshal(h.Bytes()))
		_ = p.Check(h.Bytes(), dg)
		w.ICResp(&p)
		want = fmt.Sprint(p)
	case TypeCapsuleCmd:
		c, err := ParseCapsuleCmd(h.Bytes())
		mustDecode(t, err)
		_ = c.Name(false)
		w.CapsuleCmd(&c, data)
		want = fmt.Sprint(c, data)
	case TypeCapsuleResp:
		c, err := ParseCapsuleResp(h.Bytes())
		mustDecode(t, err)
		w.CapsuleResp(&c)
		want = fmt.Sprint(c)
	case TypeH2CData, TypeC2HData:
		var d DataHeader
		mustDecode(t, d.Unmarshal(h.Bytes()))
		if h.Type == TypeH2CData {
			w.H2CData(&d, data)
		} else {
			w.C2HData(&d, data)
		}
		want = fmt.Sprint(d, data)
	case TypeR2T:
		var r R2T
		mustDecode(t, r.Unmarshal(h.Bytes()))
		w.R2T(&r)
		want = fmt.Sprint(r)
	case TypeH2CTermReq, TypeC2HTermReq:
		var tr TermReq
		mustDecode(t, tr.Unmarshal(h.Bytes(), data))
		_ = tr.String()
		w.TermReq(&tr)
		want = fmt.Sprint(tr.Type, tr.FES, tr.FEI, tr.Data)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	role := RoleController
	if !h.Type.FromHost() {
		role = RoleHost
	}
	r := NewReader(&buf, role)
	if h.Type != TypeICReq && h.Type != TypeICResp {
		r.Negotiated(dg, pda, Limits{InCapsuleData: 1 << 20, MaxH2CData: 1 << 20, MaxC2HData: 1 << 20})
	}
	h2, err := r.Next()
	if err != nil {
		t.Fatalf("%s written again: %v", h.Type, err)
	}
	data2 := make([]byte, h2.DataLen)
	if err := r.ReadData(data2); err != nil {
		t.Fatalf("%s written again: data: %v", h.Type, err)
	}
	var got string
	switch h.Type {
	case TypeICReq:
		var p ICReq
		_ = p.Unmarshal(h2.Bytes())
		got = fmt.Sprint(p)
	case TypeICResp:
		var p ICResp
		_ = p.Unmarshal(h2.Bytes())
		got = fmt.Sprint(p)
	case TypeCapsuleCmd:
		c, _ := ParseCapsuleCmd(h2.Bytes())
		got = fmt.Sprint(c, data2)
	case TypeCapsuleResp:
		c, _ := ParseCapsuleResp(h2.Bytes())
		got = fmt.Sprint(c)
	case TypeH2CData, TypeC2HData:
		var d DataHeader
		_ = d.Unmarshal(h2.Bytes())
		got = fmt.Sprint(d, data2)
	case TypeR2T:
		var r R2T
		_ = r.Unmarshal(h2.Bytes())
		got = fmt.Sprint(r)
	case TypeH2CTermReq, TypeC2HTermReq:
		var tr TermReq
		_ = tr.Unmarshal(h2.Bytes(), data2)
		got = fmt.Sprint(tr.Type, tr.FES, tr.FEI, tr.Data)
	}
	if got != want {
		t.Fatalf("%s written again reads back\n%s\nwant\n%s", h.Type, got, want)
	}
}

func mustDecode(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("an accepted header does not decode: %v", err)
	}
}

type readerSeed struct {
	stream []byte
	mode   uint8 // bit 0 host side, bits 2:1 digests, bit 3 initialized, bits 5:4 PDA
}

func readerSeeds() []readerSeed {
	enc := func(dg Digests, pda uint8, f func(w *Writer)) []byte {
		var buf bytes.Buffer
		w := NewWriter(&buf)
		w.Negotiated(dg, pda)
		f(w)
		w.Flush()
		return buf.Bytes()
	}
	wr, _ := nvme.WriteCommand(1, 0, 1, 0, nvme.InCapsuleSGL(0, 4096))
	rd, _ := nvme.ReadCommand(1, 0, 2, 0, nvme.TransportSGL(8192))
	conn := nvme.ConnectCommand(nvme.ConnectParams{QID: 0, SQSIZE: 31, KATO: 5000}, nvme.InCapsuleSGL(0, nvme.ConnectDataSize))
	cd, _ := (&nvme.ConnectData{CNTLID: nvme.DynamicControllerID, SubNQN: "nqn.2024-01.io.nprdma:default",
		HostNQN: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001"}).Marshal()
	cqe := nvme.Completion{CID: 3, SQHD: 1, Status: nvme.StatusInvalidField.WithDNR()}
	block := pattern(4096, 9)
	both := HeaderDigest | DataDigest
	mode := func(host bool, dg Digests, init bool, pda uint8) uint8 {
		m := uint8(dg)<<1 | pda<<4
		if host {
			m |= 1
		}
		if init {
			m |= 8
		}
		return m
	}
	return []readerSeed{
		// A controller's view: ICReq, Connect, a write in the capsule, a
		// read, a write by R2T.
		{enc(0, 0, func(w *Writer) {
			w.ICReq(&ICReq{})
			w.Negotiated(0, 0)
			w.CapsuleCmd(&conn, cd)
			w.CapsuleCmd(&wr, block)
			w.CapsuleCmd(&rd, nil)
			w.H2CData(&DataHeader{CCCID: 4, TTAG: 1, Last: true}, block)
		}), mode(false, 0, false, 0)},
		{enc(both, 0, func(w *Writer) {
			w.CapsuleCmd(&wr, block)
			w.H2CData(&DataHeader{CCCID: 4, TTAG: 1, DATAO: 4096, Last: true}, block)
			w.TermReq(&TermReq{Type: TypeH2CTermReq, FES: FESPDUSequenceError, Data: block[:72]})
		}), mode(false, both, true, 0)},
		// A host's view: ICResp, completions, read data, an R2T.
		{enc(0, 0, func(w *Writer) {
			w.ICResp(&ICResp{Digests: HeaderDigest, MAXH2CDATA: 131072})
			w.Negotiated(HeaderDigest, 0)
			w.CapsuleResp(&cqe)
			w.C2HData(&DataHeader{CCCID: 3, Last: true, Success: true}, block)
			w.R2T(&R2T{CCCID: 4, TTAG: 2, R2TL: 8192})
		}), mode(true, HeaderDigest, false, 0)},
		{enc(both, 3, func(w *Writer) {
			w.C2HData(&DataHeader{CCCID: 3, DATAO: 0}, block)
			w.C2HData(&DataHeader{CCCID: 3, DATAO: 4096, Last: true}, block)
			w.CapsuleResp(&cqe)
			w.TermReq(&TermReq{Type: TypeC2HTermReq, FES: FESHeaderDigestError})
		}), mode(true, both, true, 3)},
		// Broken streams: a truncated capsule, garbage, a data digest off.
		{enc(0, 0, func(w *Writer) { w.CapsuleCmd(&wr, block) })[:100], mode(false, 0, true, 0)},
		{bytes.Repeat([]byte{0x04, 0, 72, 0, 0xff, 0xff, 0xff, 0x7f}, 4), mode(false, 0, true, 0)},
		{func() []byte {
			b := enc(both, 0, func(w *Writer) { w.CapsuleCmd(&wr, block) })
			b[len(b)-1] ^= 1
			return b
		}(), mode(false, both, true, 0)},
	}
}

// TestWriteFuzzSeeds writes the seed corpora (FuzzReader's, and the host's
// FuzzHostStream's) in the "go test fuzz v1" format when
// NPRDMA_WRITE_FUZZ_SEEDS=1; otherwise it checks that they are committed.
func TestWriteFuzzSeeds(t *testing.T) {
	for name, seeds := range map[string][]readerSeed{"FuzzReader": readerSeeds(), "FuzzHostStream": hostStreamSeeds()} {
		dir := filepath.Join("testdata", "fuzz", name)
		if os.Getenv("NPRDMA_WRITE_FUZZ_SEEDS") != "1" {
			files, err := os.ReadDir(dir)
			if err != nil || len(files) < len(seeds) {
				t.Fatalf("%s: %d committed seeds, want %d (%v); run with NPRDMA_WRITE_FUZZ_SEEDS=1", dir, len(files), len(seeds), err)
			}
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, s := range seeds {
			b := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\nbyte(%q)\n", s.stream, rune(s.mode))
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(b), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
