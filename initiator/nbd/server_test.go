package nbd

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nprdma/nprdma/initiator/blockio"
	"github.com/nprdma/nprdma/internal/leaktest"
	"github.com/nprdma/nprdma/internal/logtest"
	"github.com/nprdma/nprdma/internal/promtest"
)

const (
	testBlock      = 4096
	testExportSize = 1 << 20
)

type testServer struct {
	srv    *Server
	ln     net.Listener
	addr   net.Addr
	path   string
	cancel context.CancelFunc
	done   chan error
}

// shortTempDir returns a directory whose paths fit in a sun_path.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "nbdt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// startServer serves b on a fresh unix socket until the test ends.
func startServer(t *testing.T, b blockio.Backend, opts ...Option) *testServer {
	t.Helper()
	srv, err := NewServer(b, opts...)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(shortTempDir(t), "nbd.sock")
	ln, err := ListenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{srv: srv, ln: ln, addr: ln.Addr(), path: path, cancel: cancel, done: make(chan error, 1)}
	go func() { ts.done <- srv.Serve(ctx, ln) }()
	t.Cleanup(ts.stop)
	return ts
}

// stop cancels Serve and waits for it (idempotent).
func (ts *testServer) stop() {
	ts.cancel()
	if err, ok := <-ts.done; ok {
		close(ts.done)
		if err != nil {
			panic("Serve: " + err.Error())
		}
	}
}

func pattern(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 99))
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(rng.Uint32())
	}
	return p
}

func TestGoAdvertisesExactlyWhatIsImplemented(t *testing.T) {
	for _, tc := range []struct {
		name       string
		opts       []Option
		structured bool
		want       uint16
	}{
		{"simple", nil, false, FlagHasFlags | FlagSendFlush | FlagSendFUA | FlagSendTrim | FlagSendWriteZeroes},
		{"structured", nil, true, FlagHasFlags | FlagSendFlush | FlagSendFUA | FlagSendTrim | FlagSendWriteZeroes | FlagSendDF},
		{"multi-conn", []Option{WithMultiConn(true)}, false, FlagHasFlags | FlagSendFlush | FlagSendFUA | FlagSendTrim | FlagSendWriteZeroes | FlagCanMultiConn},
		{"read-only", []Option{WithReadOnly()}, false, FlagHasFlags | FlagReadOnly | FlagCanMultiConn},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startServer(t, blockio.NewMemory(testExportSize, testBlock), append(tc.opts, WithExportName("disk"))...)
			c := dial(t, ts.addr, tc.structured)
			if c.size != testExportSize {
				t.Errorf("size %d, want %d", c.size, testExportSize)
			}
			if c.flags != tc.want {
				t.Errorf("transmission flags %#x, want %#x", c.flags, tc.want)
			}
			if c.blockSizes != [3]uint32{1, testBlock, defaultMaxPayload} {
				t.Errorf("block sizes %v, want [1 %d %d]", c.blockSizes, testBlock, defaultMaxPayload)
			}
			c.disconnect()
		})
	}
}

func TestPreferredBlockSizeIsAtLeast512(t *testing.T) {
	srv, err := NewServer(blockio.NewMemory(8192, 1))
	if err != nil {
		t.Fatal(err)
	}
	if minimum, preferred, _ := srv.BlockSizes(); minimum != 1 || preferred != 512 {
		t.Fatalf("block sizes for a byte-granular backend: min %d preferred %d", minimum, preferred)
	}
}

