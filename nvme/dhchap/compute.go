package dhchap

import "encoding/binary"

// ResponseParams are the inputs of a response besides the key: the
// challenge (augmented when a DH group is used), its sequence number, the
// transaction and the secure channel concatenation byte, and the two NQNs.
type ResponseParams struct {
	Hash      HashID
	Challenge []byte // C1 or C2, or its augmented form (AugmentedChallenge)
	Seq       uint32 // S1 or S2
	TID       uint16
	SCC       uint8
	HostNQN   string
	SubNQN    string
}

// HostResponse is R1, the host's proof of its secret:
// HMAC(Kh, C1 || S1 || T_ID || SC_C || "HostHost" || NQNh || 00h || NQNc),
// with Kh the host secret transformed with the host NQN, integers little
// endian.
func HostResponse(key []byte, p ResponseParams) []byte {
	return response(key, p, "HostHost", p.HostNQN, p.SubNQN)
}

// ControllerResponse is R2, the controller's proof of its secret:
// HMAC(Kc, C2 || S2 || T_ID || SC_C || "Controller" || NQNc || 00h || NQNh),
// with Kc the controller secret transformed with the subsystem NQN.
func ControllerResponse(key []byte, p ResponseParams) []byte {
	return response(key, p, "Controller", p.SubNQN, p.HostNQN)
}

func response(key []byte, p ResponseParams, label, first, second string) []byte {
	var fixed [7]byte
	binary.LittleEndian.PutUint32(fixed[0:], p.Seq)
	binary.LittleEndian.PutUint16(fixed[4:], p.TID)
	fixed[6] = p.SCC
	return p.Hash.mac(key, p.Challenge, fixed[:], []byte(label), []byte(first), []byte{0}, []byte(second))
}

// AugmentedChallenge is the challenge a response covers when a DH group
// is used: HMAC(H(session key), C), so that the response depends on the
// exchange's ephemeral keys.
func AugmentedChallenge(h HashID, sessionKey, challenge []byte) []byte {
	return h.mac(h.digest(sessionKey), challenge)
}
