package initiator

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/fabric"
)

// Reading through a frame table (region descriptor format 2, nvme/frames.go):
// a target on a real RDMA device keeps copies of recently read blocks in
// frames of pinned memory. Each block is read with one RDMA READ of the frame
// that holds it, found in the host's cache of the table or, failing that,
// by an RDMA READ of its bucket first; a frame is used only if it proves
// itself the block's current content (nvme.CheckFrame). The blocks no frame
// holds, and those whose frame does not prove itself, are read with NVMe
// Read, which also lets the target put them in frames for the next time.

// frameGroup is the most blocks read through frames at once: a batch of
// READs (fabric.MaxReadBatch) into one buffer of the controller's pool.
const frameGroup = fabric.MaxReadBatch

// frameHints is a host's cache of a frame table: which frame held a block
// when last read. A stale hint costs a READ that does not prove itself.
type frameHints struct {
	mu  sync.Mutex
	at  map[uint64]uint32
	max int
}

func (h *frameHints) get(b uint64) (uint32, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f, ok := h.at[b]
	return f, ok
}

func (h *frameHints) put(b uint64, f uint32) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.at == nil || len(h.at) >= h.max {
		h.at = make(map[uint64]uint32) // the table has moved on since most of them
	}
	h.at[b] = f
}

func (h *frameHints) drop(b uint64) {
	h.mu.Lock()
	delete(h.at, b)
	h.mu.Unlock()
}

// readFrames reads p at off (one transfer) through the frame table.
func (n *Namespace) readFrames(ctx context.Context, q hostQueue, rq remoteReader, rr *remoteReads, ri *regionInfo, p []byte, off int64, start time.Time) error {
	c := n.c
	d := ri.desc
	nb := len(p) / BlockSize
	first := uint64(off / BlockSize)
	c.ctr.oneSidedReads.Add(1)
	c.ctr.oneSidedPages.Add(uint64(nb))
	c.ctr.oneSidedBytes.Add(uint64(len(p)))
	fbuf, err := rr.pool.Get(min(nb, frameGroup) * int(d.FrameSize))
	if err != nil {
		return fmt.Errorf("initiator: frame buffer: %w", err)
	}
	defer fbuf.Release()
	var tbuf *nprdma.Buffer
	defer func() {
		if tbuf != nil {
			tbuf.Release()
		}
	}()
	var missed [fabric.MaxTransfer / BlockSize]bool // blocks to read two-sided
	var reads [frameGroup]fabric.RemoteRead
	for g := 0; g < nb; g += frameGroup {
		k := min(nb-g, frameGroup)
		var frames [frameGroup]uint32
		var have, lookup [frameGroup]bool
		need := 0
		for i := 0; i < k; i++ {
			if frames[i], have[i] = ri.hints.get(first + uint64(g+i)); !have[i] {
				lookup[i] = true
				need++
			}
		}
		if need > 0 {
			// Read the buckets of the blocks without a hint.
			if tbuf == nil {
				if tbuf, err = rr.pool.Get(frameGroup * nvme.FrameBucketSize); err != nil {
					return fmt.Errorf("initiator: table buffer: %w", err)
				}
			}
			r := 0
			for i := 0; i < k; i++ {
				if lookup[i] {
					bk := nvme.FrameBucket(d.Seed, first+uint64(g+i), d.Buckets)
					reads[r] = fabric.RemoteRead{Off: i * nvme.FrameBucketSize, N: nvme.FrameBucketSize, Addr: d.BucketAddress(bk), RKey: d.RKey}
					r++
				}
			}
			if err := rq.ReadRemoteBatch(ctx, tbuf, reads[:r]); err != nil {
				return err
			}
			c.ctr.frameTableReads.Add(uint64(r))
			for i := 0; i < k; i++ {
				if !lookup[i] {
					continue
				}
				bucket := tbuf.Bytes()[i*nvme.FrameBucketSize : (i+1)*nvme.FrameBucketSize]
				if f, ok := nvme.FindInBucket(bucket, first+uint64(g+i)); ok && f < d.Frames {
					frames[i], have[i] = f, true
				} else {
					missed[g+i] = true
					c.ctr.frameMisses.Add(1)
				}
			}
		}
		r := 0
		for i := 0; i < k; i++ {
			if have[i] {
				reads[r] = fabric.RemoteRead{Off: i * int(d.FrameSize), N: int(d.FrameSize), Addr: d.FrameAddress(frames[i]), RKey: d.RKey}
				r++
			}
		}
		if err := rq.ReadRemoteBatch(ctx, fbuf, reads[:r]); err != nil {
			return err
		}
		for i := 0; i < k; i++ {
			if !have[i] {
				continue
			}
			b := first + uint64(g+i)
			fr := fbuf.Bytes()[i*int(d.FrameSize) : (i+1)*int(d.FrameSize)]
			data, ok := nvme.CheckFrame(d.Seed, b, fr)
			if !ok {
				ri.hints.drop(b)
				missed[g+i] = true
				c.ctr.frameRejects.Add(1)
				continue
			}
			ri.hints.put(b, frames[i])
			copy(p[(g+i)*BlockSize:], data)
		}
	}
	suspected := 0
	for i := 0; i < nb; {
		if !missed[i] {
			i++
			continue
		}
		j := i
		for j < nb && missed[j] {
			j++
		}
		if err := n.readRun(ctx, q, p[i*BlockSize:j*BlockSize], off+int64(i*BlockSize)); err != nil {
			return err
		}
		suspected += j - i
		i = j
	}
	if suspected == 0 {
		c.ctr.readsOneSided.Add(1)
		c.observeRead(pathOneSided, time.Since(start))
		return nil
	}
	c.ctr.suspectedPages.Add(uint64(suspected))
	c.observeRead(pathFallback, time.Since(start))
	return nil
}

// readRun reads blocks no frame held with NVMe Read, into p.
func (n *Namespace) readRun(ctx context.Context, q hostQueue, p []byte, off int64) error {
	if err := n.readTwoSided(ctx, q, p, off); err != nil {
		return err
	}
	n.c.ctr.fallbackReads.Add(1)
	n.c.ctr.fallbackPages.Add(uint64(len(p) / BlockSize))
	return nil
}
