//go:build cgo && !noverbs

package verbs

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/conformance"
)

// The tests below need an RDMA device and an address of it to listen on:
// NPRDMA_VERBS_ADDR (the guest lab runs them on Soft-RoCE over eth0 with
// 10.0.2.15: TestGuestRDMA in integration/rdma), and optionally
// NPRDMA_VERBS_DEVICE. Without them they skip.

func testAddr(t *testing.T) string {
	t.Helper()
	a := os.Getenv("NPRDMA_VERBS_ADDR")
	if a == "" {
		t.Skip("NPRDMA_VERBS_ADDR is not set: no address of an RDMA device to listen on (the guest lab sets it: TestGuestRDMA in integration/rdma)")
	}
	return a
}

func openDevice(t *testing.T) *nprdma.Device {
	t.Helper()
	testAddr(t)
	d, err := OpenDevice(os.Getenv("NPRDMA_VERBS_DEVICE"))
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("no RDMA here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("close device: %v", err)
		}
	})
	return d
}

// On a machine without devices the error says what is missing.
func TestUnavailableSaysWhy(t *testing.T) {
	_, err := Devices()
	if err == nil {
		t.Skip("this machine has RDMA devices")
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Devices: %v, want ErrUnavailable", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "no RDMA device") && !strings.Contains(msg, "libibverbs") && !strings.Contains(msg, "librdmacm") {
		t.Fatalf("error %q names neither the missing library nor the missing device", msg)
	}
	if _, oerr := OpenDevice(""); !errors.Is(oerr, ErrUnavailable) {
		t.Fatalf("Open: %v, want ErrUnavailable", oerr)
	}
}

// The nprdma conformance suite on the device.
func TestConformance(t *testing.T) {
	host := testAddr(t)
	conformance.Run(t, conformance.Harness{NewDevice: openDevice, ListenAddr: net.JoinHostPort(host, "0")})
}

func TestRNRTimerCode(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int
	}{{0, 14}, {time.Millisecond, 14}, {10 * time.Microsecond, 1}, {11 * time.Microsecond, 2}, {400 * time.Millisecond, 31}, {500 * time.Millisecond, 0}} {
		if got := rnrTimerCode(c.d); got != c.want {
			t.Errorf("rnrTimerCode(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

type end struct {
	dev *nprdma.Device
	pd  *nprdma.PD
	cq  *nprdma.CQ
	qp  *nprdma.QP
}

func newEnd(t *testing.T, d *nprdma.Device, cfg nprdma.QPConfig) *end {
	t.Helper()
	pd := d.AllocPD()
	cq := d.NewCQ(256)
	cfg.SendCQ = cq
	qp, err := pd.NewQP(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		qp.Close()
		cq.Close()
		pd.Close()
	})
	return &end{dev: d, pd: pd, cq: cq, qp: qp}
}

func (e *end) region(t *testing.T, n int, access nprdma.Access) (*nprdma.MR, []byte) {
	t.Helper()
	buf, err := nprdma.AllocBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	rand.Read(buf)
	mr, err := e.pd.Register(buf, access)
	if err != nil {
		nprdma.FreeBuffer(buf)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mr.Deregister()
		nprdma.FreeBuffer(buf)
	})
	return mr, buf
}

func wait1(t *testing.T, cq *nprdma.CQ) nprdma.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wc [1]nprdma.WC
	if _, err := cq.Wait(ctx, wc[:]); err != nil {
		t.Fatalf("wait for a completion: %v", err)
	}
	return wc[0]
}

func expect(t *testing.T, cq *nprdma.CQ, id uint64, op nprdma.Opcode, st nprdma.Status) nprdma.WC {
	t.Helper()
	wc := wait1(t, cq)
	if wc.ID != id || wc.Op != op || wc.Status != st {
		t.Fatalf("completion %+v (%s), want id %d %s %s", wc, wc.Status, id, op, st)
	}
	return wc
}

