package nvme

import (
	"fmt"
	"time"
)

// FeatureID is the feature identifier (FID) of Set/Get Features.
type FeatureID uint8

// Features.
const (
	FeatureArbitration          FeatureID = 0x01
	FeaturePowerManagement      FeatureID = 0x02
	FeatureTemperatureThreshold FeatureID = 0x04
	FeatureErrorRecovery        FeatureID = 0x05
	FeatureVolatileWriteCache   FeatureID = 0x06
	FeatureNumberOfQueues       FeatureID = 0x07
	FeatureInterruptCoalescing  FeatureID = 0x08
	FeatureWriteAtomicity       FeatureID = 0x0a
	FeatureAsyncEventConfig     FeatureID = 0x0b
	FeatureTimestamp            FeatureID = 0x0e
	FeatureKeepAliveTimer       FeatureID = 0x0f
	FeatureHostIdentifier       FeatureID = 0x81
)

// FeatureSelect is the SEL field of Get Features (CDW10 bits 10:8).
type FeatureSelect uint8

// Feature selects.
const (
	SelectCurrent   FeatureSelect = 0
	SelectDefault   FeatureSelect = 1
	SelectSaved     FeatureSelect = 2
	SelectSupported FeatureSelect = 3 // supported capabilities
)

// FeatureParams are the Set/Get Features fields.
type FeatureParams struct {
	FID    FeatureID     // CDW10 bits 7:0
	Save   bool          // Set Features: CDW10 bit 31 (SV)
	Select FeatureSelect // Get Features: CDW10 bits 10:8 (SEL)
	Value  uint32        // CDW11: the feature's value (Set) or argument (Get)
}

// SetFeaturesCommand sets feature fid to value (CDW11). save asks for the
// value to persist across resets (SV).
func SetFeaturesCommand(fid FeatureID, value uint32, save bool) Command {
	c := Command{Opcode: AdminSetFeatures, Flags: FlagsSGL, DPTR: NullSGL(), CDW10: uint32(fid), CDW11: value}
	if save {
		c.CDW10 |= 1 << 31
	}
	return c
}

// GetFeaturesCommand reads feature fid; the value comes back in DW0. arg is
// CDW11 (feature specific, usually 0).
func GetFeaturesCommand(fid FeatureID, sel FeatureSelect, arg uint32) Command {
	return Command{Opcode: AdminGetFeatures, Flags: FlagsSGL, DPTR: NullSGL(),
		CDW10: uint32(fid) | uint32(sel&7)<<8, CDW11: arg}
}

// Features decodes the Set/Get Features fields of c.
func (c *Command) Features() FeatureParams {
	return FeatureParams{
		FID:    FeatureID(c.CDW10),
		Save:   c.CDW10&(1<<31) != 0,
		Select: FeatureSelect(c.CDW10>>8) & 7,
		Value:  c.CDW11,
	}
}

// MaxQueueCount is the largest number of I/O queues Number of Queues can
// request (0's based 0xFFFE; 0xFFFF is invalid).
const MaxQueueCount = 0xffff

// NumberOfQueues is the value of feature 0x07: counts of I/O submission and
// completion queues, 1's based here (the wire carries count-1: NSQR in bits
// 15:0, NCQR in bits 31:16 of CDW11 and of DW0).
type NumberOfQueues struct {
	Submission int
	Completion int
}

// Encode returns the CDW11/DW0 value. Each count must be 1..MaxQueueCount.
func (q NumberOfQueues) Encode() (uint32, error) {
	if q.Submission < 1 || q.Submission > MaxQueueCount || q.Completion < 1 || q.Completion > MaxQueueCount {
		return 0, fmt.Errorf("nvme: number of queues %d/%d outside 1..%d", q.Submission, q.Completion, MaxQueueCount)
	}
	return uint32(q.Submission-1) | uint32(q.Completion-1)<<16, nil
}

// DecodeNumberOfQueues decodes CDW11 or DW0. A 0's based value of 0xFFFF is
// Invalid Field in Command (DNR).
func DecodeNumberOfQueues(v uint32) (NumberOfQueues, error) {
	nsqr, ncqr := v&0xffff, v>>16
	if nsqr == 0xffff || ncqr == 0xffff {
		return NumberOfQueues{}, Errorf(StatusInvalidField.WithDNR(), "number of queues 0x%08x requests 65536 queues", v)
	}
	return NumberOfQueues{Submission: int(nsqr) + 1, Completion: int(ncqr) + 1}, nil
}

