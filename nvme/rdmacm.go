package nvme

import "fmt"

// Sizes of the NVMe-oF RDMA CM private data.
const (
	CMRequestSize = 32
	CMAcceptSize  = 32
	CMRejectSize  = 4
)

// CMRejectStatus is the STS of an NVMe-oF RDMA CM REJECT.
type CMRejectStatus uint16

// RDMA CM reject statuses.
const (
	CMRejectInvalidLength  CMRejectStatus = 1
	CMRejectInvalidRECFMT  CMRejectStatus = 2
	CMRejectInvalidQID     CMRejectStatus = 3
	CMRejectInvalidHSQSIZE CMRejectStatus = 4
	CMRejectInvalidHRQSIZE CMRejectStatus = 5
	CMRejectNoResources    CMRejectStatus = 6
	CMRejectInvalidIRD     CMRejectStatus = 7
	CMRejectInvalidORD     CMRejectStatus = 8
)

var cmRejectNames = map[CMRejectStatus]string{
	CMRejectInvalidLength:  "invalid private data length",
	CMRejectInvalidRECFMT:  "invalid RECFMT",
	CMRejectInvalidQID:     "invalid QID",
	CMRejectInvalidHSQSIZE: "invalid HSQSIZE",
	CMRejectInvalidHRQSIZE: "invalid HRQSIZE",
	CMRejectNoResources:    "no resources",
	CMRejectInvalidIRD:     "invalid IRD",
	CMRejectInvalidORD:     "invalid ORD",
}

func (s CMRejectStatus) String() string {
	if n, ok := cmRejectNames[s]; ok {
		return fmt.Sprintf("%s (%d)", n, uint16(s))
	}
	return fmt.Sprintf("unknown reject status %d", uint16(s))
}

// CMRejectError is a refused connection request: the binding answers it
// with a REJECT carrying Status.
type CMRejectError struct {
	Status CMRejectStatus
	Detail string
}

func (e *CMRejectError) Error() string {
	return "nvme: rdma cm reject: " + e.Detail + ": " + e.Status.String()
}

// CMRequest is the host's connection request private data (32 bytes).
type CMRequest struct {
	RECFMT  uint16 // @0 record format, 0
	QID     uint16 // @2 queue: 0 admin
	HRQSIZE uint16 // @4 host receive queue size, 1's based
	HSQSIZE uint16 // @6 host send queue size, 0's based (= Connect SQSIZE)
	CNTLID  uint16 // @8 controller ID (SPDK; Linux sends 0)
}

// Marshal returns the 32-byte private data.
func (r *CMRequest) Marshal() []byte {
	b := make([]byte, CMRequestSize)
	le.PutUint16(b[0:], r.RECFMT)
	le.PutUint16(b[2:], r.QID)
	le.PutUint16(b[4:], r.HRQSIZE)
	le.PutUint16(b[6:], r.HSQSIZE)
	le.PutUint16(b[8:], r.CNTLID)
	return b
}

// ParseCMRequest decodes a connection request's private data. Transports
// may pad private data, so b may be longer than 32 bytes. A short b or a
// RECFMT other than 0 is a *CMRejectError (invalid length, invalid RECFMT);
// checking QID and the sizes against the target's limits is the binding's
// job (invalid QID, HSQSIZE, HRQSIZE).
func ParseCMRequest(b []byte) (CMRequest, error) {
	if len(b) < CMRequestSize {
		return CMRequest{}, &CMRejectError{Status: CMRejectInvalidLength,
			Detail: fmt.Sprintf("request private data is %d bytes, want %d", len(b), CMRequestSize)}
	}
	r := CMRequest{
		RECFMT:  le.Uint16(b[0:]),
		QID:     le.Uint16(b[2:]),
		HRQSIZE: le.Uint16(b[4:]),
		HSQSIZE: le.Uint16(b[6:]),
		CNTLID:  le.Uint16(b[8:]),
	}
	if r.RECFMT != 0 {
		return r, &CMRejectError{Status: CMRejectInvalidRECFMT, Detail: fmt.Sprintf("request RECFMT %d", r.RECFMT)}
	}
	return r, nil
}

// CMAccept is the target's accept private data (32 bytes).
type CMAccept struct {
	RECFMT  uint16 // @0 record format, 0
	CRQSIZE uint16 // @2 controller receive queue size (nvmet: HSQSIZE+1)
}

// Marshal returns the 32-byte private data.
func (a *CMAccept) Marshal() []byte {
	b := make([]byte, CMAcceptSize)
	le.PutUint16(b[0:], a.RECFMT)
	le.PutUint16(b[2:], a.CRQSIZE)
	return b
}

// ParseCMAccept decodes accept private data (at least 32 bytes; RECFMT 0).
func ParseCMAccept(b []byte) (CMAccept, error) {
	if len(b) < CMAcceptSize {
		return CMAccept{}, fmt.Errorf("nvme: rdma cm accept private data is %d bytes, want %d", len(b), CMAcceptSize)
	}
	a := CMAccept{RECFMT: le.Uint16(b[0:]), CRQSIZE: le.Uint16(b[2:])}
	if a.RECFMT != 0 {
		return a, fmt.Errorf("nvme: rdma cm accept RECFMT %d, want 0", a.RECFMT)
	}
	return a, nil
}

// CMReject is the target's reject private data (4 bytes).
type CMReject struct {
	RECFMT uint16         // @0
	Status CMRejectStatus // @2
}

// Marshal returns the 4-byte private data.
func (r *CMReject) Marshal() []byte {
	b := make([]byte, CMRejectSize)
	le.PutUint16(b[0:], r.RECFMT)
	le.PutUint16(b[2:], uint16(r.Status))
	return b
}

// ParseCMReject decodes reject private data (at least 4 bytes).
func ParseCMReject(b []byte) (CMReject, error) {
	if len(b) < CMRejectSize {
		return CMReject{}, fmt.Errorf("nvme: rdma cm reject private data is %d bytes, want %d", len(b), CMRejectSize)
	}
	return CMReject{RECFMT: le.Uint16(b[0:]), Status: CMRejectStatus(le.Uint16(b[2:]))}, nil
}

// Err is the reject as a *CMRejectError, for the connecting host.
func (r CMReject) Err() error {
	return &CMRejectError{Status: r.Status, Detail: "connection refused by the target"}
}
