package dhchap

import (
	"encoding/binary"
	"errors"
	"fmt"
)

var le = binary.LittleEndian

// AuthType is byte 0 of every message: the common messages (negotiate,
// failures) or the DH-HMAC-CHAP ones.
type AuthType uint8

// Auth types.
const (
	AuthTypeCommon AuthType = 0x00
	AuthTypeDHCHAP AuthType = 0x01
)

// MessageID is byte 1 of every message (AUTH_ID).
type MessageID uint8

// Messages. Negotiate, Failure1 and Failure2 are common messages; the rest
// are DH-HMAC-CHAP messages.
const (
	MsgNegotiate MessageID = 0x00
	MsgChallenge MessageID = 0x01
	MsgReply     MessageID = 0x02
	MsgSuccess1  MessageID = 0x03
	MsgSuccess2  MessageID = 0x04
	MsgFailure2  MessageID = 0xf0
	MsgFailure1  MessageID = 0xf1
)

// authType is the auth type each message carries.
func (m MessageID) authType() AuthType {
	switch m {
	case MsgNegotiate, MsgFailure1, MsgFailure2:
		return AuthTypeCommon
	}
	return AuthTypeDHCHAP
}

func (m MessageID) String() string {
	switch m {
	case MsgNegotiate:
		return "AUTH_Negotiate"
	case MsgChallenge:
		return "DH-HMAC-CHAP_Challenge"
	case MsgReply:
		return "DH-HMAC-CHAP_Reply"
	case MsgSuccess1:
		return "DH-HMAC-CHAP_Success1"
	case MsgSuccess2:
		return "DH-HMAC-CHAP_Success2"
	case MsgFailure1:
		return "AUTH_Failure1"
	case MsgFailure2:
		return "AUTH_Failure2"
	}
	return fmt.Sprintf("message 0x%02x", uint8(m))
}

// Protocol constants of the Authentication Send/Receive commands and the
// negotiation.
const (
	// SECP is the security protocol of NVMe in-band authentication.
	SECP = 0xe9
	// SPSP is the value of both SPSP0 and SPSP1 for DH-HMAC-CHAP.
	SPSP = 0x01
	// ProtocolDHCHAP is the AUTHID of a DH-HMAC-CHAP protocol descriptor.
	ProtocolDHCHAP = 0x01
	// SCCNone: no secure channel concatenation (the only one supported).
	SCCNone = 0x00
	// ReceiveLength is the allocation length hosts give Authentication
	// Receive, as Linux does: enough for any message (a challenge with an
	// ffdhe8192 value is 16 + 64 + 1024 bytes).
	ReceiveLength = 4096
)

// Header is the common start of every message: AUTH_TYPE, AUTH_ID and the
// transaction ID (bytes 4-5).
type Header struct {
	Type AuthType
	ID   MessageID
	TID  uint16
}

// HeaderSize is the bytes every message has at least.
const HeaderSize = 8

// PeekHeader decodes the header of msg, which tells which decoder to use.
func PeekHeader(msg []byte) (Header, error) {
	if len(msg) < HeaderSize {
		return Header{}, payloadErrorf("message of %d bytes, shorter than its header", len(msg))
	}
	return Header{Type: AuthType(msg[0]), ID: MessageID(msg[1]), TID: le.Uint16(msg[4:])}, nil
}

func putHeader(b []byte, id MessageID, tid uint16) {
	b[0] = byte(id.authType())
	b[1] = byte(id)
	le.PutUint16(b[4:], tid)
}

// checkHeader verifies that msg is at least min bytes of message id.
func checkHeader(msg []byte, id MessageID, min int) error {
	if len(msg) < min {
		return payloadErrorf("%v of %d bytes, shorter than %d", id, len(msg), min)
	}
	if AuthType(msg[0]) != id.authType() || MessageID(msg[1]) != id {
		return &ProtocolError{Explanation: ExplanationIncorrectMessage,
			Detail: fmt.Sprintf("type 0x%02x id 0x%02x is not %v", msg[0], msg[1], id)}
	}
	return nil
}

// ProtocolError is a message that cannot be accepted, with the reason
// code explanation a failure message reports for it.
type ProtocolError struct {
	Explanation Explanation
	Detail      string
}

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("dhchap: %s: %v", e.Detail, e.Explanation)
}

func payloadErrorf(format string, args ...any) error {
	return &ProtocolError{Explanation: ExplanationIncorrectPayload, Detail: fmt.Sprintf(format, args...)}
}

// explanationOf is the explanation to report for err: its own for a
// ProtocolError, Failed otherwise.
func explanationOf(err error) Explanation {
	var pe *ProtocolError
	if errors.As(err, &pe) {
		return pe.Explanation
	}
	return ExplanationFailed
}
