package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nvme"
)

// fakeController is a scripted NVMe/TCP controller for the host's tests:
// it answers ICReq, serves Read and Write on NSID 1 from memory (reads in
// C2HData chunks of chunk bytes, writes beyond the capsule through one R2T
// for the whole transfer, answered in H2CData of at most MAXH2CDATA), and
// completes every other command with success. Its hooks misbehave on
// purpose.
type fakeController struct {
	t       testing.TB
	ln      net.Listener
	mem     []byte
	maxH2C  uint32
	cpda    uint8
	chunk   int  // C2HData size (0: the whole read in one PDU)
	success bool // SUCCESS on a read's last C2HData instead of a CapsuleResp

	// grant overrides the digests the ICResp grants (nil: those asked).
	grant func(asked Digests) Digests
	// onCommand may answer a command itself (true: handled); what it
	// writes to conn directly goes out after w's batch.
	onCommand func(w *Writer, conn net.Conn, cmd *nvme.Command) bool

	mu    sync.Mutex
	terms []TermReq // termination requests received
	conns []net.Conn
	wg    sync.WaitGroup
	ended chan struct{} // a value per connection served to its end
	once  sync.Once
}

// newFakeController listens; it serves from the first start on, so that
// the test configures it first.
func newFakeController(t testing.TB, size int) *fakeController {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeController{t: t, ln: ln, mem: make([]byte, size), maxH2C: 16 << 10, chunk: 8 << 10, ended: make(chan struct{}, 64)}
	t.Cleanup(f.close)
	return f
}

func (f *fakeController) start() {
	f.once.Do(f.accept)
}

func (f *fakeController) accept() {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			conn, err := f.ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.conns = append(f.conns, conn)
			f.mu.Unlock()
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				defer func() { f.ended <- struct{}{} }()
				defer conn.Close()
				f.serve(conn)
			}()
		}
	}()
}

func (f *fakeController) addr() string { return f.ln.Addr().String() }

func (f *fakeController) close() {
	f.ln.Close()
	f.mu.Lock()
	for _, c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// termReqs waits a little for the first termination request to arrive and
// returns those received.
func (f *fakeController) termReqs() []TermReq {
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		f.mu.Lock()
		n := len(f.terms)
		f.mu.Unlock()
		if n > 0 {
			break
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]TermReq(nil), f.terms...)
}

// pendingWrite is a write the controller asked the data of with an R2T.
type pendingWrite struct {
	cmd   nvme.Command
	off   int // byte offset in mem
	n     int
	moved int
}

func (f *fakeController) serve(conn net.Conn) {
	r := NewReader(conn, RoleController)
	w := NewWriter(conn)
	h, err := r.Next()
	if err != nil {
		return
	}
	var req ICReq
	if req.Unmarshal(h.Bytes()) != nil {
		return
	}
	d := req.Digests
	if f.grant != nil {
		d = f.grant(d)
	}
	w.ICResp(&ICResp{PFV: PFV10, CPDA: f.cpda, Digests: d, MAXH2CDATA: f.maxH2C})
	if w.Flush() != nil {
		return
	}
	r.Negotiated(d, f.cpda, Limits{InCapsuleData: 8192, MaxH2CData: int(f.maxH2C)})
	w.Negotiated(d, req.HPDA)
	writes := map[uint16]*pendingWrite{}
	for {
		h, err := r.Next()
		if err != nil {
			return
		}
		data := make([]byte, h.DataLen)
		if err := r.ReadData(data); err != nil {
			return
		}
		switch h.Type {
		case TypeH2CTermReq:
			var t TermReq
			t.Unmarshal(h.Bytes(), data)
			f.mu.Lock()
			f.terms = append(f.terms, t)
			f.mu.Unlock()
			return
		case TypeH2CData:
			var dh DataHeader
			dh.Unmarshal(h.Bytes())
			pw := writes[dh.CCCID]
			if pw == nil || dh.TTAG != dh.CCCID || int(dh.DATAO) != pw.moved {
				f.t.Errorf("fake controller: H2CData %+v for %+v", dh, pw)
				return
			}
			copy(f.mem[pw.off+pw.moved:], data)
			pw.moved += len(data)
			if pw.moved == pw.n {
				if !dh.Last {
					f.t.Errorf("fake controller: the write's last H2CData lacks LAST_PDU")
				}
				delete(writes, dh.CCCID)
				w.CapsuleResp(&nvme.Completion{CID: dh.CCCID})
			}
		case TypeCapsuleCmd:
			cmd, _ := ParseCapsuleCmd(h.Bytes())
			if f.onCommand != nil && f.onCommand(w, conn, &cmd) {
				break
			}
			off, n := f.extent(&cmd)
			switch cmd.Opcode {
			case nvme.IOWrite:
				if cmd.DPTR.InCapsule() {
					copy(f.mem[off:], data)
					w.CapsuleResp(&nvme.Completion{CID: cmd.CID})
					break
				}
				writes[cmd.CID] = &pendingWrite{cmd: cmd, off: off, n: n}
				w.R2T(&R2T{CCCID: cmd.CID, TTAG: cmd.CID, R2TO: 0, R2TL: uint32(n)})
			case nvme.IORead:
				f.sendRead(w, cmd.CID, f.mem[off:off+n])
			default:
				w.CapsuleResp(&nvme.Completion{CID: cmd.CID, DW0: 0x1234})
			}
		}
		if w.Flush() != nil {
			return
		}
	}
}

