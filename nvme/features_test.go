package nvme

import (
	"testing"
	"time"
)

func TestFeaturesCommands(t *testing.T) {
	s := SetFeaturesCommand(FeatureKeepAliveTimer, 5000, true)
	if s.Opcode != AdminSetFeatures || s.CDW10 != 1<<31|0x0f || s.CDW11 != 5000 {
		t.Fatalf("set: CDW10 0x%x CDW11 %d", s.CDW10, s.CDW11)
	}
	if p := s.Features(); p != (FeatureParams{FID: FeatureKeepAliveTimer, Save: true, Value: 5000}) {
		t.Errorf("set params %+v", p)
	}
	g := GetFeaturesCommand(FeatureVolatileWriteCache, SelectSupported, 0)
	if g.Opcode != AdminGetFeatures || g.CDW10 != 3<<8|0x06 {
		t.Fatalf("get: CDW10 0x%x", g.CDW10)
	}
	if p := g.Features(); p.FID != FeatureVolatileWriteCache || p.Select != SelectSupported || p.Save {
		t.Errorf("get params %+v", p)
	}
}

func TestNumberOfQueues(t *testing.T) {
	v, err := NumberOfQueues{Submission: 4, Completion: 2}.Encode()
	if err != nil || v != 0x0001_0003 {
		t.Fatalf("encode: 0x%x %v", v, err)
	}
	q, err := DecodeNumberOfQueues(0x0001_0003)
	if err != nil || q != (NumberOfQueues{Submission: 4, Completion: 2}) || q.IOQueues() != 2 {
		t.Fatalf("decode: %+v %v", q, err)
	}
	if q, err := DecodeNumberOfQueues(0); err != nil || q.IOQueues() != 1 {
		t.Errorf("0 (one queue each): %+v %v", q, err)
	}
	for _, bad := range []uint32{0xffff, 0xffff_0000} {
		if _, err := DecodeNumberOfQueues(bad); StatusOf(err) != StatusInvalidField.WithDNR() {
			t.Errorf("0x%x: %v", bad, err)
		}
	}
	for _, bad := range []NumberOfQueues{{0, 1}, {1, 0}, {65536, 1}} {
		if _, err := bad.Encode(); err == nil {
			t.Errorf("%+v encoded", bad)
		}
	}
	if v, _ := (NumberOfQueues{Submission: 65535, Completion: 65535}).Encode(); v != 0xfffe_fffe {
		t.Errorf("max: 0x%x", v)
	}
}

func TestKeepAliveAndVWC(t *testing.T) {
	if KeepAliveTimeoutValue(5*time.Second) != 5000 || KeepAliveTimeoutValue(1500*time.Microsecond) != 2 ||
		KeepAliveTimeoutValue(0) != 0 || KeepAliveTimeoutValue(-time.Second) != 0 {
		t.Error("KeepAliveTimeoutValue")
	}
	if KeepAliveTimeout(5000) != 5*time.Second {
		t.Error("KeepAliveTimeout")
	}
	if VolatileWriteCacheValue(true) != 1 || VolatileWriteCacheValue(false) != 0 ||
		!VolatileWriteCacheEnabled(1) || VolatileWriteCacheEnabled(2) {
		t.Error("VWC")
	}
	ka := KeepAliveCommand()
	if ka.Opcode != 0x18 || ka.Direction() != NoData {
		t.Errorf("keep alive %+v", ka)
	}
	if AsyncEventRequestCommand().Opcode != 0x0c {
		t.Error("AER opcode")
	}
}

func TestAsyncEvents(t *testing.T) {
	supported := AECSMARTWarnings | AECNamespaceAttribute
	if err := (AECNamespaceAttribute | 0x01).Check(supported); err != nil {
		t.Error(err)
	}
	if err := (AECANAChange).Check(supported); StatusOf(err) != StatusInvalidField.WithDNR() {
		t.Errorf("unsupported event: %v", err)
	}
	e := AsyncEvent{Type: AsyncEventNotice, Info: NoticeNamespaceAttributeChanged, Log: LogChangedNamespaces}
	if e.DW0() != 0x0004_0002 {
		t.Errorf("DW0 0x%x", e.DW0())
	}
	if DecodeAsyncEvent(0x0070_f002) != (AsyncEvent{Type: 2, Info: 0xf0, Log: LogDiscovery}) {
		t.Error("decode discovery notice")
	}
}
