package npread_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nprdma/nprdma/integration/np/npread"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nprdma/nprdmatest"
	"github.com/nprdma/nprdma/nprdma/tcp"
)

const ps = 4096

// pagerBackend serves the slow path from a test pager's memory: an absent
// page is "faulted in" (made resident) and counted, as swap would.
type pagerBackend struct {
	pg      *nprdmatest.Pager
	mu      sync.Mutex
	absent  map[int]bool
	faults  uint64
	failAt  int64 // a read covering this offset fails (-1: none)
	readErr error
}

func (b *pagerBackend) ReadAt(p []byte, off int64) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failAt >= 0 && off <= b.failAt && b.failAt < off+int64(len(p)) {
		return 0, b.readErr
	}
	for pg := int(off / ps); pg <= int((off+int64(len(p))-1)/ps); pg++ {
		if b.absent[pg] {
			delete(b.absent, pg)
			b.pg.SetState(pg, nprdmatest.Resident)
			b.faults++
		}
	}
	return copy(p, b.pg.Bytes()[off:]), nil
}

func (b *pagerBackend) counts() (uint64, uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return 0, b.faults
}

type fixture struct {
	pg      *nprdmatest.Pager
	backend *pagerBackend
	mr      *nprdma.MR
	srv     *npread.Server
	addr    string
	cliPD   *nprdma.PD
}

func newFixture(t *testing.T, prov nprdma.Provider, listen string, pages int, opts ...npread.ServerOption) *fixture {
	t.Helper()
	pg, err := nprdmatest.NewPager(pages, ps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	rand.Read(pg.Bytes())
	f := &fixture{pg: pg, backend: &pagerBackend{pg: pg, absent: map[int]bool{}, failAt: -1}}
	srvDev, cliDev := nprdma.NewDevice(prov), nprdma.NewDevice(prov)
	t.Cleanup(func() { cliDev.Close(); srvDev.Close() })
	if f.mr, err = srvDev.AllocPD().RegisterUnpinned(pg, nprdma.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	opts = append([]npread.ServerOption{npread.WithFaultCounts(f.backend.counts)}, opts...)
	if f.srv, err = npread.NewServer(f.mr, f.backend, opts...); err != nil {
		t.Fatal(err)
	}
	ln, err := srvDev.Listen(listen)
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		ln.Close()
		f.srv.Close()
	})
	f.cliPD = cliDev.AllocPD()
	return f
}

func (f *fixture) absent(pages ...int) {
	f.backend.mu.Lock()
	defer f.backend.mu.Unlock()
	for _, pg := range pages {
		f.pg.SetState(pg, nprdmatest.Absent)
		f.backend.absent[pg] = true
	}
}

func (f *fixture) dial(t *testing.T, opts ...npread.Option) *npread.Requester {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rq, err := npread.Dial(ctx, f.cliPD, f.addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rq.Close() })
	return rq
}

var providers = []struct {
	name   string
	new    func() nprdma.Provider
	listen string
}{
	{"loop", func() nprdma.Provider { return loop.New() }, ""},
	{"tcp", func() nprdma.Provider { return tcp.New() }, "127.0.0.1:0"},
}

func TestDescriptorMatchesRegion(t *testing.T) {
	f := newFixture(t, loop.New(), "", 8, npread.WithServerMaxRead(64<<10))
	rq := f.dial(t)
	want := npread.Descriptor{Addr: f.mr.Addr(), Length: 8 * ps, RKey: f.mr.RKey(), PageSize: ps, Magic: f.mr.Magic(), MaxRead: 64 << 10}
	if got := rq.Descriptor(); got != want {
		t.Fatalf("descriptor %+v, want %+v", got, want)
	}
}

// TestReadSplitsLongRunsAndPipelines: a run of absent pages longer than the
// server's largest read is fetched in several requests, more than the
// requester's depth of them, and every byte comes back right.
func TestReadSplitsLongRunsAndPipelines(t *testing.T) {
	for _, p := range providers {
		t.Run(p.name, func(t *testing.T) {
			const pages = 64
			f := newFixture(t, p.new(), p.listen, pages, npread.WithServerMaxRead(2*ps))
			rq := f.dial(t, npread.WithMaxRead(pages*ps), npread.WithDepth(3))
			var absent []int
			for pg := 4; pg < 40; pg++ { // 36 pages: 18 requests of 2 pages
				absent = append(absent, pg)
			}
			absent = append(absent, 50) // and one more run
			f.absent(absent...)
			got, info, err := rq.Read(context.Background(), ps+7, 60*ps)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, f.pg.Bytes()[ps+7:61*ps+7]) {
				t.Fatal("wrong bytes")
			}
			want := npread.ReadInfo{Pages: 61, Suspected: 37, SlowPathReads: 19, MajorFaults: 37}
			if info != want {
				t.Fatalf("info %+v, want %+v", info, want)
			}
		})
	}
}