func (f *fakeController) extent(cmd *nvme.Command) (off, n int) {
	slba := uint64(cmd.CDW10) | uint64(cmd.CDW11)<<32
	return int(slba) * 512, (int(cmd.CDW12&0xffff) + 1) * 512
}

func (f *fakeController) sendRead(w *Writer, cid uint16, data []byte) {
	chunk := f.chunk
	if chunk == 0 {
		chunk = len(data)
	}
	for off := 0; off < len(data); off += chunk {
		k := min(chunk, len(data)-off)
		last := off+k == len(data)
		w.C2HData(&DataHeader{CCCID: cid, DATAO: uint32(off), Last: last, Success: last && f.success}, data[off:off+k])
	}
	if !f.success {
		w.CapsuleResp(&nvme.Completion{CID: cid})
	}
}

// rw is a Read or Write of n bytes at off in 512-byte blocks.
func rw(t testing.TB, write bool, off, n int) nvme.Command {
	var cmd nvme.Command
	var err error
	if write {
		cmd, err = nvme.WriteCommand(1, uint64(off/512), uint32(n/512), 0, nvme.NullSGL())
	} else {
		cmd, err = nvme.ReadCommand(1, uint64(off/512), uint32(n/512), 0, nvme.NullSGL())
	}
	if err != nil {
		t.Fatal(err)
	}
	return cmd
}

func dialFake(t testing.TB, f *fakeController, qc QueueConfig, opts ...DialOption) *HostQueue {
	t.Helper()
	f.start()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q, err := Dial(ctx, f.addr(), qc, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

// TestHostReadsAndWrites writes and reads back transfers of every size
// class — in the capsule, one H2CData, several H2CData (MAXH2CDATA 16 KiB),
// one and several C2HData — from 8 goroutines at once, with every
// combination of digests, with and without the SUCCESS flag, a controller
// asking for 16-byte data alignment, and submitters that may and may not
// give up (the copy and the direct path).
func TestHostReadsAndWrites(t *testing.T) {
	for _, dg := range []Digests{0, HeaderDigest, DataDigest, HeaderDigest | DataDigest} {
		for _, success := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/success=%v", dg, success), func(t *testing.T) {
				f := newFakeController(t, 8<<20)
				f.success, f.cpda = success, 3
				q := dialFake(t, f, QueueConfig{QID: 1, Entries: 32, InCapsuleData: 4096}, WithDigests(dg))
				if q.Digests() != dg {
					t.Fatalf("digests %s, asked for %s", q.Digests(), dg)
				}
				sizes := []int{512, 4096, 8192, 16 << 10, 40 << 10, 256 << 10}
				var wg sync.WaitGroup
				for g := 0; g < 8; g++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						rng := rand.New(rand.NewPCG(uint64(g), 7))
						region := g * (512 << 10)
						for i, n := range sizes {
							ctx := context.Background()
							if i%2 == 1 {
								var cancel context.CancelFunc
								ctx, cancel = context.WithTimeout(ctx, time.Minute)
								defer cancel()
							}
							data := make([]byte, n)
							for j := 0; j < n; j += 8 {
								le.PutUint64(data[j:], rng.Uint64())
							}
							if _, err := q.Submit(ctx, rw(t, true, region, n), data); err != nil {
								t.Errorf("write %d: %v", n, err)
								return
							}
							got := make([]byte, n)
							if _, err := q.Submit(ctx, rw(t, false, region, n), got); err != nil {
								t.Errorf("read %d: %v", n, err)
								return
							}
							if !bytes.Equal(got, data) {
								t.Errorf("%d bytes read back differ", n)
								return
							}
						}
					}()
				}
				wg.Wait()
				cqe, err := q.Submit(context.Background(), nvme.FlushCommand(1), nil)
				if err != nil || cqe.DW0 != 0x1234 {
					t.Fatalf("flush: %+v %v", cqe, err)
				}
			})
		}
	}
}

