package nbd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Export is what a server says of an export during the handshake.
type Export struct {
	Size  uint64
	Flags uint16 // transmission flags (Flag*)
	// Block sizes, when the server sent them (0 otherwise).
	MinBlock, PreferredBlock, MaxBlock uint32
}

// Handshake runs the client's side of the fixed newstyle handshake on rw up
// to the transmission phase, asking for export with NBD_OPT_GO and without
// structured replies: the state in which the kernel's NBD client takes a
// connection it is handed. It reads exactly the handshake's bytes, so that
// nothing the server sends later is consumed.
func Handshake(rw io.ReadWriter, export string) (Export, error) {
	if len(export) > maxStringLength {
		return Export{}, fmt.Errorf("nbd: export name of %d bytes (limit %d)", len(export), maxStringLength)
	}
	var greeting [18]byte
	if _, err := io.ReadFull(rw, greeting[:]); err != nil {
		return Export{}, fmt.Errorf("nbd: read greeting: %w", err)
	}
	be := binary.BigEndian
	if be.Uint64(greeting[0:]) != magicInit || be.Uint64(greeting[8:]) != magicOption {
		return Export{}, fmt.Errorf("%w: greeting % x", ErrBadMagic, greeting[:16])
	}
	serverFlags := be.Uint16(greeting[16:])
	if serverFlags&flagFixedNewstyle == 0 {
		return Export{}, errors.New("nbd: the server does not speak the fixed newstyle handshake")
	}
	clientFlags := uint32(flagCFixedNewstyle)
	if serverFlags&flagNoZeroes != 0 {
		clientFlags |= flagCNoZeroes
	}
	msg := be.AppendUint32(nil, clientFlags)
	msg = be.AppendUint64(msg, magicOption)
	msg = be.AppendUint32(msg, OptGo)
	msg = be.AppendUint32(msg, uint32(4+len(export)+2+2))
	msg = be.AppendUint32(msg, uint32(len(export)))
	msg = append(msg, export...)
	msg = be.AppendUint16(msg, 1) // one information request
	msg = be.AppendUint16(msg, InfoBlockSize)
	if _, err := rw.Write(msg); err != nil {
		return Export{}, fmt.Errorf("nbd: send NBD_OPT_GO: %w", err)
	}
	var ex Export
	haveExport := false
	for range maxOptions {
		var h [optionReplyHeaderSize]byte
		if _, err := io.ReadFull(rw, h[:]); err != nil {
			return Export{}, fmt.Errorf("nbd: read option reply: %w", err)
		}
		if m := be.Uint64(h[0:]); m != magicOptionReply {
			return Export{}, fmt.Errorf("%w: option reply %#x", ErrBadMagic, m)
		}
		opt, typ, length := be.Uint32(h[8:]), be.Uint32(h[12:]), be.Uint32(h[16:])
		if opt != OptGo {
			return Export{}, fmt.Errorf("nbd: reply to option %d, want %d (NBD_OPT_GO)", opt, OptGo)
		}
		if length > maxOptionData {
			return Export{}, fmt.Errorf("nbd: option reply of %d bytes (limit %d)", length, maxOptionData)
		}
		data := make([]byte, length)
		if _, err := io.ReadFull(rw, data); err != nil {
			return Export{}, fmt.Errorf("nbd: read option reply data: %w", err)
		}
		switch {
		case typ == RepAck:
			if !haveExport {
				return Export{}, errors.New("nbd: NBD_OPT_GO acknowledged without the export's size")
			}
			return ex, nil
		case typ == RepInfo:
			if len(data) < 2 {
				return Export{}, errors.New("nbd: information reply without its type")
			}
			switch be.Uint16(data) {
			case InfoExport:
				if len(data) != infoExportLength {
					return Export{}, fmt.Errorf("nbd: NBD_INFO_EXPORT of %d bytes", len(data))
				}
				ex.Size, ex.Flags, haveExport = be.Uint64(data[2:]), be.Uint16(data[10:]), true
			case InfoBlockSize:
				if len(data) != infoBlockSizeLength {
					return Export{}, fmt.Errorf("nbd: NBD_INFO_BLOCK_SIZE of %d bytes", len(data))
				}
				ex.MinBlock, ex.PreferredBlock, ex.MaxBlock = be.Uint32(data[2:]), be.Uint32(data[6:]), be.Uint32(data[10:])
			}
			// Other information (name, description) is of no use here.
		case typ&(1<<31) != 0:
			return Export{}, fmt.Errorf("nbd: export %q refused (reply type %#x): %s", export, typ, printable(data))
		default:
			return Export{}, fmt.Errorf("nbd: unexpected reply type %d to NBD_OPT_GO", typ)
		}
	}
	return Export{}, fmt.Errorf("nbd: more than %d replies to NBD_OPT_GO", maxOptions)
}

// printable is a server's message as text, without control characters.
func printable(b []byte) string {
	out := make([]rune, 0, len(b))
	for _, r := range string(b) {
		if r < ' ' || r == 0x7f {
			r = '?'
		}
		out = append(out, r)
	}
	return string(out)
}