func TestSlowRead(t *testing.T) {
	f := newFixture(t, loop.New(), "", 8)
	rq := f.dial(t)
	got, info, err := rq.SlowRead(context.Background(), 100, 3*ps)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, f.pg.Bytes()[100:100+3*ps]) {
		t.Fatal("wrong bytes")
	}
	if info.SlowPathReads != 1 || info.Pages != 4 {
		t.Fatalf("info %+v", info)
	}
	if f.srv.Stats().Requests != 1 {
		t.Fatalf("server stats %+v", f.srv.Stats())
	}
}

// TestBackendErrorIsReportedAndTheRequesterRecovers: a failing backend read
// is answered StatusReadError; the requester returns an error naming it,
// collects the answers to the requests it already sent, and its next Read
// works.
func TestBackendErrorIsReportedAndTheRequesterRecovers(t *testing.T) {
	for _, p := range providers {
		t.Run(p.name, func(t *testing.T) {
			f := newFixture(t, p.new(), p.listen, 16)
			rq := f.dial(t)
			f.absent(2, 4, 6, 8)
			f.backend.failAt, f.backend.readErr = 4*ps+10, errors.New("injected")
			_, _, err := rq.Read(context.Background(), 0, 10*ps)
			if err == nil || !strings.Contains(err.Error(), "read error") {
				t.Fatalf("error %v, want a slow-path read error", err)
			}
			if st := f.srv.Stats(); st.Errors != 1 || st.Requests != 4 {
				t.Fatalf("server stats %+v, want 4 requests, 1 error", st)
			}
			f.backend.failAt = -1
			got, info, err := rq.Read(context.Background(), 0, 10*ps)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, f.pg.Bytes()[:10*ps]) || info.Suspected != 1 {
				t.Fatalf("after recovery: info %+v (page 4 still absent)", info)
			}
		})
	}
}

func TestReadArgumentsChecked(t *testing.T) {
	f := newFixture(t, loop.New(), "", 8)
	rq := f.dial(t, npread.WithMaxRead(2*ps))
	for _, tc := range []struct {
		off int64
		n   int
	}{{0, 0}, {0, 2*ps + 1}, {-1, 8}, {8*ps - 4, 8}, {8 * ps, 1}} {
		if _, _, err := rq.Read(context.Background(), tc.off, tc.n); err == nil {
			t.Errorf("Read(%d, %d) succeeded", tc.off, tc.n)
		}
	}
	rq.Close()
	if _, _, err := rq.Read(context.Background(), 0, 8); !errors.Is(err, nprdma.ErrClosed) {
		t.Fatalf("read after Close: %v", err)
	}
}

// rawClient sends hand-made requests to a server and returns its answers.
type rawClient struct {
	qp      *nprdma.QP
	cq      *nprdma.CQ
	mr      *nprdma.MR
	mem     []byte
	wcs     []nprdma.WC
	recvOff int
}

