package fabric

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nprdma/tcp"
	"github.com/nprdma/nprdma/nvme"
)

// provider builds the two sides of a test: each its own provider (one per
// process in a real deployment), on one in-process fabric for loop.
type providerKind struct {
	name   string
	new    func() (srv, cli nprdma.Provider)
	listen string
}

var providers = []providerKind{
	{"loop", func() (nprdma.Provider, nprdma.Provider) {
		f := loop.NewFabric()
		return loop.New(loop.WithFabric(f)), loop.New(loop.WithFabric(f))
	}, ""},
	{"tcp", func() (nprdma.Provider, nprdma.Provider) { return tcp.New(), tcp.New() }, "127.0.0.1:0"},
}

func forEachProvider(t *testing.T, fn func(t *testing.T, pk providerKind)) {
	for _, pk := range providers {
		t.Run(pk.name, func(t *testing.T) { fn(t, pk) })
	}
}

// memController is a minimal controller over a byte slice: Read, Write,
// an opcode that parks until released, and Invalid Opcode for the rest.
type memController struct {
	mu     sync.Mutex
	data   []byte
	parked []*Request
	queues []*ControllerQueue
	seen   chan nvme.Command
	hook   func(*Request) bool // if set and true, it took the command
}

const (
	testBlock  = 512
	opPark     = nvme.Opcode(0x84) // vendor, no data: parked until released
	testBlocks = 4096
)

func (m *memController) handle(r *Request) {
	if m.hook != nil && m.hook(r) {
		return
	}
	if m.seen != nil {
		select {
		case m.seen <- r.Cmd:
		default:
		}
	}
	switch r.Cmd.Opcode {
	case opPark:
		m.mu.Lock()
		m.parked = append(m.parked, r)
		m.mu.Unlock()
	case nvme.IORead:
		go func() {
			b, err := r.Cmd.CheckReadWrite(testBlocks, testBlock, MaxTransfer)
			if err != nil {
				r.Fail(err)
				return
			}
			buf, err := r.DataBuffer(int(b.Blocks()) * testBlock)
			if err != nil {
				r.Fail(err)
				return
			}
			m.mu.Lock()
			copy(buf, m.data[b.SLBA*testBlock:])
			m.mu.Unlock()
			r.Complete(nvme.Completion{DW0: 0xabcd})
		}()
	case nvme.IOWrite:
		go func() {
			b, err := r.Cmd.CheckReadWrite(testBlocks, testBlock, MaxTransfer)
			if err != nil {
				r.Fail(err)
				return
			}
			p, err := r.HostData(time.Minute)
			if err != nil {
				r.Fail(err)
				return
			}
			m.mu.Lock()
			copy(m.data[b.SLBA*testBlock:], p)
			m.mu.Unlock()
			r.Complete(nvme.Completion{})
		}()
	default:
		r.Fail(nvme.InvalidOpcode(&r.Cmd, false))
	}
}

func (m *memController) releaseParked(st nvme.Status) int {
	m.mu.Lock()
	p := m.parked
	m.parked = nil
	m.mu.Unlock()
	for _, r := range p {
		r.Fail(st)
	}
	return len(p)
}

func (m *memController) parkedCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.parked)
}

type testRig struct {
	srvProv, cliProv nprdma.Provider
	srvDev, cliDev   *nprdma.Device
	ln               *Listener
	ctrl             *memController
	cliPD            *nprdma.PD
}

func newRig(t *testing.T, pk providerKind, opts ...ListenOption) *testRig {
	t.Helper()
	sp, cp := pk.new()
	rig := &testRig{srvProv: sp, cliProv: cp,
		srvDev: nprdma.NewDevice(sp, nprdma.WithPinning(false)),
		cliDev: nprdma.NewDevice(cp, nprdma.WithPinning(false)),
		ctrl:   &memController{data: make([]byte, testBlocks*testBlock)},
	}
	rig.cliPD = rig.cliDev.AllocPD()
	ln, err := Listen(rig.srvDev.AllocPD(), pk.listen, opts...)
	if err != nil {
		t.Fatal(err)
	}
	rig.ln = ln
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			q, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			rig.ctrl.mu.Lock()
			rig.ctrl.queues = append(rig.ctrl.queues, q)
			rig.ctrl.mu.Unlock()
			q.Start(rig.ctrl.handle)
		}
	}()
	t.Cleanup(func() {
		cancel()
		ln.Close()
		<-done
		rig.ctrl.releaseParked(nvme.StatusAbortedSQDeleted)
		rig.ctrl.mu.Lock()
		qs := rig.ctrl.queues
		rig.ctrl.mu.Unlock()
		for _, q := range qs {
			q.Close()
			q.Wait()
		}
		rig.cliDev.Close()
		rig.srvDev.Close()
	})
	return rig
}

