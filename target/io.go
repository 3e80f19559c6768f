package target

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/swap"
)

// hostDataTimeout bounds the RDMA READ of a command's data.
const hostDataTimeout = 30 * time.Second

// io executes an I/O command on worker w. Commands that change a namespace
// do it between w's beginChange and endChange (fence.go). On the receive
// loop (inline, w the loop's record) it completes a Read or a Write only if
// neither waits (inline.go), and returns wait for the rest with nothing
// changed.
func (c *controller) io(w *worker, r Request, inline bool) result {
	cmd := r.Command()
	if cmd.IsFabrics() {
		return result{err: nvme.InvalidOpcode(cmd, false)}
	}
	if inline && cmd.Opcode != nvme.IORead && cmd.Opcode != nvme.IOWrite {
		return result{wait: true}
	}
	if cmd.Opcode == nvme.IOFlush && cmd.NSID == nvme.BroadcastNSID {
		all := c.sub.acquireAll()
		defer func() {
			for _, n := range all {
				n.users.Done()
			}
		}()
		for _, n := range all {
			if err := n.store.Flush(); err != nil {
				return result{err: c.mediaError(n, "flush", err, nvme.StatusWriteFault)}
			}
		}
		return result{}
	}
	n := c.sub.acquire(cmd.NSID)
	if n != nil {
		defer n.users.Done()
	}
	if n == nil {
		switch cmd.Opcode {
		case nvme.IOFlush, nvme.IOWrite, nvme.IORead, nvme.IOWriteZeroes, nvme.IODatasetManagement, nvme.IONPAdvise:
			return result{err: nvme.Errorf(nvme.StatusInvalidNamespaceOrFormat.WithDNR(), "namespace %d not active", cmd.NSID)}
		}
		return result{err: nvme.InvalidOpcode(cmd, false)}
	}
	maxT := uint64(c.t.cfg.maxTransfer)
	switch cmd.Opcode {
	case nvme.IORead:
		b, err := cmd.CheckReadWrite(n.Blocks(), BlockSize, maxT)
		if err != nil {
			return result{err: err}
		}
		length := int(b.Blocks()) * BlockSize
		tr, _ := n.store.(tryReader)
		if inline && (tr == nil || length > inlineMaxTransfer) {
			return result{wait: true}
		}
		buf, err := r.DataBuffer(length)
		if err != nil {
			return result{err: err}
		}
		if inline {
			// Every page resident: no fault to report.
			return result{wait: !tr.TryReadAt(buf, int64(b.SLBA)*BlockSize)}
		}
		report := faultReport(n.region, int(b.SLBA), int(b.Blocks()))
		read := n.store.ReadAt
		if ms, ok := n.store.(*mirroredStore); ok && c.frameReader.Load() {
			read = ms.readInstalling
		}
		if _, err := read(buf, int64(b.SLBA)*BlockSize); err != nil {
			return result{err: c.mediaError(n, "read", err, nvme.StatusUnrecoveredReadError)}
		}
		return result{dw0: report}
	case nvme.IOWrite:
		b, err := cmd.CheckReadWrite(n.Blocks(), BlockSize, maxT)
		if err != nil {
			return result{err: err}
		}
		if inline {
			return c.tryWrite(w, r, n, b)
		}
		data, err := r.HostData(hostDataTimeout)
		if err != nil {
			return result{err: err}
		}
		off := int64(b.SLBA) * BlockSize
		if err := c.beginChange(w, n, b.SLBA, b.SLBA+b.Blocks()); err != nil {
			return result{err: err}
		}
		if c.writeThrough(b) {
			_, err = n.store.WriteAtFUA(data, off)
		} else {
			_, err = n.store.WriteAt(data, off)
		}
		w.endChange()
		if err != nil {
			return result{err: c.mediaError(n, "write", err, nvme.StatusWriteFault)}
		}
		return result{}
	case nvme.IOFlush:
		if err := n.store.Flush(); err != nil {
			return result{err: c.mediaError(n, "flush", err, nvme.StatusWriteFault)}
		}
		return result{}
	case nvme.IOWriteZeroes:
		b := cmd.BlockIO()
		if err := b.CheckRange(n.Blocks()); err != nil {
			return result{err: err}
		}
		if err := c.beginChange(w, n, b.SLBA, b.SLBA+b.Blocks()); err != nil {
			return result{err: err}
		}
		err := n.store.WriteZeroes(int64(b.SLBA)*BlockSize, int64(b.Blocks())*BlockSize)
		w.endChange()
		if err != nil {
			return result{err: c.mediaError(n, "write zeroes", err, nvme.StatusWriteFault)}
		}
		if b.FUA {
			if err := n.store.Flush(); err != nil {
				return result{err: c.mediaError(n, "write zeroes (FUA)", err, nvme.StatusWriteFault)}
			}
		}
		return result{}
	case nvme.IODatasetManagement:
		p := cmd.DatasetManagement()
		// The data may be longer than the ranges: Linux sends its whole
		// 4 KiB range buffer (256 ranges) whatever NR says, and nvmet
		// accepts an SGL at least as long as the ranges.
		if n := uint64(cmd.DPTR.Length()); n < p.DataLength() {
			return result{err: nvme.Errorf(nvme.StatusDataSGLLengthInvalid.WithDNR(), "SGL describes %d bytes, %d ranges need %d", n, p.Ranges(), p.DataLength())}
		} else if n > maxT {
			return result{err: nvme.Errorf(nvme.StatusInvalidField.WithDNR(), "transfer of %d bytes exceeds the controller's limit of %d", n, maxT)}
		}
		data, err := r.HostData(hostDataTimeout)
		if err != nil {
			return result{err: err}
		}
		ranges, err := nvme.ParseDSMRanges(data, p.Ranges())
		if err != nil {
			return result{err: err}
		}
		for _, rg := range ranges {
			if err := rg.CheckRange(n.Blocks()); err != nil {
				return result{err: err}
			}
		}
		if p.Attributes&nvme.DSMDeallocate == 0 {
			return result{} // hints only
		}
		// Fenced as one change of the blocks that all ranges span.
		lo, hi := uint64(1<<64-1), uint64(0)
		for _, rg := range ranges {
			if rg.Blocks > 0 {
				lo, hi = min(lo, rg.SLBA), max(hi, rg.SLBA+uint64(rg.Blocks))
			}
		}
		if lo >= hi {
			return result{}
		}
		if err := c.beginChange(w, n, lo, hi); err != nil {
			return result{err: err}
		}
		defer w.endChange()
		for _, rg := range ranges {
			if rg.Blocks == 0 {
				continue
			}
			if err := n.store.Trim(int64(rg.SLBA)*BlockSize, int64(rg.Blocks)*BlockSize); err != nil {
				return result{err: c.mediaError(n, "deallocate", err, nvme.StatusWriteFault)}
			}
		}
		return result{}
	case nvme.IONPAdvise:
		b := cmd.BlockIO()
		if err := b.CheckRange(n.Blocks()); err != nil {
			return result{err: err}
		}
		if err := n.store.Advise(int64(b.SLBA)*BlockSize, int64(b.Blocks())*BlockSize); err != nil {
			return result{err: nvme.Errorf(nvme.StatusInternalError, "advise: %w", err)}
		}
		return result{}
	}
	return result{err: nvme.InvalidOpcode(cmd, false)}
}

