package nbd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/initiator/blockio"
	"github.com/nprdma/nprdma/internal/leaktest"
	"golang.org/x/sys/unix"
)

// socketPair returns both ends of a unix socket pair as connections: what
// the kernel NBD frontend hands the kernel one end of.
func socketPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	return conns[0], conns[1]
}

// Handshake against the server over a socket pair leaves the connection in
// the transmission phase, with nothing of it read ahead: simple replies to
// requests sent right after it, as the kernel sends them.
func TestHandshakeThenServeConn(t *testing.T) {
	before := runtime.NumGoroutine()
	mem := blockio.NewMemory(1<<20, 4096)
	srv, err := NewServer(mem, WithExportName("disk"), WithMultiConn(true))
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := socketPair(t)
	served := make(chan error, 1)
	go func() { served <- srv.ServeConn(context.Background(), ours) }()

	ex, err := Handshake(theirs, "disk")
	if err != nil {
		t.Fatal(err)
	}
	if ex.Size != 1<<20 || ex.Flags != srv.TransmissionFlags(false) || ex.PreferredBlock != 4096 || ex.MinBlock != 1 {
		t.Fatalf("export %+v; flags want %#x", ex, srv.TransmissionFlags(false))
	}
	c := &testClient{t: t, conn: theirs, r: bufio.NewReader(theirs), pending: map[uint64]Request{}}
	data := bytes.Repeat([]byte{0x5a}, 4096)
	if rep := c.do(Request{Type: CmdWrite, Flags: CmdFlagFUA, Offset: 8192, Length: 4096}, data); rep.errno != 0 {
		t.Fatalf("write: errno %d", rep.errno)
	}
	if rep := c.do(Request{Type: CmdRead, Offset: 8192, Length: 4096}, nil); rep.errno != 0 || !bytes.Equal(rep.data, data) {
		t.Fatalf("read: errno %d, equal %v", rep.errno, bytes.Equal(rep.data, data))
	}
	if mem.Stats().FUAWrites != 1 {
		t.Fatalf("backend %+v", mem.Stats())
	}
	c.disconnect()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("ServeConn after NBD_CMD_DISC: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeConn did not return after NBD_CMD_DISC")
	}
	theirs.Close()

	// Close ends a connection being served, and ServeConn after Close
	// refuses.
	ours, theirs = socketPair(t)
	go func() { served <- srv.ServeConn(context.Background(), ours) }()
	if _, err := Handshake(theirs, "disk"); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	if err := <-served; err != nil {
		t.Fatalf("ServeConn cut by Close: %v", err)
	}
	if _, err := io.ReadFull(theirs, make([]byte, 1)); err == nil {
		t.Fatal("the connection is still open after Close")
	}
	theirs.Close()
	ours, theirs = socketPair(t)
	defer theirs.Close()
	if err := srv.ServeConn(context.Background(), ours); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("ServeConn after Close: %v", err)
	}
	leaktest.WaitGoroutines(t, before, 5*time.Second)
}

func TestHandshakeErrors(t *testing.T) {
	srv, err := NewServer(blockio.NewMemory(1<<20, 4096), WithExportName("disk"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ours, theirs := socketPair(t)
	defer theirs.Close()
	go srv.ServeConn(context.Background(), ours)
	if _, err := Handshake(theirs, "other"); err == nil || !strings.Contains(err.Error(), `export "other" refused`) {
		t.Fatalf("unknown export: %v", err)
	}
	for name, server := range map[string][]byte{
		"bad magic":      bytes.Repeat([]byte{1}, 18),
		"old style":      append(binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, magicInit), magicOption), 0, 0),
		"cut greeting":   binary.BigEndian.AppendUint64(nil, magicInit),
		"ack, no export": append(greetingBytes(), optionReplyBytes(RepAck, nil)...),
	} {
		if _, err := Handshake(scripted(server), "disk"); err == nil {
			t.Errorf("%s: handshake succeeded", name)
		}
	}
}

func greetingBytes() []byte {
	b := binary.BigEndian.AppendUint64(nil, magicInit)
	b = binary.BigEndian.AppendUint64(b, magicOption)
	return binary.BigEndian.AppendUint16(b, flagFixedNewstyle|flagNoZeroes)
}

func optionReplyBytes(typ uint32, data []byte) []byte {
	b := binary.BigEndian.AppendUint64(nil, magicOptionReply)
	b = binary.BigEndian.AppendUint32(b, OptGo)
	b = binary.BigEndian.AppendUint32(b, typ)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

// scripted is a server that sends its bytes and swallows what it is sent.
func scripted(server []byte) io.ReadWriter {
	return struct {
		io.Reader
		io.Writer
	}{bytes.NewReader(server), io.Discard}
}

// FuzzHandshake feeds the client's handshake arbitrary server bytes: it
// never panics, and what it accepts is a complete export description.
func FuzzHandshake(f *testing.F) {
	info := binary.BigEndian.AppendUint16(nil, InfoExport)
	info = binary.BigEndian.AppendUint64(info, 1<<30)
	info = binary.BigEndian.AppendUint16(info, FlagHasFlags|FlagSendFlush)
	bs := binary.BigEndian.AppendUint16(nil, InfoBlockSize)
	bs = binary.BigEndian.AppendUint32(bs, 1)
	bs = binary.BigEndian.AppendUint32(bs, 4096)
	bs = binary.BigEndian.AppendUint32(bs, 32<<20)
	good := append(greetingBytes(), optionReplyBytes(RepInfo, info)...)
	good = append(good, optionReplyBytes(RepInfo, bs)...)
	f.Add(append(good, optionReplyBytes(RepAck, nil)...))
	f.Add(append(greetingBytes(), optionReplyBytes(RepErrUnknown, []byte("no such export"))...))
	f.Add(append(greetingBytes(), optionReplyBytes(RepInfo, info[:5])...))
	f.Fuzz(func(t *testing.T, server []byte) {
		ex, err := Handshake(scripted(server), "disk")
		// An accepted handshake had an NBD_INFO_EXPORT: a reply of type
		// NBD_REP_INFO (3), 12 bytes, information type 0.
		if err == nil && !bytes.Contains(server, []byte{0, 0, 0, 3, 0, 0, 0, 12, 0, 0}) {
			t.Fatalf("accepted without NBD_INFO_EXPORT: %+v", ex)
		}
	})
}
