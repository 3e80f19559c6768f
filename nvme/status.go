package nvme

import (
	"errors"
	"fmt"
	"strings"
)

// Status is the status field of a completion as it sits in CQE bytes 14-15,
// without the phase tag: SC bits 8:1, SCT bits 11:9, CRD bits 13:12, More
// bit 14, DNR bit 15. Bit 0 (phase) is always zero in a Status; the phase
// lives in Completion.Phase.
//
// Status implements error so that a controller may return a bare status; a
// *StatusError adds a description and a result value. The named constants
// carry no DNR/CRD/More bits; add them with WithDNR, WithCRD and WithMore.
type Status uint16

// StatusCodeType is the SCT field.
type StatusCodeType uint8

// Status code types.
const (
	SCTGeneric         StatusCodeType = 0
	SCTCommandSpecific StatusCodeType = 1
	SCTMediaError      StatusCodeType = 2
	SCTPathRelated     StatusCodeType = 3
	SCTVendorSpecific  StatusCodeType = 7
)

const (
	sct0 Status = 0 << 9
	sct1 Status = 1 << 9
	sct2 Status = 2 << 9
	sct3 Status = 3 << 9

	statusMoreBit = 1 << 14
	statusDNRBit  = 1 << 15
	statusCRDMask = 3 << 12
	statusCode    = 0x0ffe // SCT and SC
)

// NewStatus packs a status code type and status code.
func NewStatus(sct StatusCodeType, sc uint8) Status {
	return Status(uint16(sct&7)<<9 | uint16(sc)<<1)
}

// Generic command statuses (SCT 0), including the NVM command set's 0x80+.
const (
	StatusSuccess                     Status = sct0 | 0x00<<1
	StatusInvalidOpcode               Status = sct0 | 0x01<<1
	StatusInvalidField                Status = sct0 | 0x02<<1
	StatusCommandIDConflict           Status = sct0 | 0x03<<1
	StatusDataTransferError           Status = sct0 | 0x04<<1
	StatusAbortedPowerLoss            Status = sct0 | 0x05<<1
	StatusInternalError               Status = sct0 | 0x06<<1
	StatusAbortRequested              Status = sct0 | 0x07<<1
	StatusAbortedSQDeleted            Status = sct0 | 0x08<<1
	StatusInvalidNamespaceOrFormat    Status = sct0 | 0x0b<<1
	StatusCommandSequenceError        Status = sct0 | 0x0c<<1
	StatusInvalidSGLSegmentDescriptor Status = sct0 | 0x0d<<1
	StatusInvalidNumberOfSGLDescs     Status = sct0 | 0x0e<<1
	StatusDataSGLLengthInvalid        Status = sct0 | 0x0f<<1
	StatusMetadataSGLLengthInvalid    Status = sct0 | 0x10<<1
	StatusSGLDescriptorTypeInvalid    Status = sct0 | 0x11<<1
	StatusSGLOffsetInvalid            Status = sct0 | 0x16<<1
	StatusKeepAliveTimerExpired       Status = sct0 | 0x19<<1
	StatusKeepAliveTimeoutInvalid     Status = sct0 | 0x1a<<1
	StatusNamespaceWriteProtected     Status = sct0 | 0x20<<1
	StatusCommandInterrupted          Status = sct0 | 0x21<<1
	StatusTransientTransportError     Status = sct0 | 0x22<<1
	StatusLBAOutOfRange               Status = sct0 | 0x80<<1
	StatusCapacityExceeded            Status = sct0 | 0x81<<1
	StatusNamespaceNotReady           Status = sct0 | 0x82<<1
)