// queue returns the controller queue accepted i-th, waiting for it.
func (rig *testRig) queue(t *testing.T, i int) *ControllerQueue {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rig.ctrl.mu.Lock()
		if len(rig.ctrl.queues) > i {
			q := rig.ctrl.queues[i]
			rig.ctrl.mu.Unlock()
			return q
		}
		rig.ctrl.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("controller queue %d never accepted", i)
		}
		time.Sleep(time.Millisecond)
	}
}

func (rig *testRig) dial(t *testing.T, qc QueueConfig, opts ...DialOption) *HostQueue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q, err := Dial(ctx, rig.cliPD, rig.ln.Addr(), qc, opts...)
	if err != nil {
		t.Fatalf("dial %+v: %v", qc, err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

// busyPoll runs fn with both ends blocking and with both ends busy-polling
// (the controller's receive loop and the host's completions).
func busyPoll(t *testing.T, fn func(t *testing.T, lo []ListenOption, do []DialOption)) {
	t.Run("blocking", func(t *testing.T) { fn(t, nil, nil) })
	t.Run("busy-poll", func(t *testing.T) {
		d := 200 * time.Microsecond
		fn(t, []ListenOption{WithReceiveBusyPoll(d)}, []DialOption{WithCompletionBusyPoll(d)})
	})
}

func TestWritesAndReads(t *testing.T) {
	forEachProvider(t, func(t *testing.T, pk providerKind) {
		busyPoll(t, func(t *testing.T, lo []ListenOption, do []DialOption) {
			rig := newRig(t, pk, lo...)
			q := rig.dial(t, QueueConfig{QID: 1, Entries: 32, InCapsuleData: DefaultInCapsuleData}, do...)
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(1, 2))
			for _, blocks := range []uint32{1, 8, 16, 17, 64, 2048} {
				payload := make([]byte, int(blocks)*testBlock)
				for i := range payload {
					payload[i] = byte(rng.Uint32())
				}
				srvBefore := rig.queue(t, 0).Stats()
				slba := uint64(blocks) // distinct places
				if _, err := q.Submit(ctx, mustCmdNoT(nvme.WriteCommand(1, slba, blocks, 0, nvme.NullSGL())), payload); err != nil {
					t.Fatalf("write %d blocks: %v", blocks, err)
				}
				srvAfter := rig.queue(t, 0).Stats()
				wantRDMA := len(payload) > DefaultInCapsuleData
				if got := srvAfter.HostReads - srvBefore.HostReads; (got == 1) != wantRDMA {
					t.Fatalf("write of %d bytes: %d RDMA READs of host data, want in-capsule=%v", len(payload), got, !wantRDMA)
				}
				got := make([]byte, len(payload))
				cqe, err := q.Submit(ctx, mustCmdNoT(nvme.ReadCommand(1, slba, blocks, 0, nvme.NullSGL())), got)
				if err != nil {
					t.Fatalf("read %d blocks: %v", blocks, err)
				}
				if cqe.DW0 != 0xabcd || cqe.SQID != 1 {
					t.Fatalf("completion %+v: DW0/SQID not carried", cqe)
				}
				if !bytes.Equal(got, payload) {
					t.Fatalf("read back %d blocks: data differs", blocks)
				}
			}
		})
	})
}

func TestSubmitBufferAndAdminQueueKeyedData(t *testing.T) {
	forEachProvider(t, func(t *testing.T, pk providerKind) {
		rig := newRig(t, pk)
		// The admin queue carries no in-capsule data: even 512 bytes go by
		// RDMA READ, as the 1024-byte Connect data does.
		q := rig.dial(t, QueueConfig{QID: 0, Entries: 32})
		ctx := context.Background()
		payload := bytes.Repeat([]byte("admin"), 1024/5*testBlock/1024+200)[:testBlock]
		if _, err := q.Submit(ctx, mustCmdNoT(nvme.WriteCommand(1, 7, 1, 0, nvme.NullSGL())), payload); err != nil {
			t.Fatal(err)
		}
		if got := rig.queue(t, 0).Stats().HostReads; got != 1 {
			t.Fatalf("host reads %d, want 1", got)
		}
		buf, err := q.Pool().Get(3 * testBlock)
		if err != nil {
			t.Fatal(err)
		}
		defer buf.Release()
		clear(buf.Bytes())
		if _, err := q.SubmitBuffer(ctx, mustCmdNoT(nvme.ReadCommand(1, 7, 1, 0, nvme.NullSGL())), buf, testBlock, testBlock); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes()[testBlock:2*testBlock], payload) {
			t.Fatal("SubmitBuffer: data not placed at the offset")
		}
		if !bytes.Equal(buf.Bytes()[:testBlock], make([]byte, testBlock)) || !bytes.Equal(buf.Bytes()[2*testBlock:], make([]byte, testBlock)) {
			t.Fatal("SubmitBuffer: bytes outside the range were written")
		}
	})
}

