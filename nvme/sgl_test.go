package nvme

import (
	"bytes"
	"errors"
	"testing"
)

func TestKeyedSGLLayout(t *testing.T) {
	d, err := KeyedSGL(0x1122334455667788, 0xabcdef, 0xdeadbeef)
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0xef, 0xcd, 0xab, 0xef, 0xbe, 0xad, 0xde, 0x40}
	if !bytes.Equal(d[:], want) {
		t.Fatalf("keyed SGL\n got % x\nwant % x", d[:], want)
	}
	if d.Address() != 0x1122334455667788 || d.Length() != 0xabcdef || d.Key() != 0xdeadbeef ||
		!d.Keyed() || d.InvalidateKey() || d.Type() != SGLTypeKeyedDataBlock || d.Subtype() != SGLSubtypeAddress {
		t.Errorf("accessors: %v", d)
	}
	inv, err := KeyedSGLInvalidate(0x1000, 4096, 7)
	if err != nil || inv[15] != 0x4f || !inv.InvalidateKey() || inv.Subtype() != SGLSubtypeInvalidateKey || inv.Key() != 7 {
		t.Errorf("invalidate form: %v %v", inv, err)
	}
	if _, err := KeyedSGL(0, MaxKeyedSGLLength+1, 1); err == nil {
		t.Error("keyed length beyond 24 bits accepted")
	}
	if d, err := KeyedSGL(0, MaxKeyedSGLLength, 1); err != nil || d.Length() != MaxKeyedSGLLength {
		t.Errorf("max keyed length: %d, %v", d.Length(), err)
	}
}

func TestUnkeyedSGLLayout(t *testing.T) {
	d := InCapsuleSGL(16, 0x01020304)
	want := []byte{16, 0, 0, 0, 0, 0, 0, 0, 4, 3, 2, 1, 0, 0, 0, 0x01}
	if !bytes.Equal(d[:], want) {
		t.Fatalf("in-capsule SGL\n got % x\nwant % x", d[:], want)
	}
	if !d.InCapsule() || d.Keyed() || d.Key() != 0 || d.Length() != 0x01020304 || d.Address() != 16 {
		t.Errorf("accessors: %v", d)
	}
	tr := TransportSGL(8192)
	if tr[15] != 0x5a || !tr.Transport() || tr.Length() != 8192 {
		t.Errorf("transport SGL: %v", tr)
	}
	n := NullSGL()
	if n[15] != 0x40 || n.Length() != 0 || !isZero(n[:15]) {
		t.Errorf("null SGL: % x", n[:])
	}
}

func TestSGLValidate(t *testing.T) {
	for _, id := range []uint8{0x40, 0x4f, 0x01, 0x5a} {
		d := SGLDescriptor{15: id}
		if err := d.Validate(); err != nil {
			t.Errorf("0x%02x rejected: %v", id, err)
		}
	}
	for _, id := range []uint8{0x00, 0x10, 0x20, 0x30, 0x31, 0x41, 0x4a, 0x50, 0x60, 0xf0, 0x0a} {
		d := SGLDescriptor{15: id}
		err := d.Validate()
		var se *StatusError
		if !errors.As(err, &se) || se.Status != StatusSGLDescriptorTypeInvalid.WithDNR() {
			t.Errorf("0x%02x: %v, want SGL descriptor type invalid with DNR", id, err)
		}
	}
}

func TestDescriptions(t *testing.T) {
	k, _ := KeyedSGLInvalidate(0x1000, 512, 0xab)
	cases := map[string]string{
		k.String():                                         "keyed{addr 0x1000 len 512 key 0xab invalidate}",
		InCapsuleSGL(16, 32).String():                      "in-capsule{offset 16 len 32}",
		TransportSGL(8).String():                           "transport{len 8}",
		SGLDescriptor{15: 0x30}.String():                   "sgl{type 0x3 subtype 0x0 addr 0x0 len 0}",
		FabricsConnect.String():                            "connect",
		FabricsType(0x42).String():                         "fabrics type 0x42",
		ControllerToHost.String():                          "controller to host",
		Bidirectional.String():                             "bidirectional",
		(&StatusError{Status: StatusInvalidField}).Error(): "nvme: invalid field in command (SCT 0 SC 0x02)",
	}
	for got, want := range cases {
		if got != want {
			t.Errorf("%q, want %q", got, want)
		}
	}
	if k.ID() != 0x4f {
		t.Errorf("ID 0x%x", k.ID())
	}
}
