package nvme

import (
	"errors"
	"fmt"
	"io"
	"testing"
)

func TestStatusPacking(t *testing.T) {
	// STATUS u16 = DNR<<15 | M<<14 | CRD<<12 | SCT<<9 | SC<<1 (bit 0: phase).
	cases := []struct {
		name string
		got  Status
		want uint16
	}{
		{"success", StatusSuccess, 0x0000},
		{"invalid opcode DNR", StatusInvalidOpcode.WithDNR(), 1<<15 | 0<<9 | 0x01<<1},
		{"invalid field DNR", StatusInvalidField.WithDNR(), 0x8004},
		{"LBA out of range DNR", StatusLBAOutOfRange.WithDNR(), 1<<15 | 0<<9 | 0x80<<1},
		{"data SGL length invalid DNR", StatusDataSGLLengthInvalid.WithDNR(), 0x801e},
		{"SGL descriptor type invalid DNR", StatusSGLDescriptorTypeInvalid.WithDNR(), 0x8022},
		{"SGL offset invalid DNR", StatusSGLOffsetInvalid.WithDNR(), 0x802c},
		{"connect invalid parameters DNR", StatusConnectInvalidParameters.WithDNR(), 1<<15 | 1<<9 | 0x82<<1},
		{"connect invalid host DNR", StatusConnectInvalidHost.WithDNR(), 0x8308},
		{"controller busy", StatusControllerBusy, 1<<9 | 0x81<<1},
		{"invalid log page", StatusInvalidLogPage, 0x0212},
		{"unrecovered read error", StatusUnrecoveredReadError, 2<<9 | 0x81<<1},
		{"host pathing error", StatusHostPathingError, 3<<9 | 0x70<<1},
		{"transient transport error CRD 1", StatusTransientTransportError.WithCRD(1), 1<<12 | 0x22<<1},
		{"internal error More DNR", StatusInternalError.WithMore().WithDNR(), 1<<15 | 1<<14 | 0x06<<1},
	}
	for _, c := range cases {
		if uint16(c.got) != c.want {
			t.Errorf("%s: 0x%04x, want 0x%04x", c.name, uint16(c.got), c.want)
		}
	}
	s := NewStatus(SCTCommandSpecific, 0x82).WithDNR().WithCRD(3).WithMore()
	if s.SCT() != SCTCommandSpecific || s.SC() != 0x82 || !s.DNR() || !s.More() || s.CRD() != 3 {
		t.Errorf("accessors of 0x%04x: SCT %d SC 0x%x DNR %v More %v CRD %d", uint16(s), s.SCT(), s.SC(), s.DNR(), s.More(), s.CRD())
	}
	if s.Code() != StatusConnectInvalidParameters {
		t.Errorf("Code() = 0x%04x, want 0x%04x", uint16(s.Code()), uint16(StatusConnectInvalidParameters))
	}
	if s.WithCRD(0).CRD() != 0 {
		t.Errorf("WithCRD(0) kept CRD %d", s.WithCRD(0).CRD())
	}
	if !StatusSuccess.OK() || StatusInvalidField.OK() || !StatusSuccess.WithDNR().OK() {
		t.Error("OK() wrong")
	}
}

func TestStatusString(t *testing.T) {
	cases := map[Status]string{
		StatusLBAOutOfRange.WithDNR():                       "LBA out of range (SCT 0 SC 0x80, DNR)",
		StatusSuccess:                                       "success (SCT 0 SC 0x00)",
		StatusConnectInvalidHost:                            "connect invalid host (SCT 1 SC 0x84)",
		StatusTransientTransportError.WithCRD(2).WithMore(): "transient transport error (SCT 0 SC 0x22, More, CRD 2)",
		NewStatus(SCTVendorSpecific, 0xab).WithDNR():        "unknown status (SCT 7 SC 0xAB, DNR)",
		StatusSGLDescriptorTypeInvalid.WithDNR():            "SGL descriptor type invalid (SCT 0 SC 0x11, DNR)",
	}
	for s, want := range cases {
		if got := s.String(); got != want {
			t.Errorf("0x%04x: %q, want %q", uint16(s), got, want)
		}
	}
	if got := fmt.Sprint(StatusInvalidOpcode); got != "invalid command opcode (SCT 0 SC 0x01)" {
		t.Errorf("fmt.Sprint = %q", got)
	}
}

func TestStatusErrorMatching(t *testing.T) {
	cause := io.ErrUnexpectedEOF
	var err error = Errorf(StatusLBAOutOfRange.WithDNR(), "read of namespace %d: %w", 1, cause)
	wrapped := fmt.Errorf("queue 3: %w", err)

	if !errors.Is(wrapped, StatusLBAOutOfRange) {
		t.Error("errors.Is(err, StatusLBAOutOfRange) is false for a DNR status")
	}
	if errors.Is(wrapped, StatusInvalidField) {
		t.Error("errors.Is matched a different status")
	}
	if !errors.Is(wrapped, cause) {
		t.Error("errors.Is does not reach the cause")
	}
	var se *StatusError
	if !errors.As(wrapped, &se) || se.Status != StatusLBAOutOfRange.WithDNR() {
		t.Fatalf("errors.As *StatusError: %v", se)
	}
	var st Status
	if !errors.As(wrapped, &st) || st != StatusLBAOutOfRange.WithDNR() {
		t.Errorf("errors.As Status: 0x%04x", uint16(st))
	}
	want := "nvme: read of namespace 1: unexpected EOF: LBA out of range (SCT 0 SC 0x80, DNR)"
	if se.Error() != want {
		t.Errorf("Error() = %q, want %q", se.Error(), want)
	}
	// A bare Status as an error matches too.
	if !errors.Is(fmt.Errorf("x: %w", StatusInvalidOpcode.WithDNR()), StatusInvalidOpcode) {
		t.Error("bare Status does not match by code")
	}
}

func TestStatusOf(t *testing.T) {
	cases := []struct {
		err  error
		want Status
	}{
		{nil, StatusSuccess},
		{Errorf(StatusInvalidField.WithDNR(), "x"), StatusInvalidField.WithDNR()},
		{fmt.Errorf("wrapped: %w", StatusCapacityExceeded), StatusCapacityExceeded},
		{io.EOF, StatusInternalError},
	}
	for _, c := range cases {
		if got := StatusOf(c.err); got != c.want {
			t.Errorf("StatusOf(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