func TestInfoOptionsAndErrors(t *testing.T) {
	ts := startServer(t, blockio.NewMemory(testExportSize, testBlock), WithExportName("disk"), WithDescription("test disk"))
	c := dialRaw(t, ts.addr)
	if err := c.greet(flagCFixedNewstyle); err != nil {
		t.Fatal(err)
	}
	// INFO with the canonical name, asking for name and description.
	if typ := c.infoGo(OptInfo, "disk", InfoName, InfoDescription); typ != RepAck {
		t.Fatalf("NBD_OPT_INFO answered %#x", typ)
	}
	if string(c.infos[InfoName]) != "disk" || string(c.infos[InfoDescription]) != "test disk" {
		t.Fatalf("name %q description %q", c.infos[InfoName], c.infos[InfoDescription])
	}
	checks := []struct {
		name string
		opt  uint32
		data []byte
		want uint32
	}{
		{"unknown export", OptInfo, appendInfoRequest(nil, infoRequest{Name: "other"}), RepErrUnknown},
		{"truncated info", OptGo, []byte{0, 0, 0, 9, 'x'}, RepErrInvalid},
		{"info count mismatch", OptInfo, []byte{0, 0, 0, 0, 0, 2, 0, 3}, RepErrInvalid},
		{"list with data", OptList, []byte{1}, RepErrInvalid},
		{"unknown option", 999, []byte("junk"), RepErrUnsup},
		{"starttls", OptStartTLS, nil, RepErrUnsup},
		{"meta context", OptSetMetaContext, []byte{0, 0, 0, 0, 0, 0, 0, 0}, RepErrUnsup},
		{"structured with data", OptStructuredReply, []byte{0}, RepErrInvalid},
	}
	for _, ch := range checks {
		replies := c.option(ch.opt, ch.data)
		if got := replies[len(replies)-1].typ; got != ch.want {
			t.Errorf("%s: reply %#x, want %#x", ch.name, got, ch.want)
		}
		if len(replies[len(replies)-1].data) == 0 {
			t.Errorf("%s: error reply carries no message", ch.name)
		}
	}
	replies := c.option(OptList, nil)
	if len(replies) != 2 || replies[0].typ != RepServer || replies[1].typ != RepAck {
		t.Fatalf("NBD_OPT_LIST replies %+v", replies)
	}
	if nameLen := binary.BigEndian.Uint32(replies[0].data); string(replies[0].data[4:4+nameLen]) != "disk" ||
		string(replies[0].data[4+nameLen:]) != "test disk" {
		t.Fatalf("NBD_REP_SERVER data %q", replies[0].data)
	}
	if rep := c.option(OptStructuredReply, nil); rep[0].typ != RepAck {
		t.Fatal("structured replies refused")
	}
	if rep := c.option(OptStructuredReply, nil); rep[0].typ != RepErrInvalid {
		t.Fatal("second NBD_OPT_STRUCTURED_REPLY accepted")
	}
	// After all those, the client can still go into transmission.
	c.structured = true
	if typ := c.infoGo(OptGo, "disk"); typ != RepAck {
		t.Fatalf("GO after errors answered %#x", typ)
	}
	if rep := c.do(Request{Type: CmdRead, Length: 512}, nil); rep.errno != 0 || len(rep.data) != 512 {
		t.Fatalf("read after negotiation: %+v", rep)
	}
}

// closedByServer reports whether a read saw the server close the connection:
// the end of the stream, or a reset when the server closed with bytes of
// ours still unread in its socket (a client stuck mid-handshake, say), which
// the kernel answers with a reset instead.
func closedByServer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}

func TestAbortAndHardDisconnects(t *testing.T) {
	ts := startServer(t, blockio.NewMemory(testExportSize, testBlock))
	expectClosed := func(c *testClient, what string) {
		t.Helper()
		c.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.r.ReadByte(); !closedByServer(err) {
			t.Errorf("%s: connection not closed by the server: %v", what, err)
		}
	}

	c := dialRaw(t, ts.addr)
	c.greet(flagCFixedNewstyle)
	if rep := c.option(OptAbort, nil); rep[0].typ != RepAck {
		t.Fatalf("NBD_OPT_ABORT answered %#x", rep[0].typ)
	}
	expectClosed(c, "abort")

	c = dialRaw(t, ts.addr)
	c.greet(1 << 7) // unknown client flag
	expectClosed(c, "unknown client flag")

	c = dialRaw(t, ts.addr)
	c.greet(flagCFixedNewstyle)
	c.conn.Write(make([]byte, optionHeaderSize)) // zero magic
	expectClosed(c, "bad option magic")

	c = dialRaw(t, ts.addr)
	c.greet(flagCFixedNewstyle)
	c.sendOption(OptExportName, []byte("nonexistent"))
	expectClosed(c, "EXPORT_NAME of an unknown export")

	c = dialRaw(t, ts.addr)
	c.greet(flagCFixedNewstyle)
	c.conn.Write(binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(
		binary.BigEndian.AppendUint64(nil, magicOption), 999), maxOptionData+1))
	expectClosed(c, "oversized option")

	c = dial(t, ts.addr, false)
	c.conn.Write(make([]byte, requestSize)) // bad request magic
	expectClosed(c, "bad request magic")
}

