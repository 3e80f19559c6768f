package target

import (
	"context"
	"time"

	"github.com/nprdma/nprdma/nvme"
)

// The transport seam. The controller (admin commands, Connect, access
// control, namespaces, I/O) is written once against Queue and Request; a
// transport binding supplies them: the nprdma fabric (nvme/fabric, the
// NVMe-oF RDMA binding over nprdma queue pairs), NVMe/TCP (nvme/tcp), and
// later NVMe/RDMA over verbs. It plays the part of SPDK's transport ops
// table, narrowed to what a controller calls. A binding's listener is
// adapted to listener in a port_<binding>.go file, the only place that
// names the binding's types.

// Queue is one controller queue of a binding: the commands of one host
// connection (an admin queue, QID 0, or an I/O queue).
type Queue interface {
	// QID is the queue ID: 0 for the admin queue. A binding that learns it
	// from the Connect command (NVMe/TCP) knows it before the queue is
	// accepted.
	QID() uint16
	// Entries is the submission queue size the queue holds: Connect's
	// SQSIZE may not ask for more.
	Entries() int
	// RemoteAddr is the host's address, for logs.
	RemoteAddr() string
	// Lost is closed as soon as the connection to the host is lost, which
	// may be before the queue has stopped (Done): from then on the host
	// takes the queue's commands for lost (fencing, fence.go).
	Lost() <-chan struct{}
	// Done is closed once the queue has failed or been closed and its
	// receive loop has stopped: no command arrives any more.
	Done() <-chan struct{}
	// Err says why the queue stopped (nil while it runs).
	Err() error
	// Close tears the queue down: the host sees its connection go; commands
	// still executing complete into nothing. It returns once the receive
	// loop has stopped.
	Close() error
	// Wait waits until every command handed out has released its buffers
	// (after Close).
	Wait()
}

// Request is one command received on a Queue. Its methods may be called
// from any goroutine; Complete (or Fail) is called exactly once, and the
// controller keeps no reference to it afterwards (the binding reuses it).
type Request interface {
	// Command is the command (valid until Complete).
	Command() *nvme.Command
	// HostData returns the data the command moves from the host (nil when
	// it moves none), fetching it if it did not arrive with the command,
	// for at most timeout (then the error is context.DeadlineExceeded, or
	// the binding fails the queue). Valid until Complete; never called on
	// the receive loop.
	HostData(timeout time.Duration) ([]byte, error)
	// DataBuffer returns an n-byte buffer whose content Complete sends to
	// the host (for commands that return data); valid until Complete.
	DataBuffer(n int) ([]byte, error)
	// Complete sends the completion c (the binding fills its CID, SQID and
	// SQHD) and, when c is a success, the data buffer's content first.
	Complete(c nvme.Completion) error
	// Fail completes the command with the status err maps to
	// (nvme.StatusOf; a *nvme.StatusError's Result goes into DW0).
	Fail(err error) error
}

// setData copies p into r's data buffer (Request.DataBuffer).
func setData(r Request, p []byte) error {
	b, err := r.DataBuffer(len(p))
	if err != nil {
		return err
	}
	copy(b, p)
	return nil
}

// RegionExporter is the optional capability of a queue over which hosts may
// read namespaces one-sidedly: the nprdma fabric's queue pairs. A
// controller whose admin queue has it serves NP Get Region Descriptor and
// tags its queues with the access tag of its region registrations, so that
// an rkey works only on that controller's queues (docs/np-rdma.md §7).
// Other bindings answer NP Get Region Descriptor with Invalid Opcode, which
// hosts take for "two-sided reads only".
type RegionExporter interface {
	SetAccessTag(tag uint64)
}

// listener is a binding's listener, adapted for the target.
type listener interface {
	// Accept waits for the next queue. start begins its receive loop,
	// handing every command to handle on that loop (handle must not block).
	Accept(ctx context.Context) (q Queue, start func(handle func(Request)), err error)
	// Addr is the address hosts connect to.
	Addr() string
	// Close stops accepting; queues accepted are not affected.
	Close() error
}