// IOQueues is how many I/O queue pairs the counts allow.
func (q NumberOfQueues) IOQueues() int { return min(q.Submission, q.Completion) }

// KeepAliveTimeoutValue is the KATO value (milliseconds, rounded up) for d,
// as carried by Set Features 0x0F CDW11 and by Connect.
func KeepAliveTimeoutValue(d time.Duration) uint32 {
	if d <= 0 {
		return 0
	}
	ms := (d + time.Millisecond - 1) / time.Millisecond
	if ms > 0xffffffff {
		return 0xffffffff
	}
	return uint32(ms)
}

// KeepAliveTimeout is the duration of a KATO value; 0 means disabled.
func KeepAliveTimeout(kato uint32) time.Duration { return time.Duration(kato) * time.Millisecond }

// VolatileWriteCacheValue is the CDW11/DW0 value of feature 0x06 (WCE bit 0).
func VolatileWriteCacheValue(enabled bool) uint32 {
	if enabled {
		return 1
	}
	return 0
}

// VolatileWriteCacheEnabled decodes feature 0x06.
func VolatileWriteCacheEnabled(v uint32) bool { return v&1 != 0 }

// AsyncEventConfig is the value of feature 0x0B: which events may complete
// an Async Event Request.
type AsyncEventConfig uint32

// Async event configuration bits.
const (
	AECSMARTWarnings      AsyncEventConfig = 0xff // critical warning bits of the health log
	AECNamespaceAttribute AsyncEventConfig = 1 << 8
	AECFirmwareActivation AsyncEventConfig = 1 << 9
	AECTelemetryLog       AsyncEventConfig = 1 << 10
	AECANAChange          AsyncEventConfig = 1 << 11
	AECPredictableLatency AsyncEventConfig = 1 << 12
	AECLBAStatus          AsyncEventConfig = 1 << 13
	AECEnduranceGroup     AsyncEventConfig = 1 << 14
	AECDiscoveryLogChange AsyncEventConfig = 1 << 31
)

// Check returns Invalid Field in Command (DNR) if c enables events outside
// supported, as nvmet does.
func (c AsyncEventConfig) Check(supported AsyncEventConfig) error {
	if extra := c &^ supported; extra != 0 {
		return Errorf(StatusInvalidField.WithDNR(), "async event configuration 0x%08x enables unsupported events 0x%08x", uint32(c), uint32(extra))
	}
	return nil
}

// KeepAliveCommand builds a Keep Alive command.
func KeepAliveCommand() Command {
	return Command{Opcode: AdminKeepAlive, Flags: FlagsSGL, DPTR: NullSGL()}
}

// AsyncEventRequestCommand builds an Asynchronous Event Request; the
// controller holds it until an event occurs.
func AsyncEventRequestCommand() Command {
	return Command{Opcode: AdminAsyncEventRequest, Flags: FlagsSGL, DPTR: NullSGL()}
}

// Async event types.
const (
	AsyncEventError        uint8 = 0
	AsyncEventSMART        uint8 = 1
	AsyncEventNotice       uint8 = 2
	AsyncEventIOCommandSet uint8 = 6
	AsyncEventVendor       uint8 = 7
)

// Async event information for notices.
const (
	NoticeNamespaceAttributeChanged uint8 = 0x00
	NoticeFirmwareActivation        uint8 = 0x01
	NoticeTelemetryLog              uint8 = 0x02
	NoticeANAChange                 uint8 = 0x03
	NoticeDiscoveryLogChange        uint8 = 0xf0
)

// AsyncEvent is DW0 of a completed Async Event Request.
type AsyncEvent struct {
	Type uint8     // bits 2:0
	Info uint8     // bits 15:8
	Log  LogPageID // bits 23:16: the log to read (with RAE clear) to rearm
}

// DW0 encodes the event.
func (e AsyncEvent) DW0() uint32 {
	return uint32(e.Type&7) | uint32(e.Info)<<8 | uint32(e.Log)<<16
}

// DecodeAsyncEvent decodes DW0 of a completed Async Event Request.
func DecodeAsyncEvent(dw0 uint32) AsyncEvent {
	return AsyncEvent{Type: uint8(dw0 & 7), Info: uint8(dw0 >> 8), Log: LogPageID(dw0 >> 16)}
}