func TestExportNameOption(t *testing.T) {
	ts := startServer(t, blockio.NewMemory(testExportSize, testBlock), WithExportName("disk"))
	for _, noZeroes := range []bool{false, true} {
		c := dialRaw(t, ts.addr)
		flags := uint32(flagCFixedNewstyle)
		if noZeroes {
			flags |= flagCNoZeroes
		}
		c.greet(flags)
		c.sendOption(OptExportName, []byte("disk"))
		want := exportNameReplySize
		if !noZeroes {
			want += exportNameZeroPadding
		}
		got := make([]byte, want)
		if _, err := io.ReadFull(c.r, got); err != nil {
			t.Fatal(err)
		}
		if binary.BigEndian.Uint64(got) != testExportSize {
			t.Fatalf("size %d", binary.BigEndian.Uint64(got))
		}
		if !bytes.Equal(got[exportNameReplySize:], make([]byte, want-exportNameReplySize)) {
			t.Fatal("padding is not zero")
		}
		// Transmission works right after the padding.
		if rep := c.do(Request{Type: CmdRead, Length: 4096}, nil); rep.errno != 0 {
			t.Fatalf("read after EXPORT_NAME: errno %d", rep.errno)
		}
	}
}

func TestCommands(t *testing.T) {
	for _, structured := range []bool{false, true} {
		name := "simple"
		if structured {
			name = "structured"
		}
		t.Run(name, func(t *testing.T) { testCommands(t, structured) })
	}
}

