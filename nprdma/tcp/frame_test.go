package tcp

import (
	"bytes"
	"errors"
	"testing"

	"github.com/nprdma/nprdma/nprdma"
)

// samplePackets has one header of every data-path frame type.
func samplePackets() []nprdma.Header {
	return []nprdma.Header{
		{Kind: nprdma.PacketSend, Seq: 1, Len: 5},
		{Kind: nprdma.PacketSend, Seq: 2, Len: 3, HasImm: true, Imm: 0xdeadbeef},
		{Kind: nprdma.PacketWrite, Seq: 3, Len: 4, RKey: 0x1234, Addr: 0x7f0000001000},
		{Kind: nprdma.PacketWrite, Seq: 4, Len: 2, RKey: 7, Addr: 9, HasImm: true, Imm: 42},
		{Kind: nprdma.PacketReadRequest, Seq: 5, Len: 4096, RKey: 0xabcdef, Addr: 0x1000},
		{Kind: nprdma.PacketReadResponse, Seq: 5, Len: 6, Offset: 0},
		{Kind: nprdma.PacketReadResponse, Seq: 5, Len: 4090, Offset: 6, Fill: true, Pattern: 0x0102030405060708, Last: true},
		{Kind: nprdma.PacketAck, Seq: 4},
		{Kind: nprdma.PacketNak, Seq: 6, Syndrome: nprdma.NakRNR},
		{Kind: nprdma.PacketNak, Seq: 6, Syndrome: nprdma.NakRemoteOperation},
		{Kind: nprdma.PacketDisconnect},
	}
}

func TestFrameRoundTrip(t *testing.T) {
	for _, want := range samplePackets() {
		b := appendHeader(nil, &want)
		if len(b) != headerLen(b[0]) {
			t.Fatalf("%s: encoded %d bytes, header length %d", want.Kind, len(b), headerLen(b[0]))
		}
		var got nprdma.Header
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
	huge := nprdma.Header{Kind: nprdma.PacketSend, Seq: 1, Len: 0xffffffff}
	b := appendHeader(nil, &huge)
	var h nprdma.Header
	if _, err := parseHeader(b, &h); !errors.Is(err, errFrame) {
		t.Fatalf("SEND claiming 4 GiB: %v, want a malformed-frame error", err)
	}
	seg := nprdma.Header{Kind: nprdma.PacketReadResponse, Len: 16, Offset: nprdma.MaxMessageSize - 8}
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
		"last on a SEND":   append([]byte{frameSend, flagLast}, make([]byte, 14)...),
		"imm on READ resp": append([]byte{frameReadResp, flagImm}, make([]byte, 14)...),
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
		{typ: frameReject, privateData: bytes.Repeat([]byte{1}, nprdma.MaxPrivateData)},
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
	tooMuch := appendCM(nil, cmFrame{typ: frameReject, privateData: make([]byte, nprdma.MaxPrivateData+1)})
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