func TestStatusesAndQueueKeepsWorking(t *testing.T) {
	forEachProvider(t, func(t *testing.T, pk providerKind) {
		rig := newRig(t, pk)
		q := rig.dial(t, QueueConfig{QID: 1, Entries: 8, InCapsuleData: DefaultInCapsuleData})
		ctx := context.Background()
		good := func() {
			t.Helper()
			if _, err := q.Submit(ctx, mustCmdNoT(nvme.ReadCommand(1, 0, 1, 0, nvme.NullSGL())), make([]byte, testBlock)); err != nil {
				t.Fatalf("good read after a bad command: %v", err)
			}
		}
		cases := []struct {
			name string
			cmd  nvme.Command
			data []byte
			want nvme.Status
		}{
			{"OutOfRangeLBA", mustCmdNoT(nvme.ReadCommand(1, testBlocks, 1, 0, nvme.NullSGL())), make([]byte, testBlock), nvme.StatusLBAOutOfRange},
			{"LBAWrap", mustCmdNoT(nvme.ReadCommand(1, ^uint64(0), 2, 0, nvme.NullSGL())), make([]byte, 2*testBlock), nvme.StatusLBAOutOfRange},
			{"ZeroLengthTransfer", mustCmdNoT(nvme.ReadCommand(1, 0, 1, 0, nvme.NullSGL())), nil, nvme.StatusDataSGLLengthInvalid},
			{"ShortSGL", mustCmdNoT(nvme.ReadCommand(1, 0, 4, 0, nvme.NullSGL())), make([]byte, testBlock), nvme.StatusDataSGLLengthInvalid},
			{"Oversized", mustCmdNoT(nvme.ReadCommand(1, 0, 4096, 0, nvme.NullSGL())), make([]byte, MaxTransfer), nvme.StatusInvalidField},
			{"UnknownOpcode", nvme.Command{Opcode: 0x7e, Flags: nvme.FlagsSGL, NSID: 1, DPTR: nvme.NullSGL()}, nil, nvme.StatusInvalidOpcode},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				_, err := q.Submit(ctx, tc.cmd, tc.data)
				if !errors.Is(err, tc.want) {
					t.Fatalf("got %v, want %s", err, tc.want)
				}
				var se *nvme.StatusError
				if !errors.As(err, &se) || !se.Status.DNR() {
					t.Fatalf("%v: want a status with DNR", err)
				}
				good()
			})
		}
	})
}

