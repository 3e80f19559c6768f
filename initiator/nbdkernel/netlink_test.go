package nbdkernel

import (
	"bytes"
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// The encoding of NBD_CMD_CONNECT's sockets: nested items, each padded to 4
// bytes, as the kernel's nla_for_each_nested walks them.
func TestAttributesRoundTrip(t *testing.T) {
	attrs := []attr{attrU32(attrIndex, 7), attrString(attrBackendID, "nprdma:d"), sockets([]int{3, 4}), attrU64(attrSizeBytes, 1<<40)}
	b := appendAttrs(nil, attrs)
	want := []byte{
		8, 0, 1, 0, 7, 0, 0, 0, // index
		13, 0, 10, 0, 'n', 'p', 'r', 'd', 'm', 'a', ':', 'd', 0, 0, 0, 0, // backend id, padded
		28, 0, 7, 0, // sockets
		12, 0, 1, 0, 8, 0, 1, 0, 3, 0, 0, 0, // item: fd 3
		12, 0, 1, 0, 8, 0, 1, 0, 4, 0, 0, 0, // item: fd 4
		12, 0, 2, 0, 0, 0, 0, 0, 0, 1, 0, 0, // size
	}
	if !bytes.Equal(b, want) {
		t.Fatalf("encoded\n% x\nwant\n% x", b, want)
	}
	got, err := parseAttrs(b)
	if err != nil || len(got) != 4 {
		t.Fatalf("parsed %d attributes: %v", len(got), err)
	}
	if v, err := got[0].u32(); v != 7 || err != nil {
		t.Fatalf("index %d, %v", v, err)
	}
	items, err := parseAttrs(got[2].value)
	if err != nil || len(items) != 2 {
		t.Fatalf("socket items %+v, %v", items, err)
	}
	for i, it := range items {
		fd, err := parseAttrs(it.value)
		if err != nil || len(fd) != 1 || fd[0].typ != sockFD {
			t.Fatalf("item %d: %+v, %v", i, fd, err)
		}
		if v, _ := fd[0].u32(); v != uint32(3+i) {
			t.Fatalf("item %d: fd %d", i, v)
		}
	}
	if _, err := got[3].u32(); err == nil {
		t.Fatal("a 64-bit attribute read as 32 bits")
	}
}

func TestParseRejectsBadLengths(t *testing.T) {
	for name, b := range map[string][]byte{
		"short header":      {8, 0, 1},
		"length too small":  {2, 0, 1, 0},
		"length past end":   {12, 0, 1, 0, 1, 2, 3, 4},
		"message past end":  {64, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		"message too small": {8, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
	} {
		_, aerr := parseAttrs(b)
		_, merr := parseMessages(b)
		if aerr == nil && merr == nil {
			t.Errorf("%s: both parsers accepted % x", name, b)
		}
	}
}

// The generic netlink controller answers on any Linux: the family ID of
// nlctrl is its own, and a family that is not there is ENOENT.
func TestFamilyID(t *testing.T) {
	g, err := openGenl()
	if err != nil {
		t.Skipf("no generic netlink here: %v", err)
	}
	defer g.close()
	if id, err := g.familyID("nlctrl"); err != nil || id != genlIDCtrl {
		t.Fatalf("nlctrl: %d, %v", id, err)
	}
	if _, err := g.familyID("nprdma-nothing"); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("a missing family: %v, want ENOENT", err)
	}
}

// FuzzParseMessages feeds the reply parsers arbitrary datagrams: no panic,
// and everything parsed lies within the input.
func FuzzParseMessages(f *testing.F) {
	msg := func(typ uint16, payload []byte) []byte {
		b := ne.AppendUint32(nil, uint32(nlmsgHdrSize+len(payload)))
		b = ne.AppendUint16(b, typ)
		b = ne.AppendUint16(b, 0)
		b = ne.AppendUint32(b, 1)
		b = ne.AppendUint32(b, 0)
		return append(b, payload...)
	}
	f.Add(msg(0x20, append([]byte{1, 1, 0, 0}, appendAttrs(nil, []attr{attrU32(attrIndex, 3)})...)))
	f.Add(append(msg(unix.NLMSG_ERROR, make([]byte, 20)), msg(unix.NLMSG_DONE, nil)...))
	f.Add(msg(0x10, append([]byte{1, 2, 0, 0}, appendAttrs(nil, []attr{{typ: 2, value: []byte{0x20, 0}}, sockets([]int{5})})...)))
	f.Fuzz(func(t *testing.T, b []byte) {
		msgs, err := parseMessages(b)
		if err != nil {
			return
		}
		total := 0
		for _, m := range msgs {
			total += nlmsgHdrSize + len(m.payload)
			if len(m.payload) < genlHdrSize {
				continue
			}
			attrs, err := parseAttrs(m.payload[genlHdrSize:])
			if err != nil {
				continue
			}
			for _, a := range attrs {
				if len(a.value) > len(m.payload) {
					t.Fatalf("attribute of %d bytes in a payload of %d", len(a.value), len(m.payload))
				}
				parseAttrs(a.value)
			}
		}
		if total > len(b) {
			t.Fatalf("messages of %d bytes parsed from %d", total, len(b))
		}
	})
}
