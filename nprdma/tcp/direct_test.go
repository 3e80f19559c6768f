package tcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/link"
)

// directPair is a client and a server QP, each on a provider of its own, so
// that each provider holds exactly one link.
type directPair struct {
	cliProv, srvProv *Provider
	cli, srv         *nprdma.QP
	cliSCQ, cliRCQ   *nprdma.CQ
	srvSCQ, srvRCQ   *nprdma.CQ
	lmr, rmr         *nprdma.MR
	lbuf, rbuf       []byte
}

// cqOpts apply to the client's completion queues.
func newDirectPair(t *testing.T, cliOpts, srvOpts []Option, cqOpts ...nprdma.CQOption) *directPair {
	t.Helper()
	p := &directPair{cliProv: New(cliOpts...), srvProv: New(srvOpts...)}
	cdev := nprdma.NewDevice(p.cliProv, nprdma.WithPinning(false))
	sdev := nprdma.NewDevice(p.srvProv, nprdma.WithPinning(false))
	t.Cleanup(func() { cdev.Close(); sdev.Close() })
	cpd, spd := cdev.AllocPD(), sdev.AllocPD()
	p.cliSCQ, p.cliRCQ = cdev.NewCQ(256, cqOpts...), cdev.NewCQ(256, cqOpts...)
	p.srvSCQ, p.srvRCQ = sdev.NewCQ(256), sdev.NewCQ(256)
	var err error
	if p.cli, err = cpd.NewQP(nprdma.QPConfig{SendCQ: p.cliSCQ, RecvCQ: p.cliRCQ}); err != nil {
		t.Fatal(err)
	}
	if p.srv, err = spd.NewQP(nprdma.QPConfig{SendCQ: p.srvSCQ, RecvCQ: p.srvRCQ}); err != nil {
		t.Fatal(err)
	}
	p.lbuf, p.rbuf = make([]byte, 16<<20), make([]byte, 16<<20)
	rand.Read(p.rbuf)
	rw := nprdma.AccessLocalWrite | nprdma.AccessRemoteRead | nprdma.AccessRemoteWrite
	if p.lmr, err = cpd.Register(p.lbuf, rw); err != nil {
		t.Fatal(err)
	}
	if p.rmr, err = spd.Register(p.rbuf, rw); err != nil {
		t.Fatal(err)
	}
	ln, err := sdev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	accepted := make(chan error, 1)
	go func() {
		req, err := ln.Accept(ctx)
		if err == nil {
			err = req.Accept(p.srv, nil)
		}
		accepted <- err
	}()
	if _, err := p.cli.Connect(ctx, ln.Addr(), nil); err != nil {
		t.Fatal(err)
	}
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	return p
}

// onlyLink is the provider's one link.
func onlyLink(t *testing.T, p *Provider) *tcpLink {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.links) != 1 {
		t.Fatalf("provider has %d links, want 1", len(p.links))
	}
	for l := range p.links {
		return l
	}
	return nil
}

func waitOne(t *testing.T, ctx context.Context, cq *nprdma.CQ, id uint64, op nprdma.Opcode) {
	t.Helper()
	wcs := make([]nprdma.WC, 1)
	if _, err := cq.Wait(ctx, wcs); err != nil {
		t.Fatal(err)
	}
	if wcs[0].ID != id || wcs[0].Op != op || wcs[0].Status != nprdma.StatusSuccess {
		t.Fatalf("completion %+v (%s), want id %d op %s success", wcs[0], wcs[0].Status, id, op)
	}
}

func (p *directPair) read(t *testing.T, ctx context.Context, id uint64, off, n int) {
	t.Helper()
	if err := p.cli.PostSend(nprdma.SendWR{ID: id, Op: nprdma.OpRead, SG: []nprdma.SGE{p.lmr.SGE(0, n)},
		RemoteAddr: p.rmr.Addr() + uint64(off), RKey: p.rmr.RKey(), Signaled: true}); err != nil {
		t.Fatal(err)
	}
	waitOne(t, ctx, p.cliSCQ, id, nprdma.OpRead)
	if !bytes.Equal(p.lbuf[:n], p.rbuf[off:off+n]) {
		t.Fatalf("READ %d of [%d, +%d): wrong bytes", id, off, n)
	}
}

