package dhchap

// Challenge is DH-HMAC-CHAP_Challenge: the controller's choice of hash and
// DH group, its challenge C1 with sequence number S1, and its public DH
// value when a group is used.
//
// Layout: type 01h, id 01h, T_ID @4, HL @6, HASHID @8, DHGID @9, DHVLEN @10,
// SEQNUM @12, C1 @16 (HL bytes), DH value (DHVLEN bytes).
type Challenge struct {
	TID       uint16
	Hash      HashID
	DHGroup   DHGroupID
	Seq       uint32
	Challenge []byte
	DHValue   []byte
}

const fixedSize = 16 // the fixed part of challenge, reply and success1

// Marshal encodes the message.
func (m *Challenge) Marshal() []byte {
	b := make([]byte, fixedSize+len(m.Challenge)+len(m.DHValue))
	putHeader(b, MsgChallenge, m.TID)
	b[6] = byte(len(m.Challenge))
	b[8] = byte(m.Hash)
	b[9] = byte(m.DHGroup)
	le.PutUint16(b[10:], uint16(len(m.DHValue)))
	le.PutUint32(b[12:], m.Seq)
	copy(b[fixedSize:], m.Challenge)
	copy(b[fixedSize+len(m.Challenge):], m.DHValue)
	return b
}

// Unmarshal decodes msg; bytes after the DH value (an allocation longer
// than the message) are ignored. The values are copied.
func (m *Challenge) Unmarshal(msg []byte) error {
	if err := checkHeader(msg, MsgChallenge, fixedSize); err != nil {
		return err
	}
	hl, dhvlen := int(msg[6]), int(le.Uint16(msg[10:]))
	if fixedSize+hl+dhvlen > len(msg) {
		return payloadErrorf("challenge of %d bytes announces %d of challenge and %d of DH value", len(msg), hl, dhvlen)
	}
	*m = Challenge{TID: le.Uint16(msg[4:]), Hash: HashID(msg[8]), DHGroup: DHGroupID(msg[9]), Seq: le.Uint32(msg[12:]),
		Challenge: clone(msg[fixedSize : fixedSize+hl]),
		DHValue:   clone(msg[fixedSize+hl : fixedSize+hl+dhvlen])}
	return nil
}

func clone(b []byte) []byte { return append([]byte{}, b...) }
