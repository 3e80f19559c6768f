package nvme

// Authentication Send (FCTYPE 05h, host to controller) and Authentication
// Receive (FCTYPE 06h, controller to host) carry the messages of in-band
// authentication (package nvme/dhchap). Layout: SPSP0 @41, SPSP1 @42,
// SECP @43 (CDW10 bits 31:8), TL or AL @44 (CDW11).

// Security protocol fields of NVMe in-band authentication with
// DH-HMAC-CHAP.
const (
	AuthSECP = 0xe9 // SECP: NVMe in-band authentication
	AuthSPSP = 0x01 // SPSP0 and SPSP1 for DH-HMAC-CHAP
)

// AuthParams are the Authentication Send/Receive fields.
type AuthParams struct {
	SECP   uint8
	SPSP0  uint8
	SPSP1  uint8
	Length uint32 // TL (send) or AL (receive)
}

func authCommand(t FabricsType, n uint32, sgl SGLDescriptor) Command {
	c := newFabrics(t)
	c.DPTR = sgl
	c.CDW10 = uint32(AuthSPSP)<<8 | uint32(AuthSPSP)<<16 | uint32(AuthSECP)<<24
	c.CDW11 = n
	return c
}

// AuthSendCommand sends tl bytes of an authentication message described by
// sgl.
func AuthSendCommand(tl uint32, sgl SGLDescriptor) Command {
	return authCommand(FabricsAuthSend, tl, sgl)
}

// AuthReceiveCommand receives up to al bytes of an authentication message
// into the buffer sgl describes.
func AuthReceiveCommand(al uint32, sgl SGLDescriptor) Command {
	return authCommand(FabricsAuthReceive, al, sgl)
}

// Auth decodes the Authentication Send/Receive fields of c.
func (c *Command) Auth() AuthParams {
	return AuthParams{SPSP0: uint8(c.CDW10 >> 8), SPSP1: uint8(c.CDW10 >> 16), SECP: uint8(c.CDW10 >> 24), Length: c.CDW11}
}

// CheckAuth validates an Authentication Send/Receive on the controller side
// (limit: the largest message accepted): a security protocol other than
// DH-HMAC-CHAP or a zero length is Invalid Field (DNR), as nvmet answers; a
// length above limit is Invalid Field too; an SGL of another length than
// TL/AL is Data SGL Length Invalid (DNR).
func (c *Command) CheckAuth(limit uint32) (AuthParams, error) {
	p := c.Auth()
	switch {
	case p.SECP != AuthSECP:
		return p, Errorf(StatusInvalidField.WithDNR(), "authentication SECP %#x: only DH-HMAC-CHAP (%#x)", p.SECP, AuthSECP)
	case p.SPSP0 != AuthSPSP || p.SPSP1 != AuthSPSP:
		return p, Errorf(StatusInvalidField.WithDNR(), "authentication SPSP %#x/%#x: want %#x", p.SPSP0, p.SPSP1, AuthSPSP)
	case p.Length == 0:
		return p, Errorf(StatusInvalidField.WithDNR(), "authentication transfer of 0 bytes")
	}
	return p, c.CheckTransfer(uint64(p.Length), uint64(limit))
}
