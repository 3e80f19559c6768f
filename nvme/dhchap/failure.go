package dhchap

import "fmt"

// Failure is AUTH_Failure1 (controller to host) or AUTH_Failure2 (host to
// controller): the transaction failed, and why.
//
// Layout: type 00h, id F1h or F0h, T_ID @4, REASON @6, EXPLANATION @7.
type Failure struct {
	ID          MessageID // MsgFailure1 or MsgFailure2
	TID         uint16
	Reason      uint8 // ReasonFailed: the only reason code defined
	Explanation Explanation
}

// ReasonFailed is the reason code "authentication failure".
const ReasonFailed = 0x01

// Explanation is the reason code explanation of a failure.
type Explanation uint8

// Reason code explanations.
const (
	ExplanationFailed           Explanation = 0x01 // authentication failed
	ExplanationNotUsable        Explanation = 0x02 // authentication protocol not usable
	ExplanationConcatMismatch   Explanation = 0x03 // secure channel concatenation mismatch
	ExplanationHashUnusable     Explanation = 0x04 // hash function not usable
	ExplanationDHGroupUnusable  Explanation = 0x05 // DH group not usable
	ExplanationIncorrectPayload Explanation = 0x06 // incorrect payload
	ExplanationIncorrectMessage Explanation = 0x07 // incorrect protocol message
)

func (e Explanation) String() string {
	switch e {
	case ExplanationFailed:
		return "authentication failed"
	case ExplanationNotUsable:
		return "authentication protocol not usable"
	case ExplanationConcatMismatch:
		return "secure channel concatenation mismatch"
	case ExplanationHashUnusable:
		return "hash function not usable"
	case ExplanationDHGroupUnusable:
		return "DH group not usable"
	case ExplanationIncorrectPayload:
		return "incorrect payload"
	case ExplanationIncorrectMessage:
		return "incorrect protocol message"
	}
	return fmt.Sprintf("explanation 0x%02x", uint8(e))
}

// Marshal encodes the message (8 bytes).
func (m *Failure) Marshal() []byte {
	b := make([]byte, HeaderSize)
	putHeader(b, m.ID, m.TID)
	b[6] = m.Reason
	b[7] = byte(m.Explanation)
	return b
}

// Unmarshal decodes a Failure1 or Failure2.
func (m *Failure) Unmarshal(msg []byte) error {
	h, err := PeekHeader(msg)
	if err != nil {
		return err
	}
	if h.ID != MsgFailure1 && h.ID != MsgFailure2 {
		return checkHeader(msg, MsgFailure1, HeaderSize)
	}
	if err := checkHeader(msg, h.ID, HeaderSize); err != nil {
		return err
	}
	*m = Failure{ID: h.ID, TID: h.TID, Reason: msg[6], Explanation: Explanation(msg[7])}
	return nil
}
