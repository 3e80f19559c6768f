package tcp

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma/link"

	"golang.org/x/sys/unix"
)

// congestionOf is the congestion control of l's socket.
func congestionOf(t *testing.T, l link.Link) string {
	t.Helper()
	rc, err := l.(*tcpLink).nc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var name string
	var gerr error
	rc.Control(func(fd uintptr) { name, gerr = unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION) })
	if gerr != nil {
		t.Fatal(gerr)
	}
	return strings.TrimRight(name, "\x00")
}

// TestCongestionControl: WithCongestionControl applies to both ends, the
// dialed connection and the one its listener accepts; without it the
// connections keep the system's default.
func TestCongestionControl(t *testing.T) {
	sys, err := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	if err != nil {
		t.Skipf("no congestion control setting to compare with: %v", err)
	}
	def := strings.TrimSpace(string(sys))
	// reno is built into every Linux and always allowed.
	for _, want := range []string{"reno", ""} {
		p := New(WithCongestionControl(want))
		ln, err := p.Listen("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		accepted := make(chan link.Link, 1)
		go func() {
			r, err := ln.Accept(ctx)
			if err != nil {
				t.Error(err)
				accepted <- nil
				return
			}
			l, err := r.Accept(link.Hello{})
			if err != nil {
				t.Error(err)
			}
			accepted <- l
		}()
		dialed, _, err := p.Dial(ctx, ln.Addr(), link.Hello{})
		if err != nil {
			t.Fatal(err)
		}
		srv := <-accepted
		cancel()
		if srv == nil {
			t.FailNow()
		}
		expect := want
		if want == "" {
			expect = def
		}
		for side, l := range map[string]link.Link{"dialed": dialed, "accepted": srv} {
			if got := congestionOf(t, l); got != expect {
				t.Errorf("WithCongestionControl(%q): the %s connection uses %q, want %q", want, side, got, expect)
			}
			l.Abort()
		}
		ln.Close()
	}
}

// TestCongestionControlRefused: a congestion control the host does not
// have fails Listen and Dial, naming it and what the host allows.
func TestCongestionControlRefused(t *testing.T) {
	p := New(WithCongestionControl("nprdma-no-such-cc"))
	if ln, err := p.Listen("127.0.0.1:0"); err == nil {
		ln.Close()
		t.Fatal("listened with a congestion control that does not exist")
	} else if !strings.Contains(err.Error(), `congestion control "nprdma-no-such-cc"`) || !strings.Contains(err.Error(), "allows") {
		t.Fatalf("listen: %v, want an error naming the congestion control and the allowed ones", err)
	}
	ok, err := New().Listen("127.0.0.1:0") // the system's default, to dial
	if err != nil {
		t.Fatal(err)
	}
	defer ok.Close()
	if _, _, err := p.Dial(context.Background(), ok.Addr(), link.Hello{}); err == nil || !strings.Contains(err.Error(), `congestion control "nprdma-no-such-cc"`) {
		t.Fatalf("dial: %v, want an error naming the congestion control", err)
	}
}
