package tcp_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nprdma/nprdma/internal/nvmetcptest"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/tcp"
)

const (
	blockSize  = 4096
	diskBlocks = 256
)

// memController serves queues accepted by a Listener from one in-memory
// disk: Connect succeeds, Read and Write move blocks, Flush does nothing,
// anything else is Invalid Opcode. It stands for the target, which the
// target package's tests use instead.
type memController struct {
	ln   *tcp.Listener
	mu   sync.Mutex
	disk []byte
	wg   sync.WaitGroup
	// hostDataTimeout is what HostData is given.
	hostDataTimeout time.Duration
	queues          chan *tcp.ControllerQueue
}

func newMemController(t *testing.T, opts ...tcp.ListenOption) *memController {
	return newMemControllerTimeout(t, 10*time.Second, opts...)
}

func newMemControllerTimeout(t *testing.T, hostDataTimeout time.Duration, opts ...tcp.ListenOption) *memController {
	return startMemController(t, hostDataTimeout, false, opts...)
}

// startMemController starts a memController; with readsOnLoop it executes
// Reads on the queue's receive loop, as the target does resident ones.
func startMemController(t *testing.T, hostDataTimeout time.Duration, readsOnLoop bool, opts ...tcp.ListenOption) *memController {
	t.Helper()
	opts = append([]tcp.ListenOption{tcp.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)
	ln, err := tcp.Listen("127.0.0.1:0", opts...)
	if err != nil {
		t.Fatal(err)
	}
	m := &memController{ln: ln, disk: make([]byte, diskBlocks*blockSize), hostDataTimeout: hostDataTimeout,
		queues: make(chan *tcp.ControllerQueue, 64)}
	ctx, cancel := context.WithCancel(context.Background())
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		for {
			q, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			m.queues <- q
			q.Start(func(r *tcp.Request) {
				if readsOnLoop && r.Cmd.Opcode == nvme.IORead && !r.Cmd.IsFabrics() {
					m.execute(r)
					return
				}
				go m.execute(r)
			})
		}
	}()
	t.Cleanup(func() {
		cancel()
		ln.Close()
		m.wg.Wait()
		for {
			select {
			case q := <-m.queues:
				q.Close()
				q.Wait()
			default:
				return
			}
		}
	})
	return m
}

func (m *memController) execute(r *tcp.Request) {
	cmd := r.Command()
	switch {
	case cmd.IsFabrics() && cmd.FabricsType() == nvme.FabricsConnect:
		if _, err := r.HostData(m.hostDataTimeout); err != nil {
			r.Fail(err)
			return
		}
		r.Complete(nvme.Completion{DW0: 1}) // CNTLID 1
	case cmd.Opcode == nvme.IOWrite:
		b := cmd.BlockIO()
		data, err := r.HostData(m.hostDataTimeout)
		if err != nil {
			r.Fail(err)
			return
		}
		if len(data) != int(b.Blocks())*blockSize || int(b.SLBA+b.Blocks()) > diskBlocks {
			r.Fail(nvme.Errorf(nvme.StatusDataSGLLengthInvalid.WithDNR(), "write of %d bytes", len(data)))
			return
		}
		m.mu.Lock()
		copy(m.disk[b.SLBA*blockSize:], data)
		m.mu.Unlock()
		r.Complete(nvme.Completion{})
	case cmd.Opcode == nvme.IORead:
		b := cmd.BlockIO()
		buf, err := r.DataBuffer(int(b.Blocks()) * blockSize)
		if err != nil {
			r.Fail(err)
			return
		}
		m.mu.Lock()
		copy(buf, m.disk[b.SLBA*blockSize:])
		m.mu.Unlock()
		r.Complete(nvme.Completion{})
	case cmd.Opcode == nvme.IOFlush:
		r.Complete(nvme.Completion{})
	default:
		r.Fail(nvme.InvalidOpcode(cmd, false))
	}
}

const (
	subNQN  = "nqn.2026-11.io.nprdma:tcp-test"
	hostNQN = "nqn.2026-11.io.nprdma:tcp-host"
)