// The waiter receives its completions itself: once the reader goroutine
// has handed the receive side over (at the first READ whose waiter has to
// wait: a response may also arrive before its waiter looks, and the reader
// goroutine still holding the link delivers it), every READ is received by
// the goroutine in Wait, as only the linger gives the link back. With
// direct completion off, none is. A busy-polling CQ's waiter drives too, and
// spins on the socket: with a spin of 10 ms and a spare P most READs'
// responses are found by a spinning read.
func TestDirectCompletionDrives(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		linger time.Duration
		spin   time.Duration
	}{{"on", time.Hour, 0}, {"off", 0, 0}, {"busy-poll", time.Hour, 10 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			var cqOpts []nprdma.CQOption
			if tc.spin > 0 {
				cqOpts = append(cqOpts, nprdma.WithBusyPoll(tc.spin))
			}
			p := newDirectPair(t, []Option{WithDirectCompletion(tc.linger)}, nil, cqOpts...)
			l := onlyLink(t, p.cliProv)
			id := uint64(0)
			if tc.linger > 0 {
				for ; l.rcv.drives.Load() == 0; id++ {
					if id == 10000 {
						t.Fatal("10000 READs and the reader goroutine never handed the receive side over")
					}
					p.read(t, ctx, id, int(id%64)*4096, 4096)
				}
			}
			drives0, hits0 := l.rcv.drives.Load(), l.cr.sp.hits.Load()
			const n = 200
			for i := 0; i < n; i++ {
				p.read(t, ctx, id, int(id%64)*4096, 4096)
				id++
			}
			drives, hits := l.rcv.drives.Load()-drives0, l.cr.sp.hits.Load()-hits0
			if tc.linger > 0 && drives != n {
				t.Fatalf("%d of %d READs after the hand-over received by their waiter, want all", drives, n)
			}
			if tc.linger == 0 && drives != 0 {
				t.Fatalf("direct completion off, yet %d READs were received by their waiter", drives)
			}
			switch {
			case tc.spin == 0 && hits != 0:
				t.Fatalf("%d reads satisfied by spinning without busy polling", hits)
			case tc.spin > 0 && runtime.GOMAXPROCS(0) > 1 && hits < n/2:
				// Not all: on a loaded machine (CI runs packages in
				// parallel) a spin may end before a starved peer answers.
				t.Fatalf("%d of %d READs found by a spinning read, want at least %d", hits, n, n/2)
			case tc.spin > 0 && runtime.GOMAXPROCS(0) == 1 && hits != 0:
				t.Fatalf("%d reads satisfied by spinning with a single P", hits)
			}
		})
	}
}

