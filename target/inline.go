package target

import (
	"time"

	"github.com/nprdma/nprdma/nvme"
)

// Commands on the receive loop.
//
// Handing a command from its queue's receive loop to a worker costs a
// goroutine wake-up: 40–60 µs when the worker runs on the other vCPU of a
// small virtual machine, ~10 µs on the same one, several times what a
// resident 4 KiB read costs. So a command that can complete without waiting
// runs on the receive loop itself, with its completion sent from there: a
// Read whose pages are all resident; a Write whose data came in the capsule,
// into resident pages, cached (no FUA), when no failed queue's change may
// hold it (fence.go); and the admin commands that only read or set the
// controller's state (inlineAdmin). Whatever may wait — a fault that reads
// the backing device, a Flush, a write through, host data still to fetch, a
// held write, Connect, Authentication Send and Receive, Dataset Management —
// goes to a worker, so it never holds up the commands behind it.
//
// "Without waiting" is not guessed beforehand: the store's try-variants
// (swap.Region.TryReadAt and TryWriteAt) do the work only if no page is
// absent or busy and no lock they need is taken, and otherwise return false
// having changed nothing the worker must undo; the worker then executes the
// command from the start.

// inlineMaxTransfer bounds the data a command moves on the receive loop:
// copying it holds up the commands behind it (a 128 KiB copy takes about
// 10 µs here).
const inlineMaxTransfer = 128 << 10

// tryReader is a store that can read without waiting or say it cannot
// (swap.Region; the pinned baseline's memory).
type tryReader interface {
	TryReadAt(p []byte, off int64) bool
}

// tryWriter is a store that can write without waiting or say it cannot
// (swap.Region).
type tryWriter interface {
	TryWriteAt(p []byte, off int64) bool
}

// inCapsule is a Request that has the data that came with its command at
// hand (nvme/fabric's and nvme/tcp's): HostData would not wait for it.
type inCapsule interface {
	InCapsuleData() []byte
}

// inline executes r on the receive loop if it completes without waiting,
// and reports whether it did.
func (qc *queueConn) inline(r Request) bool {
	start := time.Now()
	name, res := qc.execute(qc.onLoop, r, true)
	if res.wait {
		return false
	}
	t := qc.t
	defer t.inflight.Done()
	if t.met != nil {
		t.met.inline.WithLabelValues(name).Inc()
	}
	if res.parked {
		return true // an AER: completed later
	}
	c := res.completion()
	if t.met != nil {
		t.met.observe(name, c.Status, time.Since(start))
	}
	r.Complete(c)
	return true
}

// inlineAdmin reports whether an admin command only reads or sets the
// controller's state under its lock, so that it runs on the receive loop.
func inlineAdmin(cmd *nvme.Command) bool {
	if cmd.IsFabrics() {
		return cmd.FabricsType() == nvme.FabricsPropertyGet
	}
	switch cmd.Opcode {
	case nvme.AdminKeepAlive, nvme.AdminGetFeatures, nvme.AdminAsyncEventRequest, nvme.AdminAbort:
		return true
	}
	return false
}

// tryWrite is a Write of blocks b of n on the receive loop (w its record):
// done if its data came in the capsule and is written back later, no failed
// queue's change may hold it and every page is resident; otherwise wait.
func (c *controller) tryWrite(w *worker, r Request, n *Namespace, b nvme.BlockIO) result {
	ic, _ := r.(inCapsule)
	tw, _ := n.store.(tryWriter)
	if ic == nil || tw == nil || c.writeThrough(b) {
		return result{wait: true}
	}
	data := ic.InCapsuleData()
	if len(data) != int(b.Blocks())*BlockSize || len(data) > inlineMaxTransfer {
		return result{wait: true}
	}
	switch ok, err := c.startChange(w, n, b.SLBA, b.SLBA+b.Blocks(), false); {
	case err != nil:
		return result{err: err}
	case !ok:
		return result{wait: true}
	}
	done := tw.TryWriteAt(data, int64(b.SLBA)*BlockSize)
	w.endChange()
	return result{wait: !done}
}

// writeThrough reports whether a write of b must be durable on return:
// FUA, or the volatile write cache disabled (Set Features 0x06).
func (c *controller) writeThrough(b nvme.BlockIO) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return b.FUA || !c.vwc
}
