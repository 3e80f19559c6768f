// Package nvmetcptest is a minimal NVMe/TCP host for tests: raw PDUs over
// a socket, one command at a time, sending what a Linux host sends (PSDT
// 01b, SGL 0x5A for data moved in PDUs, 0x01 for in-capsule data, Fabrics
// commands' data in the capsule). Tests drive a controller with it,
// including with PDUs no host should send (Raw, Conn).
package nvmetcptest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/tcp"
)

// Host is one NVMe/TCP connection (one queue) of a test host.
type Host struct {
	Conn net.Conn
	R    *tcp.Reader
	W    *tcp.Writer
	// Resp is the controller's ICResp.
	Resp tcp.ICResp
	// ICD is the in-capsule data limit used for writes (0: every write by
	// R2T); Fabrics commands always go in the capsule, as Linux sends them.
	ICD int
	cid uint16
}

// Timeout bounds every wait of a Host.
const Timeout = 10 * time.Second

// Dial connects to addr and exchanges ICReq/ICResp asking for digests.
func Dial(t testing.TB, addr string, digests tcp.Digests) *Host {
	t.Helper()
	h, err := DialErr(addr, digests)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Conn.Close() })
	return h
}

// DialErr is Dial returning its error.
func DialErr(addr string, digests tcp.Digests) (*Host, error) {
	conn, err := net.DialTimeout("tcp", addr, Timeout)
	if err != nil {
		return nil, err
	}
	h := &Host{Conn: conn, R: tcp.NewReader(conn, tcp.RoleHost), W: tcp.NewWriter(conn), ICD: 8192}
	conn.SetDeadline(time.Now().Add(Timeout))
	h.W.ICReq(&tcp.ICReq{Digests: digests})
	if err := h.W.Flush(); err != nil {
		conn.Close()
		return nil, err
	}
	p, err := h.R.Next()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("ICResp: %w", err)
	}
	if err := h.Resp.Unmarshal(p.Bytes()); err != nil {
		conn.Close()
		return nil, err
	}
	if err := h.Resp.Check(p.Bytes(), digests); err != nil {
		conn.Close()
		return nil, err
	}
	h.R.Negotiated(digests, 0, tcp.Limits{MaxC2HData: 16 << 20})
	h.W.Negotiated(digests, h.Resp.CPDA)
	conn.SetDeadline(time.Time{})
	return h, nil
}

