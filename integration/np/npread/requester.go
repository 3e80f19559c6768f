package npread

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nprdma/nprdma/nprdma"
)

// Option configures a Requester.
type Option func(*Requester)

// WithMaxRead sets the largest Read (default DefaultMaxRead): the size of
// the requester's registered buffer.
func WithMaxRead(n int) Option { return func(r *Requester) { r.maxRead = n } }

// WithBusyPoll makes the requester's completion queue spin for up to d
// before parking (nprdma.WithBusyPoll).
func WithBusyPoll(d time.Duration) Option { return func(r *Requester) { r.busyPoll = d } }

// WithDepth sets how many slow-path requests may be outstanding at once
// (default DefaultDepth; more ranges are sent in turns).
func WithDepth(n int) Option { return func(r *Requester) { r.depth = n } }

// Stats are a requester's counters. Pages are counted per page of the region
// a read touched, whole or in part.
type Stats struct {
	Reads           uint64 // Read calls that succeeded
	Pages           uint64 // pages those reads touched
	OneSidedHits    uint64 // pages the one-sided READ delivered (no magic page)
	SuspectedFaults uint64 // pages that came back as the magic page
	FalsePositives  uint64 // of those, pages whose slow-path data was the magic page too: real content
	SlowPathReads   uint64 // two-sided requests sent (one per run of adjacent suspected pages)
	MinorFaults     uint64 // pages the server resolved without device I/O
	MajorFaults     uint64 // pages the server read from its backing device
}

// ReadInfo says how one Read was served.
type ReadInfo struct {
	Pages, Suspected, FalsePositives int
	SlowPathReads                    int
	MinorFaults, MajorFaults         int
}

// Requester reads a remote unpinned region the NP-RDMA way: a one-sided READ,
// nprdma's FindMagicPages over what came back, and a two-sided slow-path
// read of just the suspected pages, whose data the server writes over the
// magic pages in the requester's buffer. It owns one queue pair and one
// registered buffer and is not safe for concurrent use: readers running in
// parallel each dial their own.
type Requester struct {
	dev      *nprdma.Device
	qp       *nprdma.QP
	cq       *nprdma.CQ
	desc     Descriptor
	maxRead  int
	depth    int
	busyPoll time.Duration

	buf     []byte // READ destination and slow-path WRITE target
	bufMR   *nprdma.MR
	respMem []byte
	respMR  *nprdma.MR
	wcs     []nprdma.WC
	reqBuf  [RequestSize]byte
	tag     uint64
	ranges  []nprdma.PageRange // of the current Read
	parts   []slowPart         // the slow path's requests, reused

	reads, pages, hits, suspected, falsePos, slow, minor, major atomic.Uint64
}

// Dial connects a requester in pd to the server listening at addr.
func Dial(ctx context.Context, pd *nprdma.PD, addr string, opts ...Option) (*Requester, error) {
	r := &Requester{dev: pd.Device(), maxRead: DefaultMaxRead, depth: DefaultDepth}
	for _, o := range opts {
		o(r)
	}
	if r.maxRead < 1 || r.maxRead > MaxReadLimit {
		return nil, fmt.Errorf("npread: requester: largest read %d outside [1, %d]", r.maxRead, MaxReadLimit)
	}
	if r.depth < 1 || r.depth > 1024 {
		return nil, fmt.Errorf("npread: requester: depth %d outside [1, 1024]", r.depth)
	}
	ok := false
	defer func() {
		if !ok {
			r.Close()
		}
	}()
	var cqOpts []nprdma.CQOption
	if r.busyPoll > 0 {
		cqOpts = append(cqOpts, nprdma.WithBusyPoll(r.busyPoll))
	}
	r.cq = r.dev.NewCQ(2*r.depth+2, cqOpts...)
	r.wcs = make([]nprdma.WC, 2*r.depth+2)
	var err error
	if r.qp, err = pd.NewQP(nprdma.QPConfig{SendCQ: r.cq, SendDepth: r.depth + 1, RecvDepth: r.depth}); err != nil {
		return nil, err
	}
	if r.buf, err = nprdma.AllocBuffer(r.maxRead); err != nil {
		return nil, err
	}
	// The server writes slow-path data straight into the buffer.
	if r.bufMR, err = pd.Register(r.buf, nprdma.AccessLocalWrite|nprdma.AccessRemoteWrite); err != nil {
		return nil, err
	}
	if r.respMem, err = nprdma.AllocBuffer(max(4096, r.depth*ResponseSize)); err != nil {
		return nil, err
	}
	if r.respMR, err = pd.Register(r.respMem, nprdma.AccessLocalWrite); err != nil {
		return nil, err
	}
	for slot := 0; slot < r.depth; slot++ {
		if err := r.postRecv(slot); err != nil {
			return nil, err
		}
	}
	pdata, err := r.qp.Connect(ctx, addr, nil)
	if err != nil {
		return nil, err
	}
	if r.desc, err = DecodeDescriptor(pdata); err != nil {
		return nil, fmt.Errorf("npread: connect to %s: %w", addr, err)
	}
	ok = true
	return r, nil
}

