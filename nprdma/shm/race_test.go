package shm

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/nprdmatest"
)

// pair is a target device serving an unpinned region and an initiator
// device, connected over one shm provider.
type pair struct {
	prov     *Provider
	srv, cli *nprdma.Device
	mr       *nprdma.MR
	ln       *nprdma.Listener
}

func newPair(t *testing.T, p *Provider, pager nprdma.Pager) *pair {
	t.Helper()
	pr := &pair{prov: p, srv: nprdma.NewDevice(p, nprdma.WithName("target")), cli: nprdma.NewDevice(p, nprdma.WithName("initiator"), nprdma.WithPinning(false))}
	t.Cleanup(func() { pr.cli.Close(); pr.srv.Close() })
	var err error
	if pr.mr, err = pr.srv.AllocPD().RegisterUnpinned(pager, nprdma.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	if pr.ln, err = pr.srv.Listen(""); err != nil {
		t.Fatal(err)
	}
	go func() {
		spd := pr.mr.PD()
		for {
			req, err := pr.ln.Accept(context.Background())
			if err != nil {
				return
			}
			qp, err := spd.NewQP(nprdma.QPConfig{SendCQ: pr.srv.NewCQ(64)})
			if err != nil {
				req.Reject(nil)
				continue
			}
			req.Accept(qp, nil)
		}
	}()
	t.Cleanup(func() { pr.ln.Close() })
	return pr
}

// reader is an initiator queue pair with a destination buffer.
type reader struct {
	qp   *nprdma.QP
	cq   *nprdma.CQ
	dst  *nprdma.MR
	buf  []byte
	next uint64
	sge  [1]nprdma.SGE
	wc   [1]nprdma.WC
}

func (pr *pair) dial(t *testing.T, n int) *reader {
	t.Helper()
	pd := pr.cli.AllocPD()
	cq := pr.cli.NewCQ(64)
	qp, err := pd.NewQP(nprdma.QPConfig{SendCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qp.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := qp.Connect(ctx, pr.ln.Addr(), nil); err != nil {
		t.Fatal(err)
	}
	buf, err := nprdma.AllocBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nprdma.FreeBuffer(buf) })
	dst, err := pd.Register(buf, nprdma.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	return &reader{qp: qp, cq: cq, dst: dst, buf: buf}
}

// read READs [off, off+n) of the region into the reader's buffer.
func (r *reader) read(mr *nprdma.MR, off, n int) ([]byte, error) {
	r.next++
	r.sge[0] = r.dst.SGE(0, n)
	if err := r.qp.PostSend(nprdma.SendWR{ID: r.next, Op: nprdma.OpRead, SG: r.sge[:],
		RemoteAddr: mr.Addr() + uint64(off), RKey: mr.RKey(), Signaled: true}); err != nil {
		return nil, err
	}
	if _, err := r.cq.Wait(context.Background(), r.wc[:]); err != nil {
		return nil, err
	}
	if r.wc[0].Status != nprdma.StatusSuccess {
		return nil, fmt.Errorf("READ completed %s", r.wc[0].Status)
	}
	return r.buf[:n], nil
}

// waitInPlace reads until a READ was executed in place (the region's share
// has arrived).
func (pr *pair) waitInPlace(t *testing.T, r *reader) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for before := pr.cli.Stats().LocalReads; pr.cli.Stats().LocalReads == before; {
		if _, err := r.read(pr.mr, 0, 8); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("no READ executed in place")
		}
	}
}

// fillVersion writes page's content at version v: every word page<<32|v.
func fillVersion(b []byte, page int, v uint32) {
	w := uint64(page)<<32 | uint64(v)
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], w)
	}
}

// TestInPlaceReadsRaceRelease races READs executed in place against an
// owner that rewrites pages (busy, then a new version) and releases them
// (absent: a hole punched in the memory file) and faults them in again,
// with a hook that holds copies between their state check and their copy
// so that releases land inside copies. Every page part a READ returns must
// be one whole version no older than the last one completed before the
// READ, or the magic page; copies that met a released page must have
// faulted and recovered (mapped reads) instead of allocating it; and at the
// end exactly the present pages hold memory in the owner's file.
func TestInPlaceReadsRaceRelease(t *testing.T) {
	for _, mode := range []InPlaceMode{InPlaceMapped, InPlacePread} {
		t.Run(mode.String(), func(t *testing.T) { raceRelease(t, mode) })
	}
}

