package nvme

import (
	"strings"
	"testing"
)

func TestValidateNQN(t *testing.T) {
	good := []string{
		DiscoveryNQN,
		"nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6",
		"nqn.2024-01.io.nprdma:subsys1",
		"nqn.2016-06.io.spdk:cnode1",
		"nqn.2014-08.com.example:nvme.host.sys.xyz",
		"nqn.2019-12.com.2ndquadrant-x:a:b",
		"nqn.2024-01.io.nprdma:" + strings.Repeat("a", MaxNQNLength-len("nqn.2024-01.io.nprdma:")),
	}
	for _, n := range good {
		if err := ValidateNQN(n); err != nil {
			t.Errorf("%q: %v", n, err)
		}
	}
	bad := []string{
		"",
		"nqn.2024-01.io.nprdma:" + strings.Repeat("a", MaxNQNLength-len("nqn.2024-01.io.nprdma:")+1),
		"iqn.2024-01.io.nprdma:x",
		"nqn.24-01.io.nprdma:x",
		"nqn.2024-13.io.nprdma:x",
		"nqn.2024-00.io.nprdma:x",
		"nqn.2024-01.io.nprdma",
		"nqn.2024-01.io.nprdma:",
		"nqn.2024-01.:x",
		"nqn.2024-01.io..nprdma:x",
		"nqn.2024-01.-io.nprdma:x",
		"nqn.2024-01.io_x.nprdma:x",
		"nqn.2014-08.org.nvmexpress:uuid:not-a-uuid",
		"nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bfz",
		"nqn.2024-01.io.nprdma:a\x00b",
		"nqn.2024-01.io.nprdma:\xff",
	}
	for _, n := range bad {
		if err := ValidateNQN(n); err == nil {
			t.Errorf("%q accepted", n)
		}
	}
}

func TestHostNQN(t *testing.T) {
	u, err := ParseUUID("F81D4FAE-7DEC-11D0-A765-00A0C91E6BF6")
	if err != nil {
		t.Fatal(err)
	}
	nqn := HostNQNFromUUID(u)
	if nqn != "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6" {
		t.Fatalf("host NQN %q", nqn)
	}
	if err := ValidateNQN(nqn); err != nil {
		t.Error(err)
	}
	if back, ok := UUIDFromNQN(nqn); !ok || back != u {
		t.Errorf("UUIDFromNQN: %v %v", back, ok)
	}
	if _, ok := UUIDFromNQN("nqn.2024-01.io.nprdma:x"); ok {
		t.Error("UUID from a non-UUID NQN")
	}
	a, b := NewUUID(), NewUUID()
	if a == b || a[6]>>4 != 4 || a[8]>>6 != 2 {
		t.Errorf("NewUUID: %v %v", a, b)
	}
	if err := ValidateNQN(HostNQNFromUUID(a)); err != nil {
		t.Error(err)
	}
}
