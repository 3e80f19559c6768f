package nbd

// A small NBD client for the tests: enough of the protocol to drive every
// option and command and to see exactly what the server answers.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

type testClient struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader

	structured bool
	size       uint64
	flags      uint16
	blockSizes [3]uint32
	infos      map[uint16][]byte

	mu      sync.Mutex
	pending map[uint64]Request
	cookie  uint64
}

// reply is what the server answered to one request.
type reply struct {
	cookie uint64
	errno  uint32
	data   []byte
	msg    string
}

func dialRaw(t *testing.T, addr net.Addr) *testClient {
	t.Helper()
	conn, err := net.DialTimeout(addr.Network(), addr.String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &testClient{t: t, conn: conn, r: bufio.NewReader(conn), pending: map[uint64]Request{}, infos: map[uint16][]byte{}}
}

// greet reads the server's greeting and sends the client flags.
func (c *testClient) greet(clientFlags uint32) error {
	var g [18]byte
	if _, err := io.ReadFull(c.r, g[:]); err != nil {
		return err
	}
	if binary.BigEndian.Uint64(g[0:]) != magicInit || binary.BigEndian.Uint64(g[8:]) != magicOption {
		return fmt.Errorf("bad greeting % x", g)
	}
	if hf := binary.BigEndian.Uint16(g[16:]); hf != flagFixedNewstyle|flagNoZeroes {
		return fmt.Errorf("handshake flags %#x", hf)
	}
	_, err := c.conn.Write(binary.BigEndian.AppendUint32(nil, clientFlags))
	return err
}

func (c *testClient) sendOption(opt uint32, data []byte) {
	c.t.Helper()
	if _, err := c.conn.Write(appendOption(nil, opt, data)); err != nil {
		c.t.Fatal(err)
	}
}

type optReply struct {
	option, typ uint32
	data        []byte
}

func (c *testClient) readOptionReply() (optReply, error) {
	var h [optionReplyHeaderSize]byte
	if _, err := io.ReadFull(c.r, h[:]); err != nil {
		return optReply{}, err
	}
	if m := binary.BigEndian.Uint64(h[0:]); m != magicOptionReply {
		return optReply{}, fmt.Errorf("option reply magic %#x", m)
	}
	rep := optReply{option: binary.BigEndian.Uint32(h[8:]), typ: binary.BigEndian.Uint32(h[12:])}
	rep.data = make([]byte, binary.BigEndian.Uint32(h[16:]))
	_, err := io.ReadFull(c.r, rep.data)
	return rep, err
}

// option sends an option and collects replies up to the final one.
func (c *testClient) option(opt uint32, data []byte) []optReply {
	c.t.Helper()
	c.sendOption(opt, data)
	var out []optReply
	for {
		rep, err := c.readOptionReply()
		if err != nil {
			c.t.Fatalf("option %d: %v", opt, err)
		}
		if rep.option != opt {
			c.t.Fatalf("reply for option %d while waiting for %d", rep.option, opt)
		}
		out = append(out, rep)
		if rep.typ != RepInfo && rep.typ != RepServer {
			return out
		}
	}
}

// infoGo sends NBD_OPT_INFO or NBD_OPT_GO and records what the server says.
// It returns the final reply type.
func (c *testClient) infoGo(opt uint32, name string, infos ...uint16) uint32 {
	c.t.Helper()
	replies := c.option(opt, appendInfoRequest(nil, infoRequest{Name: name, Infos: infos}))
	for _, rep := range replies {
		if rep.typ != RepInfo {
			continue
		}
		typ := binary.BigEndian.Uint16(rep.data)
		c.infos[typ] = rep.data[2:]
		switch typ {
		case InfoExport:
			if len(rep.data) != infoExportLength {
				c.t.Fatalf("NBD_INFO_EXPORT of %d bytes", len(rep.data))
			}
			c.size = binary.BigEndian.Uint64(rep.data[2:])
			c.flags = binary.BigEndian.Uint16(rep.data[10:])
		case InfoBlockSize:
			if len(rep.data) != infoBlockSizeLength {
				c.t.Fatalf("NBD_INFO_BLOCK_SIZE of %d bytes", len(rep.data))
			}
			for i := range c.blockSizes {
				c.blockSizes[i] = binary.BigEndian.Uint32(rep.data[2+4*i:])
			}
		}
	}
	return replies[len(replies)-1].typ
}

// dial connects and negotiates up to transmission with NBD_OPT_GO.
func dial(t *testing.T, addr net.Addr, structured bool) *testClient {
	t.Helper()
	c := dialRaw(t, addr)
	if err := c.greet(flagCFixedNewstyle | flagCNoZeroes); err != nil {
		t.Fatal(err)
	}
	if structured {
		if rep := c.option(OptStructuredReply, nil); rep[0].typ != RepAck {
			t.Fatalf("structured replies refused: %#x", rep[0].typ)
		}
		c.structured = true
	}
	if typ := c.infoGo(OptGo, "", InfoBlockSize); typ != RepAck {
		t.Fatalf("NBD_OPT_GO answered %#x", typ)
	}
	return c
}

// send writes a request (with payload for a write) and returns its cookie.
func (c *testClient) send(req Request, payload []byte) uint64 {
	c.t.Helper()
	c.mu.Lock()
	c.cookie++
	req.Cookie = c.cookie
	c.pending[req.Cookie] = req
	c.mu.Unlock()
	msg := AppendRequest(nil, req)
	msg = append(msg, payload...)
	if _, err := c.conn.Write(msg); err != nil {
		c.t.Fatal(err)
	}
	return req.Cookie
}

// sendTogether writes several requests (without payloads) in one write,
// so that they reach the server together, and returns their cookies.
func (c *testClient) sendTogether(reqs ...Request) []uint64 {
	c.t.Helper()
	var msg []byte
	cookies := make([]uint64, len(reqs))
	c.mu.Lock()
	for i, req := range reqs {
		c.cookie++
		req.Cookie = c.cookie
		c.pending[req.Cookie] = req
		cookies[i] = req.Cookie
		msg = AppendRequest(msg, req)
	}
	c.mu.Unlock()
	if _, err := c.conn.Write(msg); err != nil {
		c.t.Fatal(err)
	}
	return cookies
}

// recv reads one complete reply.
func (c *testClient) recv() (reply, error) {
	var magic [4]byte
	if _, err := io.ReadFull(c.r, magic[:]); err != nil {
		return reply{}, err
	}
	switch binary.BigEndian.Uint32(magic[:]) {
	case magicSimpleReply:
		var h [12]byte
		if _, err := io.ReadFull(c.r, h[:]); err != nil {
			return reply{}, err
		}
		rep := reply{errno: binary.BigEndian.Uint32(h[0:]), cookie: binary.BigEndian.Uint64(h[4:])}
		req, ok := c.take(rep.cookie)
		if !ok {
			return rep, fmt.Errorf("simple reply for unknown cookie %d", rep.cookie)
		}
		if req.Type == CmdRead && rep.errno == 0 {
			if c.structured {
				return rep, errors.New("simple reply to a READ after structured replies were negotiated")
			}
			rep.data = make([]byte, req.Length)
			_, err := io.ReadFull(c.r, rep.data)
			return rep, err
		}
		return rep, nil
	case magicStructuredReply:
		if !c.structured {
			return reply{}, errors.New("structured reply without negotiation")
		}
		var rep reply
		var req Request
		first := true
		for {
			if !first {
				if _, err := io.ReadFull(c.r, magic[:]); err != nil {
					return rep, err
				}
				if binary.BigEndian.Uint32(magic[:]) != magicStructuredReply {
					return rep, errors.New("chunk of a structured reply without its magic")
				}
			}
			var h [16]byte
			if _, err := io.ReadFull(c.r, h[:]); err != nil {
				return rep, err
			}
			flags, typ := binary.BigEndian.Uint16(h[0:]), binary.BigEndian.Uint16(h[2:])
			cookie, length := binary.BigEndian.Uint64(h[4:]), binary.BigEndian.Uint32(h[12:])
			if first {
				rep.cookie = cookie
				c.mu.Lock()
				req = c.pending[cookie]
				c.mu.Unlock()
				if req.Type == CmdRead {
					rep.data = make([]byte, req.Length)
				}
			} else if cookie != rep.cookie {
				return rep, errors.New("interleaved chunks are not expected from this server")
			}
			first = false
			payload := make([]byte, length)
			if _, err := io.ReadFull(c.r, payload); err != nil {
				return rep, err
			}
			switch typ {
			case ReplyTypeNone:
			case ReplyTypeOffsetData:
				off := binary.BigEndian.Uint64(payload)
				if off < req.Offset || off-req.Offset+uint64(len(payload)-8) > uint64(req.Length) {
					return rep, fmt.Errorf("data chunk at %d outside the request", off)
				}
				copy(rep.data[off-req.Offset:], payload[8:])
			case ReplyTypeError:
				rep.errno = binary.BigEndian.Uint32(payload)
				n := binary.BigEndian.Uint16(payload[4:])
				rep.msg = string(payload[6 : 6+int(n)])
			default:
				return rep, fmt.Errorf("unexpected chunk type %d", typ)
			}
			if flags&ReplyFlagDone != 0 {
				c.take(rep.cookie)
				if rep.errno != 0 {
					rep.data = nil
				}
				return rep, nil
			}
		}
	}
	return reply{}, fmt.Errorf("reply magic % x", magic)
}

func (c *testClient) take(cookie uint64) (Request, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	req, ok := c.pending[cookie]
	delete(c.pending, cookie)
	return req, ok
}

// do sends one request and waits for its reply.
func (c *testClient) do(req Request, payload []byte) reply {
	c.t.Helper()
	cookie := c.send(req, payload)
	rep, err := c.recv()
	if err != nil {
		c.t.Fatalf("%s: %v", CommandName(req.Type), err)
	}
	if rep.cookie != cookie {
		c.t.Fatalf("reply cookie %d, want %d", rep.cookie, cookie)
	}
	return rep
}

func (c *testClient) disconnect() {
	c.send(Request{Type: CmdDisc}, nil)
}
