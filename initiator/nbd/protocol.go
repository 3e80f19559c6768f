package nbd

// The NBD wire format: constants, message layouts and their encoders and
// decoders, kept in this one file. Everything is big-endian. Names follow
// the protocol document (NetworkBlockDevice/nbd doc/proto.md).

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Magic numbers.
const (
	magicInit            = 0x4e42444d41474943 // "NBDMAGIC"
	magicOption          = 0x49484156454F5054 // "IHAVEOPT"
	magicOptionReply     = 0x0003e889045565a9
	magicRequest         = 0x25609513
	magicSimpleReply     = 0x67446698
	magicStructuredReply = 0x668e33ef
)

// Handshake flags (server) and client flags.
const (
	flagFixedNewstyle  = 1 << 0
	flagNoZeroes       = 1 << 1
	flagCFixedNewstyle = 1 << 0
	flagCNoZeroes      = 1 << 1
)

// Transmission flags, sent with the export's size.
const (
	FlagHasFlags        = 1 << 0
	FlagReadOnly        = 1 << 1
	FlagSendFlush       = 1 << 2
	FlagSendFUA         = 1 << 3
	FlagRotational      = 1 << 4
	FlagSendTrim        = 1 << 5
	FlagSendWriteZeroes = 1 << 6
	FlagSendDF          = 1 << 7
	FlagCanMultiConn    = 1 << 8
	FlagSendResize      = 1 << 9
	FlagSendCache       = 1 << 10
	FlagSendFastZero    = 1 << 11
)

// Options sent during the handshake.
const (
	OptExportName      = 1
	OptAbort           = 2
	OptList            = 3
	OptPeekExport      = 4
	OptStartTLS        = 5
	OptInfo            = 6
	OptGo              = 7
	OptStructuredReply = 8
	OptListMetaContext = 9
	OptSetMetaContext  = 10
	OptExtendedHeaders = 11
)

// Option reply types. Errors have bit 31 set.
const (
	RepAck              = 1
	RepServer           = 2
	RepInfo             = 3
	RepMetaContext      = 4
	RepErrUnsup         = 1<<31 + 1
	RepErrPolicy        = 1<<31 + 2
	RepErrInvalid       = 1<<31 + 3
	RepErrPlatform      = 1<<31 + 4
	RepErrTLSReqd       = 1<<31 + 5
	RepErrUnknown       = 1<<31 + 6
	RepErrShutdown      = 1<<31 + 7
	RepErrBlockSizeReqd = 1<<31 + 8
	RepErrTooBig        = 1<<31 + 9
)

// Information types of NBD_OPT_INFO and NBD_OPT_GO.
const (
	InfoExport      = 0
	InfoName        = 1
	InfoDescription = 2
	InfoBlockSize   = 3
)

// Commands.
const (
	CmdRead        = 0
	CmdWrite       = 1
	CmdDisc        = 2
	CmdFlush       = 3
	CmdTrim        = 4
	CmdCache       = 5
	CmdWriteZeroes = 6
	CmdBlockStatus = 7
	CmdResize      = 8
)

// Command flags.
const (
	CmdFlagFUA      = 1 << 0
	CmdFlagNoHole   = 1 << 1
	CmdFlagDF       = 1 << 2
	CmdFlagReqOne   = 1 << 3
	CmdFlagFastZero = 1 << 4
)

// Structured reply flags and chunk types.
const (
	ReplyFlagDone         = 1 << 0
	ReplyTypeNone         = 0
	ReplyTypeOffsetData   = 1
	ReplyTypeOffsetHole   = 2
	ReplyTypeBlockStatus  = 5
	ReplyTypeError        = 1<<15 + 1
	ReplyTypeErrorOffset  = 1<<15 + 2
	replyTypeErrorBitMask = 1 << 15
)

// Error values of the transmission phase. They are not errnos of the server's
// system: the protocol fixes them.
const (
	EPERM     = 1
	EIO       = 5
	ENOMEM    = 12
	EINVAL    = 22
	ENOSPC    = 28
	EOVERFLOW = 75
	ENOTSUP   = 95
	ESHUTDOWN = 108
)