func testCommands(t *testing.T, structured bool) {
	mem := blockio.NewMemory(testExportSize, testBlock)
	ts := startServer(t, mem, WithMaxPayload(64<<10))
	c := dial(t, ts.addr, structured)
	ok := func(rep reply, what string) {
		t.Helper()
		if rep.errno != 0 {
			t.Fatalf("%s: errno %d (%s)", what, rep.errno, rep.msg)
		}
	}
	fails := func(rep reply, want uint32, what string) {
		t.Helper()
		if rep.errno != want {
			t.Fatalf("%s: errno %d, want %d", what, rep.errno, want)
		}
		if structured && rep.msg == "" {
			t.Fatalf("%s: structured error without a message", what)
		}
	}

	// Aligned write, read back.
	data := pattern(3*testBlock, 1)
	ok(c.do(Request{Type: CmdWrite, Offset: 8 * testBlock, Length: uint32(len(data))}, data), "write")
	rep := c.do(Request{Type: CmdRead, Offset: 8 * testBlock, Length: uint32(len(data))}, nil)
	ok(rep, "read")
	if !bytes.Equal(rep.data, data) {
		t.Fatal("read back differs from what was written")
	}

	// Unaligned write and read go through read-modify-write.
	odd := pattern(5000, 2)
	ok(c.do(Request{Type: CmdWrite, Offset: 8*testBlock + 100, Length: uint32(len(odd))}, odd), "unaligned write")
	copy(data[100:], odd)
	rep = c.do(Request{Type: CmdRead, Offset: 8 * testBlock, Length: uint32(len(data))}, nil)
	ok(rep, "read after unaligned write")
	if !bytes.Equal(rep.data, data) {
		t.Fatal("unaligned write corrupted its neighbours")
	}
	rep = c.do(Request{Type: CmdRead, Offset: 8*testBlock + 7, Length: 3}, nil)
	ok(rep, "3-byte read")
	if !bytes.Equal(rep.data, data[7:10]) {
		t.Fatal("3-byte read returned wrong bytes")
	}

	// FUA write reaches WriteAtFUA; FLUSH reaches Flush.
	before := mem.Stats()
	ok(c.do(Request{Type: CmdWrite, Flags: CmdFlagFUA, Offset: 0, Length: testBlock}, pattern(testBlock, 3)), "FUA write")
	ok(c.do(Request{Type: CmdFlush}, nil), "flush")
	after := mem.Stats()
	if after.FUAWrites != before.FUAWrites+1 || after.Flushes != before.Flushes+1 {
		t.Fatalf("FUA writes %d→%d, flushes %d→%d", before.FUAWrites, after.FUAWrites, before.Flushes, after.Flushes)
	}

	// TRIM and WRITE_ZEROES (with FUA: followed by a flush) read back zeros.
	ok(c.do(Request{Type: CmdTrim, Offset: 8 * testBlock, Length: testBlock}, nil), "trim")
	ok(c.do(Request{Type: CmdWriteZeroes, Flags: CmdFlagFUA | CmdFlagNoHole, Offset: 9*testBlock + 10, Length: 100}, nil), "write zeroes")
	clear(data[:testBlock])
	clear(data[testBlock+10 : testBlock+110])
	rep = c.do(Request{Type: CmdRead, Offset: 8 * testBlock, Length: uint32(len(data))}, nil)
	if !bytes.Equal(rep.data, data) {
		t.Fatal("trimmed or zeroed range does not read back zeros")
	}
	st := mem.Stats()
	if st.Trims != after.Trims+1 || st.Flushes != after.Flushes+1 {
		t.Fatalf("trims %d→%d, flushes %d→%d", after.Trims, st.Trims, after.Flushes, st.Flushes)
	}

	// Zero-length requests are harmless no-ops.
	rep = c.do(Request{Type: CmdRead, Offset: 0, Length: 0}, nil)
	ok(rep, "zero-length read")
	if len(rep.data) != 0 {
		t.Fatal("zero-length read returned data")
	}
	ok(c.do(Request{Type: CmdWrite, Offset: testExportSize, Length: 0}, nil), "zero-length write at the end")

	// Reads with DF are fine once structured replies are on.
	if structured {
		ok(c.do(Request{Type: CmdRead, Flags: CmdFlagDF, Length: 64 << 10}, nil), "DF read")
	} else {
		fails(c.do(Request{Type: CmdRead, Flags: CmdFlagDF, Length: 512}, nil), EINVAL, "DF without structured replies")
	}

	// Out of range, oversized, unknown: errors, and the connection goes on.
	fails(c.do(Request{Type: CmdRead, Offset: testExportSize - 10, Length: 11}, nil), EINVAL, "read past the end")
	fails(c.do(Request{Type: CmdWrite, Offset: testExportSize - 10, Length: 11}, make([]byte, 11)), ENOSPC, "write past the end")
	fails(c.do(Request{Type: CmdWriteZeroes, Offset: testExportSize, Length: 1}, nil), ENOSPC, "write zeroes past the end")
	fails(c.do(Request{Type: CmdTrim, Offset: testExportSize, Length: 4096}, nil), EINVAL, "trim past the end")
	fails(c.do(Request{Type: CmdRead, Offset: 1<<64 - 512, Length: 1024}, nil), EINVAL, "read with a wrapping offset")
	fails(c.do(Request{Type: CmdRead, Length: 64<<10 + 1}, nil), EINVAL, "oversized read")
	fails(c.do(Request{Type: CmdWriteZeroes, Length: 64<<10 + 4096}, nil), EINVAL, "oversized write zeroes")
	big := pattern(64<<10+4096, 4)
	fails(c.do(Request{Type: CmdWrite, Length: uint32(len(big))}, big), EINVAL, "oversized write")
	ok(c.do(Request{Type: CmdTrim, Length: 256 << 10}, nil), "trim larger than the maximum payload")
	fails(c.do(Request{Type: 42}, nil), EINVAL, "unknown command")
	fails(c.do(Request{Type: 0xffff}, nil), EINVAL, "command 0xffff")
	fails(c.do(Request{Type: CmdCache, Length: 4096}, nil), EINVAL, "cache (not advertised)")
	fails(c.do(Request{Type: CmdBlockStatus, Length: 4096}, nil), EINVAL, "block status (not negotiated)")
	fails(c.do(Request{Type: CmdWrite, Flags: CmdFlagNoHole, Length: 512}, make([]byte, 512)), EINVAL, "NO_HOLE on a write")
	fails(c.do(Request{Type: CmdWriteZeroes, Flags: CmdFlagFastZero, Length: 512}, nil), EINVAL, "FAST_ZERO (not advertised)")
	ok(c.do(Request{Type: CmdFlush, Flags: CmdFlagFUA}, nil), "FUA on flush (clients do send it)")

	// Backend errors map onto protocol errors.
	mem.FailWith(syscall.EIO)
	fails(c.do(Request{Type: CmdRead, Length: 4096}, nil), EIO, "read from a failing backend")
	fails(c.do(Request{Type: CmdFlush}, nil), EIO, "flush of a failing backend")
	mem.FailWith(syscall.ENOSPC)
	fails(c.do(Request{Type: CmdWrite, Length: 4096}, make([]byte, 4096)), ENOSPC, "write to a full backend")
	mem.FailWith(errors.New("opaque"))
	fails(c.do(Request{Type: CmdTrim, Length: 4096}, nil), EIO, "trim with an opaque error")
	mem.FailWith(nil)
	ok(c.do(Request{Type: CmdRead, Length: 4096}, nil), "read after the backend recovered")

	c.disconnect()
}