// rawCapsule sends arbitrary bytes as a capsule with the CID slot cid
// reserved, and waits for the completion.
func rawCapsule(t *testing.T, q *HostQueue, b []byte) nvme.Completion {
	t.Helper()
	cid := <-q.cids
	c := q.calls[cid]
	if len(b) >= 4 {
		b[2], b[3] = byte(cid), byte(cid>>8)
	}
	q.mu.Lock()
	c.StartLocked()
	q.mu.Unlock()
	cb, err := q.Pool().Get(len(b))
	if err != nil {
		t.Fatal(err)
	}
	copy(cb.Bytes(), b)
	c.capsule = cb
	if err := q.qp.PostSend(nprdma.SendWR{ID: wrSend | uint64(cid), Op: nprdma.OpSend, SG: []nprdma.SGE{cb.SGE()}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := q.turns.Wait(ctx, &c.Slot, &q.mu, (*leader)(q)); err != nil {
		t.Fatalf("no completion for a malformed capsule: %v", err)
	}
	cqe := c.cqe
	q.recycle(c, cid)
	return cqe
}

func TestMalformedCapsules(t *testing.T) {
	forEachProvider(t, func(t *testing.T, pk providerKind) {
		rig := newRig(t, pk)
		q := rig.dial(t, QueueConfig{QID: 1, Entries: 8, InCapsuleData: 4096})
		ctx := context.Background()
		read := mustCmdNoT(nvme.ReadCommand(1, 0, 1, 0, nvme.NullSGL()))
		fused := read
		fused.Flags |= 1
		psdt := read
		psdt.Flags = 0x80
		badSGL := read
		badSGL.DPTR[15] = 0x20 // segment
		icdForRead := read
		icdForRead.DPTR = nvme.InCapsuleSGL(0, 16)
		icdBeyond := mustCmdNoT(nvme.WriteCommand(1, 0, 1, 0, nvme.InCapsuleSGL(DefaultInCapsuleData+16, 512)))
		cases := []struct {
			name    string
			capsule []byte
			want    nvme.Status
		}{
			{"Fused", fused.Marshal(), nvme.StatusInvalidField},
			{"PSDT", psdt.Marshal(), nvme.StatusInvalidField},
			{"SGLType", badSGL.Marshal(), nvme.StatusSGLDescriptorTypeInvalid},
			{"InCapsuleDataForRead", nvme.MarshalCapsule(&icdForRead, make([]byte, 16)), nvme.StatusInvalidField},
			{"InCapsuleOffsetBeyond", icdBeyond.Marshal(), nvme.StatusSGLOffsetInvalid},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				before := rig.queue(t, 0).Stats().Malformed
				cqe := rawCapsule(t, q, tc.capsule)
				if !cqe.Status.Is(tc.want) || !cqe.Status.DNR() {
					t.Fatalf("status %s, want %s with DNR", cqe.Status, tc.want)
				}
				if got := rig.queue(t, 0).Stats().Malformed - before; got != 1 {
					t.Fatalf("malformed counted %d, want 1", got)
				}
				if _, err := q.Submit(ctx, read, make([]byte, testBlock)); err != nil {
					t.Fatalf("good command after a malformed capsule: %v", err)
				}
			})
		}
		t.Run("ShortCapsuleDropped", func(t *testing.T) {
			before := rig.queue(t, 0).Stats().ShortCapsules
			if err := q.qp.PostSend(nprdma.SendWR{ID: wrSend, Op: nprdma.OpSend, Inline: true, InlineData: make([]byte, 40)}); err != nil {
				t.Fatal(err)
			}
			if _, err := q.Submit(ctx, read, make([]byte, testBlock)); err != nil {
				t.Fatalf("good command after a short capsule: %v", err)
			}
			if got := rig.queue(t, 0).Stats().ShortCapsules - before; got != 1 {
				t.Fatalf("short capsules counted %d, want 1", got)
			}
		})
	})
}