// Sizes of fixed parts of messages.
const (
	requestSize            = 28
	simpleReplySize        = 16
	structuredReplySize    = 20
	optionHeaderSize       = 16
	optionReplyHeaderSize  = 20
	exportNameReplySize    = 10 // size + transmission flags
	exportNameZeroPadding  = 124
	maxStringLength        = 4096 // export names, descriptions, messages
	defaultMaxPayload      = 32 << 20
	minimumPreferredBlock  = 512
	maximumMinimumBlock    = 64 << 10
	infoExportLength       = 12
	infoBlockSizeLength    = 14
	structuredErrorMinimum = 6
)

// Request is the header of a transmission-phase request. A write's payload
// follows it on the wire.
type Request struct {
	Flags  uint16
	Type   uint16
	Cookie uint64 // "handle" in older versions of the protocol
	Offset uint64
	Length uint32
}

// ErrBadMagic reports a message that does not start with its magic number:
// the stream is out of step and the connection must be dropped.
var ErrBadMagic = errors.New("nbd: bad magic number")

// DecodeRequest parses a request header from the first requestSize bytes of b.
func DecodeRequest(b []byte) (Request, error) {
	if len(b) < requestSize {
		return Request{}, fmt.Errorf("nbd: request header of %d bytes, want %d", len(b), requestSize)
	}
	if m := binary.BigEndian.Uint32(b[0:4]); m != magicRequest {
		return Request{}, fmt.Errorf("%w: request magic %#08x", ErrBadMagic, m)
	}
	return Request{
		Flags:  binary.BigEndian.Uint16(b[4:6]),
		Type:   binary.BigEndian.Uint16(b[6:8]),
		Cookie: binary.BigEndian.Uint64(b[8:16]),
		Offset: binary.BigEndian.Uint64(b[16:24]),
		Length: binary.BigEndian.Uint32(b[24:28]),
	}, nil
}

// AppendRequest appends the encoded header of r to b.
func AppendRequest(b []byte, r Request) []byte {
	b = binary.BigEndian.AppendUint32(b, magicRequest)
	b = binary.BigEndian.AppendUint16(b, r.Flags)
	b = binary.BigEndian.AppendUint16(b, r.Type)
	b = binary.BigEndian.AppendUint64(b, r.Cookie)
	b = binary.BigEndian.AppendUint64(b, r.Offset)
	return binary.BigEndian.AppendUint32(b, r.Length)
}

// appendSimpleReply appends a simple reply header.
func appendSimpleReply(b []byte, errno uint32, cookie uint64) []byte {
	b = binary.BigEndian.AppendUint32(b, magicSimpleReply)
	b = binary.BigEndian.AppendUint32(b, errno)
	return binary.BigEndian.AppendUint64(b, cookie)
}

// appendChunkHeader appends a structured reply chunk header.
func appendChunkHeader(b []byte, flags, typ uint16, cookie uint64, length uint32) []byte {
	b = binary.BigEndian.AppendUint32(b, magicStructuredReply)
	b = binary.BigEndian.AppendUint16(b, flags)
	b = binary.BigEndian.AppendUint16(b, typ)
	b = binary.BigEndian.AppendUint64(b, cookie)
	return binary.BigEndian.AppendUint32(b, length)
}

// appendErrorChunk appends a final NBD_REPLY_TYPE_ERROR chunk with a message
// for humans (truncated to the protocol's string limit).
func appendErrorChunk(b []byte, cookie uint64, errno uint32, msg string) []byte {
	if len(msg) > maxStringLength {
		msg = msg[:maxStringLength]
	}
	b = appendChunkHeader(b, ReplyFlagDone, ReplyTypeError, cookie, uint32(structuredErrorMinimum+len(msg)))
	b = binary.BigEndian.AppendUint32(b, errno)
	b = binary.BigEndian.AppendUint16(b, uint16(len(msg)))
	return append(b, msg...)
}

// optionHeader is what a client sends before each option's data.
type optionHeader struct {
	Option uint32
	Length uint32
}

// decodeOptionHeader parses an option header from b (optionHeaderSize bytes).
func decodeOptionHeader(b []byte) (optionHeader, error) {
	if len(b) < optionHeaderSize {
		return optionHeader{}, fmt.Errorf("nbd: option header of %d bytes, want %d", len(b), optionHeaderSize)
	}
	if m := binary.BigEndian.Uint64(b[0:8]); m != magicOption {
		return optionHeader{}, fmt.Errorf("%w: option magic %#016x", ErrBadMagic, m)
	}
	return optionHeader{
		Option: binary.BigEndian.Uint32(b[8:12]),
		Length: binary.BigEndian.Uint32(b[12:16]),
	}, nil
}