// A busy-polling waiter spins only for its spin time, then blocks: while the
// server is frozen for 300 ms, a waiter with a 1 ms spin burns next to no
// CPU, and the READ completes with the right bytes after the thaw.
func TestBusyPollSpinEnds(t *testing.T) {
	if runtime.GOMAXPROCS(0) == 1 {
		t.Skip("a single P: Wait does not spin")
	}
	p := newDirectPair(t, []Option{WithDirectCompletion(time.Hour)}, nil, nprdma.WithBusyPoll(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < 3; i++ {
		p.read(t, ctx, uint64(i), 0, 4096) // the waiter drives from here on
	}
	p.srvProv.Freeze()
	before := cpuTime(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.read(t, ctx, 9, 8192, 4096)
	}()
	time.Sleep(300 * time.Millisecond)
	used := cpuTime(t) - before
	p.srvProv.Thaw()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("READ not completed after the thaw")
	}
	// A waiter spinning all along would have used ~300 ms.
	if used > 100*time.Millisecond {
		t.Fatalf("the process used %v of CPU in 300 ms of waiting: the waiter spun past its 1 ms", used)
	}
	t.Logf("CPU used while waiting 300 ms: %v", used)
}

// A busy-polling waiter that finds the reader goroutine receiving spins on
// its queue; when the reader goroutine steps aside (Wake) the waiter stops
// spinning and drives. The reader goroutine may step aside before it has
// read the response: a waiter that went on spinning would see no
// completion until its spin time (a minute here) ran out.
func TestBusyPollWaiterTakesOver(t *testing.T) {
	p := newDirectPair(t, []Option{WithDirectCompletion(time.Hour)}, nil, nprdma.WithBusyPoll(time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := 0; i < 20; i++ {
		p.read(t, ctx, uint64(i), i*4096, 4096)
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// When the waiter leaves, the reader goroutine takes the receive side back
// after the linger time: a SEND whose completion nobody waits for is
// received and completes.
func TestDirectLingerHandsBack(t *testing.T) {
	ctx := context.Background()
	p := newDirectPair(t, []Option{WithDirectCompletion(time.Millisecond)}, nil)
	l := onlyLink(t, p.cliProv)
	if err := p.cli.PostRecv(nprdma.RecvWR{ID: 7, SG: []nprdma.SGE{p.lmr.SGE(1<<20, 64)}}); err != nil {
		t.Fatal(err)
	}
	// The first READ asks the reader goroutine to step aside, the next is
	// received by its waiter (unless this machine is so loaded that 1 ms
	// passes between two READs: then try again).
	for i := 0; l.rcv.drives.Load() == 0; i++ {
		if i == 100 {
			t.Fatal("no READ received by its waiter")
		}
		p.read(t, ctx, uint64(i+1), 0, 4096)
	}
	copy(p.rbuf[8<<20:], "hello from the server")
	if err := p.srv.PostSend(nprdma.SendWR{ID: 9, Op: nprdma.OpSend, SG: []nprdma.SGE{p.rmr.SGE(8<<20, 21)}, Signaled: true}); err != nil {
		t.Fatal(err)
	}
	// Nobody waits on the client's receive CQ: only the reader goroutine,
	// back after the linger time, can deliver the SEND.
	wcs := make([]nprdma.WC, 1)
	deadline := time.Now().Add(30 * time.Second)
	for p.cliRCQ.Poll(wcs) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the SEND was never received")
		}
		time.Sleep(100 * time.Microsecond)
	}
	if wcs[0].ID != 7 || wcs[0].Status != nprdma.StatusSuccess || wcs[0].ByteLen != 21 || string(p.lbuf[1<<20:1<<20+21]) != "hello from the server" {
		t.Fatalf("receive completion %+v, bytes %q", wcs[0], p.lbuf[1<<20:1<<20+21])
	}
	l.rcv.mu.Lock()
	owner := l.rcv.owner
	l.rcv.mu.Unlock()
	if owner != rxReader {
		t.Fatalf("receive side owner %d after the linger, want the reader goroutine", owner)
	}
	// The server's SEND completes once its acknowledgement arrives.
	waitOne(t, ctx, p.srvSCQ, 9, nprdma.OpSend)
}

// While waiters keep driving, the linger checks back off — each check that
// finds the receive side in use or just left doubles the interval to the
// next — and once nobody waits, the reader goroutine still takes the
// receive side back (delivering what arrived meanwhile) and the checks
// start over at the linger.
func TestLingerChecksBackOff(t *testing.T) {
	ctx := context.Background()
	const linger = 2 * time.Millisecond
	p := newDirectPair(t, []Option{WithDirectCompletion(linger)}, nil)
	l := onlyLink(t, p.cliProv)
	check := func() time.Duration {
		l.rcv.mu.Lock()
		defer l.rcv.mu.Unlock()
		return l.rcv.check
	}
	if err := p.cli.PostRecv(nprdma.RecvWR{ID: 7, SG: []nprdma.SGE{p.lmr.SGE(1<<20, 64)}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for i := 1; check() <= linger; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("checks never backed off over %d READs", i)
		}
		p.read(t, ctx, uint64(i), 0, 4096)
	}
	if c := check(); c > maxLingerBackoff*linger {
		t.Fatalf("check interval %v, want at most %v", c, maxLingerBackoff*linger)
	}
	copy(p.rbuf[8<<20:], "hello from the server")
	if err := p.srv.PostSend(nprdma.SendWR{ID: 9, Op: nprdma.OpSend, SG: []nprdma.SGE{p.rmr.SGE(8<<20, 21)}, Signaled: true}); err != nil {
		t.Fatal(err)
	}
	wcs := make([]nprdma.WC, 1)
	for p.cliRCQ.Poll(wcs) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the SEND was never received")
		}
		time.Sleep(100 * time.Microsecond)
	}
	if wcs[0].ID != 7 || wcs[0].Status != nprdma.StatusSuccess || string(p.lbuf[1<<20:1<<20+21]) != "hello from the server" {
		t.Fatalf("receive completion %+v, bytes %q", wcs[0], p.lbuf[1<<20:1<<20+21])
	}
	l.rcv.mu.Lock()
	owner, c := l.rcv.owner, l.rcv.check
	l.rcv.mu.Unlock()
	if owner != rxReader || c != 0 {
		t.Fatalf("after nobody waited: receive side owner %d, check interval %v; want the reader goroutine, 0 (the linger)", owner, c)
	}
	waitOne(t, ctx, p.srvSCQ, 9, nprdma.OpSend)
}

// A waiter whose context ends stops driving between frames: the link
// stays consistent, and the next wait receives what is still coming. Many
// short waits during a 16 MiB READ end in the middle of its payload.
func TestDriveContextEnds(t *testing.T) {
	t.Run("blocking", func(t *testing.T) { testDriveContextEnds(t) })
	// Waits of 200 µs with a spin of 1 s: the spin stops when the context
	// ends, as the blocking read does.
	t.Run("busy-poll", func(t *testing.T) { testDriveContextEnds(t, nprdma.WithBusyPoll(time.Second)) })
}

func testDriveContextEnds(t *testing.T, cqOpts ...nprdma.CQOption) {
	p := newDirectPair(t, []Option{WithDirectCompletion(time.Hour)}, nil, cqOpts...)
	ctx := context.Background()
	p.read(t, ctx, 1, 0, 4096)
	p.read(t, ctx, 2, 0, 4096)

	short, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
	defer cancel()
	wcs := make([]nprdma.WC, 1)
	if n, err := p.cliSCQ.Wait(short, wcs); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait with nothing outstanding: %d completions, error %v, want the context's", n, err)
	}

	// 32 READs of 512 KiB in flight, collected by waits of 200 µs: waits
	// end between frames and in the middle of payloads.
	const k, size = 32, 512 << 10
	for i := 0; i < k; i++ {
		if err := p.cli.PostSend(nprdma.SendWR{ID: uint64(100 + i), Op: nprdma.OpRead, SG: []nprdma.SGE{p.lmr.SGE(i*size, size)},
			RemoteAddr: p.rmr.Addr() + uint64(i*size), RKey: p.rmr.RKey(), Signaled: true}); err != nil {
			t.Fatal(err)
		}
	}
	interrupted, got := 0, 0
	deadline := time.Now().Add(30 * time.Second)
	for got < k {
		c, cancel := context.WithTimeout(ctx, 200*time.Microsecond)
		n, err := p.cliSCQ.Wait(c, wcs)
		cancel()
		if n == 0 {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("wait: %v", err)
			}
			interrupted++
		}
		for _, wc := range wcs[:n] {
			if wc.ID != uint64(100+got) || wc.Status != nprdma.StatusSuccess {
				t.Fatalf("completion %+v (%s), want READ %d", wc, wc.Status, 100+got)
			}
			got++
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d READs completed", got, k)
		}
	}
	if !bytes.Equal(p.lbuf[:k*size], p.rbuf[:k*size]) {
		t.Fatal("READs collected by interrupted waits: wrong bytes")
	}
	t.Logf("%d waits ended by their context while the READs were under way", interrupted)
	p.read(t, ctx, 4, 4096, 4096) // no stale deadline left behind
}