func TestConnectRejects(t *testing.T) {
	forEachProvider(t, func(t *testing.T, pk providerKind) {
		rig := newRig(t, pk, WithMaxQueueID(4), WithQueueEntries(32, 64))
		cases := []struct {
			qc   QueueConfig
			want nvme.CMRejectStatus
		}{
			{QueueConfig{QID: 5, Entries: 8}, nvme.CMRejectInvalidQID},
			{QueueConfig{QID: 0, Entries: 33}, nvme.CMRejectInvalidHSQSIZE},
			{QueueConfig{QID: 1, Entries: 65}, nvme.CMRejectInvalidHSQSIZE},
		}
		for i, tc := range cases {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := Dial(ctx, rig.cliPD, rig.ln.Addr(), tc.qc)
			cancel()
			var rej *nvme.CMRejectError
			if !errors.As(err, &rej) || rej.Status != tc.want {
				t.Fatalf("dial %+v: %v, want a reject with %s", tc.qc, err, tc.want)
			}
			if got := rig.ln.Rejected(); got != uint64(i+1) {
				t.Fatalf("rejected %d, want %d", got, i+1)
			}
		}
		// The listener goes on accepting.
		q := rig.dial(t, QueueConfig{QID: 4, Entries: 64, InCapsuleData: 4096})
		if _, err := q.Submit(context.Background(), mustCmdNoT(nvme.ReadCommand(1, 0, 1, 0, nvme.NullSGL())), make([]byte, testBlock)); err != nil {
			t.Fatal(err)
		}
	})
}

type crasher interface{ Crash() }

func TestQueueLossFailsOutstandingCommands(t *testing.T) {
	for _, how := range []string{"ControllerClose", "ControllerCrash", "HostClose"} {
		t.Run(how, func(t *testing.T) {
			forEachProvider(t, func(t *testing.T, pk providerKind) {
				rig := newRig(t, pk)
				q := rig.dial(t, QueueConfig{QID: 1, Entries: 8, InCapsuleData: 4096})
				const n = 6
				errs := make(chan error, n)
				for i := 0; i < n; i++ {
					go func() {
						_, err := q.Submit(context.Background(), nvme.Command{Opcode: opPark, Flags: nvme.FlagsSGL, NSID: 1, DPTR: nvme.NullSGL()}, nil)
						errs <- err
					}()
				}
				deadline := time.Now().Add(10 * time.Second)
				for rig.ctrl.parkedCount() < n {
					if time.Now().After(deadline) {
						t.Fatalf("%d of %d commands reached the controller", rig.ctrl.parkedCount(), n)
					}
					time.Sleep(time.Millisecond)
				}
				switch how {
				case "ControllerClose":
					rig.queue(t, 0).Close()
				case "ControllerCrash":
					rig.srvProv.(crasher).Crash()
				case "HostClose":
					q.Close()
				}
				for i := 0; i < n; i++ {
					select {
					case err := <-errs:
						if !errors.Is(err, ErrQueueFailed) {
							t.Fatalf("outstanding command: %v, want ErrQueueFailed", err)
						}
					case <-time.After(20 * time.Second):
						t.Fatal("an outstanding command hangs after the queue was lost")
					}
				}
				select {
				case <-q.Done():
				case <-time.After(10 * time.Second):
					t.Fatal("host queue not done")
				}
				if _, err := q.Submit(context.Background(), mustCmdNoT(nvme.ReadCommand(1, 0, 1, 0, nvme.NullSGL())), make([]byte, testBlock)); !errors.Is(err, ErrQueueFailed) {
					t.Fatalf("submit on a failed queue: %v, want ErrQueueFailed", err)
				}
				// Completing a parked command after the loss releases it.
				rig.ctrl.releaseParked(nvme.StatusAbortedSQDeleted)
				cq := rig.queue(t, 0)
				cq.Close()
				waited := make(chan struct{})
				go func() { cq.Wait(); close(waited) }()
				select {
				case <-waited:
				case <-time.After(10 * time.Second):
					t.Fatal("controller queue still has commands in flight after teardown")
				}
			})
		})
	}
}

