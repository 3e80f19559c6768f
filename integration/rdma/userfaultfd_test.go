package rdma

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/internal/guesttest"
	"github.com/nprdma/nprdma/lab"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/verbs"
	"github.com/nprdma/nprdma/swap"
)

// What a real NIC does with the namespace region, measured rather than
// assumed (docs/np-rdma.md §11): the region is paged by userfaultfd, and
// its evicted pages are holes the kernel must ask swap to fill.
//
//   - An on-demand-paging registration (Soft-RoCE on the 7.3 kernel) of the
//     region: READs of resident and of evicted pages return the right data
//     (the kernel's ODP fault on a userfaultfd hole waits for swap to fill
//     it), and after swap releases pages the NIC faults them again and sees
//     what was written since; but a READ racing a write of its page is not
//     ordered with it (counted: READs that returned parts of two writes).
//   - A pinned registration of the region: pinning faults every page in
//     through userfaultfd and holds them all (the whole region pinned,
//     whatever the budget);
//     after swap evicts a page and the page is written again, the NIC still
//     reads the old physical page: the NIC and the CPU disagree.
//
// TestGuestRegistrationsMeetUserfaultfd runs TestInGuestRegistrations in a
// 7.3 guest over Soft-RoCE; each check also records what it saw in
// $NPRDMA_REPORT for the docs.

func TestGuestRegistrationsMeetUserfaultfd(t *testing.T) {
	t.Parallel()
	lab.RequireKernel(t, "7.3")
	bin := guesttest.TestBinary(t, "./integration/rdma")
	res := lab.RunT(t, lab.Spec{
		Kernel:  "7.3",
		Modules: []string{"rdma_rxe", "rdma_ucm"},
		Env:     map[string]string{"BIN": bin},
		Script: `step rxe
rxe_up
ibv_devinfo -v -d rxe0 | grep -q ODP_SUPPORT
cp "$BIN" /dev/shm/rdma.test
step test
cd /dev/shm
NPRDMA_VERBS_ADDR=10.0.2.15 NPRDMA_REPORT="$LAB_OUT/report" ./rdma.test -test.v -test.run '^TestInGuestRegistrations$' -test.timeout 3m
`,
	})
	report, _ := os.ReadFile(filepath.Join(res.Dir, "report"))
	t.Logf("report:\n%s", report)
	if !strings.Contains(res.Output, "--- PASS: TestInGuestRegistrations") {
		t.Fatalf("no PASS from the test in the guest:\n%s", res.Output)
	}
}

func report(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Logf(format, args...)
	if p := os.Getenv("NPRDMA_REPORT"); p != "" {
		f, err := os.OpenFile(p, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			fmt.Fprintln(f, strings.TrimSpace(fmt.Sprintf(format, args...)))
			f.Close()
		}
	}
}