// connectIO dials an I/O queue (QID 1, 32 entries) and connects it.
func connectIO(t *testing.T, addr string, dg tcp.Digests) *nvmetcptest.Host {
	t.Helper()
	h := nvmetcptest.Dial(t, addr, dg)
	if c := h.Connect(t, 1, 31, subNQN, hostNQN, 1); !c.Status.OK() {
		t.Fatalf("connect: %v", c.Status)
	}
	return h
}

func writeCmd(t testing.TB, slba uint64, blocks uint32) nvme.Command {
	c, err := nvme.WriteCommand(1, slba, blocks, 0, nvme.SGLDescriptor{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func readCmd(t testing.TB, slba uint64, blocks uint32) nvme.Command {
	c, err := nvme.ReadCommand(1, slba, blocks, 0, nvme.SGLDescriptor{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func fill(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed ^ byte(i*13+i>>9)
	}
	return b
}

// writeRead writes blocks at slba and reads them back through h.
func writeRead(t *testing.T, h *nvmetcptest.Host, slba uint64, blocks uint32, seed byte) {
	t.Helper()
	data := fill(int(blocks)*blockSize, seed)
	if c, err := h.Exec(writeCmd(t, slba, blocks), data, nil); err != nil || !c.Status.OK() {
		t.Fatalf("write %d blocks at %d: %v %v", blocks, slba, err, c.Status)
	}
	got := make([]byte, len(data))
	if c, err := h.Exec(readCmd(t, slba, blocks), nil, got); err != nil || !c.Status.OK() {
		t.Fatalf("read %d blocks at %d: %v %v", blocks, slba, err, c.Status)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("%d blocks at %d read back differ", blocks, slba)
	}
}

// TestCompletionsOfCommandsReadTogetherLeaveTogether: Reads that arrive
// together and complete on the receive loop have their data and
// completions written in a few writes, not one each; a Write among them,
// whose data comes by R2T on another goroutine while the loop holds
// writing back, gets its R2T all the same; everything read back is right.
func TestCompletionsOfCommandsReadTogetherLeaveTogether(t *testing.T) {
	const reads = 32
	m := startMemController(t, 10*time.Second, true)
	h := connectIO(t, m.ln.Addr(), 0)
	q := <-m.queues
	data := fill(reads*blockSize, 9)
	m.mu.Lock()
	copy(m.disk, data)
	m.mu.Unlock()
	before := q.Stats()
	var cids []uint16
	var b []byte
	for i := range reads {
		c := readCmd(t, uint64(i), 1)
		c.CID, c.Flags, c.DPTR = uint16(100+i), nvme.FlagsSGL, nvme.TransportSGL(blockSize)
		cids = append(cids, c.CID)
		b = append(b, h.Encode(func(w *tcp.Writer) { w.CapsuleCmd(&c, nil) })...)
	}
	if err := h.Raw(b); err != nil {
		t.Fatal(err)
	}
	h.Conn.SetDeadline(time.Now().Add(nvmetcptest.Timeout))
	for i, cid := range cids {
		got := make([]byte, blockSize)
		if c, err := h.Await(cid, nil, got); err != nil || !c.Status.OK() {
			t.Fatalf("read %d: %v %v", i, err, c.Status)
		}
		if !bytes.Equal(got, data[i*blockSize:(i+1)*blockSize]) {
			t.Fatalf("read %d returned the wrong data", i)
		}
	}
	st := q.Stats()
	// One write each without holding; at least 3 with it (the first read's
	// completion goes at once, then one per sendBatch), one more each time
	// the host's bytes arrive in parts.
	if n := st.Writes - before.Writes; n == 0 || n > reads/4 {
		t.Fatalf("%d completions of reads that arrived together took %d writes, want at most %d", reads, n, reads/4)
	}
	// A write by R2T behind reads: its R2T leaves while the loop goes on.
	h.ICD = 0
	var batch []byte
	w := writeCmd(t, 200, 2)
	w.CID, w.Flags, w.DPTR = 1, nvme.FlagsSGL, nvme.TransportSGL(2*blockSize)
	batch = h.Encode(func(tw *tcp.Writer) { tw.CapsuleCmd(&w, nil) })
	for i := range 4 {
		c := readCmd(t, uint64(i), 1)
		c.CID, c.Flags, c.DPTR = uint16(2+i), nvme.FlagsSGL, nvme.TransportSGL(blockSize)
		batch = append(batch, h.Encode(func(tw *tcp.Writer) { tw.CapsuleCmd(&c, nil) })...)
	}
	if err := h.Raw(batch); err != nil {
		t.Fatal(err)
	}
	// The R2T comes among the reads' PDUs, wherever the worker queued it.
	wdata := fill(2*blockSize, 3)
	await := map[uint16]nvmetcptest.Transfer{1: {Out: wdata}}
	for i := range 4 {
		await[uint16(2+i)] = nvmetcptest.Transfer{In: make([]byte, blockSize)}
	}
	cs, err := h.AwaitAll(await)
	if err != nil {
		t.Fatal(err)
	}
	for cid, c := range cs {
		if !c.Status.OK() {
			t.Fatalf("CID %d: %v", cid, c.Status)
		}
	}
	for i := range 4 {
		if !bytes.Equal(await[uint16(2+i)].In, data[i*blockSize:(i+1)*blockSize]) {
			t.Fatalf("read %d behind the write returned the wrong data", i)
		}
	}
	writeRead(t, h, 200, 2, 3)
}

// TestWritesAndReads: writes in the capsule and by R2T (split by
// MAXH2CDATA), reads in C2HData, every combination of digests; the data
// read back is the data written.
func TestWritesAndReads(t *testing.T) {
	m := newMemController(t, tcp.WithMaxH2CData(8192))
	for _, dg := range []tcp.Digests{0, tcp.HeaderDigest, tcp.DataDigest, tcp.HeaderDigest | tcp.DataDigest} {
		t.Run(dg.String(), func(t *testing.T) {
			h := connectIO(t, m.ln.Addr(), dg)
			if h.Resp.MAXH2CDATA != 8192 || h.Resp.CPDA != 0 || h.Resp.Digests != dg {
				t.Fatalf("ICResp %+v", h.Resp)
			}
			writeRead(t, h, 0, 1, 1)   // in the capsule
			writeRead(t, h, 8, 2, 2)   // 8 KiB: still in the capsule
			writeRead(t, h, 16, 5, 3)  // R2T, three H2CData PDUs
			writeRead(t, h, 64, 64, 4) // 256 KiB
			h.ICD = 0
			writeRead(t, h, 32, 1, 5) // R2T for a single block
			if c, err := h.Exec(nvme.FlushCommand(1), nil, nil); err != nil || !c.Status.OK() {
				t.Fatalf("flush: %v %v", err, c.Status)
			}
		})
	}
}

// TestQueueFromConnect: the queue's ID and size come from its Connect.
func TestQueueFromConnect(t *testing.T) {
	m := newMemController(t, tcp.WithQueueEntries(32, 64))
	h := nvmetcptest.Dial(t, m.ln.Addr(), 0)
	h.Connect(t, 3, 15, subNQN, hostNQN, 1)
	q := <-m.queues
	if q.QID() != 3 || q.Entries() != 16 {
		t.Fatalf("queue %d of %d entries, want 3 of 16", q.QID(), q.Entries())
	}
	big := nvmetcptest.Dial(t, m.ln.Addr(), 0)
	big.Connect(t, 1, 1023, subNQN, hostNQN, 1)
	if q := <-m.queues; q.Entries() != 64 {
		t.Fatalf("a queue asking for 1024 entries holds %d: the limit is 64", q.Entries())
	}
}

// TestSQHDAdvances: every completion carries the SQ head after its command,
// wrapping at the queue's size.
func TestSQHDAdvances(t *testing.T) {
	m := newMemController(t)
	h := nvmetcptest.Dial(t, m.ln.Addr(), 0)
	h.Connect(t, 1, 3, subNQN, hostNQN, 1) // 4 entries; the Connect was the first
	for i, want := range []uint16{2, 3, 0, 1, 2} {
		c, err := h.Exec(nvme.FlushCommand(1), nil, nil)
		if err != nil || c.SQHD != want {
			t.Fatalf("command %d: SQHD %d (%v), want %d", i, c.SQHD, err, want)
		}
	}
}

// TestDisabledSQFlowControl: a host that disables SQ flow control gets SQHD
// 0xFFFF, and successful reads end with C2HData carrying SUCCESS instead of
// a CapsuleResp.
func TestDisabledSQFlowControl(t *testing.T) {
	m := newMemController(t)
	h := nvmetcptest.Dial(t, m.ln.Addr(), 0)
	d := nvme.ConnectData{CNTLID: 1, SubNQN: subNQN, HostNQN: hostNQN}
	data, _ := d.Marshal()
	c, err := h.Exec(nvme.ConnectCommand(nvme.ConnectParams{QID: 1, SQSIZE: 31, CATTR: 1 << 2}, nvme.SGLDescriptor{}), data, nil)
	if err != nil || !c.Status.OK() || c.SQHD != 0xffff {
		t.Fatalf("connect: %v %v SQHD %#x", err, c.Status, c.SQHD)
	}
	writeRead(t, h, 0, 2, 7)
	if s := (<-m.queues).Stats(); s.C2HData != 1 || s.Completions != 3 {
		t.Fatalf("stats %+v: want the read's completion in its C2HData", s)
	}
	c, err = h.Exec(nvme.FlushCommand(1), nil, nil)
	if err != nil || c.SQHD != 0xffff {
		t.Fatalf("flush: %v SQHD %#x", err, c.SQHD)
	}
}

// TestMalformedCapsulesAreAnswered: capsules the binding can parse but not
// serve get a status by CID, and the connection goes on.
func TestMalformedCapsulesAreAnswered(t *testing.T) {
	m := newMemController(t)
	h := connectIO(t, m.ln.Addr(), 0)
	send := func(cmd nvme.Command, icd []byte) nvme.Completion {
		t.Helper()
		cmd.CID = 77
		h.W.CapsuleCmd(&cmd, icd)
		if err := h.W.Flush(); err != nil {
			t.Fatal(err)
		}
		c, err := h.Await(77, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	fused := writeCmd(t, 0, 1)
	fused.Flags, fused.DPTR = nvme.FlagsSGL|1, nvme.InCapsuleSGL(0, 4096)
	keyed := readCmd(t, 0, 1)
	keyed.Flags = nvme.FlagsSGL
	keyed.DPTR, _ = nvme.KeyedSGL(0x1000, 4096, 5)
	icdRead := readCmd(t, 0, 1)
	icdRead.Flags, icdRead.DPTR = nvme.FlagsSGL, nvme.InCapsuleSGL(0, 512)
	for _, c := range []struct {
		name string
		cmd  nvme.Command
		icd  []byte
		want nvme.Status
	}{
		{"fused", fused, make([]byte, 4096), nvme.StatusInvalidField},
		{"keyed SGL", keyed, nil, nvme.StatusSGLDescriptorTypeInvalid},
		{"in-capsule data for a read", icdRead, make([]byte, 512), nvme.StatusInvalidField},
	} {
		got := send(c.cmd, c.icd)
		if !errors.Is(got.Err(), c.want) || !got.Status.DNR() {
			t.Errorf("%s: %v, want %v with DNR", c.name, got.Status, c.want)
		}
	}
	writeRead(t, h, 3, 1, 9)
}

// badInput is a host misbehaving on an I/O queue; its queue must end with
// the termination request given (or be closed, fes 0) while another host
// goes on.
type badInput struct {
	name string
	dg   tcp.Digests
	do   func(t *testing.T, h *nvmetcptest.Host)
	fes  tcp.FES
	fei  uint32
}

func badInputs(t *testing.T) []badInput {
	cmd := writeCmd(t, 0, 1)
	cmd.CID, cmd.Flags, cmd.DPTR = 900, nvme.FlagsSGL, nvme.InCapsuleSGL(0, 4096)
	raw := func(b []byte) func(t *testing.T, h *nvmetcptest.Host) {
		return func(t *testing.T, h *nvmetcptest.Host) {
			if err := h.Raw(b); err != nil {
				t.Fatal(err)
			}
		}
	}
	capsule := func(h *nvmetcptest.Host) []byte {
		return h.Encode(func(w *tcp.Writer) { w.CapsuleCmd(&cmd, make([]byte, 4096)) })
	}
	return []badInput{
		{name: "unknown PDU type", do: raw([]byte{0x08, 0, 24, 0, 24, 0, 0, 0}), fes: tcp.FESInvalidHeaderField, fei: 0},
		{name: "PDU of the controller's direction", do: raw([]byte{byte(tcp.TypeCapsuleResp), 0, 24, 0, 24, 0, 0, 0}), fes: tcp.FESInvalidHeaderField, fei: 0},
		{name: "second ICReq", do: func(t *testing.T, h *nvmetcptest.Host) {
			h.Raw(h.Encode(func(w *tcp.Writer) { w.ICReq(&tcp.ICReq{}) }))
		}, fes: tcp.FESPDUSequenceError, fei: 0},
		{name: "header digest mismatch", dg: tcp.HeaderDigest, do: func(t *testing.T, h *nvmetcptest.Host) {
			b := capsule(h)
			b[tcp.CapsuleCmdHeaderSize] ^= 0xff
			h.Raw(b)
		}, fes: tcp.FESHeaderDigestError, fei: 0},
		{name: "in-capsule data larger than negotiated", do: func(t *testing.T, h *nvmetcptest.Host) {
			big := cmd
			big.DPTR = nvme.InCapsuleSGL(0, 12288)
			h.Raw(h.Encode(func(w *tcp.Writer) { w.CapsuleCmd(&big, make([]byte, 12288)) }))
		}, fes: tcp.FESDataLimitExceeded, fei: 4},
		{name: "H2CData without R2T", do: func(t *testing.T, h *nvmetcptest.Host) {
			h.Raw(h.Encode(func(w *tcp.Writer) { w.H2CData(&tcp.DataHeader{CCCID: 1, TTAG: 0, Last: true}, make([]byte, 4096)) }))
		}, fes: tcp.FESInvalidHeaderField, fei: 10},
		{name: "H2CData larger than MAXH2CDATA", do: func(t *testing.T, h *nvmetcptest.Host) {
			w := writeCmd(t, 0, 8)
			w.CID, w.Flags, w.DPTR = 901, nvme.FlagsSGL, nvme.TransportSGL(8*4096)
			h.Raw(h.Encode(func(wr *tcp.Writer) { wr.CapsuleCmd(&w, nil) }))
			p, err := h.R.Next() // the R2T
			if err != nil || p.Type != tcp.TypeR2T {
				t.Fatalf("want an R2T: %v", err)
			}
			var r tcp.R2T
			_ = r.Unmarshal(p.Bytes())
			h.Raw(h.Encode(func(wr *tcp.Writer) {
				wr.H2CData(&tcp.DataHeader{CCCID: 901, TTAG: r.TTAG, Last: true}, make([]byte, 8*4096))
			}))
		}, fes: tcp.FESDataLimitExceeded, fei: 4},
		{name: "H2CData beyond the R2T", do: func(t *testing.T, h *nvmetcptest.Host) {
			w := writeCmd(t, 0, 2)
			w.CID, w.Flags, w.DPTR = 902, nvme.FlagsSGL, nvme.TransportSGL(2*4096)
			h.Raw(h.Encode(func(wr *tcp.Writer) { wr.CapsuleCmd(&w, nil) }))
			p, err := h.R.Next()
			if err != nil || p.Type != tcp.TypeR2T {
				t.Fatalf("want an R2T: %v", err)
			}
			var r tcp.R2T
			_ = r.Unmarshal(p.Bytes())
			h.Raw(h.Encode(func(wr *tcp.Writer) {
				wr.H2CData(&tcp.DataHeader{CCCID: 902, TTAG: r.TTAG, DATAO: 4096, Last: true}, make([]byte, 8192))
			}))
		}, fes: tcp.FESDataOutOfRange, fei: 12},
		{name: "more commands than the queue holds", do: func(t *testing.T, h *nvmetcptest.Host) {
			// 32 entries; Writes whose data never comes keep their slots.
			h.Raw(h.Encode(func(wr *tcp.Writer) {
				for i := 0; i < 33; i++ {
					w := writeCmd(t, 0, 4)
					w.CID, w.Flags, w.DPTR = uint16(1000+i), nvme.FlagsSGL, nvme.TransportSGL(4*4096)
					wr.CapsuleCmd(&w, nil)
				}
			}))
		}, fes: tcp.FESPDUSequenceError, fei: 0},
		{name: "host terminates", do: func(t *testing.T, h *nvmetcptest.Host) {
			h.Raw(h.Encode(func(w *tcp.Writer) { w.TermReq(&tcp.TermReq{Type: tcp.TypeH2CTermReq, FES: tcp.FESHeaderDigestError}) }))
		}},
		{name: "truncated PDU", do: func(t *testing.T, h *nvmetcptest.Host) {
			h.Raw(capsule(h)[:100])
			h.Conn.(*net.TCPConn).CloseWrite()
		}},
	}
}

// TestBadInputEndsThatQueueOnly: each bad input ends its connection with
// the termination request the specification gives (or a plain close), and
// another host's queue keeps being served throughout.
func TestBadInputEndsThatQueueOnly(t *testing.T) {
	m := newMemController(t, tcp.WithMaxH2CData(16384))
	good := connectIO(t, m.ln.Addr(), tcp.HeaderDigest|tcp.DataDigest)
	for i, c := range badInputs(t) {
		t.Run(c.name, func(t *testing.T) {
			h := connectIO(t, m.ln.Addr(), c.dg)
			c.do(t, h)
			if c.fes == 0 {
				h.ExpectClosed(t)
			} else {
				tr := h.ExpectTermReq(t)
				if tr.FES != c.fes || tr.FEI != c.fei || len(tr.Data) == 0 {
					t.Fatalf("%v with %d bytes of header, want FES %v FEI %d", &tr, len(tr.Data), c.fes, c.fei)
				}
			}
			writeRead(t, good, uint64(i), 1, byte(i))
		})
	}
}

// TestDataDigestErrorsFailTheCommandOnly: a write whose data digest is
// wrong (in the capsule or in H2CData) fails with Transient Transport Error
// (no DNR: the host retries), nothing of it is written, and the connection
// goes on.
func TestDataDigestErrorsFailTheCommandOnly(t *testing.T) {
	m := newMemController(t)
	h := connectIO(t, m.ln.Addr(), tcp.DataDigest)
	writeRead(t, h, 0, 1, 1)
	bad := writeCmd(t, 0, 1)
	bad.CID, bad.Flags, bad.DPTR = 500, nvme.FlagsSGL, nvme.InCapsuleSGL(0, 4096)
	b := h.Encode(func(w *tcp.Writer) { w.CapsuleCmd(&bad, fill(4096, 2)) })
	b[len(b)-1] ^= 1
	h.Raw(b)
	if c, err := h.Await(500, nil, nil); err != nil || !errors.Is(c.Err(), nvme.StatusTransientTransportError) || c.Status.DNR() {
		t.Fatalf("in-capsule digest error: %v %v", err, c.Status)
	}
	r2t := writeCmd(t, 0, 2)
	r2t.CID, r2t.Flags, r2t.DPTR = 501, nvme.FlagsSGL, nvme.TransportSGL(8192)
	h.Raw(h.Encode(func(w *tcp.Writer) { w.CapsuleCmd(&r2t, nil) }))
	p, err := h.R.Next()
	if err != nil || p.Type != tcp.TypeR2T {
		t.Fatalf("want an R2T: %v", err)
	}
	var r tcp.R2T
	_ = r.Unmarshal(p.Bytes())
	b = h.Encode(func(w *tcp.Writer) { w.H2CData(&tcp.DataHeader{CCCID: 501, TTAG: r.TTAG, Last: true}, fill(8192, 3)) })
	b[len(b)-1] ^= 1
	h.Raw(b)
	if c, err := h.Await(501, nil, nil); err != nil || !errors.Is(c.Err(), nvme.StatusTransientTransportError) {
		t.Fatalf("H2CData digest error: %v %v", err, c.Status)
	}
	got := make([]byte, 4096)
	if c, err := h.Exec(readCmd(t, 0, 1), nil, got); err != nil || !c.Status.OK() || !bytes.Equal(got, fill(4096, 1)) {
		t.Fatalf("block 0 after the failed writes: %v %v, data kept %v", err, c.Status, bytes.Equal(got, fill(4096, 1)))
	}
	if s := (<-m.queues).Stats(); s.DigestErrors != 2 {
		t.Fatalf("stats %+v: want 2 digest errors", s)
	}
}

// TestStalledHostsAreClosed: a host that stops in the middle of a PDU, or
// never sends the data its R2T asked for, has its queue closed after the
// stall timeout; a host that is merely idle is not.
func TestStalledHostsAreClosed(t *testing.T) {
	m := newMemControllerTimeout(t, 200*time.Millisecond, tcp.WithStallTimeout(200*time.Millisecond))
	idle := connectIO(t, m.ln.Addr(), 0)
	half := connectIO(t, m.ln.Addr(), 0)
	cmd := writeCmd(t, 0, 1)
	cmd.CID, cmd.Flags, cmd.DPTR = 5, nvme.FlagsSGL, nvme.InCapsuleSGL(0, 4096)
	half.Raw(half.Encode(func(w *tcp.Writer) { w.CapsuleCmd(&cmd, make([]byte, 4096)) })[:1000])
	noData := connectIO(t, m.ln.Addr(), 0)
	w := writeCmd(t, 0, 4)
	w.CID, w.Flags, w.DPTR = 6, nvme.FlagsSGL, nvme.TransportSGL(4*4096)
	noData.Raw(noData.Encode(func(wr *tcp.Writer) { wr.CapsuleCmd(&w, nil) }))
	half.ExpectClosed(t)
	noData.ExpectClosed(t)
	time.Sleep(300 * time.Millisecond)
	writeRead(t, idle, 1, 1, 1)
}

// TestBadICReq: an ICReq the controller cannot serve is answered with a
// C2HTermReq (unsupported parameter, the field's offset) and a close; a
// connection that never sends one is closed after the handshake timeout.
func TestBadICReq(t *testing.T) {
	m := newMemController(t, tcp.WithHandshakeTimeout(200*time.Millisecond))
	for _, c := range []struct {
		req tcp.ICReq
		fei uint32
	}{{tcp.ICReq{PFV: 1}, 8}, {tcp.ICReq{HPDA: 32}, 10}, {tcp.ICReq{Digests: 0x80}, 11}} {
		conn, err := net.Dial("tcp", m.ln.Addr())
		if err != nil {
			t.Fatal(err)
		}
		h := &nvmetcptest.Host{Conn: conn, R: tcp.NewReader(conn, tcp.RoleHost), W: tcp.NewWriter(conn)}
		h.W.ICReq(&c.req)
		h.W.Flush()
		tr := h.ExpectTermReq(t)
		if tr.FES != tcp.FESUnsupportedParameter || tr.FEI != c.fei {
			t.Errorf("ICReq %+v: %v, want unsupported parameter at %d", c.req, &tr, c.fei)
		}
		conn.Close()
	}
	silent, err := net.Dial("tcp", m.ln.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	(&nvmetcptest.Host{Conn: silent}).ExpectClosed(t)
	if n := m.ln.Rejected(); n != 4 {
		t.Fatalf("%d connections refused, want 4", n)
	}
	connectIO(t, m.ln.Addr(), 0)
}

// TestMaxQueues: connections beyond the limit are closed at once.
func TestMaxQueues(t *testing.T) {
	m := newMemController(t, tcp.WithMaxQueues(2))
	a := connectIO(t, m.ln.Addr(), 0)
	connectIO(t, m.ln.Addr(), 0)
	if _, err := nvmetcptest.DialErr(m.ln.Addr(), 0); err == nil {
		t.Fatal("a third connection was served")
	}
	writeRead(t, a, 0, 1, 1)
}

// TestListenerCloseEndsQueuesNotAccepted: a queue initialized but never
// accepted is closed with the listener, its first command released.
func TestListenerCloseEndsQueuesNotAccepted(t *testing.T) {
	ln, err := tcp.Listen("127.0.0.1:0", tcp.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	h := nvmetcptest.Dial(t, ln.Addr(), 0)
	d := nvme.ConnectData{CNTLID: 1, SubNQN: subNQN, HostNQN: hostNQN}
	data, _ := d.Marshal()
	cmd := nvme.ConnectCommand(nvme.ConnectParams{QID: 1, SQSIZE: 31}, nvme.InCapsuleSGL(0, uint32(len(data))))
	cmd.CID, cmd.Flags = 1, nvme.FlagsSGL
	h.W.CapsuleCmd(&cmd, data)
	if err := h.W.Flush(); err != nil {
		t.Fatal(err)
	}
	for ln.Queues() != 1 {
		time.Sleep(time.Millisecond)
	}
	done := make(chan struct{})
	go func() { ln.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hangs on a queue nobody accepted")
	}
	h.ExpectClosed(t)
	if n := ln.Queues(); n != 0 {
		t.Fatalf("%d queues left", n)
	}
}