// faultReport counts the pages of [page, page+n) that are not resident as
// the Read arrives, as the faults it will resolve: minor (known zero) in
// bits 15:0 of the completion's DW0, major in bits 31:16, each saturating.
// Read's DW0 is reserved in the NVM command set; stock hosts ignore it, the
// nprdma initiator counts it. A page inside a hole of a backing file that
// was never written counts as major here though swap resolves it as minor.
func faultReport(r *swap.Region, page, n int) uint32 {
	if r == nil {
		return 0 // the pinned baseline: no faults
	}
	states := r.States()
	var minor, major uint32
	for i := page; i < page+n && i < len(states); i++ {
		s := atomic.LoadUint64(&states[i])
		switch {
		case s&swap.StatePresent != 0:
		case s&swap.StateZero != 0:
			minor = min(minor+1, 0xffff)
		default:
			major = min(major+1, 0xffff)
		}
	}
	return minor | major<<16
}

// mediaError maps a region error to a status: failures of the backing
// device are media errors (SCT 2, the code given), running out of memory
// and closed regions are internal errors. Every one is logged: the host
// only sees the status.
func (c *controller) mediaError(n *Namespace, op string, err error, media nvme.Status) error {
	c.t.log.Error("target: namespace I/O failed", "op", op, "subsystem", c.sub.nqn, "nsid", n.nsid, "cntlid", c.id, "err", err)
	if errors.Is(err, swap.ErrNoMemory) || errors.Is(err, swap.ErrClosed) {
		return nvme.Errorf(nvme.StatusInternalError, "%s on namespace %d: %w", op, n.nsid, err)
	}
	return nvme.Errorf(media, "%s on namespace %d: %w", op, n.nsid, err)
}
