package target

import (
	"context"
	"strings"

	"github.com/nprdma/nprdma/nprdma/shm"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/fabric"
)

// The nprdma fabric's port: the NVMe-oF RDMA binding over nprdma queue
// pairs (nvme/fabric), with one-sided reads of the namespaces' regions.

type fabricListener struct{ ln *fabric.Listener }

func (f fabricListener) Accept(ctx context.Context) (Queue, func(func(Request)), error) {
	q, err := f.ln.Accept(ctx)
	if err != nil {
		return nil, nil, err
	}
	return q, func(h func(Request)) { q.Start(func(r *fabric.Request) { h(r) }) }, nil
}

func (f fabricListener) Addr() string { return f.ln.Addr() }
func (f fabricListener) Close() error { return f.ln.Close() }

// listenFabric listens on the nprdma fabric at addr, one of t.cfg.listen.
func (t *Target) listenFabric(addr string) (*port, error) {
	opts := []fabric.ListenOption{
		fabric.WithQueueEntries(fabric.DefaultAdminQueueEntries, t.cfg.queueDepth),
		fabric.WithInCapsuleData(t.cfg.icd),
		fabric.WithMaxQueueID(t.cfg.maxIOQueues),
		fabric.WithMaxQueues(t.cfg.maxConnections),
		fabric.WithDataPool(t.pool),
		fabric.WithListenLogger(t.log),
	}
	if t.cfg.qpTimeout != 0 {
		opts = append(opts, fabric.WithControllerQPTimeout(t.cfg.qpTimeout))
	}
	if t.cfg.busyPoll > 0 {
		opts = append(opts, fabric.WithReceiveBusyPoll(t.cfg.busyPoll))
	}
	ln, err := fabric.Listen(t.pd, addr, opts...)
	if err != nil {
		return nil, err
	}
	host, svc := splitHostPort(ln.Addr())
	e := nvme.DiscoveryLogEntry{TRTYPE: nvme.TransportRDMA, ADRFAM: nvme.AddressIPv4, TSAS: nvme.RDMATSAS()}
	switch {
	case strings.HasPrefix(ln.Addr(), shm.Scheme):
		// Shared memory, for initiators on this host: the address is the
		// socket's, scheme included.
		e.TRTYPE, e.ADRFAM = nvme.TransportLoop, nvme.AddressIntraHost
		host, svc = ln.Addr(), ""
	case t.dev.Provider() != nil && t.dev.Provider().Name() == "loop":
		e.TRTYPE, e.ADRFAM = nvme.TransportLoop, nvme.AddressIntraHost
	}
	e.TREQ, e.CNTLID, e.ASQSZ = nvme.TREQSecureChannelNotRequired, nvme.DynamicControllerID, fabric.DefaultAdminQueueEntries
	e.TRADDR, e.TRSVCID = host, svc
	return &port{transport: "nprdma", ln: fabricListener{ln}, oneSided: true, icd: t.cfg.icd,
		sgls:  nvme.SGLSSupported | nvme.SGLSKeyedDataBlock | nvme.SGLSOffset,
		entry: e, release: func() { ln.ClosePool() }}, nil
}
