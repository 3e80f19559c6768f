package nbdkernel

// A minimal generic netlink client (golang.org/x/sys/unix, no external
// module): requests with attributes, their replies and acknowledgements,
// and the resolution of a family's ID through the nlctrl family. Netlink
// is in native byte order.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

const (
	nlmsgHdrSize = 16
	genlHdrSize  = 4
	nlaHdrSize   = 4

	genlIDCtrl         = 0x10 // GENL_ID_CTRL
	ctrlCmdGetFamily   = 3    // CTRL_CMD_GETFAMILY
	ctrlAttrFamilyID   = 1    // CTRL_ATTR_FAMILY_ID
	ctrlAttrFamilyName = 2    // CTRL_ATTR_FAMILY_NAME

	nlaTypeMask = 0x3fff // without NLA_F_NESTED and NLA_F_NET_BYTEORDER
)

var ne = binary.NativeEndian

// attr is one netlink attribute: a value, or nested attributes.
type attr struct {
	typ    uint16
	value  []byte
	nested []attr
}

func attrU32(typ uint16, v uint32) attr { return attr{typ: typ, value: ne.AppendUint32(nil, v)} }
func attrU64(typ uint16, v uint64) attr { return attr{typ: typ, value: ne.AppendUint64(nil, v)} }
func attrString(typ uint16, s string) attr {
	return attr{typ: typ, value: append([]byte(s), 0)}
}

func align4(n int) int { return (n + 3) &^ 3 }

// appendAttrs encodes attributes, each padded to 4 bytes.
func appendAttrs(b []byte, attrs []attr) []byte {
	for _, a := range attrs {
		start := len(b)
		b = append(b, 0, 0, 0, 0)
		if a.nested != nil {
			b = appendAttrs(b, a.nested)
		} else {
			b = append(b, a.value...)
		}
		ne.PutUint16(b[start:], uint16(len(b)-start))
		ne.PutUint16(b[start+2:], a.typ)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
	}
	return b
}

// parseAttrs decodes a run of attributes (their values alias b).
func parseAttrs(b []byte) ([]attr, error) {
	var out []attr
	for len(b) > 0 {
		if len(b) < nlaHdrSize {
			return nil, fmt.Errorf("netlink: %d bytes left, short of an attribute header", len(b))
		}
		n := int(ne.Uint16(b))
		if n < nlaHdrSize || n > len(b) {
			return nil, fmt.Errorf("netlink: attribute of length %d with %d bytes left", n, len(b))
		}
		out = append(out, attr{typ: ne.Uint16(b[2:]) & nlaTypeMask, value: b[nlaHdrSize:n]})
		b = b[min(align4(n), len(b)):]
	}
	return out, nil
}

func findAttr(attrs []attr, typ uint16) (attr, bool) {
	for _, a := range attrs {
		if a.typ == typ {
			return a, true
		}
	}
	return attr{}, false
}

func (a attr) u32() (uint32, error) {
	if len(a.value) != 4 {
		return 0, fmt.Errorf("netlink: attribute %d of %d bytes, want 4", a.typ, len(a.value))
	}
	return ne.Uint32(a.value), nil
}

func (a attr) u16() (uint16, error) {
	if len(a.value) != 2 {
		return 0, fmt.Errorf("netlink: attribute %d of %d bytes, want 2", a.typ, len(a.value))
	}
	return ne.Uint16(a.value), nil
}

// message is one netlink message of a reply.
type message struct {
	typ, flags uint16
	seq        uint32
	payload    []byte
}

// parseMessages splits a datagram into its messages (payloads alias b).
func parseMessages(b []byte) ([]message, error) {
	var out []message
	for len(b) > 0 {
		if len(b) < nlmsgHdrSize {
			return nil, fmt.Errorf("netlink: %d bytes left, short of a message header", len(b))
		}
		n := int(ne.Uint32(b))
		if n < nlmsgHdrSize || n > len(b) {
			return nil, fmt.Errorf("netlink: message of length %d with %d bytes left", n, len(b))
		}
		out = append(out, message{typ: ne.Uint16(b[4:]), flags: ne.Uint16(b[6:]), seq: ne.Uint32(b[8:]), payload: b[nlmsgHdrSize:n]})
		b = b[min(align4(n), len(b)):]
	}
	return out, nil
}

// genl is a generic netlink socket.
type genl struct {
	mu  sync.Mutex
	fd  int
	seq uint32
	buf []byte
}

func openGenl() (*genl, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_GENERIC)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	return &genl{fd: fd, buf: make([]byte, 64<<10)}, nil
}

func (g *genl) close() error { return unix.Close(g.fd) }

// request sends command cmd of family with attrs and returns the attributes
// of the replies that carry data (none for a plain acknowledgement). An
// error reply is returned as its errno.
func (g *genl) request(family uint16, cmd, version uint8, attrs []attr) ([][]attr, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.seq++
	msg := make([]byte, nlmsgHdrSize, 256)
	msg = append(msg, cmd, version, 0, 0)
	msg = appendAttrs(msg, attrs)
	ne.PutUint32(msg[0:], uint32(len(msg)))
	ne.PutUint16(msg[4:], family)
	ne.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	ne.PutUint32(msg[8:], g.seq)
	if err := unix.Sendto(g.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("netlink send: %w", err)
	}
	var replies [][]attr
	for {
		n, _, err := unix.Recvfrom(g.fd, g.buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("netlink receive: %w", err)
		}
		msgs, err := parseMessages(g.buf[:n])
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.seq != g.seq {
				continue // an answer to an earlier request given up on
			}
			switch m.typ {
			case unix.NLMSG_ERROR:
				if len(m.payload) < 4 {
					return nil, errors.New("netlink: short error message")
				}
				if code := int32(ne.Uint32(m.payload)); code != 0 {
					return nil, unix.Errno(-code)
				}
				return replies, nil // the acknowledgement ends the request
			case unix.NLMSG_DONE:
				return replies, nil
			case family:
				if len(m.payload) < genlHdrSize {
					return nil, errors.New("netlink: reply without its generic header")
				}
				// A copy: the next datagram (the acknowledgement) is
				// received into the same buffer.
				a, err := parseAttrs(bytes.Clone(m.payload[genlHdrSize:]))
				if err != nil {
					return nil, err
				}
				replies = append(replies, a)
			}
		}
	}
}

// familyID resolves a generic netlink family's ID by name.
func (g *genl) familyID(name string) (uint16, error) {
	replies, err := g.request(genlIDCtrl, ctrlCmdGetFamily, 1, []attr{attrString(ctrlAttrFamilyName, name)})
	if err != nil {
		return 0, fmt.Errorf("netlink family %q: %w", name, err)
	}
	for _, r := range replies {
		if a, ok := findAttr(r, ctrlAttrFamilyID); ok {
			return a.u16()
		}
	}
	return 0, fmt.Errorf("netlink family %q: no ID in the reply", name)
}
