package initiator

import (
	"context"
	"fmt"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/fabric"
	"github.com/nprdma/nprdma/nvme/tcp"
)

// Transport is the NVMe-oF transport a controller's queues run over:
// NPRDMA (the nprdma fabric, with one-sided reads) or TCP (NVMe/TCP,
// two-sided only). The controller's bring-up, keep-alive, reconnect and
// controller-loss logic is the same over either.
type Transport struct {
	name string
	bind func(cfg *config) (binding, error)
}

// String is the transport's name: "nprdma" or "tcp".
func (t Transport) String() string { return t.name }

// NPRDMA is the nprdma fabric over device dev (the caller keeps dev and
// closes it after the controllers that use it): the NVMe-oF RDMA-style
// binding of package nvme/fabric, whose queues also read the target's
// regions one-sided.
func NPRDMA(dev *nprdma.Device) Transport {
	return Transport{name: "nprdma", bind: func(cfg *config) (binding, error) { return bindNPRDMA(dev, cfg) }}
}

// TCP is NVMe/TCP (package nvme/tcp): two-sided I/O to any NVMe/TCP
// target, with the dial options given (digests; default none). WithQPTimeout
// and WithBusyPoll do not apply to it: a silent target is noticed by the
// keep-alive, a target that stops in the middle of a PDU by
// tcp.WithHostStallTimeout.
func TCP(opts ...tcp.DialOption) Transport {
	return Transport{name: "tcp", bind: func(*config) (binding, error) { return tcpBinding{opts: opts}, nil }}
}

// queueConfig describes one queue a session dials.
type queueConfig struct {
	qid     uint16
	entries int
	// icd is the in-capsule data limit of I/O queues (nvme.ICDLimit of
	// Identify IOCCSZ); the admin queue's is the transport's own.
	icd    int
	cntlid uint16
}

// binding dials the queues of one controller over its transport and holds
// what they share.
type binding interface {
	dial(ctx context.Context, addr string, qc queueConfig) (hostQueue, error)
	// maxTransfer bounds the data of one command on this transport.
	maxTransfer() int
	// remote is the binding's one-sided read support (nil: none).
	remote() *remoteReads
	close() error
}

// hostQueue is one queue of a session (admin or I/O) as the controller uses
// it: fabric.HostQueue and tcp.HostQueue implement it. Submit is called from
// many goroutines at once; an error of a failed queue wraps
// nvme.ErrQueueFailed.
type hostQueue interface {
	QID() uint16
	// Entries is the number of commands the queue holds in flight.
	Entries() int
	// Submit sends cmd with data (the payload of a command moving data to
	// the controller, else the buffer the controller's data fills) and
	// waits for its completion.
	Submit(ctx context.Context, cmd nvme.Command, data []byte) (nvme.Completion, error)
	// Done is closed once the queue failed or was closed; Err says why.
	Done() <-chan struct{}
	Err() error
	Close() error
}

// remoteReader is the capability of a queue that also reads the target's
// memory one-sided (fabric.HostQueue): an RDMA READ of a region into a
// registered buffer, and the NVMe Read fallback into the same buffer.
type remoteReader interface {
	ReadRemote(ctx context.Context, buf *nprdma.Buffer, off, n int, raddr uint64, rkey uint32) error
	ReadRemoteBatch(ctx context.Context, buf *nprdma.Buffer, reads []fabric.RemoteRead) error
	SubmitBuffer(ctx context.Context, cmd nvme.Command, buf *nprdma.Buffer, off, n int) (nvme.Completion, error)
}

// remoteReads is what one-sided reads need besides the queue: registered
// buffers to read into and the device's scan for the region's magic pages.
type remoteReads struct {
	dev  *nprdma.Device
	pool *nprdma.BufferPool
}

// nprdmaBinding dials fabric.HostQueues with a protection domain and a
// buffer pool of the controller's own.
type nprdmaBinding struct {
	pd   *nprdma.PD
	rr   remoteReads
	opts []fabric.DialOption
}

func bindNPRDMA(dev *nprdma.Device, cfg *config) (binding, error) {
	if dev == nil {
		return nil, fmt.Errorf("initiator: the nprdma transport needs a device")
	}
	b := &nprdmaBinding{pd: dev.AllocPD()}
	pool, err := nprdma.NewBufferPool(b.pd, fabric.HostAccess)
	if err != nil {
		b.pd.Close()
		return nil, fmt.Errorf("initiator: %w", err)
	}
	b.rr = remoteReads{dev: dev, pool: pool}
	b.opts = []fabric.DialOption{fabric.WithPool(pool)}
	if cfg.qpTimeout != 0 {
		b.opts = append(b.opts, fabric.WithQPTimeout(cfg.qpTimeout))
	}
	if cfg.busyPoll > 0 {
		b.opts = append(b.opts, fabric.WithCompletionBusyPoll(cfg.busyPoll))
	}
	return b, nil
}

func (b *nprdmaBinding) dial(ctx context.Context, addr string, qc queueConfig) (hostQueue, error) {
	q, err := fabric.Dial(ctx, b.pd, addr, fabric.QueueConfig{QID: qc.qid, Entries: qc.entries, InCapsuleData: qc.icd, CNTLID: qc.cntlid}, b.opts...)
	if err != nil {
		return nil, err
	}
	return q, nil
}

func (b *nprdmaBinding) maxTransfer() int     { return fabric.MaxTransfer }
func (b *nprdmaBinding) remote() *remoteReads { return &b.rr }

func (b *nprdmaBinding) close() error {
	err := b.rr.pool.Close()
	if perr := b.pd.Close(); err == nil {
		err = perr
	}
	return err
}

// tcpBinding dials tcp.HostQueues; it holds nothing.
type tcpBinding struct{ opts []tcp.DialOption }

func (b tcpBinding) dial(ctx context.Context, addr string, qc queueConfig) (hostQueue, error) {
	q, err := tcp.Dial(ctx, addr, tcp.QueueConfig{QID: qc.qid, Entries: qc.entries, InCapsuleData: qc.icd}, b.opts...)
	if err != nil {
		return nil, err
	}
	return q, nil
}

func (tcpBinding) maxTransfer() int     { return tcp.MaxTransfer }
func (tcpBinding) remote() *remoteReads { return nil }
func (tcpBinding) close() error         { return nil }