func TestInGuestRegistrations(t *testing.T) {
	addr := os.Getenv("NPRDMA_VERBS_ADDR")
	if addr == "" {
		t.Skip("NPRDMA_VERBS_ADDR is not set: run by TestGuestRegistrationsMeetUserfaultfd")
	}
	dev, err := verbs.OpenDevice("")
	if errors.Is(err, verbs.ErrUnavailable) {
		t.Skipf("no RDMA: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	t.Run("OnDemand", func(t *testing.T) { testOnDemandRegion(t, dev, addr) })
	t.Run("Pinned", func(t *testing.T) { testPinnedRegion(t, dev, addr) })
}

const regionPages = 64

// newRegion is a userfaultfd-paged region of 64 pages whose pages hold
// page-numbered content, written and flushed through a budget of 16, so
// that most of them are evicted: absent, holes userfaultfd fills.
func newRegion(t *testing.T, gen byte) *swap.Region {
	t.Helper()
	path := filepath.Join(t.TempDir(), "backing")
	if err := blockdev.Create(path, regionPages*swap.PageSize); err != nil {
		t.Fatal(err)
	}
	bd, err := blockdev.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	r, err := swap.New(bd, swap.WithBudget(16*swap.PageSize))
	if err != nil {
		bd.Close()
		t.Fatalf("a userfaultfd region: %v", err)
	}
	t.Cleanup(func() {
		r.Close()
		bd.Close()
	})
	for p := 0; p < regionPages; p++ {
		if _, err := r.WriteAt(pageContent(p, gen), int64(p)*swap.PageSize); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	return r
}

func pageContent(p int, gen byte) []byte {
	b := bytes.Repeat([]byte{gen, byte(p)}, swap.PageSize/2)
	return b
}

// pages returns a present and an absent page of r.
func pages(t *testing.T, r *swap.Region) (present, absent int) {
	t.Helper()
	present, absent = -1, -1
	states := r.States()
	for p := range states {
		s := atomic.LoadUint64(&states[p])
		switch {
		case s&swap.StatePresent != 0 && present < 0:
			present = p
		case s&swap.StatePresent == 0 && absent < 0:
			absent = p
		}
	}
	if present < 0 || absent < 0 {
		t.Fatalf("region with no present (%d) or no absent (%d) page", present, absent)
	}
	return present, absent
}

func resident(r *swap.Region) int {
	n := 0
	for i := range r.States() {
		if atomic.LoadUint64(&r.States()[i])&swap.StatePresent != 0 {
			n++
		}
	}
	return n
}

// pair connects a reader's queue pair to a queue pair of srv's PD.
type pair struct {
	cq       *nprdma.CQ
	qp, peer *nprdma.QP
	buf      []byte
	mr       *nprdma.MR
}

func connectPair(t *testing.T, dev *nprdma.Device, srvPD *nprdma.PD, addr string) *pair {
	t.Helper()
	ln, err := dev.Listen(net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	scq := dev.NewCQ(16)
	peer, err := srvPD.NewQP(nprdma.QPConfig{SendCQ: scq})
	if err != nil {
		t.Fatal(err)
	}
	pd := dev.AllocPD()
	cq := dev.NewCQ(16)
	qp, err := pd.NewQP(nprdma.QPConfig{SendCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		r, err := ln.Accept(ctx)
		if err == nil {
			err = r.Accept(peer, nil)
		}
		errc <- err
	}()
	if _, err := qp.Connect(ctx, ln.Addr(), nil); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	p := &pair{cq: cq, qp: qp, peer: peer}
	if p.buf, err = nprdma.AllocBuffer(swap.PageSize); err != nil {
		t.Fatal(err)
	}
	if p.mr, err = pd.Register(p.buf, nprdma.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		qp.Close()
		peer.Close()
		p.mr.Deregister()
		nprdma.FreeBuffer(p.buf)
		cq.Close()
		scq.Close()
		pd.Close()
	})
	return p
}

// read READs page p of the remote region: the completion's status, and
// how long it took.
func (p *pair) read(t *testing.T, mr *nprdma.MR, page int) (nprdma.Status, time.Duration) {
	t.Helper()
	start := time.Now()
	if err := p.qp.PostSend(nprdma.SendWR{ID: uint64(page), Op: nprdma.OpRead, SG: []nprdma.SGE{p.mr.SGE(0, swap.PageSize)},
		RemoteAddr: mr.Addr() + uint64(page)*swap.PageSize, RKey: mr.RKey(), Signaled: true}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wc [1]nprdma.WC
	if _, err := p.cq.Wait(ctx, wc[:]); err != nil {
		t.Fatalf("READ of page %d: no completion: %v", page, err)
	}
	return wc[0].Status, time.Since(start)
}

func testOnDemandRegion(t *testing.T, dev *nprdma.Device, addr string) {
	if !dev.Caps().OnDemand {
		t.Skip("the device has no on-demand paging (the 7.3 kernel's Soft-RoCE has)")
	}
	r := newRegion(t, 1)
	present, absent := pages(t, r)
	pd := dev.AllocPD()
	mr, err := pd.Register(r.Bytes(), nprdma.AccessRemoteRead|nprdma.AccessOnDemand)
	if err != nil {
		t.Fatalf("register the region on demand: %v", err)
	}
	defer mr.Deregister()
	p := connectPair(t, dev, pd, addr)
	report(t, "odp: registered %d pages on demand, %d resident", regionPages, resident(r))

	st, took := p.read(t, mr, present)
	report(t, "odp: READ of resident page %d: %s in %v, data right: %v", present, st, took.Round(time.Microsecond), bytes.Equal(p.buf, pageContent(present, 1)))
	if st != nprdma.StatusSuccess || !bytes.Equal(p.buf, pageContent(present, 1)) {
		t.Fatalf("READ of a resident page through ODP: %s", st)
	}
	clear(p.buf)
	st, took = p.read(t, mr, absent)
	right := bytes.Equal(p.buf, pageContent(absent, 1))
	nowPresent := atomic.LoadUint64(&r.States()[absent])&swap.StatePresent != 0
	report(t, "odp: READ of evicted page %d: %s after %v, data right: %v; queue pair %s; the page is present now: %v (swap served the NIC's fault through userfaultfd)",
		absent, st, took.Round(time.Microsecond), right, p.qp.State(), nowPresent)
	if st != nprdma.StatusSuccess || !right || !nowPresent {
		t.Fatalf("READ of an evicted page through ODP: %s, data right %v, faulted in %v; docs/np-rdma.md says it succeeds on this kernel", st, right, nowPresent)
	}

	// Every page written again through the budget: swap releases pages the
	// NIC had mapped, and the MMU notifier makes the NIC fault them again.
	for pg := 0; pg < regionPages; pg++ {
		if _, err := r.WriteAt(pageContent(pg, 2), int64(pg)*swap.PageSize); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	fresh, stale := 0, 0
	for pg := 0; pg < regionPages; pg++ {
		if st, _ := p.read(t, mr, pg); st != nprdma.StatusSuccess {
			t.Fatalf("READ of page %d after the rewrite: %s", pg, st)
		}
		switch {
		case bytes.Equal(p.buf, pageContent(pg, 2)):
			fresh++
		case bytes.Equal(p.buf, pageContent(pg, 1)):
			stale++
		}
	}
	report(t, "odp: after every page was written again: %d of %d READs returned the new content, %d the old", fresh, regionPages, stale)
	if fresh != regionPages {
		t.Fatalf("ODP READs after a rewrite: %d fresh of %d", fresh, regionPages)
	}

	// READs racing writes of one page: nothing orders the NIC's copy with
	// swap's, so a READ may return part of each.
	const racePage = 5
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for gen := byte(3); ; gen++ {
			select {
			case <-stop:
				return
			default:
			}
			r.WriteAt(pageContent(racePage, gen), racePage*swap.PageSize)
		}
	}()
	reads, torn := 0, 0
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); reads++ {
		if st, _ := p.read(t, mr, racePage); st != nprdma.StatusSuccess {
			t.Fatalf("racing READ: %s", st)
		}
		first := p.buf[0]
		for i := 0; i < len(p.buf); i += 2 {
			if p.buf[i] != first || p.buf[i+1] != racePage {
				torn++
				break
			}
		}
	}
	close(stop)
	<-done
	report(t, "odp: %d READs racing writes of page %d: %d returned parts of two writes", reads, racePage, torn)
}

func testPinnedRegion(t *testing.T, dev *nprdma.Device, addr string) {
	r := newRegion(t, 1)
	_, absent := pages(t, r)
	before, pinBefore := resident(r), vmPin(t)
	pd := dev.AllocPD()
	start := time.Now()
	mr, err := pd.Register(r.Bytes(), nprdma.AccessRemoteRead)
	took := time.Since(start)
	if err != nil {
		report(t, "pinned: registering the region failed after %v: %v", took.Round(time.Microsecond), err)
		t.Fatalf("a pinned registration of the region: %v", err)
	}
	defer mr.Deregister()
	pinned := vmPin(t) - pinBefore
	report(t, "pinned: registration took %v and pinned %d KiB, the whole region (%d pages, budget 16); swap's resident pages: %d before, %d after",
		took.Round(time.Microsecond), pinned>>10, regionPages, before, resident(r))
	if pinned < regionPages*swap.PageSize {
		t.Fatalf("the registration pinned %d bytes, less than the region's %d", pinned, regionPages*swap.PageSize)
	}
	p := connectPair(t, dev, pd, addr)
	if st, _ := p.read(t, mr, absent); st != nprdma.StatusSuccess || !bytes.Equal(p.buf, pageContent(absent, 1)) {
		t.Fatalf("READ of a page the registration faulted in: %s", st)
	}
	// Write every page again, through the budget: swap evicts pages the
	// registration holds, and installs the new content in new ones.
	for pg := 0; pg < regionPages; pg++ {
		if _, err := r.WriteAt(pageContent(pg, 2), int64(pg)*swap.PageSize); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	stale, fresh := 0, 0
	for pg := 0; pg < regionPages; pg++ {
		st, _ := p.read(t, mr, pg)
		if st != nprdma.StatusSuccess {
			t.Fatalf("READ of page %d: %s", pg, st)
		}
		switch {
		case bytes.Equal(p.buf, pageContent(pg, 2)):
			fresh++
		case bytes.Equal(p.buf, pageContent(pg, 1)):
			stale++
		default:
			t.Fatalf("page %d: neither the old nor the new content", pg)
		}
	}
	report(t, "pinned: after every page was written again: %d of %d READs returned the new content, %d the old (the NIC kept pages swap had released)",
		fresh, regionPages, stale)
	if stale == 0 {
		t.Fatal("no stale page: swap released no page the registration held")
	}
}

// vmPin is the process's pinned memory (VmPin of /proc/self/status), bytes.
func vmPin(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	return vmPinOf(t, b)
}
