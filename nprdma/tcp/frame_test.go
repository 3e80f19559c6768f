package tcp

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"unsafe"

	"github.com/nprdma/nprdma/nprdma/link"
)

// samplePackets has one header of every data-path frame type.
func samplePackets() []link.Header {
	return []link.Header{
		{Kind: link.PacketSend, Seq: 1, Len: 5},
		{Kind: link.PacketSend, Seq: 2, Len: 3, HasImm: true, Imm: 0xdeadbeef},
		{Kind: link.PacketSend, Seq: 3, Len: 7, HasAck: true, Ack: 0xfffffffe},
		{Kind: link.PacketWrite, Seq: 3, Len: 4, RKey: 0x1234, Addr: 0x7f0000001000},
		{Kind: link.PacketWrite, Seq: 4, Len: 2, RKey: 7, Addr: 9, HasImm: true, Imm: 42, HasAck: true, Ack: 0},
		{Kind: link.PacketReadRequest, Seq: 5, Len: 4096, RKey: 0xabcdef, Addr: 0x1000},
		{Kind: link.PacketReadRequest, Seq: 6, Len: 8, RKey: 1, Addr: 0x2000, HasAck: true, Ack: 77},
		{Kind: link.PacketReadResponse, Seq: 5, Len: 6, Offset: 0},
		{Kind: link.PacketReadResponse, Seq: 5, Len: 4090, Offset: 6, Fill: true, Pattern: 0x0102030405060708, Last: true},
		{Kind: link.PacketAck, Seq: 4},
		{Kind: link.PacketNak, Seq: 6, Syndrome: link.NakRNR},
		{Kind: link.PacketNak, Seq: 6, Syndrome: link.NakRemoteOperation},
		{Kind: link.PacketDisconnect},
	}
}

func TestFrameRoundTrip(t *testing.T) {
	for _, want := range samplePackets() {
		b := appendHeader(nil, &want)
		if len(b) != headerLen(b[0]) {
			t.Fatalf("%s: encoded %d bytes, header length %d", want.Kind, len(b), headerLen(b[0]))
		}
		var got link.Header
		n, err := parseHeader(b, &got)
		if err != nil || n != len(b) {
			t.Fatalf("%s: parse: n=%d err=%v", want.Kind, n, err)
		}
		if got != want {
			t.Fatalf("round trip of %+v gave %+v", want, got)
		}
		for k := 0; k < len(b); k++ {
			if _, err := parseHeader(b[:k], &got); !errors.Is(err, errShort) {
				t.Fatalf("%s cut to %d bytes: %v, want errShort", want.Kind, k, err)
			}
		}
	}
}

func TestFrameRefusesLies(t *testing.T) {
	huge := link.Header{Kind: link.PacketSend, Seq: 1, Len: 0xffffffff}
	b := appendHeader(nil, &huge)
	var h link.Header
	if _, err := parseHeader(b, &h); !errors.Is(err, errFrame) {
		t.Fatalf("SEND claiming 4 GiB: %v, want a malformed-frame error", err)
	}
	seg := link.Header{Kind: link.PacketReadResponse, Len: 16, Offset: link.MaxMessageSize - 8}
	if _, err := parseHeader(appendHeader(nil, &seg), &h); !errors.Is(err, errFrame) {
		t.Fatalf("READ response segment beyond the limit: %v", err)
	}
	cases := map[string][]byte{
		"unknown type":     {99, 0, 0, 0, 0, 0, 0, 0},
		"cm type":          {frameConnect, 0, 0, 0, 0, 0, 0, 0},
		"bad flags":        {frameAck, flagImm, 0, 0, 0, 0, 0, 0},
		"reserved bits":    {frameAck, 0, 1, 0, 0, 0, 0, 0},
		"bad syndrome":     {frameNak, 0, 9, 0, 0, 0, 0, 0},
		"syndrome high":    {frameNak, 0, 1, 1, 0, 0, 0, 0},
		"last on a SEND":   append([]byte{frameSend, flagLast}, make([]byte, 18)...),
		"imm on READ resp": append([]byte{frameReadResp, flagImm}, make([]byte, 14)...),
		"ack on READ resp": append([]byte{frameReadResp, flagAck}, make([]byte, 14)...),
		"ack on an ACK":    {frameAck, flagAck, 0, 0, 0, 0, 0, 0},
		"ack without flag": append(append([]byte{frameReadReq}, make([]byte, 23)...), 1, 0, 0, 0),
	}
	for name, b := range cases {
		if _, err := parseHeader(b, &h); !errors.Is(err, errFrame) {
			t.Fatalf("%s: %v, want a malformed-frame error", name, err)
		}
	}
}

