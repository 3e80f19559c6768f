package reliability_test

import (
	"io"
	"net"
	"sync"
	"testing"
)

// cutProxy forwards the loopback TCP connections made to it to the address
// to: Cut resets every connection forwarded so far, as a network failure
// resets them, while later ones are forwarded again, so an NVMe/TCP host
// reconnects. It is the NVMe/TCP counterpart of the cutter provider.
type cutProxy struct {
	ln    net.Listener
	to    string
	mu    sync.Mutex
	conns []*net.TCPConn
	wg    sync.WaitGroup
}

// startCutProxy listens on loopback; the proxy is closed when the test
// ends.
func startCutProxy(t testing.TB, to string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, to: to}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is where hosts connect.
func (p *cutProxy) Addr() string { return p.ln.Addr().String() }

func (p *cutProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.to)
		if err != nil {
			c.Close()
			continue
		}
		a, b := c.(*net.TCPConn), up.(*net.TCPConn)
		p.mu.Lock()
		p.conns = append(p.conns, a, b)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(a, b)
		go p.pipe(b, a)
	}
}

// pipe copies from src to dst; when either ends, both do.
func (p *cutProxy) pipe(dst, src *net.TCPConn) {
	defer p.wg.Done()
	io.Copy(dst, src)
	dst.Close()
	src.Close()
}

// Cut resets every connection forwarded so far, on both sides.
func (p *cutProxy) Cut() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, c := range conns {
		c.SetLinger(0) // close with a reset, not an orderly shutdown
		c.Close()
	}
}

func (p *cutProxy) close() {
	p.ln.Close()
	p.Cut()
	p.wg.Wait()
}
