package nbd_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/nprdma/nprdma/initiator/blockio"
	"github.com/nprdma/nprdma/initiator/nbd"
)

// A server exports a backend on a unix socket, and a client reads it: the
// handshake (NBD_OPT_GO), then one NBD_CMD_READ and its simple reply.
// nprdma-initiator attach --mode nbd serves an initiator.Namespace the same
// way; an in-memory backend stands in for it here. fio's nbd engine,
// nbdinfo, nbdcopy and qemu are the usual clients.
func Example() {
	dir, err := os.MkdirTemp("", "nbd-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	// A 1 MiB backend whose block 5 holds a greeting.
	backend := blockio.NewMemory(1<<20, 4096)
	block := make([]byte, 4096)
	copy(block, "hello over NBD")
	if _, err := backend.WriteAt(block, 5*4096); err != nil {
		panic(err)
	}

	srv, err := nbd.NewServer(backend, nbd.WithExportName("ns1"))
	if err != nil {
		panic(err)
	}
	ln, err := nbd.ListenUnix(filepath.Join(dir, "ns1.sock"))
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	fmt.Println(strings.Replace(nbd.URI(ln.Addr(), "ns1"), dir, "DIR", 1))

	// The client.
	conn, err := net.Dial("unix", filepath.Join(dir, "ns1.sock"))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	export, err := nbd.Handshake(conn, "ns1")
	if err != nil {
		panic(err)
	}
	fmt.Printf("export of %d KiB, flush %v, read-only %v\n", export.Size>>10,
		export.Flags&nbd.FlagSendFlush != 0, export.Flags&nbd.FlagReadOnly != 0)
	req := nbd.AppendRequest(nil, nbd.Request{Type: nbd.CmdRead, Cookie: 1, Offset: 5 * 4096, Length: 4096})
	if _, err := conn.Write(req); err != nil {
		panic(err)
	}
	// A simple reply: magic, error, cookie, then the data.
	var reply [16]byte
	if _, err := io.ReadFull(conn, reply[:]); err != nil {
		panic(err)
	}
	data := make([]byte, 4096)
	if _, err := io.ReadFull(conn, data); err != nil {
		panic(err)
	}
	fmt.Printf("reply: magic %#x, error %d, cookie %d\n", binary.BigEndian.Uint32(reply[0:]),
		binary.BigEndian.Uint32(reply[4:]), binary.BigEndian.Uint64(reply[8:]))
	fmt.Printf("%q\n", bytes.TrimRight(data, "\x00"))

	// Close ends the connections and Serve returns.
	if err := srv.Close(); err != nil {
		panic(err)
	}
	fmt.Println("served:", <-served)
	// Output:
	// nbd+unix:///ns1?socket=DIR/ns1.sock
	// export of 1024 KiB, flush true, read-only false
	// reply: magic 0x67446698, error 0, cookie 1
	// "hello over NBD"
	// served: <nil>
}