// Connect sends a Fabrics Connect for queue qid of sqsize+1 entries (KATO
// 5 s on the admin queue, 0xFFFF as CNTLID there) and returns the
// completion.
func (h *Host) Connect(t testing.TB, qid, sqsize uint16, subNQN, hostNQN string, cntlid uint16) nvme.Completion {
	t.Helper()
	var kato uint32
	if qid == 0 {
		kato, cntlid = 5000, nvme.DynamicControllerID
	}
	d := nvme.ConnectData{HostID: nvme.UUID{1, 2, 3}, CNTLID: cntlid, SubNQN: subNQN, HostNQN: hostNQN}
	data, err := d.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	cmd := nvme.ConnectCommand(nvme.ConnectParams{QID: qid, SQSIZE: sqsize, KATO: kato}, nvme.InCapsuleSGL(0, uint32(len(data))))
	c, err := h.Exec(cmd, data, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Exec sends cmd and waits for its completion: out is the data it writes
// (in the capsule up to ICD bytes, and always for Fabrics commands; else
// sent when the controller's R2Ts ask for it), in receives the data it
// reads (C2HData). Its CID and SGL are set here. A completion with an error
// status is not an error of Exec: the status is in the completion.
func (h *Host) Exec(cmd nvme.Command, out, in []byte) (nvme.Completion, error) {
	cid, err := h.Send(cmd, out, len(in))
	if err != nil {
		return nvme.Completion{}, err
	}
	h.Conn.SetDeadline(time.Now().Add(Timeout))
	defer h.Conn.SetDeadline(time.Time{})
	return h.Await(cid, out, in)
}

// Send sends cmd without waiting for it and returns its CID, for Await:
// out is the data it writes (as Exec), inLen the length of the data it
// reads.
func (h *Host) Send(cmd nvme.Command, out []byte, inLen int) (uint16, error) {
	h.cid++
	cmd.CID = h.cid
	cmd.Flags = nvme.FlagsSGL
	var icd []byte
	switch {
	case len(out) > 0 && (len(out) <= h.ICD || cmd.IsFabrics()):
		icd = out
		cmd.DPTR = nvme.InCapsuleSGL(0, uint32(len(out)))
	case len(out) > 0:
		cmd.DPTR = nvme.TransportSGL(uint32(len(out)))
	default:
		cmd.DPTR = nvme.TransportSGL(uint32(inLen))
	}
	h.Conn.SetWriteDeadline(time.Now().Add(Timeout))
	defer h.Conn.SetWriteDeadline(time.Time{})
	h.W.CapsuleCmd(&cmd, icd)
	return cmd.CID, h.W.Flush()
}

// Await reads PDUs until the completion of command cid: it answers R2Ts
// with out, places C2HData in in, and takes a C2HData with SUCCESS for a
// successful completion. A termination request is an error wrapping
// tcp.ErrTermReq.
func (h *Host) Await(cid uint16, out, in []byte) (nvme.Completion, error) {
	cs, err := h.AwaitAll(map[uint16]Transfer{cid: {Out: out, In: in}})
	return cs[cid], err
}

// Transfer is the data of a command in flight: Out answers its R2Ts, In
// takes its C2HData.
type Transfer struct{ Out, In []byte }

// AwaitAll reads PDUs until every command of cmds has completed, in
// whatever order their PDUs come, and returns their completions (as Await
// does for one). A PDU of a command not in cmds is an error.
func (h *Host) AwaitAll(cmds map[uint16]Transfer) (map[uint16]nvme.Completion, error) {
	got := make(map[uint16]int, len(cmds))
	done := make(map[uint16]nvme.Completion, len(cmds))
	for len(done) < len(cmds) {
		p, err := h.R.Next()
		if err != nil {
			return done, err
		}
		switch p.Type {
		case tcp.TypeCapsuleResp:
			c, _ := tcp.ParseCapsuleResp(p.Bytes())
			x, ok := cmds[c.CID]
			if _, twice := done[c.CID]; !ok || twice {
				return done, fmt.Errorf("completion of CID %d, not awaited", c.CID)
			}
			done[c.CID] = c
			if c.Status.OK() && got[c.CID] != len(x.In) {
				return done, fmt.Errorf("CID %d: %d of %d bytes of data before the completion", c.CID, got[c.CID], len(x.In))
			}
		case tcp.TypeC2HData:
			var d tcp.DataHeader
			_ = d.Unmarshal(p.Bytes())
			x, ok := cmds[d.CCCID]
			if !ok || int(d.DATAO) != got[d.CCCID] || int(d.DATAO)+int(d.DATAL) > len(x.In) {
				return done, fmt.Errorf("C2HData %+v after %d bytes of %d", d, got[d.CCCID], len(x.In))
			}
			if err := h.R.ReadData(x.In[d.DATAO : d.DATAO+d.DATAL]); err != nil {
				return done, err
			}
			got[d.CCCID] += int(d.DATAL)
			if d.Success {
				done[d.CCCID] = nvme.Completion{CID: d.CCCID, SQHD: 0xffff}
			}
		case tcp.TypeR2T:
			var r tcp.R2T
			_ = r.Unmarshal(p.Bytes())
			out := cmds[r.CCCID].Out
			if uint64(r.R2TO)+uint64(r.R2TL) > uint64(len(out)) {
				return done, fmt.Errorf("R2T %+v for CID %d with %d bytes to write", r, r.CCCID, len(out))
			}
			for off := r.R2TO; off < r.R2TO+r.R2TL; {
				n := min(r.R2TO+r.R2TL-off, h.Resp.MAXH2CDATA)
				d := tcp.DataHeader{CCCID: r.CCCID, TTAG: r.TTAG, DATAO: off, Last: off+n == r.R2TO+r.R2TL}
				h.W.H2CData(&d, out[off:off+n])
				off += n
			}
			if err := h.W.Flush(); err != nil {
				return done, err
			}
		case tcp.TypeC2HTermReq:
			data := make([]byte, p.DataLen)
			_ = h.R.ReadData(data)
			var tr tcp.TermReq
			_ = tr.Unmarshal(p.Bytes(), data)
			return done, &TermReqError{TermReq: tr}
		}
	}
	return done, nil
}

// TermReqError is the C2HTermReq a controller sent.
type TermReqError struct{ TermReq tcp.TermReq }

func (e *TermReqError) Error() string { return "C2HTermReq: " + e.TermReq.String() }
func (e *TermReqError) Unwrap() error { return tcp.ErrTermReq }

// Raw sends b as it is.
func (h *Host) Raw(b []byte) error {
	h.Conn.SetWriteDeadline(time.Now().Add(Timeout))
	_, err := h.Conn.Write(b)
	return err
}

// ExpectTermReq reads, skipping any other PDU, until the controller's
// C2HTermReq and then the end of the connection, and returns the request.
func (h *Host) ExpectTermReq(t testing.TB) tcp.TermReq {
	t.Helper()
	h.Conn.SetReadDeadline(time.Now().Add(Timeout))
	for {
		p, err := h.R.Next()
		if err != nil {
			t.Fatalf("want a C2HTermReq, got %v", err)
		}
		if p.Type != tcp.TypeC2HTermReq {
			continue
		}
		data := make([]byte, p.DataLen)
		if err := h.R.ReadData(data); err != nil {
			t.Fatal(err)
		}
		var tr tcp.TermReq
		if err := tr.Unmarshal(p.Bytes(), data); err != nil {
			t.Fatal(err)
		}
		h.ExpectClosed(t)
		return tr
	}
}

// ExpectClosed waits for the controller to close the connection.
func (h *Host) ExpectClosed(t testing.TB) {
	t.Helper()
	h.Conn.SetReadDeadline(time.Now().Add(Timeout))
	var b [512]byte
	for {
		_, err := h.Conn.Read(b[:])
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the controller kept the connection open")
		}
		return
	}
}

// Encode returns what w's PDUs encode to with the host's digests.
func (h *Host) Encode(f func(w *tcp.Writer)) []byte {
	var buf bytes.Buffer
	w := tcp.NewWriter(&buf)
	w.Negotiated(h.Resp.Digests, h.Resp.CPDA)
	f(w)
	_ = w.Flush()
	return buf.Bytes()
}
