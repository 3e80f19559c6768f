package target

import (
	"context"

	"github.com/nprdma/nprdma/nvme"
)

// port is one listener of the target and how the controllers reached
// through it present themselves.
type port struct {
	id        uint16 // PORTID of its discovery log entries: 1, 2, … in the order started
	transport string // "nprdma" or "tcp": a controller's I/O queues come over its admin queue's
	ln        listener
	// discoveryOnly: the port serves the discovery NQN only (NVMe/TCP's
	// discovery port, 8009); an I/O port serves it too.
	discoveryOnly bool
	// oneSided: its queues are RegionExporters (NP Get Region Descriptor).
	oneSided bool
	icd      int    // in-capsule data of its I/O queues, advertised as IOCCSZ
	sgls     uint32 // Identify Controller SGLS
	// entry holds the transport fields of the discovery log entries that
	// point at it (TRTYPE, ADRFAM, TREQ, PORTID, CNTLID, ASQSZ, TRADDR,
	// TRSVCID, TSAS).
	entry nvme.DiscoveryLogEntry
	// release frees what the port's queues shared, once every one is gone.
	release func()
}

// addPortLocked starts serving p (t.mu held).
func (t *Target) addPortLocked(p *port) {
	p.id = uint16(len(t.ports) + 1)
	p.entry.PORTID = p.id
	t.ports = append(t.ports, p)
	t.acceptWG.Add(1)
	go t.acceptLoop(t.acceptCtx, p)
}

// ioPorts are the ports of transport that serve I/O subsystems.
func (t *Target) ioPorts(transport string) []*port {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ps []*port
	for _, p := range t.ports {
		if p.transport == transport && !p.discoveryOnly {
			ps = append(ps, p)
		}
	}
	return ps
}

func (t *Target) acceptLoop(ctx context.Context, p *port) {
	defer t.acceptWG.Done()
	for {
		q, start, err := p.ln.Accept(ctx)
		if err != nil {
			return
		}
		qc := newQueueConn(t, q, p)
		t.accepted.Store(true)
		t.mu.Lock()
		if t.closed || t.draining.Load() {
			t.mu.Unlock()
			q.Close()
			continue
		}
		t.queues[qc] = struct{}{}
		t.mu.Unlock()
		if t.met != nil {
			t.met.connections.Inc()
		}
		start(qc.handle)
		go qc.watch()
	}
}