func (r *Requester) postRecv(slot int) error {
	return r.qp.PostRecv(nprdma.RecvWR{ID: uint64(slot), SG: []nprdma.SGE{r.respMR.SGE(slot*ResponseSize, ResponseSize)}})
}

// Descriptor is the region the requester reads, as the server described it.
func (r *Requester) Descriptor() Descriptor { return r.desc }

// Device is the requester's device (its SuspectedFaults counter moves with
// every magic page found).
func (r *Requester) Device() *nprdma.Device { return r.dev }

// Stats returns a snapshot of the requester's counters. It may be called
// from any goroutine.
func (r *Requester) Stats() Stats {
	return Stats{Reads: r.reads.Load(), Pages: r.pages.Load(), OneSidedHits: r.hits.Load(),
		SuspectedFaults: r.suspected.Load(), FalsePositives: r.falsePos.Load(), SlowPathReads: r.slow.Load(),
		MinorFaults: r.minor.Load(), MajorFaults: r.major.Load()}
}

// Close closes the queue pair and frees the buffers.
func (r *Requester) Close() error {
	var err error
	if r.qp != nil {
		err = r.qp.Close()
	}
	if r.cq != nil {
		r.cq.Close()
	}
	for _, mr := range []*nprdma.MR{r.bufMR, r.respMR} {
		if mr != nil {
			mr.Deregister()
		}
	}
	for _, b := range [][]byte{r.buf, r.respMem} {
		if b != nil {
			nprdma.FreeBuffer(b)
		}
	}
	r.qp, r.cq, r.bufMR, r.respMR, r.buf, r.respMem = nil, nil, nil, nil, nil, nil
	return err
}

// pagesTouched counts the region pages [addr, addr+n) touches.
func (r *Requester) pagesTouched(addr uint64, n int) int {
	ps := uint64(r.desc.PageSize)
	rel := addr - r.desc.Addr
	return int((rel+uint64(n)-1)/ps - rel/ps + 1)
}

