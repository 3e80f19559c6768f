package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nvme"
)

// The host's fuzz target. Its committed seed corpus lives in
// testdata/fuzz/FuzzHostStream (regenerate it with
// NPRDMA_WRITE_FUZZ_SEEDS=1 go test -run TestWriteFuzzSeeds ./nvme/tcp).

// The commands in flight while the host reads a fuzzed stream, in CID
// order: a read of 8 KiB (CID 0), a write of 16 KiB beyond the capsule
// (CID 1), a flush (CID 2).
const (
	fuzzReadLen  = 8 << 10
	fuzzWriteLen = 16 << 10
	fuzzMaxH2C   = 4096
)

// FuzzHostStream gives a host queue a controller that answers ICReq
// properly (with the digests mode picks) and then sends stream, and ends
// the connection, while three commands are in flight. The host never
// panics or hangs: every Submit returns, with a completion or an error;
// and whatever it received, everything it sends is a valid PDU: capsules,
// H2CData within MAXH2CDATA and inside the write, and at most one
// termination request, last.
func FuzzHostStream(f *testing.F) {
	for _, s := range hostStreamSeeds() {
		f.Add(s.stream, s.mode)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	defer ln.Close()
	f.Fuzz(func(t *testing.T, stream []byte, mode uint8) {
		dg := Digests(mode) & (HeaderDigest | DataDigest)
		host, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		ctrl, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		sent := make(chan error, 1)
		go func() { sent <- checkHostOutput(ctrl, dg) }()
		go func() {
			var icresp bytes.Buffer
			w := NewWriter(&icresp)
			w.ICResp(&ICResp{PFV: PFV10, Digests: dg, MAXH2CDATA: fuzzMaxH2C})
			w.Flush()
			ctrl.Write(icresp.Bytes())
			ctrl.Write(stream)
			ctrl.(*net.TCPConn).CloseWrite() // the host reads the end; what it sends is still read
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		q, err := newHostQueue(ctx, host, "fuzz", QueueConfig{QID: 1, Entries: 8}, WithDigests(dg), WithHostStallTimeout(time.Second))
		if err != nil {
			host.Close()
			t.Fatalf("dial: %v", err)
		}
		read, _ := nvme.ReadCommand(1, 0, fuzzReadLen/4096, 0, nvme.NullSGL())
		write, _ := nvme.WriteCommand(1, 8, fuzzWriteLen/4096, 0, nvme.NullSGL())
		cmds := []struct {
			cmd  nvme.Command
			data []byte
		}{{read, make([]byte, fuzzReadLen)}, {write, bytes.Repeat([]byte{0x5a}, fuzzWriteLen)}, {nvme.FlushCommand(1), nil}}
		errs := make([]chan error, len(cmds))
		for i, c := range cmds {
			errs[i] = make(chan error, 1)
			go func() {
				_, err := q.Submit(context.Background(), c.cmd, c.data)
				errs[i] <- err
			}()
			// In flight (or done already) before the next: CIDs in order.
			for q.calls[i].Finished() && q.Err() == nil && len(errs[i]) == 0 {
				time.Sleep(10 * time.Microsecond)
			}
		}
		for _, e := range errs {
			select {
			case err := <-e:
				if err != nil && !errors.Is(err, nvme.ErrQueueFailed) && !isStatus(err) {
					t.Fatalf("submit: %v: neither a failed queue nor a status", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("a Submit still waits 10 s after the stream ended")
			}
		}
		q.Close()
		if err := <-sent; err != nil {
			t.Fatal(err)
		}
	})
}

// isStatus reports an error that is an NVMe status.
func isStatus(err error) bool {
	var se *nvme.StatusError
	var st nvme.Status
	return errors.As(err, &se) || errors.As(err, &st)
}

// checkHostOutput reads what the host sends as a controller would, until
// the host closes the connection, and reports the first PDU a controller
// could not accept.
func checkHostOutput(c net.Conn, dg Digests) error {
	defer c.Close()
	r := NewReader(c, RoleController)
	h, err := r.Next()
	if err != nil {
		return fmt.Errorf("the host's ICReq: %w", err)
	}
	var req ICReq
	if err := req.Unmarshal(h.Bytes()); err != nil || req.Check(h.Bytes()) != nil || req.Digests != dg {
		return fmt.Errorf("the host's ICReq %+v: %v", req, err)
	}
	r.Negotiated(dg, 0, Limits{InCapsuleData: FabricsInCapsuleData, MaxH2CData: fuzzMaxH2C})
	terminated := false
	for {
		h, err := r.Next()
		if err != nil {
			var pe *ProtocolError
			if errors.As(err, &pe) {
				return fmt.Errorf("the host sent an invalid PDU: %w", err)
			}
			io.Copy(io.Discard, c)
			return nil
		}
		if terminated {
			return fmt.Errorf("the host sent %s after its termination request", h.Type)
		}
		data := make([]byte, h.DataLen)
		if err := r.ReadData(data); err != nil {
			return fmt.Errorf("the host's %s: %w", h.Type, err)
		}
		switch h.Type {
		case TypeH2CTermReq:
			var t TermReq
			if err := t.Unmarshal(h.Bytes(), data); err != nil || t.FES < FESInvalidHeaderField || t.FES > FESUnsupportedParameter {
				return fmt.Errorf("the host's termination request %v: %v", &t, err)
			}
			terminated = true
		case TypeH2CData:
			var d DataHeader
			d.Unmarshal(h.Bytes())
			if d.CCCID != 1 || uint64(d.DATAO)+uint64(d.DATAL) > fuzzWriteLen || !bytes.Equal(data, bytes.Repeat([]byte{0x5a}, len(data))) {
				return fmt.Errorf("the host sent H2CData %+v (%d bytes) for its 16 KiB write", d, len(data))
			}
		case TypeCapsuleCmd:
		default:
			return fmt.Errorf("the host sent %s", h.Type)
		}
	}
}

// hostStreamSeeds are controller streams after the ICResp (mode: the
// digests): the commands answered properly in several ways, and the
// misbehaviour the host's tests cover.
func hostStreamSeeds() []readerSeed {
	pdus := func(dg Digests, add func(w *Writer)) []byte {
		var b bytes.Buffer
		w := NewWriter(&b)
		w.Negotiated(dg, 0)
		add(w)
		w.Flush()
		return b.Bytes()
	}
	read := make([]byte, fuzzReadLen)
	for i := range read {
		read[i] = byte(i)
	}
	answer := func(success bool, chunk int) func(w *Writer) {
		return func(w *Writer) {
			for off := 0; off < fuzzReadLen; off += chunk {
				last := off+chunk == fuzzReadLen
				w.C2HData(&DataHeader{CCCID: 0, DATAO: uint32(off), Last: last, Success: last && success}, read[off:off+chunk])
			}
			if !success {
				w.CapsuleResp(&nvme.Completion{CID: 0})
			}
			w.R2T(&R2T{CCCID: 1, TTAG: 7, R2TO: 0, R2TL: 8192})
			w.R2T(&R2T{CCCID: 1, TTAG: 8, R2TO: 8192, R2TL: 8192})
			w.CapsuleResp(&nvme.Completion{CID: 1})
			w.CapsuleResp(&nvme.Completion{CID: 2, Status: nvme.StatusInvalidField.WithDNR()})
		}
	}
	var seeds []readerSeed
	for _, dg := range []Digests{0, HeaderDigest | DataDigest} {
		seeds = append(seeds,
			readerSeed{pdus(dg, answer(false, fuzzReadLen)), uint8(dg)},
			readerSeed{pdus(dg, answer(true, 2048)), uint8(dg)},
		)
	}
	seeds = append(seeds,
		// C2HData for a CID not in flight; beyond the read; SUCCESS without LAST.
		readerSeed{pdus(0, func(w *Writer) { w.C2HData(&DataHeader{CCCID: 5, Last: true}, read[:512]) }), 0},
		readerSeed{pdus(0, func(w *Writer) { w.C2HData(&DataHeader{CCCID: 0, DATAO: 4096, Last: true}, read) }), 0},
		readerSeed{pdus(0, func(w *Writer) { w.C2HData(&DataHeader{CCCID: 0, Success: true}, read) }), 0},
		// R2T for the read, past the write, out of order.
		readerSeed{pdus(0, func(w *Writer) { w.R2T(&R2T{CCCID: 0, R2TL: 4096}) }), 0},
		readerSeed{pdus(0, func(w *Writer) { w.R2T(&R2T{CCCID: 1, R2TL: 1 << 20}) }), 0},
		readerSeed{pdus(0, func(w *Writer) { w.R2T(&R2T{CCCID: 1, R2TO: 4096, R2TL: 4096}) }), 0},
		// A termination request; a completion cut short; a PDU only a host sends.
		readerSeed{pdus(0, func(w *Writer) {
			w.TermReq(&TermReq{Type: TypeC2HTermReq, FES: FESPDUSequenceError, Data: read[:24]})
		}), 0},
		readerSeed{pdus(0, func(w *Writer) { w.CapsuleResp(&nvme.Completion{CID: 2}) })[:20], 0},
		readerSeed{pdus(0, func(w *Writer) { w.H2CData(&DataHeader{CCCID: 1, Last: true}, read[:64]) }), 0},
	)
	return seeds
}
