package dhchap

import "fmt"

// Negotiate is AUTH_Negotiate: the host starts a transaction and lists the
// hash functions and DH groups it accepts.
//
// Layout: type 00h, id 00h, T_ID @4, SC_C @6, NAPD @7, then NAPD protocol
// descriptors of 64 bytes: AUTHID @0, HALEN @2, DHLEN @3, hash IDs from @4
// (HALEN of them), DH group IDs from @34 (DHLEN of them).
type Negotiate struct {
	TID      uint16
	SCC      uint8
	Hashes   []HashID
	DHGroups []DHGroupID
}

const (
	descriptorSize = 64
	maxIDs         = 30 // per list in a descriptor
)

// Marshal encodes the message with one DH-HMAC-CHAP descriptor.
func (m *Negotiate) Marshal() ([]byte, error) {
	if len(m.Hashes) > maxIDs || len(m.DHGroups) > maxIDs {
		return nil, fmt.Errorf("dhchap: negotiate lists %d hashes and %d DH groups, at most %d each", len(m.Hashes), len(m.DHGroups), maxIDs)
	}
	b := make([]byte, HeaderSize+descriptorSize)
	putHeader(b, MsgNegotiate, m.TID)
	b[6] = m.SCC
	b[7] = 1
	d := b[HeaderSize:]
	d[0] = ProtocolDHCHAP
	d[2] = byte(len(m.Hashes))
	d[3] = byte(len(m.DHGroups))
	for i, h := range m.Hashes {
		d[4+i] = byte(h)
	}
	for i, g := range m.DHGroups {
		d[4+maxIDs+i] = byte(g)
	}
	return b, nil
}

// Unmarshal decodes msg, taking the lists of its first DH-HMAC-CHAP
// descriptor; bytes after the descriptors are ignored. A message without
// one, or with a descriptor list that does not fit, is a *ProtocolError.
func (m *Negotiate) Unmarshal(msg []byte) error {
	if err := checkHeader(msg, MsgNegotiate, HeaderSize+descriptorSize); err != nil {
		return err
	}
	napd := int(msg[7])
	if napd == 0 || HeaderSize+napd*descriptorSize > len(msg) {
		return payloadErrorf("negotiate announces %d protocol descriptors in %d bytes", napd, len(msg))
	}
	*m = Negotiate{TID: le.Uint16(msg[4:]), SCC: msg[6]}
	for i := 0; i < napd; i++ {
		d := msg[HeaderSize+i*descriptorSize:][:descriptorSize]
		if d[0] != ProtocolDHCHAP {
			continue
		}
		halen, dhlen := int(d[2]), int(d[3])
		if halen > maxIDs || dhlen > maxIDs {
			return payloadErrorf("descriptor lists %d hashes and %d DH groups, at most %d each", halen, dhlen, maxIDs)
		}
		for _, id := range d[4 : 4+halen] {
			m.Hashes = append(m.Hashes, HashID(id))
		}
		for _, id := range d[4+maxIDs : 4+maxIDs+dhlen] {
			m.DHGroups = append(m.DHGroups, DHGroupID(id))
		}
		return nil
	}
	return &ProtocolError{Explanation: ExplanationNotUsable, Detail: "negotiate offers no DH-HMAC-CHAP protocol"}
}