// Read returns n bytes at offset off of the region: one-sided, with the
// slow path for the pages that came back as the magic page. The result is
// the requester's buffer, valid until the next call.
func (r *Requester) Read(ctx context.Context, off int64, n int) ([]byte, ReadInfo, error) {
	var info ReadInfo
	if err := r.checkRange(off, n); err != nil {
		return nil, info, err
	}
	addr := r.desc.Addr + uint64(off)
	buf, err := r.ReadOneSided(ctx, addr, r.desc.RKey, n)
	if err != nil {
		return nil, info, err
	}
	info.Pages = r.pagesTouched(addr, n)
	r.ranges = r.dev.FindMagicPages(buf, addr, r.desc.Addr, int(r.desc.PageSize), r.desc.Magic)
	for _, pr := range r.ranges {
		info.Suspected += r.pagesTouched(pr.Addr, pr.Len)
	}
	if len(r.ranges) > 0 {
		if err := r.slowPath(ctx, &info); err != nil {
			return nil, info, err
		}
		// Data still equal to the magic page after the slow path is the
		// page's real content: a false positive, correct all the same.
		for _, pr := range r.ranges {
			for _, fp := range nprdma.FindMagicPages(buf[pr.Off:pr.Off+pr.Len], pr.Addr, r.desc.Addr, int(r.desc.PageSize), r.desc.Magic) {
				info.FalsePositives += r.pagesTouched(fp.Addr, fp.Len)
			}
		}
	}
	r.reads.Add(1)
	r.pages.Add(uint64(info.Pages))
	r.hits.Add(uint64(info.Pages - info.Suspected))
	if info.Suspected > 0 { // the no-fault path touches three counters only
		r.suspected.Add(uint64(info.Suspected))
		r.falsePos.Add(uint64(info.FalsePositives))
		r.slow.Add(uint64(info.SlowPathReads))
		r.minor.Add(uint64(info.MinorFaults))
		r.major.Add(uint64(info.MajorFaults))
	}
	return buf, info, nil
}

// SlowRead reads n bytes at off two-sided only (no one-sided READ first):
// what a requester without NP-RDMA would do for every read.
func (r *Requester) SlowRead(ctx context.Context, off int64, n int) ([]byte, ReadInfo, error) {
	var info ReadInfo
	if err := r.checkRange(off, n); err != nil {
		return nil, info, err
	}
	addr := r.desc.Addr + uint64(off)
	r.ranges = append(r.ranges[:0], nprdma.PageRange{Off: 0, Addr: addr, Len: n})
	info.Pages = r.pagesTouched(addr, n)
	if err := r.slowPath(ctx, &info); err != nil {
		return nil, info, err
	}
	return r.buf[:n], info, nil
}

func (r *Requester) checkRange(off int64, n int) error {
	if r.qp == nil {
		return fmt.Errorf("npread: read: %w", nprdma.ErrClosed)
	}
	if n < 1 || n > r.maxRead {
		return fmt.Errorf("npread: read of %d bytes: outside [1, %d]", n, r.maxRead)
	}
	if off < 0 || uint64(off) > r.desc.Length || uint64(n) > r.desc.Length-uint64(off) {
		return fmt.Errorf("npread: read [%d, +%d): beyond the region's %d bytes", off, n, r.desc.Length)
	}
	return nil
}

// ReadOneSided is a plain one-sided READ of n bytes at remote address addr
// with rkey into the requester's buffer, without looking for magic pages:
// the baseline against a pinned region. The result is valid until the next
// call.
func (r *Requester) ReadOneSided(ctx context.Context, addr uint64, rkey uint32, n int) ([]byte, error) {
	if r.qp == nil {
		return nil, fmt.Errorf("npread: read: %w", nprdma.ErrClosed)
	}
	if n < 1 || n > r.maxRead {
		return nil, fmt.Errorf("npread: read of %d bytes: outside [1, %d]", n, r.maxRead)
	}
	r.tag++
	if err := r.qp.PostSend(nprdma.SendWR{ID: r.tag, Op: nprdma.OpRead, SG: []nprdma.SGE{r.bufMR.SGE(0, n)},
		RemoteAddr: addr, RKey: rkey, Signaled: true}); err != nil {
		return nil, err
	}
	for {
		k, err := r.cq.Wait(ctx, r.wcs[:1])
		if err != nil {
			return nil, r.failed("READ", err)
		}
		if k == 1 {
			wc := r.wcs[0]
			if wc.Status != nprdma.StatusSuccess {
				return nil, r.failed("READ", fmt.Errorf("completed with %s", wc.Status))
			}
			if wc.Op != nprdma.OpRead || wc.ID != r.tag {
				return nil, r.failed("READ", fmt.Errorf("unexpected completion %s id %d", wc.Op, wc.ID))
			}
			return r.buf[:n], nil
		}
	}
}

