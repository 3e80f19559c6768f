package tcp_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/link"
	"github.com/nprdma/nprdma/nprdma/tcp"
)

const peerEnv = "NPRDMA_TCP_TEST_PEER"

// TestHelperPeer is the peer process of TestPeerKilled: it serves a 1 MiB
// region for READs until it is killed.
func TestHelperPeer(t *testing.T) {
	if os.Getenv(peerEnv) != "1" {
		t.Skip("helper process for TestPeerKilled")
	}
	dev := nprdma.NewDevice(tcp.New(), nprdma.WithPinning(false))
	pd := dev.AllocPD()
	buf := make([]byte, 1<<20)
	mr, err := pd.Register(buf, nprdma.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.NewQP(nprdma.QPConfig{SendCQ: dev.NewCQ(16)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("PEER %s %d %d\n", ln.Addr(), mr.Addr(), mr.RKey())
	req, err := ln.Accept(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	req.Accept(qp, nil)
	select {} // serve until killed
}

// TestPeerKilled kills the peer process (SIGKILL) while READs are in flight:
// every work request completes, with errors after the death, and the QP
// reports a lost peer.
func TestPeerKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperPeer$", "-test.v")
	cmd.Env = append(os.Environ(), peerEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start the peer process: %v", err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	var addr string
	var raddr uint64
	var rkey uint32
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 4 && f[0] == "PEER" {
			addr = f[1]
			raddr, _ = strconv.ParseUint(f[2], 10, 64)
			k, _ := strconv.ParseUint(f[3], 10, 32)
			rkey = uint32(k)
			break
		}
	}
	if addr == "" {
		t.Fatal("the peer process printed no address")
	}
	go io.Copy(io.Discard, out)

	dev := nprdma.NewDevice(tcp.New(), nprdma.WithPinning(false))
	defer dev.Close()
	pd := dev.AllocPD()
	cq := dev.NewCQ(256)
	qp, err := pd.NewQP(nprdma.QPConfig{SendCQ: cq, SendDepth: 128})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := qp.Connect(ctx, addr, nil); err != nil {
		t.Fatal(err)
	}
	local := make([]byte, 1<<20)
	lmr, err := pd.Register(local, nprdma.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	const n = 128
	for i := 0; i < n; i++ {
		if err := qp.PostSend(nprdma.SendWR{ID: uint64(i), Op: nprdma.OpRead, SG: []nprdma.SGE{lmr.SGE(0, 1<<20)}, RemoteAddr: raddr, RKey: rkey, Signaled: true}); err != nil {
			t.Fatal(err)
		}
	}
	wcs := make([]nprdma.WC, n)
	got, err := cq.Wait(ctx, wcs)
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for got < n {
		k, err := cq.Wait(ctx, wcs[got:])
		if err != nil {
			t.Fatalf("after %d completions: %v", got, err)
		}
		got += k
	}
	failed := 0
	for i, wc := range wcs {
		if wc.ID != uint64(i) {
			t.Fatalf("completion %d has id %d", i, wc.ID)
		}
		if wc.Status != nprdma.StatusSuccess {
			failed++
			if failed == 1 && wc.Status != nprdma.StatusRetryExceeded {
				t.Fatalf("first failure %s, want %s", wc.Status, nprdma.StatusRetryExceeded)
			}
			if failed > 1 && wc.Status != nprdma.StatusWRFlushed {
				t.Fatalf("completion %d: %s, want a flush", i, wc.Status)
			}
		} else if failed > 0 {
			t.Fatalf("completion %d succeeded after a failure", i)
		}
	}
	if failed == 0 {
		t.Fatal("every READ finished before the kill: nothing tested")
	}
	<-qp.Done()
	if !errors.Is(qp.Err(), link.ErrPeerLost) {
		t.Fatalf("qp error %v, want ErrPeerLost", qp.Err())
	}
}

// serverQP listens and accepts one connection into a fresh QP.
func serverQP(t *testing.T) (*nprdma.QP, *nprdma.Listener, <-chan error) {
	t.Helper()
	dev := nprdma.NewDevice(tcp.New(), nprdma.WithPinning(false))
	t.Cleanup(func() { dev.Close() })
	pd := dev.AllocPD()
	qp, err := pd.NewQP(nprdma.QPConfig{SendCQ: dev.NewCQ(16)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := dev.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		req, err := ln.Accept(ctx)
		if err == nil {
			err = req.Accept(qp, nil)
		}
		done <- err
	}()
	return qp, ln, done
}

// rawConnect speaks the handshake by hand.
func rawConnect(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	connect := []byte{16, 0, 0, 0, 0, 0, 0, 0, 'N', 'P', 'R', 'D', 2, 0, 0, 0, 1, 0, 0, 0} // protocol version 2
	if _, err := c.Write(connect); err != nil {
		t.Fatal(err)
	}
	accept := make([]byte, 16)
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(c, accept); err != nil {
		t.Fatal(err)
	}
	if accept[0] != 17 {
		t.Fatalf("answer frame type %d, want ACCEPT", accept[0])
	}
	return c
}

// A peer claiming a 4 GiB SEND is cut off before anything is allocated or
// read, and the QP reports a protocol violation.
func TestPeerClaimsHugeFrame(t *testing.T) {
	qp, ln, accepted := serverQP(t)
	c := rawConnect(t, ln.Addr())
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	hdr := make([]byte, 20)
	hdr[0] = 1 // SEND
	binary.LittleEndian.PutUint32(hdr[8:], 0xffffffff)
	if _, err := c.Write(hdr); err != nil {
		t.Fatal(err)
	}
	select {
	case <-qp.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("QP still up after a 4 GiB frame")
	}
	if !errors.Is(qp.Err(), link.ErrProtocol) {
		t.Fatalf("qp error %v, want ErrProtocol", qp.Err())
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	var ne net.Error
	if _, err := io.Copy(io.Discard, c); errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("connection still open after the protocol violation")
	}
}

// A connection that does not speak the handshake is dropped; the listener
// goes on serving.
func TestGarbageHandshake(t *testing.T) {
	qp, ln, accepted := serverQP(t)
	c, err := net.Dial("tcp", ln.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if n, _ := io.Copy(io.Discard, c); n != 0 {
		t.Fatalf("got %d bytes back from a garbage handshake", n)
	}
	rawConnect(t, ln.Addr())
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	if qp.State() != nprdma.QPStateRTS {
		t.Fatalf("state %s", qp.State())
	}
}