// appendOption appends an option header and its data (used by clients).
func appendOption(b []byte, option uint32, data []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, magicOption)
	b = binary.BigEndian.AppendUint32(b, option)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

// appendOptionReply appends an option reply header and its data.
func appendOptionReply(b []byte, option, typ uint32, data []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, magicOptionReply)
	b = binary.BigEndian.AppendUint32(b, option)
	b = binary.BigEndian.AppendUint32(b, typ)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

// infoRequest is the data of NBD_OPT_INFO and NBD_OPT_GO.
type infoRequest struct {
	Name  string
	Infos []uint16
}

// errMalformedOption marks option data that does not parse; the server
// answers NBD_REP_ERR_INVALID and keeps negotiating.
var errMalformedOption = errors.New("malformed option data")

// decodeInfoRequest parses the data of NBD_OPT_INFO / NBD_OPT_GO:
// 32-bit name length, name, 16-bit count, count 16-bit information types.
func decodeInfoRequest(data []byte) (infoRequest, error) {
	if len(data) < 6 {
		return infoRequest{}, fmt.Errorf("%w: %d bytes, need at least 6", errMalformedOption, len(data))
	}
	nameLen := binary.BigEndian.Uint32(data[0:4])
	if uint64(nameLen) > uint64(len(data)-6) {
		return infoRequest{}, fmt.Errorf("%w: name of %d bytes in %d bytes of data", errMalformedOption, nameLen, len(data))
	}
	if nameLen > maxStringLength {
		return infoRequest{}, fmt.Errorf("%w: name of %d bytes exceeds %d", errMalformedOption, nameLen, maxStringLength)
	}
	rest := data[4+nameLen:]
	count := int(binary.BigEndian.Uint16(rest[0:2]))
	rest = rest[2:]
	if len(rest) != 2*count {
		return infoRequest{}, fmt.Errorf("%w: %d information requests in %d bytes", errMalformedOption, count, len(rest))
	}
	req := infoRequest{Name: string(data[4 : 4+nameLen]), Infos: make([]uint16, count)}
	for i := range req.Infos {
		req.Infos[i] = binary.BigEndian.Uint16(rest[2*i:])
	}
	return req, nil
}

// appendInfoRequest encodes the data of NBD_OPT_INFO / NBD_OPT_GO.
func appendInfoRequest(b []byte, r infoRequest) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.Name)))
	b = append(b, r.Name...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(r.Infos)))
	for _, info := range r.Infos {
		b = binary.BigEndian.AppendUint16(b, info)
	}
	return b
}

// appendInfoExport encodes an NBD_INFO_EXPORT reply's data.
func appendInfoExport(b []byte, size uint64, flags uint16) []byte {
	b = binary.BigEndian.AppendUint16(b, InfoExport)
	b = binary.BigEndian.AppendUint64(b, size)
	return binary.BigEndian.AppendUint16(b, flags)
}

// appendInfoBlockSize encodes an NBD_INFO_BLOCK_SIZE reply's data.
func appendInfoBlockSize(b []byte, minimum, preferred, maximum uint32) []byte {
	b = binary.BigEndian.AppendUint16(b, InfoBlockSize)
	b = binary.BigEndian.AppendUint32(b, minimum)
	b = binary.BigEndian.AppendUint32(b, preferred)
	return binary.BigEndian.AppendUint32(b, maximum)
}

// appendInfoString encodes NBD_INFO_NAME or NBD_INFO_DESCRIPTION data.
func appendInfoString(b []byte, typ uint16, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, typ)
	return append(b, s...)
}

// appendServerReply encodes an NBD_REP_SERVER reply's data.
func appendServerReply(b []byte, name, description string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(name)))
	b = append(b, name...)
	return append(b, description...)
}

// CommandName names a command for errors and logs.
func CommandName(typ uint16) string {
	switch typ {
	case CmdRead:
		return "READ"
	case CmdWrite:
		return "WRITE"
	case CmdDisc:
		return "DISC"
	case CmdFlush:
		return "FLUSH"
	case CmdTrim:
		return "TRIM"
	case CmdCache:
		return "CACHE"
	case CmdWriteZeroes:
		return "WRITE_ZEROES"
	case CmdBlockStatus:
		return "BLOCK_STATUS"
	case CmdResize:
		return "RESIZE"
	}
	return fmt.Sprintf("command %d", typ)
}