// failed names the queue pair's own error when there is one.
func (r *Requester) failed(what string, err error) error {
	if qerr := r.qp.Err(); qerr != nil {
		return fmt.Errorf("npread: %s: %w (queue pair: %w)", what, err, qerr)
	}
	return fmt.Errorf("npread: %s: %w", what, err)
}

// slowPart is one slow-path request: n bytes of the region at addr into the
// requester's buffer at off.
type slowPart struct {
	off  int
	addr uint64
	n    int
}

// slowPath asks the server for every range in r.ranges, at most depth at a
// time, and waits for all the answers. Ranges longer than the server's
// largest read are split.
func (r *Requester) slowPath(ctx context.Context, info *ReadInfo) error {
	parts := r.parts[:0]
	maxRead := int(r.desc.MaxRead)
	for _, pr := range r.ranges {
		for o := 0; o < pr.Len; o += maxRead {
			parts = append(parts, slowPart{pr.Off + o, pr.Addr + uint64(o), min(maxRead, pr.Len-o)})
		}
	}
	r.parts = parts
	firstTag := r.tag + 1
	sent, answered := 0, 0
	// A refused request stops further sending, but the answers to those
	// already sent are collected, so the next Read starts clean.
	var refused error
	for answered < sent || (refused == nil && sent < len(parts)) {
		for refused == nil && sent < len(parts) && sent-answered < r.depth {
			p := parts[sent]
			r.tag++
			q := Request{Tag: r.tag, Off: p.addr - r.desc.Addr, Len: uint32(p.n),
				DestAddr: r.bufMR.Addr() + uint64(p.off), DestRKey: r.bufMR.RKey()}
			// Inline: the request is copied at post time, so one buffer
			// serves every request.
			if err := r.qp.PostSend(nprdma.SendWR{ID: r.tag, Op: nprdma.OpSend, Inline: true,
				InlineData: AppendRequest(r.reqBuf[:0], q)}); err != nil {
				return r.failed("slow-path request", err)
			}
			sent++
			info.SlowPathReads++
		}
		k, err := r.cq.Wait(ctx, r.wcs[:sent-answered])
		if err != nil {
			return r.failed("slow path", err)
		}
		for _, wc := range r.wcs[:k] {
			if wc.Status != nprdma.StatusSuccess {
				return r.failed("slow path", fmt.Errorf("%s completed with %s", wc.Op, wc.Status))
			}
			if wc.Op != nprdma.OpRecv {
				return r.failed("slow path", fmt.Errorf("unexpected completion %s id %d", wc.Op, wc.ID))
			}
			slot := int(wc.ID)
			resp, err := DecodeResponse(r.respMem[slot*ResponseSize : slot*ResponseSize+int(wc.ByteLen)])
			if perr := r.postRecv(slot); perr != nil && err == nil {
				err = perr
			}
			if err != nil {
				return r.failed("slow-path response", err)
			}
			// Responses come in request order (one connection, served in order).
			want := firstTag + uint64(answered)
			if resp.Tag != want {
				return r.failed("slow-path response", fmt.Errorf("tag %d, want %d", resp.Tag, want))
			}
			p := parts[answered]
			answered++
			if resp.Status != StatusOK {
				if refused == nil {
					refused = fmt.Errorf("npread: slow-path read [%d, +%d): %s", p.addr-r.desc.Addr, p.n, resp.Status)
				}
				continue
			}
			if int(resp.Len) != p.n {
				return r.failed("slow-path response", fmt.Errorf("%d bytes for a %d-byte request", resp.Len, p.n))
			}
			info.MinorFaults += int(resp.MinorFaults)
			info.MajorFaults += int(resp.MajorFaults)
		}
	}
	return refused
}
