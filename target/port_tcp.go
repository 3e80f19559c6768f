package target

import (
	"context"
	"net"

	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/tcp"
)

// The NVMe/TCP ports (nvme/tcp): an I/O port, and optionally a port that
// serves only the discovery controller (8009 by convention). Reads are
// two-sided: through the namespace's region like every command, so a stock
// host gets the same DRAM cache over the backing device.

type tcpListener struct{ ln *tcp.Listener }

func (l tcpListener) Accept(ctx context.Context) (Queue, func(func(Request)), error) {
	q, err := l.ln.Accept(ctx)
	if err != nil {
		return nil, nil, err
	}
	return q, func(h func(Request)) { q.Start(func(r *tcp.Request) { h(r) }) }, nil
}

func (l tcpListener) Addr() string { return l.ln.Addr() }
func (l tcpListener) Close() error { return l.ln.Close() }

// listenTCP listens for NVMe/TCP hosts at addr.
func (t *Target) listenTCP(addr string, discoveryOnly bool) (*port, error) {
	ln, err := tcp.Listen(addr,
		tcp.WithQueueEntries(tcp.DefaultAdminQueueEntries, t.cfg.queueDepth),
		tcp.WithInCapsuleData(t.cfg.icd),
		tcp.WithMaxTransfer(t.cfg.maxTransfer),
		tcp.WithMaxQueues(t.cfg.maxConnections),
		tcp.WithLogger(t.log))
	if err != nil {
		return nil, err
	}
	host, svc := splitHostPort(ln.Addr())
	e := nvme.DiscoveryLogEntry{TRTYPE: nvme.TransportTCP, ADRFAM: nvme.AddressIPv4,
		TREQ:   nvme.TREQSecureChannelNotRequired,
		CNTLID: nvme.DynamicControllerID, ASQSZ: tcp.DefaultAdminQueueEntries, TRADDR: host, TRSVCID: svc}
	if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
		e.ADRFAM = nvme.AddressIPv6
	}
	return &port{transport: "tcp", ln: tcpListener{ln}, discoveryOnly: discoveryOnly, icd: t.cfg.icd,
		sgls: nvme.SGLSSupported | nvme.SGLSOffset, entry: e}, nil
}