func TestHandshakeFrames(t *testing.T) {
	for _, f := range []cmFrame{
		{typ: frameConnect, qpn: 7, privateData: []byte("hello")},
		{typ: frameAccept, qpn: 9, privateData: []byte{}},
		{typ: frameReject, privateData: bytes.Repeat([]byte{1}, link.MaxPrivateData)},
	} {
		b := appendCM(nil, f)
		got, n, err := parseCM(b, frameConnect, frameAccept, frameReject)
		if err != nil || n != len(b) || got.typ != f.typ || got.qpn != f.qpn || !bytes.Equal(got.privateData, f.privateData) {
			t.Fatalf("round trip of %+v: %+v n=%d err=%v", f, got, n, err)
		}
		if _, _, err := parseCM(b[:len(b)-1], f.typ); !errors.Is(err, errShort) && len(f.privateData) > 0 {
			t.Fatalf("cut frame: %v", err)
		}
	}
	tooMuch := appendCM(nil, cmFrame{typ: frameReject, privateData: make([]byte, link.MaxPrivateData+1)})
	if _, _, err := parseCM(tooMuch[:12], frameReject); !errors.Is(err, errFrame) {
		t.Fatalf("oversized private data refused only after reading it: %v", err)
	}
	wrongMagic := appendCM(nil, cmFrame{typ: frameConnect})
	wrongMagic[8] ^= 1
	if _, _, err := parseCM(wrongMagic, frameConnect); !errors.Is(err, errFrame) {
		t.Fatalf("wrong magic: %v", err)
	}
	if _, _, err := parseCM(appendCM(nil, cmFrame{typ: frameAccept}), frameConnect); !errors.Is(err, errFrame) {
		t.Fatalf("unexpected frame type accepted: %v", err)
	}
}

func TestPadFrames(t *testing.T) {
	for pos := 0; pos < 2*alignTo; pos++ {
		for _, want := range []int{0, 16, 63} {
			k := padFor(pos, want)
			if k != 0 && (k < prefixLen || k > maxPad) {
				t.Fatalf("padFor(%d, %d) = %d, outside [%d, %d]", pos, want, k, prefixLen, maxPad)
			}
			if (pos+k-want)%alignTo != 0 {
				t.Fatalf("padFor(%d, %d) = %d does not reach the alignment", pos, want, k)
			}
			if k == 0 {
				continue
			}
			b := appendPad(nil, k)
			if len(b) != k {
				t.Fatalf("PAD of %d bytes encoded as %d", k, len(b))
			}
			n, err := parsePad(b)
			if err != nil || prefixLen+n != k {
				t.Fatalf("PAD of %d bytes parsed as %d more, %v", k, n, err)
			}
			var h link.Header
			if _, err := parseHeader(b, &h); !errors.Is(err, errFrame) {
				t.Fatalf("PAD accepted as a packet: %v", err)
			}
		}
	}
	for name, b := range map[string][]byte{
		"too long": {framePad, 0, 0, 0, maxPad - prefixLen + 1, 0, 0, 0},
		"flags":    {framePad, flagLast, 0, 0, 0, 0, 0, 0},
		"reserved": {framePad, 0, 0, 1, 0, 0, 0, 0},
	} {
		if _, err := parsePad(b); !errors.Is(err, errFrame) {
			t.Fatalf("%s: %v, want a malformed-frame error", name, err)
		}
	}
	if _, err := parsePad([]byte{framePad, 0, 0}); !errors.Is(err, errShort) {
		t.Fatalf("cut PAD: %v", err)
	}
}

// The writer pads a batch so that a large payload starts at its source's
// alignment and the batch ends on a multiple of alignTo; the reader skips
// the padding and delivers the same packets.
func TestBatchPadding(t *testing.T) {
	mem := make([]byte, 3*alignTo+8192)
	for i := range mem {
		mem[i] = byte(i)
	}
	l := &tcpLink{pend: new(wbatch)}
	small := link.Packet{Header: link.Header{Kind: link.PacketSend, Seq: 1, Len: 10}, Data: [][]byte{mem[:10]}}
	src := mem[alignTo+5 : alignTo+5+4096] // source at 5 mod 64
	large := link.Packet{Header: link.Header{Kind: link.PacketWrite, Seq: 2, Len: 4096, RKey: 1, Addr: 0x1000}, Data: [][]byte{src}}
	l.Send([]link.Packet{small, large})
	b := l.pend
	b.pad(0)
	var stream []byte
	for _, s := range b.segs {
		if s.data != nil {
			if &s.data[0] == &src[0] && (len(stream)-int(uintptr(unsafe.Pointer(&src[0]))))%alignTo != 0 {
				t.Fatalf("payload at stream offset %d, source at %#x: not aligned alike", len(stream), uintptr(unsafe.Pointer(&src[0])))
			}
			stream = append(stream, s.data...)
		} else {
			stream = append(stream, b.hdr[s.off:s.off+s.n]...)
		}
	}
	if len(stream) != b.size || b.size%alignTo != 0 {
		t.Fatalf("batch of %d bytes (size %d), want a multiple of %d", len(stream), b.size, alignTo)
	}
	// Read back through the real reader: the two packets, nothing else.
	var got []link.Header
	var payloads [][]byte
	rx := &recordingReceiver{deliver: func(h *link.Header, p link.Payload) error {
		buf := make([]byte, h.PayloadLen())
		if err := p.Read(buf); err != nil {
			return err
		}
		got, payloads = append(got, *h), append(payloads, buf)
		return nil
	}}
	rl := &tcpLink{prov: New(), rd: newReader(bytes.NewReader(stream), 4096), rx: rx, abortCh: make(chan struct{})}
	if err := rl.readFrames(); err != io.EOF {
		t.Fatalf("reading the batch: %v", err)
	}
	if len(got) != 2 || got[0] != small.Header || got[1] != large.Header || !bytes.Equal(payloads[0], mem[:10]) || !bytes.Equal(payloads[1], src) {
		t.Fatalf("read back %+v", got)
	}
}

type recordingReceiver struct {
	deliver func(*link.Header, link.Payload) error
}

func (r *recordingReceiver) Deliver(h *link.Header, p link.Payload) error { return r.deliver(h, p) }
func (r *recordingReceiver) Idle()                                        {}
func (r *recordingReceiver) LinkDown(error)                               {}
