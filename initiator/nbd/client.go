package nbd

import (
	"encoding/binary"
	"fmt"
	"io"
)

// The smallest client side of the transmission phase, for a connection that
// Handshake left without structured replies: one request at a time, simple
// replies. It is what a program needs to time or check a server with a
// read (the bench polls servers with it); the kernel's NBD client and
// fio's nbd engine are the clients that carry data.

// DecodeSimpleReply parses a simple reply header from the first 16 bytes
// of b: the server's error (0 for success, else an NBD error value; see
// ErrorName) and the request's cookie.
func DecodeSimpleReply(b []byte) (errno uint32, cookie uint64, err error) {
	if len(b) < simpleReplySize {
		return 0, 0, fmt.Errorf("nbd: reply header of %d bytes, want %d", len(b), simpleReplySize)
	}
	if m := binary.BigEndian.Uint32(b); m != magicSimpleReply {
		return 0, 0, fmt.Errorf("%w: simple reply magic %#08x", ErrBadMagic, m)
	}
	return binary.BigEndian.Uint32(b[4:]), binary.BigEndian.Uint64(b[8:]), nil
}

// ReadAt reads len(p) bytes at off of the export on rw with one
// NBD_CMD_READ and waits for its simple reply. A server error is returned
// with its name; the connection stays usable after it.
func ReadAt(rw io.ReadWriter, p []byte, off uint64) error {
	const cookie = 0x6e7072646d61 // "nprdma"
	if _, err := rw.Write(AppendRequest(nil, Request{Type: CmdRead, Cookie: cookie, Offset: off, Length: uint32(len(p))})); err != nil {
		return fmt.Errorf("nbd: send read: %w", err)
	}
	var h [simpleReplySize]byte
	if _, err := io.ReadFull(rw, h[:]); err != nil {
		return fmt.Errorf("nbd: read reply: %w", err)
	}
	errno, got, err := DecodeSimpleReply(h[:])
	switch {
	case err != nil:
		return err
	case got != cookie:
		return fmt.Errorf("nbd: reply for cookie %#x, sent %#x", got, cookie)
	case errno != 0:
		return fmt.Errorf("nbd: read [%d, +%d): server error %s", off, len(p), ErrorName(errno))
	}
	if _, err := io.ReadFull(rw, p); err != nil {
		return fmt.Errorf("nbd: read data: %w", err)
	}
	return nil
}

// Disconnect sends NBD_CMD_DISC, the polite end of a connection (a server
// then logs no broken connection); the caller closes it.
func Disconnect(w io.Writer) error {
	_, err := w.Write(AppendRequest(nil, Request{Type: CmdDisc}))
	return err
}
