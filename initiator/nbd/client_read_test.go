package nbd

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/initiator/blockio"
)

// TestReadAtAndDisconnect: after Handshake, ReadAt returns the export's
// bytes, a read beyond the end comes back as the server's error on a
// connection that stays usable, and Disconnect ends the server's side.
func TestReadAtAndDisconnect(t *testing.T) {
	mem := blockio.NewMemory(1<<20, 4096)
	want := bytes.Repeat([]byte("nprdma!!"), 512)
	if _, err := mem.WriteAt(want, 3*4096); err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(mem)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := socketPair(t)
	served := make(chan error, 1)
	go func() { served <- srv.ServeConn(context.Background(), ours) }()
	if _, err := Handshake(theirs, ""); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	if err := ReadAt(theirs, got, 3*4096); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("ReadAt: %v, data equal %v", err, bytes.Equal(got, want))
	}
	if err := ReadAt(theirs, got, 1<<20); err == nil || !strings.Contains(err.Error(), "server error") {
		t.Fatalf("read beyond the end: %v, want the server's error", err)
	}
	if err := ReadAt(theirs, got[:8], 3*4096); err != nil || string(got[:8]) != "nprdma!!" {
		t.Fatalf("read after an error: %v %q", err, got[:8])
	}
	if err := Disconnect(theirs); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("ServeConn after Disconnect: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeConn did not return after Disconnect")
	}
}

// TestDecodeSimpleReply: a header decodes to its error and cookie; a wrong
// magic or a short header is refused.
func TestDecodeSimpleReply(t *testing.T) {
	errno, cookie, err := DecodeSimpleReply(appendSimpleReply(nil, EIO, 42))
	if err != nil || errno != EIO || cookie != 42 {
		t.Fatalf("got %d %d %v", errno, cookie, err)
	}
	if _, _, err := DecodeSimpleReply(appendChunkHeader(nil, ReplyFlagDone, ReplyTypeNone, 1, 0)); err == nil {
		t.Fatal("a structured chunk decoded as a simple reply")
	}
	if _, _, err := DecodeSimpleReply(appendSimpleReply(nil, 0, 1)[:15]); err == nil {
		t.Fatal("a short header decoded")
	}
}