// Request/response exchanges carry their acknowledgements in the next
// request: 100 SEND ping-pongs with signaled SENDs send no ACK frame, not
// one per message. The acknowledgement of the last
// answer, owed with no request to carry it, goes out at the client's next
// wait.
func TestPiggybackedAcks(t *testing.T) {
	p := newDirectPair(t, []Option{WithDirectCompletion(time.Hour)}, []Option{WithDirectCompletion(time.Hour)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const rounds = 100
	for i := 0; i < rounds+1; i++ {
		p.cli.PostRecv(nprdma.RecvWR{ID: uint64(i), SG: []nprdma.SGE{p.lmr.SGE(1<<20, 64)}})
		p.srv.PostRecv(nprdma.RecvWR{ID: uint64(i), SG: []nprdma.SGE{p.rmr.SGE(1<<20, 64)}})
	}
	answered := make(chan error, 1)
	lastDone := make(chan error, 1)
	go func() { // the server answers each SEND with a SEND
		wcs := make([]nprdma.WC, 1)
		waitFor := func(cq *nprdma.CQ, id uint64) error {
			if _, err := cq.Wait(ctx, wcs); err != nil {
				return err
			}
			if wcs[0].ID != id || wcs[0].Status != nprdma.StatusSuccess {
				return fmt.Errorf("completion %+v (%s), want id %d", wcs[0], wcs[0].Status, id)
			}
			return nil
		}
		for i := 0; i < rounds; i++ {
			if err := waitFor(p.srvRCQ, uint64(i)); err != nil {
				answered <- err
				return
			}
			if i > 0 { // acknowledged by the request just received
				if err := waitFor(p.srvSCQ, uint64(i-1)); err != nil {
					answered <- err
					return
				}
			}
			if err := p.srv.PostSend(nprdma.SendWR{ID: uint64(i), Op: nprdma.OpSend, SG: []nprdma.SGE{p.rmr.SGE(0, 64)}, Signaled: true}); err != nil {
				answered <- err
				return
			}
		}
		answered <- nil
		lastDone <- waitFor(p.srvSCQ, rounds-1)
	}()
	for i := 0; i < rounds; i++ {
		if err := p.cli.PostSend(nprdma.SendWR{ID: uint64(i), Op: nprdma.OpSend, SG: []nprdma.SGE{p.lmr.SGE(0, 64)}, Signaled: true}); err != nil {
			t.Fatal(err)
		}
		waitOne(t, ctx, p.cliRCQ, uint64(i), nprdma.OpRecv)
		waitOne(t, ctx, p.cliSCQ, uint64(i), nprdma.OpSend)
	}
	if err := <-answered; err != nil {
		t.Fatalf("server: %v", err)
	}
	cl, sl := onlyLink(t, p.cliProv), onlyLink(t, p.srvProv)
	// Without piggybacking there would be one per message, 200; the few
	// allowed come from the first exchanges, before the reader goroutines
	// stepped aside for the waiters.
	if a, b := cl.acksSent.Load(), sl.acksSent.Load(); a+b > 10 {
		t.Fatalf("%d + %d ACK frames for %d request/response exchanges, want them piggybacked", a, b, rounds)
	}
	// Nothing more to send: the client's next wait sends the owed ACK
	// before it blocks, and the server's last SEND completes.
	short, cancelShort := context.WithTimeout(ctx, 20*time.Millisecond)
	p.cliRCQ.Wait(short, make([]nprdma.WC, 1))
	cancelShort()
	if err := <-lastDone; err != nil {
		t.Fatalf("server's last SEND: %v", err)
	}
	t.Logf("ACK frames: client %d, server %d", cl.acksSent.Load(), sl.acksSent.Load())
}

// A frozen provider delivers nothing, even to a goroutine that was driving
// its link when the freeze came; after the thaw the packet is delivered.
func TestDriverRespectsFreeze(t *testing.T) {
	p := newDirectPair(t, nil, []Option{WithDirectCompletion(time.Hour)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < 3; i++ {
		p.srv.PostRecv(nprdma.RecvWR{ID: uint64(i), SG: []nprdma.SGE{p.rmr.SGE(i*64, 64)}})
	}
	got := make(chan nprdma.WC, 3)
	go func() {
		wcs := make([]nprdma.WC, 1)
		for i := 0; i < 3; i++ {
			if _, err := p.srvRCQ.Wait(ctx, wcs); err != nil {
				close(got)
				return
			}
			got <- wcs[0]
		}
	}()
	send := func(id uint64) {
		if err := p.cli.PostSend(nprdma.SendWR{ID: id, Op: nprdma.OpSend, SG: []nprdma.SGE{p.lmr.SGE(0, 64)}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := uint64(0); i < 2; i++ { // the second is received by the server's waiter
		send(i)
		if wc := <-got; wc.ID != i || wc.Status != nprdma.StatusSuccess {
			t.Fatalf("receive %+v", wc)
		}
	}
	if onlyLink(t, p.srvProv).rcv.drives.Load() == 0 {
		t.Fatal("the server's waiter never received")
	}
	p.srvProv.Freeze()
	send(2)
	select {
	case wc := <-got:
		t.Fatalf("delivered while frozen: %+v", wc)
	case <-time.After(50 * time.Millisecond):
	}
	p.srvProv.Thaw()
	select {
	case wc := <-got:
		if wc.ID != 2 || wc.Status != nprdma.StatusSuccess {
			t.Fatalf("receive after the thaw %+v", wc)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("nothing delivered after the thaw")
	}
}

// A waiter that comes while the provider is frozen and nobody receives
// (the reader goroutine parked, no driver) hands the receive side back to
// the reader goroutine, which delivers after the thaw; without that nobody
// would receive until the linger time (an hour here).
func TestWaitWhileFrozenAndNobodyReceives(t *testing.T) {
	p := newDirectPair(t, nil, []Option{WithDirectCompletion(time.Hour)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < 3; i++ {
		p.srv.PostRecv(nprdma.RecvWR{ID: uint64(i), SG: []nprdma.SGE{p.rmr.SGE(i*64, 64)}})
	}
	send := func(id uint64) {
		if err := p.cli.PostSend(nprdma.SendWR{ID: id, Op: nprdma.OpSend, SG: []nprdma.SGE{p.lmr.SGE(0, 64)}}); err != nil {
			t.Fatal(err)
		}
	}
	wcs := make([]nprdma.WC, 1)
	for i := uint64(0); i < 2; i++ { // the waiter ends up driving, then leaves
		send(i)
		if _, err := p.srvRCQ.Wait(ctx, wcs); err != nil || wcs[0].ID != i {
			t.Fatalf("receive %d: %+v %v", i, wcs[0], err)
		}
	}
	p.srvProv.Freeze()
	done := make(chan error, 1)
	go func() {
		_, err := p.srvRCQ.Wait(ctx, wcs)
		done <- err
	}()
	send(2)
	time.Sleep(20 * time.Millisecond)
	p.srvProv.Thaw()
	select {
	case err := <-done:
		if err != nil || wcs[0].ID != 2 || wcs[0].Status != nprdma.StatusSuccess {
			t.Fatalf("receive after the thaw %+v: %v", wcs[0], err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nothing delivered after the thaw")
	}
}

// The socket receive buffer is fixed unless the provider leaves it to the
// kernel: SO_RCVBUF reads back as twice the size asked for (the kernel's
// bookkeeping share), capped by net.core.rmem_max.
func TestSocketReceiveBuffer(t *testing.T) {
	raw, err := os.ReadFile("/proc/sys/net/core/rmem_max")
	if err != nil {
		t.Skip("no net.core.rmem_max:", err)
	}
	rmemMax, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	rcvbuf := func(l *tcpLink) int {
		var v int
		var serr error
		if err := l.rc.Control(func(fd uintptr) { v, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF) }); err != nil {
			t.Fatal(err)
		}
		if serr != nil {
			t.Fatal(serr)
		}
		return v
	}
	p := newDirectPair(t, nil, []Option{WithSocketReceiveBuffer(256 << 10)})
	if got, want := rcvbuf(onlyLink(t, p.cliProv)), 2*min(DefaultSocketReceiveBuffer, rmemMax); got != want {
		t.Errorf("default: SO_RCVBUF %d, want %d", got, want)
	}
	if got, want := rcvbuf(onlyLink(t, p.srvProv)), 2*min(256<<10, rmemMax); got != want {
		t.Errorf("WithSocketReceiveBuffer(256 KiB): SO_RCVBUF %d, want %d", got, want)
	}
	auto := newDirectPair(t, []Option{WithSocketReceiveBuffer(0)}, nil)
	if got := rcvbuf(onlyLink(t, auto.cliProv)); got == 2*min(DefaultSocketReceiveBuffer, rmemMax) {
		t.Errorf("WithSocketReceiveBuffer(0): SO_RCVBUF %d, the fixed default; want the kernel's own", got)
	}
}

// A peer that stops in the middle of a frame while a waiter receives for
// itself: the waiter's context ends mid-frame, it waits for the rest of the
// frame for the stalled frame timeout only, then the link fails (the peer
// is taken for dead) and the queue pair goes down. Before, the waiter
// finished the frame with no bound and stayed in the read for ever (and a
// queue closing behind it with it).
func TestPeerStopsMidFrame(t *testing.T) {
	p := newDirectPair(t, nil, []Option{WithDirectCompletion(time.Hour), WithStalledFrameTimeout(300 * time.Millisecond)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recv := nprdma.RecvWR{SG: []nprdma.SGE{p.rmr.SGE(0, 65536)}}
	p.srv.PostRecv(recv, recv)
	// SENDs until one is received by the server's waiter: from then on it
	// drives.
	sl := onlyLink(t, p.srvProv)
	wcs := make([]nprdma.WC, 1)
	for sl.rcv.drives.Load() == 0 {
		if err := p.cli.PostSend(nprdma.SendWR{Op: nprdma.OpSend, SG: []nprdma.SGE{p.lmr.SGE(0, 64)}}); err != nil {
			t.Fatal(err)
		}
		if _, err := p.srvRCQ.Wait(ctx, wcs); err != nil || wcs[0].Status != nprdma.StatusSuccess {
			t.Fatalf("receive: %v %+v", err, wcs[0])
		}
		p.srv.PostRecv(recv)
	}
	// The client's next write goes out only in part (its SEND header and
	// the start of its 64 KiB payload), then the client writes nothing more.
	cl := onlyLink(t, p.cliProv)
	cl.wmu.Lock()
	if cl.busy {
		cl.wmu.Unlock()
		t.Fatal("the client is writing")
	}
	cl.writeFn = func(fd uintptr) bool {
		b := cl.w.b
		var out []byte
		for _, sg := range b.segs {
			d := sg.data
			if d == nil {
				d = b.hdr[sg.off : sg.off+sg.n]
			}
			out = append(out, d...)
		}
		unix.Write(int(fd), out[:len(out)/4])
		cl.w.done = true // as if all of it went
		return true
	}
	cl.wmu.Unlock()
	if err := p.cli.PostSend(nprdma.SendWR{Op: nprdma.OpSend, SG: []nprdma.SGE{p.lmr.SGE(0, 65536)}}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
		_, err := p.srvRCQ.Wait(short, wcs)
		stop()
		select {
		case <-p.srv.Done():
			if !errors.Is(p.srv.Err(), link.ErrPeerLost) || !strings.Contains(p.srv.Err().Error(), "middle of a frame") {
				t.Fatalf("queue pair error %v, want the peer lost in the middle of a frame", p.srv.Err())
			}
			t.Logf("the link failed %v after the partial frame", time.Since(start).Round(time.Millisecond))
			return
		default:
		}
		if ctx.Err() != nil {
			t.Fatalf("30 s after a partial frame the queue pair is still up (last wait: %v)", err)
		}
	}
}