func TestReadOnlyRefusesWrites(t *testing.T) {
	mem := blockio.NewMemory(testExportSize, testBlock)
	ts := startServer(t, mem, WithReadOnly())
	c := dial(t, ts.addr, true)
	for _, req := range []Request{
		{Type: CmdWrite, Length: 512},
		{Type: CmdTrim, Length: 512},
		{Type: CmdWriteZeroes, Length: 512},
	} {
		var payload []byte
		if req.Type == CmdWrite {
			payload = make([]byte, req.Length)
		}
		if rep := c.do(req, payload); rep.errno != EPERM {
			t.Errorf("%s on a read-only export: errno %d, want EPERM", CommandName(req.Type), rep.errno)
		}
	}
	if st := mem.Stats(); st.Writes+st.Trims+st.WriteZeroes != 0 {
		t.Fatalf("read-only export modified the backend: %+v", st)
	}
}

// gatedBackend blocks reads until the gate opens and counts how many wait.
type gatedBackend struct {
	blockio.Backend
	gate    chan struct{}
	waiting chan struct{}
}

func (g *gatedBackend) ReadAt(p []byte, off int64) (int, error) {
	g.waiting <- struct{}{}
	<-g.gate
	return g.Backend.ReadAt(p, off)
}

// TestRequestsOnOneConnectionRunConcurrently: requests that reach the
// server together are served concurrently, each reader handing the reading
// of the next one to another goroutine.
func TestRequestsOnOneConnectionRunConcurrently(t *testing.T) {
	const n = 8
	mem := blockio.NewMemory(testExportSize, testBlock)
	gb := &gatedBackend{Backend: mem, gate: make(chan struct{}), waiting: make(chan struct{}, n)}
	reg := prometheus.NewRegistry()
	ts := startServer(t, gb, WithRegisterer(reg))
	c := dial(t, ts.addr, true)
	reqs := make([]Request, n)
	for i := range reqs {
		reqs[i] = Request{Type: CmdRead, Offset: uint64(i * testBlock), Length: testBlock}
	}
	c.sendTogether(reqs...)
	// All n reads reach the backend before any of them completes: they
	// are served concurrently, not one after another.
	for i := range n {
		select {
		case <-gb.waiting:
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d of %d reads reached the backend concurrently", i, n)
		}
	}
	close(gb.gate)
	seen := map[uint64]bool{}
	for range n {
		rep, err := c.recv()
		if err != nil || rep.errno != 0 {
			t.Fatalf("reply: %v errno %d", err, rep.errno)
		}
		seen[rep.cookie] = true
	}
	if len(seen) != n {
		t.Fatalf("%d distinct replies, want %d", len(seen), n)
	}
	if h := promtest.Sum(t, reg, "nprdma_nbd_handoffs_total"); h != n {
		t.Fatalf("%v hand-offs, want %d", h, n)
	}
}

// delayedBackend takes delay over every request, like a remote backend. It
// spins: a sleep this short can take a millisecond.
type delayedBackend struct {
	blockio.Backend
	delay atomic.Int64
}

func (d *delayedBackend) wait() {
	for start := time.Now(); time.Since(start) < time.Duration(d.delay.Load()); {
	}
}

func (d *delayedBackend) ReadAt(p []byte, off int64) (int, error) {
	d.wait()
	return d.Backend.ReadAt(p, off)
}

func (d *delayedBackend) WriteAt(p []byte, off int64) (int, error) {
	d.wait()
	return d.Backend.WriteAt(p, off)
}

func (d *delayedBackend) Flush() error {
	d.wait()
	return d.Backend.Flush()
}

// TestLoneRequestsAreServedByTheirReader: a client with one request in flight
// at a time (queue depth 1) against a backend slower than a hand-off is
// served by the goroutine that reads its requests, with no hand-off, reads
// and writes alike; a FLUSH, and everything once requests take longer than
// aloneUpTo on average, is handed off.
func TestLoneRequestsAreServedByTheirReader(t *testing.T) {
	mem := blockio.NewMemory(testExportSize, testBlock)
	db := &delayedBackend{Backend: mem}
	db.delay.Store(int64(2 * handoffAfter))
	reg := prometheus.NewRegistry()
	ts := startServer(t, db, WithRegisterer(reg))
	c := dial(t, ts.addr, true)
	handoffs := func() float64 { return promtest.Sum(t, reg, "nprdma_nbd_handoffs_total") }
	data := pattern(testBlock, 7)
	for i := range 50 {
		off := uint64(i%8) * testBlock
		if rep := c.do(Request{Type: CmdWrite, Offset: off, Length: testBlock}, data); rep.errno != 0 {
			t.Fatalf("write: errno %d", rep.errno)
		}
		if rep := c.do(Request{Type: CmdRead, Offset: off, Length: testBlock}, nil); rep.errno != 0 || !bytes.Equal(rep.data, data) {
			t.Fatalf("read: errno %d, data equal %v", rep.errno, bytes.Equal(rep.data, data))
		}
	}
	if h := handoffs(); h != 0 {
		t.Fatalf("%v hand-offs at queue depth 1, want 0", h)
	}
	c.do(Request{Type: CmdFlush}, nil)
	if h := handoffs(); h != 1 {
		t.Fatalf("%v hand-offs after a FLUSH, want 1", h)
	}
	db.delay.Store(int64(2 * aloneUpTo))
	for range 20 {
		c.do(Request{Type: CmdRead, Length: testBlock}, nil)
	}
	if h := handoffs(); h < 10 {
		t.Fatalf("%v hand-offs once requests take %v, want most of 20", h, 2*aloneUpTo)
	}
}

