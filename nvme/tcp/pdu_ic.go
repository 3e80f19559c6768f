package tcp

import "fmt"

// ICReq and ICResp open a connection: the host's ICReq, the controller's
// ICResp, each 128 bytes (HLEN = PLEN, PDO 0, no flags, no digests).

// PFV10 is the only PDU format version, NVMe/TCP 1.0.
const PFV10 = 0

// Offsets in ICReq and ICResp.
const (
	offICPFV    = 8  // u16
	offICPDA    = 10 // u8: HPDA in ICReq, CPDA in ICResp
	offICDigest = 11 // u8: DGST
	offICMax    = 12 // u32: MAXR2T in ICReq, MAXH2CDATA in ICResp
)

// ICReq is the host's Initialize Connection Request.
type ICReq struct {
	PFV uint16
	// HPDA asks the controller to align the data of the PDUs it sends to
	// (HPDA+1)·4 bytes (0's based dwords, at most MaxPDA).
	HPDA uint8
	// Digests are the digests the host asks for.
	Digests Digests
	// MAXR2T is the number of R2Ts the host accepts outstanding per
	// command, 0's based (Linux: 0, one at a time).
	MAXR2T uint32
}

// ICResp is the controller's Initialize Connection Response.
type ICResp struct {
	PFV uint16
	// CPDA asks the host to align the data of the PDUs it sends to
	// (CPDA+1)·4 bytes. Linux hosts refuse anything but 0.
	CPDA uint8
	// Digests are the digests in use: exactly those the host asked for.
	Digests Digests
	// MAXH2CDATA is the largest data of one H2CData PDU, a multiple of 4
	// and at least MinMaxH2CData.
	MAXH2CDATA uint32
}

func marshalIC(b []byte, t PDUType, pfv uint16, pda uint8, d Digests, max uint32) {
	clear(b[:ICSize])
	ch := CommonHeader{Type: t, HLEN: ICSize, PLEN: ICSize}
	ch.MarshalTo(b)
	le.PutUint16(b[offICPFV:], pfv)
	b[offICPDA] = pda
	b[offICDigest] = byte(d)
	le.PutUint32(b[offICMax:], max)
}

// MarshalTo encodes the whole PDU into b (ICSize bytes).
func (p *ICReq) MarshalTo(b []byte) { marshalIC(b, TypeICReq, p.PFV, p.HPDA, p.Digests, p.MAXR2T) }

// MarshalTo encodes the whole PDU into b (ICSize bytes).
func (p *ICResp) MarshalTo(b []byte) {
	marshalIC(b, TypeICResp, p.PFV, p.CPDA, p.Digests, p.MAXH2CDATA)
}

func unmarshalIC(b []byte, t PDUType) (pfv uint16, pda uint8, d Digests, max uint32, err error) {
	if len(b) < ICSize || PDUType(b[0]) != t {
		return 0, 0, 0, 0, fmt.Errorf("nvme/tcp: not a %s header (%d bytes)", t, len(b))
	}
	return le.Uint16(b[offICPFV:]), b[offICPDA], Digests(b[offICDigest]), le.Uint32(b[offICMax:]), nil
}

// Unmarshal decodes an ICReq header (as Reader.Next returns it).
func (p *ICReq) Unmarshal(b []byte) (err error) {
	p.PFV, p.HPDA, p.Digests, p.MAXR2T, err = unmarshalIC(b, TypeICReq)
	return err
}

// Unmarshal decodes an ICResp header (as Reader.Next returns it).
func (p *ICResp) Unmarshal(b []byte) (err error) {
	p.PFV, p.CPDA, p.Digests, p.MAXH2CDATA, err = unmarshalIC(b, TypeICResp)
	return err
}

// Check is what a controller checks of an ICReq before answering:
// anything it cannot serve is a *ProtocolError with
// FESUnsupportedParameter and the field's offset. b is the header, for the
// termination request.
func (p *ICReq) Check(b []byte) error {
	switch {
	case p.PFV != PFV10:
		return protocolErrorf(FESUnsupportedParameter, offICPFV, TypeICReq, b, "PFV %d: only %d is defined", p.PFV, PFV10)
	case p.HPDA > MaxPDA:
		return protocolErrorf(FESUnsupportedParameter, offICPDA, TypeICReq, b, "HPDA %d above %d", p.HPDA, MaxPDA)
	case p.Digests&^(HeaderDigest|DataDigest) != 0:
		return protocolErrorf(FESUnsupportedParameter, offICDigest, TypeICReq, b, "DGST 0x%02x has reserved bits", uint8(p.Digests))
	}
	return nil
}

// Check is what a host checks of an ICResp (Linux's checks): PFV 1.0, the
// digests it asked for (want) and no others, CPDA at most MaxPDA, and a
// MAXH2CDATA that is a multiple of 4 and at least MinMaxH2CData. b is the
// header, for the termination request.
func (p *ICResp) Check(b []byte, want Digests) error {
	switch {
	case p.PFV != PFV10:
		return protocolErrorf(FESUnsupportedParameter, offICPFV, TypeICResp, b, "PFV %d: only %d is defined", p.PFV, PFV10)
	case p.CPDA > MaxPDA:
		return protocolErrorf(FESUnsupportedParameter, offICPDA, TypeICResp, b, "CPDA %d above %d", p.CPDA, MaxPDA)
	case p.Digests != want:
		return protocolErrorf(FESUnsupportedParameter, offICDigest, TypeICResp, b, "digests %s, asked for %s", p.Digests, want)
	case p.MAXH2CDATA < MinMaxH2CData || p.MAXH2CDATA%4 != 0:
		return protocolErrorf(FESUnsupportedParameter, offICMax, TypeICResp, b, "MAXH2CDATA %d: not a multiple of 4 of at least %d", p.MAXH2CDATA, MinMaxH2CData)
	}
	return nil
}