// Command specific statuses (SCT 1). 0x80-0x84 and 0x91 are the Fabrics
// meanings; the NVM command set reuses 0x80-0x82 for I/O commands (conflicting
// attributes, invalid protection information, write to read-only range),
// which this package does not name because nothing here returns them.
const (
	StatusCompletionQueueInvalid    Status = sct1 | 0x00<<1
	StatusInvalidQueueIdentifier    Status = sct1 | 0x01<<1
	StatusInvalidQueueSize          Status = sct1 | 0x02<<1
	StatusAbortCommandLimitExceeded Status = sct1 | 0x03<<1
	StatusAsyncEventLimitExceeded   Status = sct1 | 0x05<<1
	StatusInvalidLogPage            Status = sct1 | 0x09<<1
	StatusInvalidFormat             Status = sct1 | 0x0a<<1
	StatusFeatureNotSaveable        Status = sct1 | 0x0d<<1
	StatusFeatureNotChangeable      Status = sct1 | 0x0e<<1
	StatusConnectIncompatibleFormat Status = sct1 | 0x80<<1
	StatusControllerBusy            Status = sct1 | 0x81<<1
	StatusConnectInvalidParameters  Status = sct1 | 0x82<<1
	StatusConnectRestartDiscovery   Status = sct1 | 0x83<<1
	StatusConnectInvalidHost        Status = sct1 | 0x84<<1
	StatusAuthenticationRequired    Status = sct1 | 0x91<<1
)

// Media and data integrity errors (SCT 2).
const (
	StatusWriteFault           Status = sct2 | 0x80<<1
	StatusUnrecoveredReadError Status = sct2 | 0x81<<1
	StatusAccessDenied         Status = sct2 | 0x86<<1
)

// Path related statuses (SCT 3).
const (
	StatusInternalPathError      Status = sct3 | 0x00<<1
	StatusControllerPathingError Status = sct3 | 0x60<<1
	StatusHostPathingError       Status = sct3 | 0x70<<1
	StatusAbortedByHost          Status = sct3 | 0x71<<1
)

var statusNames = map[Status]string{
	StatusSuccess:                     "success",
	StatusInvalidOpcode:               "invalid command opcode",
	StatusInvalidField:                "invalid field in command",
	StatusCommandIDConflict:           "command ID conflict",
	StatusDataTransferError:           "data transfer error",
	StatusAbortedPowerLoss:            "commands aborted due to power loss notification",
	StatusInternalError:               "internal error",
	StatusAbortRequested:              "command abort requested",
	StatusAbortedSQDeleted:            "command aborted due to SQ deletion",
	StatusInvalidNamespaceOrFormat:    "invalid namespace or format",
	StatusCommandSequenceError:        "command sequence error",
	StatusInvalidSGLSegmentDescriptor: "invalid SGL segment descriptor",
	StatusInvalidNumberOfSGLDescs:     "invalid number of SGL descriptors",
	StatusDataSGLLengthInvalid:        "data SGL length invalid",
	StatusMetadataSGLLengthInvalid:    "metadata SGL length invalid",
	StatusSGLDescriptorTypeInvalid:    "SGL descriptor type invalid",
	StatusSGLOffsetInvalid:            "SGL offset invalid",
	StatusKeepAliveTimerExpired:       "keep alive timer expired",
	StatusKeepAliveTimeoutInvalid:     "keep alive timeout invalid",
	StatusNamespaceWriteProtected:     "namespace is write protected",
	StatusCommandInterrupted:          "command interrupted",
	StatusTransientTransportError:     "transient transport error",
	StatusLBAOutOfRange:               "LBA out of range",
	StatusCapacityExceeded:            "capacity exceeded",
	StatusNamespaceNotReady:           "namespace not ready",

	StatusCompletionQueueInvalid:    "completion queue invalid",
	StatusInvalidQueueIdentifier:    "invalid queue identifier",
	StatusInvalidQueueSize:          "invalid queue size",
	StatusAbortCommandLimitExceeded: "abort command limit exceeded",
	StatusAsyncEventLimitExceeded:   "asynchronous event request limit exceeded",
	StatusInvalidLogPage:            "invalid log page",
	StatusInvalidFormat:             "invalid format",
	StatusFeatureNotSaveable:        "feature identifier not saveable",
	StatusFeatureNotChangeable:      "feature not changeable",
	StatusConnectIncompatibleFormat: "connect incompatible format",
	StatusControllerBusy:            "controller busy",
	StatusConnectInvalidParameters:  "connect invalid parameters",
	StatusConnectRestartDiscovery:   "connect restart discovery",
	StatusConnectInvalidHost:        "connect invalid host",
	StatusAuthenticationRequired:    "authentication required",

	StatusWriteFault:           "write fault",
	StatusUnrecoveredReadError: "unrecovered read error",
	StatusAccessDenied:         "access denied",

	StatusInternalPathError:      "internal path error",
	StatusControllerPathingError: "controller pathing error",
	StatusHostPathingError:       "host pathing error",
	StatusAbortedByHost:          "command aborted by host",
}