// pair connects a client and a server end over the device's address.
func pair(t *testing.T, d *nprdma.Device, cfg nprdma.QPConfig, recvs func(srv *end)) (cli, srv *end, reply, req []byte) {
	t.Helper()
	host := testAddr(t)
	cli, srv = newEnd(t, d, cfg), newEnd(t, d, cfg)
	if recvs != nil {
		recvs(srv)
	}
	ln, err := d.Listen(net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := make(chan []byte, 1)
	errc := make(chan error, 1)
	go func() {
		r, err := ln.Accept(ctx)
		if err != nil {
			errc <- err
			return
		}
		got <- r.PrivateData()
		errc <- r.Accept(srv.qp, []byte("from the server"))
	}()
	reply, err = cli.qp.Connect(ctx, ln.Addr(), []byte("from the client"))
	if err != nil {
		t.Fatalf("connect to %s: %v", ln.Addr(), err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("accept: %v", err)
	}
	return cli, srv, reply, <-got
}

func TestConnectSendReadWrite(t *testing.T) {
	d := openDevice(t)
	t.Logf("device %+v", d.Driver().(*Device).Info())
	const n = 8192
	var rmr *nprdma.MR
	var rbuf []byte
	cli, srv, reply, req := pair(t, d, nprdma.QPConfig{}, func(srv *end) {
		rmr, rbuf = srv.region(t, 4*n, nprdma.AccessLocalWrite|nprdma.AccessRemoteRead|nprdma.AccessRemoteWrite)
		if err := srv.qp.PostRecv(nprdma.RecvWR{ID: 100, SG: []nprdma.SGE{rmr.SGE(0, n)}}); err != nil {
			t.Fatal(err)
		}
	})
	if !bytes.HasPrefix(req, []byte("from the client")) || !bytes.HasPrefix(reply, []byte("from the server")) {
		t.Fatalf("private data %q / %q", req, reply)
	}
	if cli.qp.State() != nprdma.QPStateRTS || srv.qp.State() != nprdma.QPStateRTS {
		t.Fatalf("states %s / %s", cli.qp.State(), srv.qp.State())
	}
	if cli.qp.RemoteNum() != srv.qp.Num() || srv.qp.RemoteNum() != cli.qp.Num() {
		t.Fatalf("remote numbers %d/%d, want %d/%d", cli.qp.RemoteNum(), srv.qp.RemoteNum(), srv.qp.Num(), cli.qp.Num())
	}
	lmr, lbuf := cli.region(t, 4*n, nprdma.AccessLocalWrite)

	// SEND, received in the receive posted before the connection.
	post(t, cli.qp, nprdma.SendWR{ID: 1, Op: nprdma.OpSend, SG: []nprdma.SGE{lmr.SGE(0, 1000)}, Signaled: true})
	expect(t, cli.cq, 1, nprdma.OpSend, nprdma.StatusSuccess)
	if r := expect(t, srv.cq, 100, nprdma.OpRecv, nprdma.StatusSuccess); r.ByteLen != 1000 || r.HasImm {
		t.Fatalf("receive %+v", r)
	}
	same(t, "SEND", rbuf[:1000], lbuf[:1000])

	// SEND_WITH_IMM, inline.
	srv.qp.PostRecv(nprdma.RecvWR{ID: 101, SG: []nprdma.SGE{rmr.SGE(n, n)}})
	msg := []byte("inline bytes, copied at post time")
	want := append([]byte(nil), msg...)
	if cli.qp.MaxInline() < len(msg) {
		t.Fatalf("max inline %d", cli.qp.MaxInline())
	}
	post(t, cli.qp, nprdma.SendWR{ID: 2, Op: nprdma.OpSendWithImm, Imm: 0xfeedbeef, Inline: true, InlineData: msg, Signaled: true})
	copy(msg, "XXXXXXXXXXXXXXXX")
	expect(t, cli.cq, 2, nprdma.OpSendWithImm, nprdma.StatusSuccess)
	if r := expect(t, srv.cq, 101, nprdma.OpRecv, nprdma.StatusSuccess); !r.HasImm || r.Imm != 0xfeedbeef || int(r.ByteLen) != len(want) {
		t.Fatalf("receive with immediate %+v", r)
	}
	same(t, "inline SEND", rbuf[n:n+len(want)], want)

	// WRITE (unsignaled, then a signaled one), WRITE_WITH_IMM.
	post(t, cli.qp,
		nprdma.SendWR{ID: 3, Op: nprdma.OpWrite, SG: []nprdma.SGE{lmr.SGE(0, n/2)}, RemoteAddr: rmr.Addr() + 2*n, RKey: rmr.RKey()},
		nprdma.SendWR{ID: 4, Op: nprdma.OpWrite, SG: []nprdma.SGE{lmr.SGE(n/2, n/2)}, RemoteAddr: rmr.Addr() + 2*n + n/2, RKey: rmr.RKey(), Signaled: true})
	expect(t, cli.cq, 4, nprdma.OpWrite, nprdma.StatusSuccess)
	same(t, "WRITE", rbuf[2*n:3*n], lbuf[:n])
	srv.qp.PostRecv(nprdma.RecvWR{ID: 102})
	post(t, cli.qp, nprdma.SendWR{ID: 5, Op: nprdma.OpWriteWithImm, Imm: 77, SG: []nprdma.SGE{lmr.SGE(n, 512)}, RemoteAddr: rmr.Addr() + 3*n, RKey: rmr.RKey(), Signaled: true})
	expect(t, cli.cq, 5, nprdma.OpWriteWithImm, nprdma.StatusSuccess)
	if r := expect(t, srv.cq, 102, nprdma.OpRecvRDMAWithImm, nprdma.StatusSuccess); !r.HasImm || r.Imm != 77 || r.ByteLen != 512 {
		t.Fatalf("write-with-imm receive %+v", r)
	}
	same(t, "WRITE_WITH_IMM", rbuf[3*n:3*n+512], lbuf[n:n+512])

	// READ, scattered into two SGEs.
	post(t, cli.qp, nprdma.SendWR{ID: 6, Op: nprdma.OpRead, SG: []nprdma.SGE{lmr.SGE(2*n, 100), lmr.SGE(3*n, n-100)},
		RemoteAddr: rmr.Addr() + 5, RKey: rmr.RKey(), Signaled: true})
	if wc := expect(t, cli.cq, 6, nprdma.OpRead, nprdma.StatusSuccess); wc.ByteLen != n {
		t.Fatalf("READ completion %+v", wc)
	}
	same(t, "READ", append(append([]byte(nil), lbuf[2*n:2*n+100]...), lbuf[3*n:4*n-100]...), rbuf[5:5+n])

	// Many unsignaled WRITEs: their slots come free without the
	// application polling (hidden signals, reaped by PostSend).
	for i := 0; i < 1000; {
		err := cli.qp.PostSend(nprdma.SendWR{ID: 7, Op: nprdma.OpWrite, SG: []nprdma.SGE{lmr.SGE(0, 64)}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
		if errors.Is(err, nprdma.ErrQueueFull) {
			time.Sleep(100 * time.Microsecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		i++
	}
	post(t, cli.qp, nprdma.SendWR{ID: 8, Op: nprdma.OpWrite, SG: []nprdma.SGE{lmr.SGE(0, 64)}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey(), Signaled: true})
	expect(t, cli.cq, 8, nprdma.OpWrite, nprdma.StatusSuccess)
	var none [4]nprdma.WC
	if k := cli.cq.Poll(none[:]); k != 0 {
		t.Fatalf("unexpected completions %+v", none[:k])
	}

	// A bad rkey: the requester's READ fails, and both queue pairs fail.
	post(t, cli.qp, nprdma.SendWR{ID: 9, Op: nprdma.OpRead, SG: []nprdma.SGE{lmr.SGE(0, 64)}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey() ^ 0x5500, Signaled: true},
		nprdma.SendWR{ID: 10, Op: nprdma.OpSend, SG: []nprdma.SGE{lmr.SGE(0, 8)}})
	expect(t, cli.cq, 9, nprdma.OpRead, nprdma.StatusRemoteAccess)
	expect(t, cli.cq, 10, nprdma.OpSend, nprdma.StatusWRFlushed)
	waitErr(t, cli.qp, nprdma.ErrRemoteAccess)
	select {
	case <-srv.qp.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the responder's queue pair did not fail")
	}
	t.Logf("responder: %v", srv.qp.Err())
}

func TestRejectAndNobodyListening(t *testing.T) {
	d := openDevice(t)
	host := testAddr(t)
	cli := newEnd(t, d, nprdma.QPConfig{})
	ln, err := d.Listen(net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() {
		if r, err := ln.Accept(ctx); err == nil {
			r.Reject([]byte("go away"))
		}
	}()
	mr, _ := cli.region(t, 64, nprdma.AccessLocalWrite)
	cli.qp.PostRecv(nprdma.RecvWR{ID: 9, SG: []nprdma.SGE{mr.SGE(0, 64)}})
	_, err = cli.qp.Connect(ctx, ln.Addr(), []byte("let me in"))
	var rej *nprdma.RejectError
	if !errors.As(err, &rej) || !bytes.HasPrefix(rej.PrivateData, []byte("go away")) {
		t.Fatalf("connect: %v, want a rejection with the private data", err)
	}
	expect(t, cli.cq, 9, nprdma.OpRecv, nprdma.StatusWRFlushed)
	addr := ln.Addr()
	ln.Close()

	other := newEnd(t, d, nprdma.QPConfig{})
	_, err = other.qp.Connect(ctx, addr, nil)
	if err == nil || errors.As(err, &rej) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("connect to nothing: %v; want an error naming %s that is no rejection", err, addr)
	}
	if ctx.Err() != nil {
		t.Fatal("connect to nothing waited for the context")
	}
}

func TestDisconnectAndClose(t *testing.T) {
	d := openDevice(t)
	var rmr *nprdma.MR
	cli, srv, _, _ := pair(t, d, nprdma.QPConfig{}, func(srv *end) {
		rmr, _ = srv.region(t, 4096, nprdma.AccessLocalWrite)
		for i := 0; i < 4; i++ {
			srv.qp.PostRecv(nprdma.RecvWR{ID: uint64(i), SG: []nprdma.SGE{rmr.SGE(0, 4096)}})
		}
	})
	if err := cli.qp.Disconnect(); err != nil {
		t.Fatal(err)
	}
	waitErr(t, cli.qp, nprdma.ErrDisconnected)
	waitErr(t, srv.qp, nprdma.ErrPeerDisconnected)
	for i := 0; i < 4; i++ {
		expect(t, srv.cq, uint64(i), nprdma.OpRecv, nprdma.StatusWRFlushed)
	}
	// Posting after the failure completes with a flush.
	post(t, cli.qp, nprdma.SendWR{ID: 11, Op: nprdma.OpSend})
	expect(t, cli.cq, 11, nprdma.OpSend, nprdma.StatusWRFlushed)
	if err := srv.qp.Close(); err != nil {
		t.Fatal(err)
	}
	if srv.qp.State() != nprdma.QPStateClosed {
		t.Fatalf("state after close %s", srv.qp.State())
	}
}

func post(t *testing.T, qp *nprdma.QP, wrs ...nprdma.SendWR) {
	t.Helper()
	if err := qp.PostSend(wrs...); err != nil {
		t.Fatalf("post send: %v", err)
	}
}

func same(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: the bytes differ", what)
	}
}

func waitErr(t *testing.T, qp *nprdma.QP, want error) {
	t.Helper()
	select {
	case <-qp.Done():
	case <-time.After(20 * time.Second):
		t.Fatalf("qp %d still %s", qp.Num(), qp.State())
	}
	if err := qp.Err(); !errors.Is(err, want) {
		t.Fatalf("qp %d: %v, want %v", qp.Num(), err, want)
	}
}

// TestCloseWhilePeerDisconnects closes both ends of connections at once: the
// disconnect of one end reaches the other's connection manager loop while
// that end's Close destroys its id and queue pair, which must not be touched
// after (the loop once disconnected a destroyed id and crashed).
func TestCloseWhilePeerDisconnects(t *testing.T) {
	d := openDevice(t)
	for i := 0; i < 16; i++ {
		cli, srv, _, _ := pair(t, d, nprdma.QPConfig{}, nil)
		var wg sync.WaitGroup
		for k, e := range []*end{cli, srv} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// The server's close starts a little later each round, so
				// that some rounds close it while its loop handles the
				// client's disconnect.
				time.Sleep(time.Duration(k*i) * 200 * time.Microsecond)
				if err := e.qp.Close(); err != nil {
					t.Errorf("close qp %d: %v", e.qp.Num(), err)
				}
			}()
		}
		wg.Wait()
		for _, e := range []*end{cli, srv} {
			if st := e.qp.State(); st != nprdma.QPStateClosed {
				t.Fatalf("round %d: qp %d is %s after close", i, e.qp.Num(), st)
			}
		}
	}
}