func dialRaw(t *testing.T, f *fixture) *rawClient {
	t.Helper()
	c := &rawClient{wcs: make([]nprdma.WC, 4)}
	dev := f.cliPD.Device()
	c.cq = dev.NewCQ(64)
	var err error
	if c.qp, err = f.cliPD.NewQP(nprdma.QPConfig{SendCQ: c.cq}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.qp.Close(); c.cq.Close() })
	if c.mem, err = nprdma.AllocBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	if c.mr, err = f.cliPD.Register(c.mem, nprdma.AccessLocalWrite|nprdma.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.mr.Deregister(); nprdma.FreeBuffer(c.mem) })
	for i := 0; i < 8; i++ {
		if err := c.qp.PostRecv(nprdma.RecvWR{ID: uint64(i), SG: []nprdma.SGE{c.mr.SGE(32<<10+i*64, 64)}}); err != nil {
			t.Fatal(err)
		}
	}
	pdata, err := c.qp.Connect(context.Background(), f.addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := npread.DecodeDescriptor(pdata); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *rawClient) exchange(t *testing.T, msg []byte) (npread.Response, error) {
	t.Helper()
	if err := c.qp.PostSend(nprdma.SendWR{Op: nprdma.OpSend, Inline: true, InlineData: msg}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.cq.Wait(ctx, c.wcs[:1]); err != nil {
		return npread.Response{}, err
	}
	wc := c.wcs[0]
	if wc.Status != nprdma.StatusSuccess {
		return npread.Response{}, errors.New(wc.Status.String())
	}
	off := 32<<10 + int(wc.ID)*64
	return npread.DecodeResponse(c.mem[off : off+int(wc.ByteLen)])
}

// TestServerRefusesBadRequests: requests outside the region or longer than
// the largest read get an error status and no data; a request that is not
// one (bad encoding) costs the peer its connection.
func TestServerRefusesBadRequests(t *testing.T) {
	for _, p := range providers {
		t.Run(p.name, func(t *testing.T) {
			f := newFixture(t, p.new(), p.listen, 8, npread.WithServerMaxRead(2*ps))
			c := dialRaw(t, f)
			req := func(tag, off uint64, n uint32) []byte {
				return npread.AppendRequest(nil, npread.Request{Tag: tag, Off: off, Len: n, DestAddr: c.mr.Addr(), DestRKey: c.mr.RKey()})
			}
			for _, tc := range []struct {
				name string
				msg  []byte
				want npread.Status
			}{
				{"in range", req(1, 3*ps, ps), npread.StatusOK},
				{"beyond the end", req(2, 7*ps, 2*ps), npread.StatusOutOfRange},
				{"offset overflows", req(3, ^uint64(0)-10, ps), npread.StatusOutOfRange},
				{"longer than the largest read", req(4, 0, 2*ps+1), npread.StatusInvalid},
			} {
				clear(c.mem[:4*ps])
				resp, err := c.exchange(t, tc.msg)
				if err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				if resp.Status != tc.want {
					t.Fatalf("%s: status %s, want %s", tc.name, resp.Status, tc.want)
				}
				wantData := make([]byte, 4*ps)
				if tc.want == npread.StatusOK {
					copy(wantData, f.pg.Bytes()[3*ps:4*ps])
				}
				if !bytes.Equal(c.mem[:4*ps], wantData) {
					t.Fatalf("%s: destination memory holds the wrong bytes", tc.name)
				}
			}
			bad := req(5, 0, ps)
			bad[0] = 9
			if _, err := c.exchange(t, bad); err == nil {
				t.Fatal("a malformed request was answered")
			}
			select {
			case <-c.qp.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the connection survived a malformed request")
			}
			if st := f.srv.Stats(); st.Dropped != 1 || st.Errors != 3 || st.Requests != 4 {
				t.Fatalf("server stats %+v", st)
			}
		})
	}
}

// TestCloseEndsConnections: Close of the server breaks every connection
// (requesters see their queue pair fail) and returns once their goroutines
// are gone.
func TestCloseEndsConnections(t *testing.T) {
	f := newFixture(t, tcp.New(), "127.0.0.1:0", 8)
	rqs := []*npread.Requester{f.dial(t), f.dial(t)}
	if err := f.srv.Close(); err != nil {
		t.Fatal(err)
	}
	for _, rq := range rqs {
		if _, _, err := rq.Read(context.Background(), 0, ps); err == nil {
			t.Fatal("read succeeded after the server closed")
		}
	}
}

func TestNewServerRefusesPinnedRegion(t *testing.T) {
	dev := nprdma.NewDevice(loop.New(), nprdma.WithPinning(false))
	defer dev.Close()
	mem, err := nprdma.AllocBuffer(ps)
	if err != nil {
		t.Fatal(err)
	}
	defer nprdma.FreeBuffer(mem)
	mr, err := dev.AllocPD().Register(mem, nprdma.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := npread.NewServer(mr, nil); err == nil || !strings.Contains(err.Error(), "not an unpinned region") {
		t.Fatalf("NewServer over a pinned region: %v", err)
	}
}

// TestSlowPathAllocatesNothing: a slow-path read, request to response,
// allocates nothing in the steady state on either provider (counted over
// every goroutine, the server's included). Allocations there cost the slow
// path about 1 µs on loop (docs/npbench.md §5).
func TestSlowPathAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, p := range providers {
		t.Run(p.name, func(t *testing.T) {
			f := newFixture(t, p.new(), p.listen, 8)
			rq := f.dial(t)
			ctx := context.Background()
			off := int64(0)
			read := func() {
				got, _, err := rq.SlowRead(ctx, off, ps)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, f.pg.Bytes()[off:off+ps]) {
					t.Fatalf("wrong bytes at %d", off)
				}
				off = (off + ps) % (8 * ps)
			}
			for range 300 { // every queue slot used once
				read()
			}
			if a := testing.AllocsPerRun(200, read); a > 0.5 {
				t.Fatalf("%.2f allocations per slow-path read", a)
			}
		})
	}
}