// TestHostGivesUpAndTheQueueGoesOn: a submitter whose context ends gets its
// error at once; the read's data arrives later and lands in the queue's
// copy, not in the buffer the submitter has taken back; its CID comes back
// with the late completion, and the queue serves the next commands (more
// than its depth, so every CID is reused).
func TestHostGivesUpAndTheQueueGoesOn(t *testing.T) {
	f := newFakeController(t, 1<<20)
	for i := range f.mem {
		f.mem[i] = 0xab
	}
	var held *nvme.Command
	f.onCommand = func(w *Writer, _ net.Conn, cmd *nvme.Command) bool {
		switch {
		case cmd.Opcode == nvme.IORead && held == nil:
			c := *cmd
			held = &c
			return true // answered with the next write
		case cmd.Opcode == nvme.IOWrite && held != nil:
			f.sendRead(w, held.CID, f.mem[:4096])
		}
		return false
	}
	q := dialFake(t, f, QueueConfig{QID: 1, Entries: 3, InCapsuleData: 4096})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	given := make([]byte, 4096)
	if _, err := q.Submit(ctx, rw(t, false, 0, 4096), given); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a read never answered: %v, want the context's deadline", err)
	}
	if q.Err() != nil {
		t.Fatalf("the queue failed: %v", q.Err())
	}
	if _, err := q.Submit(context.Background(), rw(t, true, 8192, 4096), make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(given, make([]byte, 4096)) {
		t.Fatal("the late data landed in the buffer of a submitter that gave up")
	}
	for i := 0; i < 4; i++ {
		got := make([]byte, 4096)
		if _, err := q.Submit(context.Background(), rw(t, false, 0, 4096), got); err != nil || got[0] != 0xab {
			t.Fatalf("read %d: %v (first byte %#x)", i, err, got[0])
		}
	}
}

// TestHostRefusesAPDUOutOfTurn: C2HData for a CID not in flight is a
// protocol error of the controller: the host reports it with an
// H2CTermReq (invalid header field, FEI of CCCID), closes the connection
// and fails the commands in flight.
func TestHostRefusesAPDUOutOfTurn(t *testing.T) {
	f := newFakeController(t, 1<<20)
	f.onCommand = func(w *Writer, _ net.Conn, cmd *nvme.Command) bool {
		w.C2HData(&DataHeader{CCCID: cmd.CID + 5, Last: true}, make([]byte, 512))
		return true
	}
	q := dialFake(t, f, QueueConfig{QID: 1, Entries: 16})
	_, err := q.Submit(context.Background(), rw(t, false, 0, 4096), make([]byte, 4096))
	if !errors.Is(err, nvme.ErrQueueFailed) {
		t.Fatalf("read: %v, want a failed queue", err)
	}
	select {
	case <-q.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed")
	}
	terms := f.termReqs()
	if len(terms) != 1 || terms[0].FES != FESInvalidHeaderField || terms[0].FEI != offDataCCCID || len(terms[0].Data) != DataHeaderSize {
		t.Fatalf("termination requests %+v", terms)
	}
}

