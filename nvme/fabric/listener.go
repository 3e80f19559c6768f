package fabric

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nvme"
)

// Limits of the controller side (defaults of ListenOption).
const (
	// DefaultAdminQueueEntries is the largest admin queue accepted: Linux
	// asks for 32 entries and nvmet refuses more.
	DefaultAdminQueueEntries = 32
	// DefaultIOQueueEntries is the largest I/O queue accepted (CAP.MQES+1).
	DefaultIOQueueEntries = 256
	// DefaultInCapsuleData is the in-capsule data an I/O queue accepts:
	// two 4 KiB blocks, so that the common small writes need no RDMA READ.
	DefaultInCapsuleData = 8192
	// DefaultMaxQueueID bounds the I/O queue IDs a connection may name.
	DefaultMaxQueueID = 64
	// DefaultMaxQueues bounds the queues (queue pairs) a listener keeps at
	// once, connected to a controller or not: each holds receive buffers of
	// up to entries × (64 B + in-capsule data), about 1 MiB at 128 entries.
	DefaultMaxQueues = 1024
	// MaxTransfer is the largest data transfer of one command: the largest
	// buffer of an nprdma.BufferPool.
	MaxTransfer = nprdma.MaxBufferClass
)

// ListenOption configures a Listener.
type ListenOption func(*listenConfig)

type listenConfig struct {
	adminEntries int
	ioEntries    int
	icd          int
	maxQID       int
	maxQueues    int
	qpTimeout    time.Duration
	pool         *nprdma.BufferPool
	log          *slog.Logger
	busyPoll     time.Duration
}

// WithQueueEntries bounds the queue sizes accepted (admin, I/O).
func WithQueueEntries(admin, io int) ListenOption {
	return func(c *listenConfig) { c.adminEntries, c.ioEntries = admin, io }
}

// WithInCapsuleData sets the in-capsule data an I/O queue accepts, in bytes
// (a multiple of 16; advertise it with nvme.IOCCSZFor).
func WithInCapsuleData(n int) ListenOption { return func(c *listenConfig) { c.icd = n } }

// WithMaxQueueID bounds the queue IDs a connection request may name.
func WithMaxQueueID(n int) ListenOption { return func(c *listenConfig) { c.maxQID = n } }

// WithMaxQueues bounds the queues alive at once (default DefaultMaxQueues;
// 0 or less: no bound). A connection request beyond it is refused with the
// REJECT status "no resources", logged and counted.
func WithMaxQueues(n int) ListenOption { return func(c *listenConfig) { c.maxQueues = n } }

// WithControllerQPTimeout sets the queue pairs' peer-silence timeout (see
// nprdma.QPConfig.Timeout).
func WithControllerQPTimeout(d time.Duration) ListenOption {
	return func(c *listenConfig) { c.qpTimeout = d }
}

// WithDataPool makes the queues take data buffers from pool (registered in
// the listener's PD with local write) instead of a pool of the listener's.
func WithDataPool(pool *nprdma.BufferPool) ListenOption {
	return func(c *listenConfig) { c.pool = pool }
}

// WithReceiveBusyPoll makes each queue's receive loop spin for up to d for
// the next capsule before parking (nprdma.WithBusyPoll): the capsule then
// needs no wake-up of the loop, at the price of a CPU while it spins.
func WithReceiveBusyPoll(d time.Duration) ListenOption {
	return func(c *listenConfig) { c.busyPoll = d }
}

// WithListenLogger sets where refused connections are reported.
func WithListenLogger(l *slog.Logger) ListenOption { return func(c *listenConfig) { c.log = l } }

// Listener accepts NVMe-oF RDMA queues on an nprdma device: it validates
// each connection request's private data, creates the queue pair with
// receive buffers posted and accepts it.
type Listener struct {
	pd      *nprdma.PD
	ln      *nprdma.Listener
	cfg     listenConfig
	pool    *nprdma.BufferPool
	ownPool bool

	rejected atomic.Uint64
	live     atomic.Int64 // queues accepted and not torn down
}

