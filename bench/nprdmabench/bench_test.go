package nprdmabench

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nprdma/nprdmatest"
	"github.com/nprdma/nprdma/nprdma/tcp"

	"golang.org/x/sys/unix"
)

// TestQuick runs every benchmark function at tiny sizes so they keep
// working; it checks that they measure something, not how fast.
func TestQuick(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	checkLat := func(r LatencyResult, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if r.Samples == 0 || r.P50 <= 0 || r.P99 < r.P50 || r.Name == "" {
			t.Fatalf("latency result %+v", r)
		}
	}
	checkTput := func(r ThroughputResult, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if r.OpsPerSec <= 0 || r.MiBPerSec <= 0 || r.Name == "" {
			t.Fatalf("throughput result %+v", r)
		}
	}
	checkLat(RawTCPRoundTrip(ctx, 4096, 20))
	checkTput(RawTCPStream(ctx, 4096, 4, 20*time.Millisecond))
	// Streams kept between runs: every run fills and drains its pipe, so
	// that the next one starts from an empty pipe and neither hangs nor
	// fails.
	raw, err := DialRawStream(ctx, 4096, 4, "")
	if err != nil {
		t.Fatal(err)
	}
	op, err := NewOpStream(ctx, tcp.New(), nprdma.OpRead, 4096, 4, false)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		checkTput(raw.Run(ctx, 10*time.Millisecond))
		checkTput(op.Run(ctx, 10*time.Millisecond))
	}
	raw.Close()
	op.Close()
	for _, prov := range []nprdma.Provider{tcp.New(), loop.New()} {
		for _, op := range []nprdma.Opcode{nprdma.OpRead, nprdma.OpWrite, nprdma.OpSend} {
			checkLat(OpLatency(ctx, prov, op, 4096, 20, false))
			checkTput(OpThroughput(ctx, prov, op, 4096, 4, 20*time.Millisecond, true))
		}
		pg, err := nprdmatest.NewPager(8, 4096)
		if err != nil {
			t.Fatal(err)
		}
		checkLat(UnpinnedReadLatency(ctx, prov, pg, 4096, 20))
		pg.Close()
		pooled, perIO, err := PoolVsRegister(ctx, prov, 4096, 20*time.Millisecond)
		checkTput(pooled, err)
		checkTput(perIO, nil)
	}
	if _, err := OpLatency(ctx, tcp.New(), nprdma.OpRecv, 4096, 1, false); err == nil {
		t.Fatal("OpLatency accepted a receive opcode")
	}
	if CPUPlacement() == "" {
		t.Fatal("no CPU placement")
	}
}

// TestSourcesHoldRealData checks that the raw server answers from slots of
// real data in turn, and that a Pair's regions hold real data: memory never
// written reads as the kernel's zero page, which would flatter every copy.
func TestSourcesHoldRealData(t *testing.T) {
	const size, slots = 8192, 3
	b := make([]byte, size*slots+5)
	FillPattern(b)
	for i := 0; i+8 <= len(b); i += 8 {
		if binary.LittleEndian.Uint64(b[i:]) == 0 {
			t.Fatalf("FillPattern left a zero word at %d", i)
		}
	}
	if bytes.Equal(b[:size], b[size:2*size]) {
		t.Fatal("FillPattern repeats itself from one slot to the next")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := startRawServer(size, slots, "reno")
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	c, err := dialRaw(ctx, s, "reno")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The raw socket takes the congestion control fabric-ops gives ours.
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var cc string
	rc.Control(func(fd uintptr) { cc, _ = unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION) })
	if cc = strings.TrimRight(cc, "\x00"); cc != "reno" {
		t.Fatalf("raw socket's congestion control %q, want reno", cc)
	}
	var req [8]byte
	binary.LittleEndian.PutUint64(req[:], size)
	var got [][]byte
	for range slots + 1 {
		if _, err := c.Write(req[:]); err != nil {
			t.Fatal(err)
		}
		resp := make([]byte, size)
		if _, err := io.ReadFull(c, resp); err != nil {
			t.Fatal(err)
		}
		got = append(got, resp)
	}
	if !bytes.Equal(got[0], b[:size]) || !bytes.Equal(got[1], b[size:2*size]) || !bytes.Equal(got[slots], got[0]) {
		t.Fatal("the raw server does not answer from its slots of real data in turn")
	}

	p, err := NewPair(ctx, loop.New(), PairOptions{LocalSize: size, RemoteSize: size})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, mr := range []*nprdma.MR{p.Local, p.Remote} {
		if binary.LittleEndian.Uint64(mr.Bytes()) == 0 || binary.LittleEndian.Uint64(mr.Bytes()[size-8:]) == 0 {
			t.Fatal("a Pair's region holds zeros")
		}
	}
}
