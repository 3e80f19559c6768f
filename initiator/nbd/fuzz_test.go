package nbd

import (
	"bytes"
	"encoding/binary"
	"io"
	"sync"
	"testing"

	"github.com/nprdma/nprdma/initiator/blockio"
)

// stream is a client's byte stream fed to a server connection.
type stream struct {
	io.Reader
	io.Writer
}

type nopCloser struct{}

func (nopCloser) Close() error { return nil }

var (
	fuzzOnce   sync.Once
	fuzzServer *Server
)

// newFuzzServer serves a small export with a small maximum payload, so that
// no input makes the server allocate much.
func newFuzzServer(t testing.TB) *Server {
	fuzzOnce.Do(func() {
		srv, err := NewServer(blockio.NewMemory(1<<20, testBlock), WithMaxPayload(64<<10), WithExportName("disk"))
		if err != nil {
			t.Fatal(err)
		}
		fuzzServer = srv
	})
	return fuzzServer
}

func requestBytes(reqs ...any) []byte {
	var b []byte
	for _, r := range reqs {
		switch v := r.(type) {
		case Request:
			b = AppendRequest(b, v)
		case []byte:
			b = append(b, v...)
		}
	}
	return b
}

// FuzzRequest decodes request headers and runs whole request streams
// through the transmission phase against a memory backend.
func FuzzRequest(f *testing.F) {
	f.Add(requestBytes(Request{Type: CmdRead, Cookie: 1, Length: 4096}))
	f.Add(requestBytes(Request{Type: CmdWrite, Cookie: 2, Offset: 100, Length: 8}, []byte("abcdefgh"),
		Request{Type: CmdRead, Cookie: 3, Offset: 96, Length: 16}, Request{Type: CmdDisc}))
	f.Add(requestBytes(Request{Type: CmdFlush}, Request{Type: CmdTrim, Flags: CmdFlagFUA, Length: 8192},
		Request{Type: CmdWriteZeroes, Flags: CmdFlagNoHole, Offset: 1, Length: 10}))
	f.Add(requestBytes(Request{Type: CmdWrite, Length: 1 << 30}, []byte("short")))
	f.Add(requestBytes(Request{Type: CmdRead, Offset: 1<<64 - 1, Length: 2}))
	f.Add([]byte{0x25, 0x60, 0x95, 0x14, 0, 0})
	srv := newFuzzServer(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := DecodeRequest(data)
		if err == nil && !bytes.Equal(AppendRequest(nil, req), data[:requestSize]) {
			t.Fatalf("request %+v does not re-encode to its input", req)
		}
		if err != nil && len(data) >= requestSize && binary.BigEndian.Uint32(data) == magicRequest {
			t.Fatalf("valid header refused: %v", err)
		}
		c := srv.newConn(nil, stream{bytes.NewReader(data), io.Discard}, nopCloser{})
		c.structured = len(data)%2 == 1
		c.flags = srv.TransmissionFlags(c.structured)
		c.transmit() // must return (input exhausted) without panicking
	})
}

// FuzzOptions decodes option headers and INFO/GO data and runs whole client
// handshakes against the server, checking the replies stay well-formed.
func FuzzOptions(f *testing.F) {
	flags := binary.BigEndian.AppendUint32(nil, flagCFixedNewstyle|flagCNoZeroes)
	opt := func(b []byte, o uint32, data []byte) []byte { return appendOption(b, o, data) }
	goDefault := opt(bytes.Clone(flags), OptGo, appendInfoRequest(nil, infoRequest{Infos: []uint16{InfoBlockSize}}))
	f.Add(goDefault)
	f.Add(opt(opt(opt(opt(bytes.Clone(flags), OptStructuredReply, nil), OptList, nil),
		OptInfo, appendInfoRequest(nil, infoRequest{Name: "x", Infos: []uint16{InfoName, InfoDescription}})), OptAbort, nil))
	f.Add(opt(bytes.Clone(flags), OptExportName, []byte("disk")))
	f.Add(opt(binary.BigEndian.AppendUint32(nil, flagCFixedNewstyle), OptExportName, nil))
	f.Add(opt(bytes.Clone(flags), OptInfo, []byte{0, 0, 0, 200, 1, 2}))
	f.Add(binary.BigEndian.AppendUint32(nil, 0x80))
	srv := newFuzzServer(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		if h, err := decodeOptionHeader(data); err == nil {
			if enc := appendOption(nil, h.Option, nil); !bytes.Equal(enc[:12], data[:12]) ||
				binary.BigEndian.Uint32(data[12:]) != h.Length {
				t.Fatalf("option header %+v does not re-encode to its input", h)
			}
		}
		if ir, err := decodeInfoRequest(data); err == nil && !bytes.Equal(appendInfoRequest(nil, ir), data) {
			t.Fatalf("info request %+v does not re-encode to its input", ir)
		}

		var out bytes.Buffer
		c := srv.newConn(nil, stream{bytes.NewReader(data), &out}, nopCloser{})
		entered := c.negotiate() == nil
		checkHandshakeOutput(t, out.Bytes(), entered, c.noZeroes)
	})
}

// checkHandshakeOutput parses what the server sent: the greeting, option
// replies, and (only if transmission began through NBD_OPT_EXPORT_NAME) the
// export reply.
func checkHandshakeOutput(t *testing.T, out []byte, entered, noZeroes bool) {
	if len(out) < 18 || binary.BigEndian.Uint64(out) != magicInit {
		t.Fatalf("no greeting in %x", out)
	}
	out = out[18:]
	for len(out) >= optionReplyHeaderSize && binary.BigEndian.Uint64(out) == magicOptionReply {
		n := binary.BigEndian.Uint32(out[16:])
		if typ := binary.BigEndian.Uint32(out[12:]); typ == RepInfo && n < 2 {
			t.Fatalf("NBD_REP_INFO of %d bytes", n)
		}
		if uint64(len(out)) < optionReplyHeaderSize+uint64(n) {
			t.Fatalf("option reply claims %d bytes, %d follow", n, len(out)-optionReplyHeaderSize)
		}
		out = out[optionReplyHeaderSize+n:]
	}
	want := 0
	if entered && len(out) > 0 {
		want = exportNameReplySize
		if !noZeroes {
			want += exportNameZeroPadding
		}
	}
	if len(out) != want {
		t.Fatalf("%d unexplained bytes after the option replies (entered transmission: %v)", len(out), entered)
	}
}

// FuzzSimpleReply decodes simple reply headers: a header that decodes
// re-encodes to its input, and one with the right magic always decodes.
func FuzzSimpleReply(f *testing.F) {
	f.Add(appendSimpleReply(nil, 0, 1))
	f.Add(appendSimpleReply(nil, EIO, 0x6e7072646d61))
	f.Add(appendChunkHeader(nil, ReplyFlagDone, ReplyTypeNone, 1, 0))
	f.Add([]byte{0x67, 0x44, 0x66, 0x98, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		errno, cookie, err := DecodeSimpleReply(data)
		if err == nil && !bytes.Equal(appendSimpleReply(nil, errno, cookie), data[:simpleReplySize]) {
			t.Fatalf("reply (%d, %#x) does not re-encode to its input", errno, cookie)
		}
		if err != nil && len(data) >= simpleReplySize && binary.BigEndian.Uint32(data) == magicSimpleReply {
			t.Fatalf("valid header refused: %v", err)
		}
	})
}