func TestPipelinedMixedRequests(t *testing.T) {
	mem := blockio.NewMemory(testExportSize, testBlock)
	ts := startServer(t, mem, WithMaxInFlight(4))
	c := dial(t, ts.addr, false)
	const n = 200
	// In-flight requests have no order between them, so the reads go out
	// only after every write has replied; within each phase, all n
	// requests are in flight at once, their replies read concurrently.
	pipeline := func(send func(i int) uint64) map[uint64]reply {
		var reading sync.WaitGroup
		reading.Add(1)
		got := make(map[uint64]reply)
		go func() {
			defer reading.Done()
			for range n {
				rep, err := c.recv()
				if err != nil {
					t.Error(err)
					return
				}
				got[rep.cookie] = rep
			}
		}()
		for i := range n {
			send(i)
		}
		reading.Wait()
		return got
	}
	want := make([][]byte, n)
	for i := range want {
		want[i] = pattern(1000+i, uint64(i))
	}
	for cookie, rep := range pipeline(func(i int) uint64 {
		return c.send(Request{Type: CmdWrite, Offset: uint64(i * 5000), Length: uint32(len(want[i]))}, want[i])
	}) {
		if rep.errno != 0 {
			t.Fatalf("write %d: errno %d", cookie, rep.errno)
		}
	}
	reads := map[uint64]int{} // cookie -> index
	var mu sync.Mutex
	for cookie, rep := range pipeline(func(i int) uint64 {
		cookie := c.send(Request{Type: CmdRead, Offset: uint64(i * 5000), Length: uint32(len(want[i]))}, nil)
		mu.Lock()
		reads[cookie] = i
		mu.Unlock()
		return cookie
	}) {
		mu.Lock()
		i, ok := reads[cookie]
		mu.Unlock()
		if !ok || rep.errno != 0 || !bytes.Equal(rep.data, want[i]) {
			t.Fatalf("read %d (cookie %d): errno %d, data equal %v", i, cookie, rep.errno, ok && bytes.Equal(rep.data, want[i]))
		}
	}
}

func TestMultiConnFlushCoversOtherConnections(t *testing.T) {
	mem := blockio.NewMemory(testExportSize, testBlock)
	ts := startServer(t, mem, WithMultiConn(true))
	a, b := dial(t, ts.addr, true), dial(t, ts.addr, false)
	if a.flags&FlagCanMultiConn == 0 {
		t.Fatal("CAN_MULTI_CONN not advertised")
	}
	data := pattern(testBlock, 5)
	if rep := a.do(Request{Type: CmdWrite, Offset: testBlock, Length: testBlock}, data); rep.errno != 0 {
		t.Fatal(rep.errno)
	}
	flushes := mem.Stats().Flushes
	if rep := b.do(Request{Type: CmdFlush}, nil); rep.errno != 0 {
		t.Fatal(rep.errno)
	}
	if mem.Stats().Flushes != flushes+1 {
		t.Fatal("flush on the second connection did not reach the shared backend")
	}
	if rep := b.do(Request{Type: CmdRead, Offset: testBlock, Length: testBlock}, nil); !bytes.Equal(rep.data, data) {
		t.Fatal("second connection does not see the first one's write")
	}
}