// SCT is the status code type.
func (s Status) SCT() StatusCodeType { return StatusCodeType(s >> 9 & 7) }

// SC is the status code.
func (s Status) SC() uint8 { return uint8(s >> 1) }

// CRD is the command retry delay selector (0: none, 1-3: CRDT1-3 of
// Identify Controller).
func (s Status) CRD() uint8 { return uint8(s >> 12 & 3) }

// More reports the M bit (more information in the Error Information log).
func (s Status) More() bool { return s&statusMoreBit != 0 }

// DNR reports the Do Not Retry bit.
func (s Status) DNR() bool { return s&statusDNRBit != 0 }

// WithDNR returns s with Do Not Retry set.
func (s Status) WithDNR() Status { return s | statusDNRBit }

// WithMore returns s with the M bit set.
func (s Status) WithMore() Status { return s | statusMoreBit }

// WithCRD returns s with the command retry delay selector set to crd (0-3).
func (s Status) WithCRD(crd uint8) Status {
	return s&^statusCRDMask | Status(crd&3)<<12
}

// Code is s without DNR, More and CRD: the SCT and SC alone. Compare codes,
// not whole statuses.
func (s Status) Code() Status { return s & statusCode }

// OK reports whether s is a successful completion.
func (s Status) OK() bool { return s.Code() == StatusSuccess }

// Name is the specification's name of the status code, or "" if this
// package does not know it.
func (s Status) Name() string { return statusNames[s.Code()] }

// String is e.g. "LBA out of range (SCT 0 SC 0x80, DNR)".
func (s Status) String() string {
	var b strings.Builder
	name := s.Name()
	if name == "" {
		name = "unknown status"
	}
	fmt.Fprintf(&b, "%s (SCT %d SC 0x%02X", name, s.SCT(), s.SC())
	if s.DNR() {
		b.WriteString(", DNR")
	}
	if s.More() {
		b.WriteString(", More")
	}
	if crd := s.CRD(); crd != 0 {
		fmt.Fprintf(&b, ", CRD %d", crd)
	}
	b.WriteByte(')')
	return b.String()
}

// Error makes a Status usable as an error; it is the same text as String
// (fmt prefers Error, so the two must agree).
func (s Status) Error() string { return s.String() }

// Is matches another Status by code, ignoring DNR, More and CRD, so that
// errors.Is(err, nvme.StatusLBAOutOfRange) holds whatever retry bits err
// carries.
func (s Status) Is(target error) bool {
	t, ok := target.(Status)
	return ok && t.Code() == s.Code()
}

// StatusError is an error that carries the NVMe status to complete a
// command with. Controllers return it; initiators get it back from
// Completion.Err and errors.As it.
type StatusError struct {
	Status Status
	// Result is the command specific DW0 of the completion (for example the
	// IPO/IATTR of Connect Invalid Parameters).
	Result uint32
	// Detail says what was wrong, naming the object.
	Detail string
	// Err is an underlying cause, if any.
	Err error
}

// Errorf returns a *StatusError with a formatted detail. A %w verb in the
// format sets Err.
func Errorf(s Status, format string, args ...any) *StatusError {
	err := fmt.Errorf(format, args...)
	return &StatusError{Status: s, Detail: err.Error(), Err: errors.Unwrap(err)}
}

func (e *StatusError) Error() string {
	if e.Detail == "" {
		return "nvme: " + e.Status.String()
	}
	return "nvme: " + e.Detail + ": " + e.Status.String()
}

// Unwrap exposes the Status (so errors.Is(err, nvme.StatusX) and
// errors.As(err, &status) work) and the cause.
func (e *StatusError) Unwrap() []error {
	if e.Err != nil {
		return []error{e.Status, e.Err}
	}
	return []error{e.Status}
}

// StatusOf is the status to complete a command with after err: success for
// nil, the carried status for a *StatusError or Status, and Internal Error
// for anything else.
func StatusOf(err error) Status {
	if err == nil {
		return StatusSuccess
	}
	var se *StatusError
	if errors.As(err, &se) {
		return se.Status
	}
	var s Status
	if errors.As(err, &s) {
		return s
	}
	return StatusInternalError
}