func raceRelease(t *testing.T, mode InPlaceMode) {
	const pages, ps, readers, span = 32, 4096, 3, 4
	runFor := 2 * time.Second
	pg, err := nprdmatest.NewSharedPager(pages, ps)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	var completed [pages]atomic.Uint32
	for p := 0; p < pages; p++ {
		fillVersion(pg.Page(p), p, 1)
		completed[p].Store(1)
	}
	prov := New(WithInPlaceReads(mode))
	pr := newPair(t, prov, pg)
	rs := make([]*reader, readers)
	for i := range rs {
		rs[i] = pr.dial(t, span*ps)
		pr.waitInPlace(t, rs[i])
	}
	var holds atomic.Uint64
	beforeCopy = func(page int) {
		if page%3 == 0 {
			holds.Add(1)
			time.Sleep(20 * time.Microsecond)
		}
	}
	defer func() { beforeCopy = nil }()

	stop := make(chan struct{})
	errs := make(chan error, readers+1)
	var wg sync.WaitGroup
	var states [pages]nprdmatest.PageState // the owner's own view
	wg.Add(1)
	go func() { // the owner
		defer wg.Done()
		rng := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				return
			default:
			}
			p := rng.IntN(pages)
			switch {
			case states[p] == nprdmatest.Absent: // fault it in again
				v := completed[p].Load()
				pg.SetState(p, nprdmatest.Busy)
				fillVersion(pg.Page(p), p, v)
				pg.SetState(p, nprdmatest.Resident)
				states[p] = nprdmatest.Resident
			case rng.IntN(2) == 0: // release it
				pg.SetState(p, nprdmatest.Absent)
				states[p] = nprdmatest.Absent
			default: // a new version
				v := completed[p].Load() + 1
				pg.SetState(p, nprdmatest.Busy)
				fillVersion(pg.Page(p), p, v)
				pg.SetState(p, nprdmatest.Resident)
				completed[p].Store(v)
			}
			time.Sleep(time.Duration(rng.IntN(30)) * time.Microsecond)
		}
	}()
	var reads, magic, whole atomic.Int64
	for i, r := range rs {
		wg.Add(1)
		go func(i int, r *reader) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(3, uint64(i)))
			var floors [span]uint32
			for {
				select {
				case <-stop:
					return
				default:
				}
				k := 1 + rng.IntN(span)
				first := rng.IntN(pages - k + 1)
				for j := 0; j < k; j++ {
					floors[j] = completed[first+j].Load()
				}
				b, err := r.read(pr.mr, first*ps, k*ps)
				if err != nil {
					errs <- err
					return
				}
				reads.Add(1)
				for j := 0; j < k; j++ {
					part := b[j*ps : (j+1)*ps]
					if nprdma.FindMagicPages(part, pr.mr.Addr()+uint64((first+j)*ps), pr.mr.Addr(), ps, pr.mr.Magic()) != nil {
						magic.Add(1)
						continue
					}
					w := binary.LittleEndian.Uint64(part)
					page, v := int(w>>32), uint32(w)
					for o := 8; o < ps; o += 8 {
						if binary.LittleEndian.Uint64(part[o:]) != w {
							errs <- fmt.Errorf("page %d: torn: word %d is %#x, word 0 %#x", first+j, o/8, binary.LittleEndian.Uint64(part[o:]), w)
							return
						}
					}
					if page != first+j || v < floors[j] {
						errs <- fmt.Errorf("page %d: read page %d version %d, the last completed before the READ was %d", first+j, page, v, floors[j])
						return
					}
					whole.Add(1)
				}
			}
		}(i, r)
	}
	time.Sleep(runFor)
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := prov.Stats()
	t.Logf("%s: %d READs, %d whole pages, %d magic pages, %d copies held, %d faults recovered; in place %d READs",
		mode, reads.Load(), whole.Load(), magic.Load(), holds.Load(), st.InPlaceFaults, pr.cli.Stats().LocalReads)
	for p := 0; p < pages; p++ {
		if held := pg.Allocated(p); held != (states[p] != nprdmatest.Absent) {
			t.Fatalf("page %d (absent %v): memory in the owner's file %v", p, states[p] == nprdmatest.Absent, held)
		}
	}
	if whole.Load() == 0 || magic.Load() == 0 {
		t.Fatal("the run did not see both whole pages and magic pages")
	}
	if mode == InPlaceMapped && st.InPlaceFaults == 0 {
		t.Fatal("no copy met a released page: the race was not exercised")
	}
}
