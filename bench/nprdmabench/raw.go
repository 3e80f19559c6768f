package nprdmabench

import (
	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/nprdma/tcp"

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

func startRawServer(maxSize, slots int, congestion string) (*rawServer, error) {
	lc := net.ListenConfig{Control: tcp.CongestionControl(congestion)}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
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

func dialRaw(ctx context.Context, s *rawServer, congestion string) (*net.TCPConn, error) {
	d := net.Dialer{Control: tcp.CongestionControl(congestion)}
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
// to it, both sockets with the TCP congestion control congestion ("": the
// system's).
func DialRawRoundTrip(ctx context.Context, size int, congestion string) (*RawRoundTrip, error) {
	s, err := startRawServer(size, 1, congestion)
	if err != nil {
		return nil, err
	}
	c, err := dialRaw(ctx, s, congestion)
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
	r, err := DialRawRoundTrip(ctx, size, "")
	if err != nil {
		return LatencyResult{}, err
	}
	defer r.Close()
	lat := make([]time.Duration, 0, samples)
	for i := 0; i < samples+bench.WarmUpOps(samples); i++ {
		if ctx.Err() != nil {
			return LatencyResult{}, ctx.Err()
		}
		d, err := r.Once()
		if err != nil {
			return LatencyResult{}, err
		}
		if i >= bench.WarmUpOps(samples) {
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
	r, err := DialRawStream(ctx, size, qd, "")
	if err != nil {
		return ThroughputResult{}, err
	}
	defer r.Close()
	return r.Run(ctx, dur)
}

// RawStream is RawTCPStream's connection kept between runs, so that its
// runs can take turns with another stream's (see OpStream).
type RawStream struct {
	s        *rawServer
	c        *net.TCPConn
	size, qd int
	req      [8]byte
	reqs     []byte // qd requests, to fill the pipe at once
	resp     []byte
}

// DialRawStream starts a raw server answering size bytes from qd slots and
// connects to it, both sockets with the TCP congestion control congestion
// ("": the system's).
func DialRawStream(ctx context.Context, size, qd int, congestion string) (*RawStream, error) {
	s, err := startRawServer(size, qd, congestion)
	if err != nil {
		return nil, err
	}
	c, err := dialRaw(ctx, s, congestion)
	if err != nil {
		s.close()
		return nil, err
	}
	r := &RawStream{s: s, c: c, size: size, qd: qd, resp: make([]byte, size*qd)}
	binary.LittleEndian.PutUint64(r.req[:], uint64(size))
	for range qd {
		r.reqs = append(r.reqs, r.req[:]...)
	}
	return r, nil
}

// Run keeps qd requests in flight for d, then collects the responses still
// in flight (counted, and timed: draining the pipe is part of a run).
func (r *RawStream) Run(ctx context.Context, d time.Duration) (ThroughputResult, error) {
	fail := func(err error) (ThroughputResult, error) { return ThroughputResult{}, err }
	start := time.Now()
	if _, err := r.c.Write(r.reqs); err != nil {
		return fail(err)
	}
	deadline := start.Add(d)
	ops, outstanding := 0, r.qd
	for outstanding > 0 {
		slot := ops % r.qd
		if _, err := io.ReadFull(r.c, r.resp[slot*r.size:(slot+1)*r.size]); err != nil {
			return fail(err)
		}
		ops++
		outstanding--
		if time.Now().Before(deadline) && ctx.Err() == nil {
			if _, err := r.c.Write(r.req[:]); err != nil {
				return fail(err)
			}
			outstanding++
		}
	}
	return throughput(fmt.Sprintf("raw-tcp-stream-%d-qd%d", r.size, r.qd), r.size, r.qd, ops, time.Since(start)), nil
}

// Close closes the connection and the server.
func (r *RawStream) Close() {
	r.c.Close()
	r.s.close()
}