func TestCloseFinishesInFlightRequests(t *testing.T) {
	baseline := runtime.NumGoroutine()
	mem := blockio.NewMemory(testExportSize, testBlock)
	want := pattern(testBlock, 6)
	mem.WriteAt(want, 0)
	gb := &gatedBackend{Backend: mem, gate: make(chan struct{}), waiting: make(chan struct{}, 1)}
	srv, err := NewServer(gb)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(shortTempDir(t), "nbd.sock")
	ln, err := ListenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background(), ln) }()

	c := dial(t, ln.Addr(), false)
	c.send(Request{Type: CmdRead, Length: testBlock}, nil)
	<-gb.waiting // the read is in the backend

	closed := make(chan error, 1)
	go func() { closed <- srv.Close() }()
	// The listener goes away at once: nobody new can connect.
	for deadline := time.Now().Add(20 * time.Second); ; {
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("socket file still present after Close began")
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case <-closed:
		t.Fatal("Close returned while a request was still in flight")
	default:
	}
	close(gb.gate)
	rep, err := c.recv()
	if err != nil || rep.errno != 0 || !bytes.Equal(rep.data, want) {
		t.Fatalf("in-flight read during Close: %v errno %d", err, rep.errno)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve after Close: %v", err)
	}
	if _, err := c.r.ReadByte(); !closedByServer(err) {
		t.Fatalf("connection still open after Close: %v", err)
	}
	c.conn.Close()
	if err := srv.Serve(context.Background(), ln); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve after Close: %v", err)
	}
	leaktest.WaitGoroutines(t, baseline, 20*time.Second)
}

// flushGatedBackend blocks flushes until the gate opens.
type flushGatedBackend struct {
	blockio.Backend
	gate    chan struct{}
	waiting chan struct{}
}

func (g *flushGatedBackend) Flush() error {
	g.waiting <- struct{}{}
	<-g.gate
	return g.Backend.Flush()
}

// TestCloseWarnsAndFlushesBeforeDroppingAClient: a client still connected
// when the server shuts down is named in a warning (for a unix socket: its
// process), and its connection closes only after a flush of the backend.
func TestCloseWarnsAndFlushesBeforeDroppingAClient(t *testing.T) {
	mem := blockio.NewMemory(testExportSize, testBlock)
	fb := &flushGatedBackend{Backend: mem, gate: make(chan struct{}), waiting: make(chan struct{}, 4)}
	logBuf := &logtest.Buffer{}
	log := slog.New(slog.NewTextHandler(logBuf, nil))
	ts := startServer(t, fb, WithLogger(log))
	c := dial(t, ts.addr, true)
	if rep := c.do(Request{Type: CmdWrite, Offset: 0, Length: testBlock}, pattern(testBlock, 9)); rep.errno != 0 {
		t.Fatalf("write: errno %d", rep.errno)
	}
	closed := make(chan error, 1)
	go func() { closed <- ts.srv.Close() }()
	select {
	case <-fb.waiting:
	case <-time.After(20 * time.Second):
		t.Fatalf("no flush while closing a connected client; log:\n%s", logBuf.String())
	}
	// The flush is under way: the connection is still open.
	c.conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := c.r.ReadByte(); closedByServer(err) {
		t.Fatal("the connection closed before the flush completed")
	}
	close(fb.gate)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	c.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.r.ReadByte(); !closedByServer(err) {
		t.Fatalf("connection not closed: %v", err)
	}
	c.conn.Close()
	out := logBuf.String()
	for _, want := range []string{"level=WARN", "closing a connected client's connection after a flush",
		fmt.Sprintf("pid %d (uid %d) on unix:%s", os.Getpid(), os.Getuid(), ts.path)} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

func TestServeStopsOnContextCancel(t *testing.T) {
	baseline := runtime.NumGoroutine()
	ts := startServer(t, blockio.NewMemory(testExportSize, testBlock))
	c1 := dial(t, ts.addr, true)
	c2 := dialRaw(t, ts.addr) // stuck in the handshake
	c2.greet(flagCFixedNewstyle)
	if rep := c1.do(Request{Type: CmdRead, Length: 512}, nil); rep.errno != 0 {
		t.Fatal(rep.errno)
	}
	ts.stop()
	if _, err := os.Stat(ts.path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket file left behind: %v", err)
	}
	for _, c := range []*testClient{c1, c2} {
		c.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.r.ReadByte(); !closedByServer(err) {
			t.Fatalf("connection not closed: %v", err)
		}
		c.conn.Close()
	}
	leaktest.WaitGoroutines(t, baseline, 20*time.Second)
}

func TestListenUnix(t *testing.T) {
	dir := shortTempDir(t)
	path := filepath.Join(dir, "s.sock")

	// A stale socket file (its server died without unlinking) is replaced.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	ln, err := ListenUnix(path)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v (%v), want 0600", fi.Mode().Perm(), err)
	}

	// A live one is not.
	if _, err := ListenUnix(path); err == nil || !strings.Contains(err.Error(), "already listening") {
		t.Fatalf("second listener on a live socket: %v", err)
	}
	ln.Close()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("socket file not removed on close")
	}

	// Nor is a regular file.
	regular := filepath.Join(dir, "file")
	os.WriteFile(regular, []byte("x"), 0o600)
	if _, err := ListenUnix(regular); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("listening over a regular file: %v", err)
	}
	if b, _ := os.ReadFile(regular); string(b) != "x" {
		t.Fatal("regular file was touched")
	}
}

