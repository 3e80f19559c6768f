package dhchap

// Reply is DH-HMAC-CHAP_Reply: the host's response R1, and for a
// bidirectional authentication its challenge C2 with sequence number S2
// (S2 0: none), and its public DH value when a group is used.
//
// Layout: type 01h, id 02h, T_ID @4, HL @6, CVALID @8, DHVLEN @10, SEQNUM
// @12, R1 @16 (HL bytes), C2 (HL bytes, zero when CVALID is 0), DH value
// (DHVLEN bytes).
type Reply struct {
	TID      uint16
	Response []byte
	// Challenge is C2; nil when the host does not authenticate the
	// controller (CVALID 0).
	Challenge []byte
	Seq       uint32
	DHValue   []byte
}

// Marshal encodes the message.
func (m *Reply) Marshal() []byte {
	hl := len(m.Response)
	b := make([]byte, fixedSize+2*hl+len(m.DHValue))
	putHeader(b, MsgReply, m.TID)
	b[6] = byte(hl)
	if m.Challenge != nil {
		b[8] = 1
		copy(b[fixedSize+hl:fixedSize+2*hl], m.Challenge)
	}
	le.PutUint16(b[10:], uint16(len(m.DHValue)))
	le.PutUint32(b[12:], m.Seq)
	copy(b[fixedSize:], m.Response)
	copy(b[fixedSize+2*hl:], m.DHValue)
	return b
}

// Unmarshal decodes msg; bytes after the DH value are ignored. The values
// are copied.
func (m *Reply) Unmarshal(msg []byte) error {
	if err := checkHeader(msg, MsgReply, fixedSize); err != nil {
		return err
	}
	hl, dhvlen := int(msg[6]), int(le.Uint16(msg[10:]))
	if fixedSize+2*hl+dhvlen > len(msg) {
		return payloadErrorf("reply of %d bytes announces %d of response and challenge each and %d of DH value", len(msg), hl, dhvlen)
	}
	*m = Reply{TID: le.Uint16(msg[4:]), Seq: le.Uint32(msg[12:]),
		Response: clone(msg[fixedSize : fixedSize+hl]),
		DHValue:  clone(msg[fixedSize+2*hl : fixedSize+2*hl+dhvlen])}
	if msg[8]&1 != 0 {
		m.Challenge = clone(msg[fixedSize+hl : fixedSize+2*hl])
	}
	return nil
}
