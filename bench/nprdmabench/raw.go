package nprdmabench

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"
)

// rawServer answers each 8-byte request (a length) with that many bytes, on
// a plain loopback TCP socket: the physical limit of a request/response
// over the tcp provider. Responses come from slots of a source buffer in
// turn, holding real data, as a READ at queue depth slots reads its slots
// of a registered region: never-written memory would be the kernel's zero
// page, one physical page always in cache, and make the copy cheaper than
// any real data's.
type rawServer struct {
	ln   net.Listener
	done chan struct{}
}

func startRawServer(maxSize, slots int) (*rawServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &rawServer{ln: ln, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.(*net.TCPConn).SetNoDelay(true)
				src := make([]byte, maxSize*slots)
				FillPattern(src)
				var req [8]byte
				for slot := 0; ; slot = (slot + 1) % slots {
					if _, err := io.ReadFull(c, req[:]); err != nil {
						return
					}
					n := binary.LittleEndian.Uint64(req[:])
					if n > uint64(maxSize) {
						return
					}
					if _, err := c.Write(src[slot*maxSize : slot*maxSize+int(n)]); err != nil {
						return
					}
				}
			}()
		}
	}()
	return s, nil
}

// FillPattern writes non-zero bytes over b, so that every page of it is
// real memory of its own (a benchmark's source data).
func FillPattern(b []byte) {
	x := uint64(0x9e3779b97f4a7c15)
	for i := 0; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	for i := len(b) &^ 7; i < len(b); i++ {
		b[i] = 0xa5
	}
}

func (s *rawServer) close() {
	s.ln.Close()
	<-s.done
}

func dialRaw(ctx context.Context, s *rawServer) (*net.TCPConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", s.ln.Addr().String())
	if err != nil {
		return nil, err
	}
	tc := c.(*net.TCPConn)
	tc.SetNoDelay(true)
	return tc, nil
}

// RawRoundTrip is a client of a raw server: an 8-byte request answered by a
// size-byte response over a plain loopback TCP socket, as a READ moves. It
// is the physical limit of one operation over nprdma/tcp.
type RawRoundTrip struct {
	s    *rawServer
	c    *net.TCPConn
	req  [8]byte
	resp []byte
}

// DialRawRoundTrip starts a raw server for size-byte responses and connects
// to it.
func DialRawRoundTrip(ctx context.Context, size int) (*RawRoundTrip, error) {
	s, err := startRawServer(size, 1)
	if err != nil {
		return nil, err
	}
	c, err := dialRaw(ctx, s)
	if err != nil {
		s.close()
		return nil, err
	}
	r := &RawRoundTrip{s: s, c: c, resp: make([]byte, size)}
	binary.LittleEndian.PutUint64(r.req[:], uint64(size))
	return r, nil
}

// Once does one request/response and returns its latency.
func (r *RawRoundTrip) Once() (time.Duration, error) {
	t0 := time.Now()
	if _, err := r.c.Write(r.req[:]); err != nil {
		return 0, err
	}
	if _, err := io.ReadFull(r.c, r.resp); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// Close closes the connection and the server.
func (r *RawRoundTrip) Close() {
	r.c.Close()
	r.s.close()
}

// RawTCPRoundTrip measures a request/response of size bytes (an 8-byte
// request, a size-byte response, as a READ) over a plain loopback TCP socket.
func RawTCPRoundTrip(ctx context.Context, size, samples int) (LatencyResult, error) {
	r, err := DialRawRoundTrip(ctx, size)
	if err != nil {
		return LatencyResult{}, err
	}
	defer r.Close()
	lat := make([]time.Duration, 0, samples)
	for i := 0; i < samples+warmup(samples); i++ {
		if ctx.Err() != nil {
			return LatencyResult{}, ctx.Err()
		}
		d, err := r.Once()
		if err != nil {
			return LatencyResult{}, err
		}
		if i >= warmup(samples) {
			lat = append(lat, d)
		}
	}
	return summarize(fmt.Sprintf("raw-tcp-rtt-%d", size), lat), nil
}

// RawTCPStream measures pipelined request/responses of size bytes with qd
// outstanding over a plain loopback TCP socket (the shape of READs at queue
// depth qd) for dur. Responses land in qd buffers in turn, the memory a
// READ at that depth touches.
func RawTCPStream(ctx context.Context, size, qd int, dur time.Duration) (ThroughputResult, error) {
	s, err := startRawServer(size, qd)
	if err != nil {
		return ThroughputResult{}, err
	}
	defer s.close()
	c, err := dialRaw(ctx, s)
	if err != nil {
		return ThroughputResult{}, err
	}
	defer c.Close()
	var req [8]byte
	binary.LittleEndian.PutUint64(req[:], uint64(size))
	reqs := make([]byte, 0, 8*qd)
	for i := 0; i < qd; i++ {
		reqs = append(reqs, req[:]...)
	}
	resp := make([]byte, size*qd)
	if _, err := c.Write(reqs); err != nil {
		return ThroughputResult{}, err
	}
	ops := 0
	start := time.Now()
	deadline := start.Add(dur)
	for {
		slot := ops % qd
		if _, err := io.ReadFull(c, resp[slot*size:(slot+1)*size]); err != nil {
			return ThroughputResult{}, err
		}
		ops++
		if time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		if _, err := c.Write(req[:]); err != nil {
			return ThroughputResult{}, err
		}
	}
	// Drain what is still in flight so the server's writes do not fail.
	for i := 1; i < qd; i++ {
		if _, err := io.ReadFull(c, resp[:size]); err != nil {
			break
		}
	}
	return throughput(fmt.Sprintf("raw-tcp-stream-%d-qd%d", size, qd), size, qd, ops, time.Since(start)), nil
}