func TestConcurrentSubmitters(t *testing.T) {
	forEachProvider(t, func(t *testing.T, pk providerKind) {
		busyPoll(t, func(t *testing.T, lo []ListenOption, do []DialOption) {
			rig := newRig(t, pk, lo...)
			q := rig.dial(t, QueueConfig{QID: 1, Entries: 16, InCapsuleData: 4096}, do...)
			const workers, rounds = 24, 40
			var wg sync.WaitGroup
			errc := make(chan error, workers)
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(w), 9))
					for i := 0; i < rounds; i++ {
						blocks := uint32(1 + rng.IntN(16))
						slba := uint64(w) * 64 // each worker its own blocks
						p := make([]byte, int(blocks)*testBlock)
						for j := range p {
							p[j] = byte(rng.Uint32())
						}
						if _, err := q.Submit(context.Background(), mustCmdNoT(nvme.WriteCommand(1, slba, blocks, 0, nvme.NullSGL())), p); err != nil {
							errc <- err
							return
						}
						got := make([]byte, len(p))
						if _, err := q.Submit(context.Background(), mustCmdNoT(nvme.ReadCommand(1, slba, blocks, 0, nvme.NullSGL())), got); err != nil {
							errc <- err
							return
						}
						if !bytes.Equal(got, p) {
							errc <- fmt.Errorf("worker %d round %d: data differs", w, i)
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errc)
			for err := range errc {
				t.Fatal(err)
			}
		})
	})
}

// mustCmdNoT unwraps a command builder's result; the builders fail only on
// arguments a test got wrong.
func mustCmdNoT(c nvme.Command, err error) nvme.Command {
	if err != nil {
		panic(err)
	}
	return c
}

func TestCanceledSubmitterDoesNotLeakSlots(t *testing.T) {
	forEachProvider(t, func(t *testing.T, pk providerKind) {
		rig := newRig(t, pk)
		q := rig.dial(t, QueueConfig{QID: 1, Entries: 2, InCapsuleData: 4096})
		for i := 0; i < 2; i++ {
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() {
				_, err := q.Submit(ctx, nvme.Command{Opcode: opPark, Flags: nvme.FlagsSGL, NSID: 1, DPTR: nvme.NullSGL()}, nil)
				errc <- err
			}()
			for rig.ctrl.parkedCount() < 1 {
				time.Sleep(time.Millisecond)
			}
			cancel()
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Fatalf("canceled submit: %v", err)
			}
			// Completing the abandoned command frees its slot.
			if rig.ctrl.releaseParked(nvme.StatusAbortRequested) != 1 {
				t.Fatal("nothing parked")
			}
		}
		for i := 0; i < 5; i++ { // more commands than entries: slots came back
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := q.Submit(ctx, mustCmdNoT(nvme.ReadCommand(1, 0, 1, 0, nvme.NullSGL())), make([]byte, testBlock))
			cancel()
			if err != nil {
				t.Fatal(err)
			}
		}
	})
}

func TestReadRemote(t *testing.T) {
	forEachProvider(t, func(t *testing.T, pk providerKind) {
		rig := newRig(t, pk)
		region := bytes.Repeat([]byte("0123456789abcdef"), 1024)
		mr, err := rig.ln.pd.Register(region, nprdma.AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		defer mr.Deregister()
		q := rig.dial(t, QueueConfig{QID: 1, Entries: 8, InCapsuleData: 4096})
		buf, err := q.Pool().Get(8192)
		if err != nil {
			t.Fatal(err)
		}
		defer buf.Release()
		ctx := context.Background()
		if err := q.ReadRemote(ctx, buf, 100, 5000, mr.Addr()+3, mr.RKey()); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes()[100:5100], region[3:5003]) {
			t.Fatal("one-sided read: data differs")
		}
		// A wrong key is a remote access error and costs the queue.
		err = q.ReadRemote(ctx, buf, 0, 64, mr.Addr(), mr.RKey()^0x5a5a)
		if !errors.Is(err, nprdma.ErrRemoteAccess) || !errors.Is(err, ErrQueueFailed) {
			t.Fatalf("read with a wrong key: %v, want ErrRemoteAccess and ErrQueueFailed", err)
		}
		if _, err := q.Submit(ctx, mustCmdNoT(nvme.ReadCommand(1, 0, 1, 0, nvme.NullSGL())), make([]byte, testBlock)); !errors.Is(err, ErrQueueFailed) {
			t.Fatalf("submit after the remote access error: %v", err)
		}
	})
}