// Listen starts accepting queues on addr with queue pairs of pd.
func Listen(pd *nprdma.PD, addr string, opts ...ListenOption) (*Listener, error) {
	cfg := listenConfig{
		adminEntries: DefaultAdminQueueEntries,
		ioEntries:    DefaultIOQueueEntries,
		icd:          DefaultInCapsuleData,
		maxQID:       DefaultMaxQueueID,
		maxQueues:    DefaultMaxQueues,
		log:          slog.Default(),
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.icd < 0 || cfg.icd%16 != 0 {
		return nil, fmt.Errorf("nvme fabric: listen on %s: in-capsule data size %d is not a non-negative multiple of 16", addr, cfg.icd)
	}
	if cfg.adminEntries < 2 || cfg.ioEntries < 2 || cfg.ioEntries > 1<<16 {
		return nil, fmt.Errorf("nvme fabric: listen on %s: queue entries %d/%d outside [2, 65536]", addr, cfg.adminEntries, cfg.ioEntries)
	}
	l := &Listener{pd: pd, cfg: cfg, pool: cfg.pool}
	if l.pool == nil {
		pool, err := nprdma.NewBufferPool(pd, nprdma.AccessLocalWrite)
		if err != nil {
			return nil, fmt.Errorf("nvme fabric: listen on %s: %w", addr, err)
		}
		l.pool, l.ownPool = pool, true
	}
	ln, err := pd.Device().Listen(addr)
	if err != nil {
		if l.ownPool {
			l.pool.Close()
		}
		return nil, fmt.Errorf("nvme fabric: listen on %s: %w", addr, err)
	}
	l.ln = ln
	return l, nil
}

// Addr is the address hosts dial.
func (l *Listener) Addr() string { return l.ln.Addr() }

// Pool is the pool the queues take data buffers from.
func (l *Listener) Pool() *nprdma.BufferPool { return l.pool }

// Rejected counts connection requests refused so far.
func (l *Listener) Rejected() uint64 { return l.rejected.Load() }

// Queues is the number of queues accepted and not yet torn down.
func (l *Listener) Queues() int { return int(l.live.Load()) }

// InCapsuleData is the in-capsule data limit of the I/O queues.
func (l *Listener) InCapsuleData() int { return l.cfg.icd }

// MaxIOQueueEntries is the largest I/O queue accepted (CAP.MQES+1).
func (l *Listener) MaxIOQueueEntries() int { return l.cfg.ioEntries }

// Close stops accepting. Queues already accepted are not affected; the
// listener's own pool is closed once they have released their buffers
// (ClosePool).
func (l *Listener) Close() error { return l.ln.Close() }

// ClosePool closes the listener's own data pool; call it after every queue
// has finished. It does nothing for a pool given with WithDataPool.
func (l *Listener) ClosePool() error {
	if !l.ownPool {
		return nil
	}
	return l.pool.Close()
}

// Accept waits for the next valid connection request and returns its queue,
// connected, with receive buffers posted. Invalid requests are refused with
// the REJECT status the binding prescribes, logged and counted; Accept
// goes on waiting. Start the queue with ControllerQueue.Start.
func (l *Listener) Accept(ctx context.Context) (*ControllerQueue, error) {
	for {
		req, err := l.ln.Accept(ctx)
		if err != nil {
			return nil, err
		}
		q, err := l.accept(req)
		if err == nil {
			return q, nil
		}
		l.rejected.Add(1)
		var rej *nvme.CMRejectError
		if errors.As(err, &rej) {
			r := nvme.CMReject{Status: rej.Status}
			req.Reject(r.Marshal())
		} // else the request was answered already: the accept itself failed
		l.cfg.log.Warn("nvme fabric: connection refused", "from", req.RemoteAddr(), "err", err)
	}
}

func (l *Listener) accept(req *nprdma.ConnRequest) (*ControllerQueue, error) {
	cm, err := nvme.ParseCMRequest(req.PrivateData())
	if err != nil {
		return nil, err
	}
	entries := int(cm.HSQSIZE) + 1
	limit, icd := l.cfg.ioEntries, l.cfg.icd
	if cm.QID == 0 {
		limit, icd = l.cfg.adminEntries, 0 // admin RECVs carry no in-capsule data
	}
	switch {
	case int(cm.QID) > l.cfg.maxQID:
		return nil, &nvme.CMRejectError{Status: nvme.CMRejectInvalidQID,
			Detail: fmt.Sprintf("queue %d beyond the limit of %d", cm.QID, l.cfg.maxQID)}
	case cm.HSQSIZE == 0 || entries > limit:
		return nil, &nvme.CMRejectError{Status: nvme.CMRejectInvalidHSQSIZE,
			Detail: fmt.Sprintf("queue %d of %d entries: the controller accepts 2 to %d", cm.QID, entries, limit)}
	case cm.HRQSIZE == 0:
		return nil, &nvme.CMRejectError{Status: nvme.CMRejectInvalidHRQSIZE,
			Detail: fmt.Sprintf("queue %d: host receive queue of 0 entries", cm.QID)}
	}
	if n := l.live.Add(1); l.cfg.maxQueues > 0 && n > int64(l.cfg.maxQueues) {
		l.live.Add(-1)
		return nil, &nvme.CMRejectError{Status: nvme.CMRejectNoResources,
			Detail: fmt.Sprintf("queue %d: %d queues connected, the limit", cm.QID, l.cfg.maxQueues)}
	}
	q, err := newControllerQueue(l, cm, entries, icd, req.RemoteAddr())
	if err != nil {
		l.live.Add(-1)
		return nil, &nvme.CMRejectError{Status: nvme.CMRejectNoResources, Detail: err.Error()}
	}
	acc := nvme.CMAccept{CRQSIZE: uint16(entries)}
	if err := req.Accept(q.qp, acc.Marshal()); err != nil {
		q.destroy()
		l.live.Add(-1)
		return nil, fmt.Errorf("nvme fabric: accept queue %d from %s: %w", cm.QID, req.RemoteAddr(), err)
	}
	return q, nil
}