// TestHostRefusesDataBeyondTheRead: C2HData past the end of the read, and
// an R2T past the end of the write, are out of range.
func TestHostRefusesDataBeyondTheRead(t *testing.T) {
	for _, write := range []bool{false, true} {
		f := newFakeController(t, 1<<20)
		f.onCommand = func(w *Writer, _ net.Conn, cmd *nvme.Command) bool {
			if write {
				w.R2T(&R2T{CCCID: cmd.CID, R2TO: 0, R2TL: 64 << 10})
			} else {
				w.C2HData(&DataHeader{CCCID: cmd.CID, DATAO: 4096, Last: true}, make([]byte, 4096))
			}
			return true
		}
		q := dialFake(t, f, QueueConfig{QID: 1, Entries: 16})
		_, err := q.Submit(context.Background(), rw(t, write, 0, 4096), make([]byte, 4096))
		if !errors.Is(err, nvme.ErrQueueFailed) {
			t.Fatalf("write %v: %v, want a failed queue", write, err)
		}
		if terms := f.termReqs(); len(terms) != 1 || terms[0].FES != FESDataOutOfRange {
			t.Fatalf("write %v: termination requests %+v", write, terms)
		}
	}
}

// TestHostTakesATermReq: a C2HTermReq fails the queue with an error that
// says so (ErrTermReq, the FES), and is not answered.
func TestHostTakesATermReq(t *testing.T) {
	f := newFakeController(t, 1<<20)
	f.onCommand = func(w *Writer, _ net.Conn, cmd *nvme.Command) bool {
		w.TermReq(&TermReq{Type: TypeC2HTermReq, FES: FESUnsupportedParameter, FEI: 11, Data: make([]byte, 72)})
		return true
	}
	q := dialFake(t, f, QueueConfig{QID: 1, Entries: 16})
	_, err := q.Submit(context.Background(), nvme.FlushCommand(1), nil)
	if !errors.Is(err, ErrTermReq) || !errors.Is(err, nvme.ErrQueueFailed) || !bytes.Contains([]byte(err.Error()), []byte("unsupported parameter")) {
		t.Fatalf("flush: %v", err)
	}
	<-f.ended // the host closed the connection: nothing more comes
	f.mu.Lock()
	defer f.mu.Unlock()
	if terms := f.terms; len(terms) != 0 {
		t.Fatalf("the host answered a termination request: %+v", terms)
	}
}

// TestHostDataDigestMismatchFailsTheCommandOnly: a read whose data digest
// does not match fails with Data Transfer Error (as Linux reports it); the
// stream is in step and the next read succeeds.
func TestHostDataDigestMismatchFailsTheCommandOnly(t *testing.T) {
	f := newFakeController(t, 1<<20)
	bad := true
	f.onCommand = func(w *Writer, conn net.Conn, cmd *nvme.Command) bool {
		if cmd.Opcode != nvme.IORead || !bad {
			return false
		}
		bad = false
		w.Flush()
		// C2HData of 4 KiB with a data digest that does not match, then the
		// completion.
		const n = 4096
		pdu := make([]byte, DataHeaderSize+n+DigestSize)
		ch := CommonHeader{Type: TypeC2HData, Flags: FlagDDGST | FlagLast, HLEN: DataHeaderSize, PDO: DataHeaderSize, PLEN: uint32(len(pdu))}
		ch.MarshalTo(pdu)
		(&DataHeader{CCCID: cmd.CID, DATAL: n}).marshalPSH(pdu)
		le.PutUint32(pdu[DataHeaderSize+n:], Digest(pdu[DataHeaderSize:DataHeaderSize+n])^1)
		conn.Write(pdu)
		w.CapsuleResp(&nvme.Completion{CID: cmd.CID})
		return true
	}
	q := dialFake(t, f, QueueConfig{QID: 1, Entries: 16}, WithDigests(DataDigest))
	_, err := q.Submit(context.Background(), rw(t, false, 0, 4096), make([]byte, 4096))
	if !errors.Is(err, nvme.StatusDataTransferError) {
		t.Fatalf("read with a bad digest: %v, want Data Transfer Error", err)
	}
	if _, err := q.Submit(context.Background(), rw(t, false, 0, 4096), make([]byte, 4096)); err != nil {
		t.Fatalf("the next read: %v", err)
	}
}

