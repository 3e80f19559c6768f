package e2ebench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/nprdma/nprdma/initiator/nbd"
)

// A minimal NBD client, just enough for the startup experiment to time
// nbdkit's first served read the way it times the target's: connect, fixed
// newstyle handshake with NBD_OPT_EXPORT_NAME (no option replies to parse),
// one READ with a simple reply. Spawning nbdinfo or fio per poll would add
// their own start-up to the figure.

const (
	nbdMagic         = 0x4e42444d41474943 // "NBDMAGIC"
	nbdOptMagic      = 0x49484156454f5054 // "IHAVEOPT"
	nbdSimpleReply   = 0x67446698
	nbdFlagFixed     = 1 << 0 // handshake: fixed newstyle
	nbdFlagNoZeroes  = 1 << 1 // handshake: no 124 zero bytes after EXPORT_NAME
	nbdGreetingSize  = 18
	nbdExportInfo    = 10 // size + transmission flags
	nbdExportPadding = 124
	nbdReplySize     = 16
)

var errNBDProtocol = errors.New("nbd: protocol error")

// parseNBDGreeting decodes the server's first 18 bytes and returns its
// handshake flags; it requires fixed newstyle.
func parseNBDGreeting(b []byte) (uint16, error) {
	if len(b) < nbdGreetingSize {
		return 0, fmt.Errorf("%w: greeting of %d bytes, want %d", errNBDProtocol, len(b), nbdGreetingSize)
	}
	if m := binary.BigEndian.Uint64(b); m != nbdMagic {
		return 0, fmt.Errorf("%w: greeting magic %#x", errNBDProtocol, m)
	}
	if m := binary.BigEndian.Uint64(b[8:]); m != nbdOptMagic {
		return 0, fmt.Errorf("%w: not a newstyle server (magic %#x)", errNBDProtocol, m)
	}
	flags := binary.BigEndian.Uint16(b[16:])
	if flags&nbdFlagFixed == 0 {
		return 0, fmt.Errorf("%w: server is not fixed newstyle (flags %#x)", errNBDProtocol, flags)
	}
	return flags, nil
}

// parseNBDExport decodes the answer to NBD_OPT_EXPORT_NAME: the export's
// size and transmission flags.
func parseNBDExport(b []byte) (size uint64, flags uint16, err error) {
	if len(b) < nbdExportInfo {
		return 0, 0, fmt.Errorf("%w: export info of %d bytes, want %d", errNBDProtocol, len(b), nbdExportInfo)
	}
	size, flags = binary.BigEndian.Uint64(b), binary.BigEndian.Uint16(b[8:])
	if flags&nbd.FlagHasFlags == 0 {
		return 0, 0, fmt.Errorf("%w: transmission flags %#x lack HAS_FLAGS", errNBDProtocol, flags)
	}
	return size, flags, nil
}

// parseNBDReply decodes a simple reply header: the error and the cookie.
func parseNBDReply(b []byte) (errno uint32, cookie uint64, err error) {
	if len(b) < nbdReplySize {
		return 0, 0, fmt.Errorf("%w: reply of %d bytes, want %d", errNBDProtocol, len(b), nbdReplySize)
	}
	if m := binary.BigEndian.Uint32(b); m != nbdSimpleReply {
		return 0, 0, fmt.Errorf("%w: reply magic %#x (structured replies are not negotiated)", errNBDProtocol, m)
	}
	return binary.BigEndian.Uint32(b[4:]), binary.BigEndian.Uint64(b[8:]), nil
}

// nbdRead connects to an NBD server at network/addr and reads len(p) bytes
// at off from its default export.
func nbdRead(ctx context.Context, network, addr string, p []byte, off uint64) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	} else {
		conn.SetDeadline(time.Now().Add(10 * time.Second))
	}
	var hs [nbdGreetingSize]byte
	if _, err := io.ReadFull(conn, hs[:]); err != nil {
		return fmt.Errorf("nbd %s: greeting: %w", addr, err)
	}
	sflags, err := parseNBDGreeting(hs[:])
	if err != nil {
		return fmt.Errorf("nbd %s: %w", addr, err)
	}
	cflags := uint32(nbdFlagFixed)
	noZeroes := sflags&nbdFlagNoZeroes != 0
	if noZeroes {
		cflags |= nbdFlagNoZeroes
	}
	msg := binary.BigEndian.AppendUint32(nil, cflags)
	msg = binary.BigEndian.AppendUint64(msg, nbdOptMagic)
	msg = binary.BigEndian.AppendUint32(msg, nbd.OptExportName)
	msg = binary.BigEndian.AppendUint32(msg, 0) // the default export ""
	if _, err := conn.Write(msg); err != nil {
		return fmt.Errorf("nbd %s: export name: %w", addr, err)
	}
	info := make([]byte, nbdExportInfo, nbdExportInfo+nbdExportPadding)
	if !noZeroes {
		info = info[:cap(info)]
	}
	if _, err := io.ReadFull(conn, info); err != nil {
		return fmt.Errorf("nbd %s: export info: %w", addr, err)
	}
	size, _, err := parseNBDExport(info)
	if err != nil {
		return fmt.Errorf("nbd %s: %w", addr, err)
	}
	if off+uint64(len(p)) > size {
		return fmt.Errorf("nbd %s: read [%d, +%d) beyond the export's %d bytes", addr, off, len(p), size)
	}
	const cookie = 0x6e7072646d61
	req := nbd.AppendRequest(nil, nbd.Request{Type: nbd.CmdRead, Cookie: cookie, Offset: off, Length: uint32(len(p))})
	if _, err := conn.Write(req); err != nil {
		return fmt.Errorf("nbd %s: read request: %w", addr, err)
	}
	var rep [nbdReplySize]byte
	if _, err := io.ReadFull(conn, rep[:]); err != nil {
		return fmt.Errorf("nbd %s: reply: %w", addr, err)
	}
	errno, got, err := parseNBDReply(rep[:])
	switch {
	case err != nil:
		return fmt.Errorf("nbd %s: %w", addr, err)
	case got != cookie:
		return fmt.Errorf("nbd %s: %w: reply for cookie %#x, sent %#x", addr, errNBDProtocol, got, cookie)
	case errno != 0:
		return fmt.Errorf("nbd %s: read [%d, +%d): server error %s", addr, off, len(p), nbd.ErrorName(errno))
	}
	if _, err := io.ReadFull(conn, p); err != nil {
		return fmt.Errorf("nbd %s: read data: %w", addr, err)
	}
	// Leave politely (NBD_CMD_DISC), so nbdkit logs no broken connection.
	conn.Write(nbd.AppendRequest(nil, nbd.Request{Type: nbd.CmdDisc}))
	return nil
}