func TestListenTCPIsLoopbackOnly(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0"} {
		ln, err := ListenTCP(addr)
		if err == nil {
			ln.Close()
			t.Fatalf("listening on all interfaces (%s) was allowed", addr)
		}
		if !strings.Contains(err.Error(), "listen on "+addr+": the address for all interfaces is not a loopback address") {
			t.Errorf("ListenTCP(%s): %v", addr, err)
		}
	}
	ln, err := ListenTCP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	uri := URI(ln.Addr(), "")
	if !strings.HasPrefix(uri, "nbd://127.0.0.1:") || !strings.HasSuffix(uri, "/") {
		t.Fatalf("TCP URI %q", uri)
	}
	srv, _ := NewServer(blockio.NewMemory(testExportSize, testBlock))
	done := make(chan error, 1)
	go func() { done <- srv.Serve(context.Background(), ln) }()
	c := dial(t, ln.Addr(), true)
	if rep := c.do(Request{Type: CmdRead, Length: 4096}, nil); rep.errno != 0 {
		t.Fatal(rep.errno)
	}
	srv.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestURI(t *testing.T) {
	for _, tc := range []struct {
		addr   net.Addr
		export string
		want   string
	}{
		{&net.UnixAddr{Name: "/run/nprdma/ns1.sock", Net: "unix"}, "", "nbd+unix:///?socket=/run/nprdma/ns1.sock"},
		{&net.UnixAddr{Name: "/tmp/a b.sock", Net: "unix"}, "ns 1", "nbd+unix:///ns%201?socket=/tmp/a%20b.sock"},
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 10809}, "disk", "nbd://127.0.0.1:10809/disk"},
		{&net.TCPAddr{IP: net.IPv6loopback, Port: 10809}, "", "nbd://[::1]:10809/"},
	} {
		if got := URI(tc.addr, tc.export); got != tc.want {
			t.Errorf("URI(%v, %q) = %q, want %q", tc.addr, tc.export, got, tc.want)
		}
	}
}

func TestMetricsCountRequestsAndErrors(t *testing.T) {
	reg := prometheus.NewRegistry()
	ts := startServer(t, blockio.NewMemory(testExportSize, testBlock), WithRegisterer(reg))
	c := dial(t, ts.addr, false)
	c.do(Request{Type: CmdRead, Length: 4096}, nil)
	c.do(Request{Type: CmdRead, Offset: testExportSize, Length: 4096}, nil)
	c.do(Request{Type: 4242}, nil)
	abort := dialRaw(t, ts.addr)
	abort.greet(flagCFixedNewstyle)
	abort.option(OptAbort, nil)

	value := func(name string, labels map[string]string) float64 {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() != name {
				continue
			}
		metrics:
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
						continue metrics
					}
				}
				if m.GetCounter() != nil {
					return m.GetCounter().GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
		return 0
	}
	if v := value("nprdma_nbd_requests_total", map[string]string{"command": "READ"}); v != 2 {
		t.Errorf("READ requests %v, want 2", v)
	}
	if v := value("nprdma_nbd_request_errors_total", map[string]string{"command": "READ", "error": "EINVAL"}); v != 1 {
		t.Errorf("READ EINVAL errors %v, want 1", v)
	}
	if v := value("nprdma_nbd_requests_total", map[string]string{"command": "unknown"}); v != 1 {
		t.Errorf("unknown-command requests %v, want 1", v)
	}
	if v := value("nprdma_nbd_connections", nil); v != 1 {
		t.Errorf("connections %v, want 1", v)
	}
	for deadline := time.Now().Add(20 * time.Second); value("nprdma_nbd_handshakes_total", map[string]string{"result": "abort"}) != 1; {
		if time.Now().After(deadline) {
			t.Fatal("aborted handshake not counted")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
