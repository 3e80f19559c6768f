package dhchap

// Success1 is DH-HMAC-CHAP_Success1: the controller accepted R1; for a
// bidirectional authentication it carries R2.
//
// Layout: type 01h, id 03h, T_ID @4, HL @6, RVALID @8, R2 @16 (HL bytes,
// when RVALID).
type Success1 struct {
	TID uint16
	// HashLen is HL: the hash length of the transaction, also without R2
	// (Linux checks it).
	HashLen int
	// Response is R2, nil when RVALID is 0.
	Response []byte
}

// Marshal encodes the message.
func (m *Success1) Marshal() []byte {
	n := fixedSize
	if m.Response != nil {
		n += len(m.Response)
	}
	b := make([]byte, n)
	putHeader(b, MsgSuccess1, m.TID)
	b[6] = byte(m.HashLen)
	if m.Response != nil {
		b[8] = 1
		copy(b[fixedSize:], m.Response)
	}
	return b
}

// Unmarshal decodes msg; bytes after the message are ignored.
func (m *Success1) Unmarshal(msg []byte) error {
	if err := checkHeader(msg, MsgSuccess1, fixedSize); err != nil {
		return err
	}
	*m = Success1{TID: le.Uint16(msg[4:]), HashLen: int(msg[6])}
	if msg[8]&1 != 0 {
		if fixedSize+m.HashLen > len(msg) {
			return payloadErrorf("success1 of %d bytes announces a response of %d", len(msg), m.HashLen)
		}
		m.Response = clone(msg[fixedSize : fixedSize+m.HashLen])
	}
	return nil
}

// Success2 is DH-HMAC-CHAP_Success2: the host accepted R2 (16 bytes: type
// 01h, id 04h, T_ID @4).
type Success2 struct {
	TID uint16
}

// Marshal encodes the message.
func (m *Success2) Marshal() []byte {
	b := make([]byte, fixedSize)
	putHeader(b, MsgSuccess2, m.TID)
	return b
}

// Unmarshal decodes msg (at least its first 8 bytes: the rest is
// reserved).
func (m *Success2) Unmarshal(msg []byte) error {
	if err := checkHeader(msg, MsgSuccess2, HeaderSize); err != nil {
		return err
	}
	*m = Success2{TID: le.Uint16(msg[4:])}
	return nil
}