// TestHostChecksTheICResp: digests other than those asked for are refused
// with an H2CTermReq (unsupported parameter, FEI of DGST) and the dial
// fails.
func TestHostChecksTheICResp(t *testing.T) {
	f := newFakeController(t, 1<<20)
	f.grant = func(Digests) Digests { return HeaderDigest }
	f.start()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if q, err := Dial(ctx, f.addr(), QueueConfig{QID: 1, Entries: 16}); err == nil {
		q.Close()
		t.Fatal("dial accepted digests it did not ask for")
	}
	if terms := f.termReqs(); len(terms) != 1 || terms[0].FES != FESUnsupportedParameter || terms[0].FEI != offICDigest {
		t.Fatalf("termination requests %+v", terms)
	}
}

// TestHostCloseFailsWhatIsInFlight: Close while a command waits for its
// completion fails it with ErrQueueFailed, and later Submits fail at once.
func TestHostCloseFailsWhatIsInFlight(t *testing.T) {
	f := newFakeController(t, 1<<20)
	f.onCommand = func(*Writer, net.Conn, *nvme.Command) bool { return true } // never answers
	q := dialFake(t, f, QueueConfig{QID: 1, Entries: 16})
	errc := make(chan error, 1)
	go func() {
		_, err := q.Submit(context.Background(), rw(t, false, 0, 4096), make([]byte, 4096))
		errc <- err
	}()
	for q.calls[0].Finished() {
		time.Sleep(time.Millisecond)
	}
	q.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, nvme.ErrQueueFailed) {
			t.Fatalf("in flight at Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Submit still waiting after Close")
	}
	if _, err := q.Submit(context.Background(), nvme.FlushCommand(1), nil); !errors.Is(err, nvme.ErrQueueFailed) {
		t.Fatalf("after Close: %v", err)
	}
}

// TestHostContextEndsAWaitingLeader: the only submitter waits on the
// connection itself (it leads); its context ending frees it without
// breaking the stream: the late completion is taken by the next command's
// submitter and both CIDs are usable again.
func TestHostContextEndsAWaitingLeader(t *testing.T) {
	f := newFakeController(t, 1<<20)
	var mu sync.Mutex
	var late []uint16
	f.onCommand = func(w *Writer, _ net.Conn, cmd *nvme.Command) bool {
		if cmd.Opcode != nvme.IOFlush {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		if late == nil {
			late = []uint16{cmd.CID}
			return true // held until the next flush
		}
		for _, cid := range append(late, cmd.CID) {
			w.CapsuleResp(&nvme.Completion{CID: cid})
		}
		return true
	}
	q := dialFake(t, f, QueueConfig{QID: 1, Entries: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := q.Submit(ctx, nvme.FlushCommand(1), nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("held flush: %v", err)
	}
	if _, err := q.Submit(context.Background(), nvme.FlushCommand(1), nil); err != nil {
		t.Fatalf("second flush: %v", err)
	}
	for i := 0; i < 4; i++ {
		if _, err := q.Submit(context.Background(), rw(t, true, 0, 512), make([]byte, 512)); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
}

var _ io.Closer = (*HostQueue)(nil)

// BenchmarkHostRead reads 4 KiB at QD1 from the fake controller (whose
// own costs are included), with a context that cannot end (the direct
// path) and one that can (the copy path).
func BenchmarkHostRead(b *testing.B) {
	f := newFakeController(b, 1<<20)
	q := dialFake(b, f, QueueConfig{QID: 1, Entries: 32})
	cmd := rw(b, false, 0, 4096)
	buf := make([]byte, 4096)
	for _, cancelable := range []bool{false, true} {
		b.Run(fmt.Sprintf("cancelable=%v", cancelable), func(b *testing.B) {
			ctx := context.Background()
			if cancelable {
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				defer cancel()
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := q.Submit(ctx, cmd, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
