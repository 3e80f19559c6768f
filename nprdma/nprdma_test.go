package nprdma

import (
	"bufio"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma/link"

	"github.com/prometheus/client_golang/prometheus"
)

// nullProvider is enough for tests that never connect.
type nullProvider struct{}

func (nullProvider) Name() string { return "null" }
func (nullProvider) Listen(string) (link.Listener, error) {
	return nil, errors.New("null provider")
}
func (nullProvider) Dial(context.Context, string, link.Hello) (link.Link, link.Hello, error) {
	return nil, link.Hello{}, errors.New("null provider")
}

func TestFindMagicPages(t *testing.T) {
	const ps = 64
	magic := uint64(0x8877665544332211)
	region := make([]byte, 8*ps)
	for i := range region {
		region[i] = byte(i*7 + 3)
	}
	// Pages 2, 3 and 6 hold the magic page.
	for _, p := range []int{2, 3, 6} {
		fillPhase(region[p*ps:(p+1)*ps], magic, 0)
	}
	const base = 0x10000
	cases := []struct {
		name   string
		off, n int
		want   []PageRange
	}{
		{"whole region", 0, 8 * ps, []PageRange{{Off: 2 * ps, Addr: base + 2*ps, Len: 2 * ps}, {Off: 6 * ps, Addr: base + 6*ps, Len: ps}}},
		{"unaligned start and end", 2*ps + 5, 4*ps + 3, []PageRange{{Off: 0, Addr: base + 2*ps + 5, Len: 2*ps - 5}, {Off: 4*ps - 5, Addr: base + 6*ps, Len: 8}}},
		{"inside one magic page", 3*ps + 13, 11, []PageRange{{Off: 0, Addr: base + 3*ps + 13, Len: 11}}},
		{"no magic", 0, 2 * ps, nil},
		{"resident part of a page", 4*ps + 1, 30, nil},
	}
	for _, tc := range cases {
		buf := region[tc.off : tc.off+tc.n]
		got := FindMagicPages(buf, base+uint64(tc.off), base, ps, magic)
		if len(got) != len(tc.want) {
			t.Fatalf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Fatalf("%s: range %d %+v, want %+v", tc.name, i, got[i], tc.want[i])
			}
		}
	}
	// The pattern at the wrong phase is not the magic page.
	shifted := make([]byte, ps)
	fillPhase(shifted, magic, 1)
	if r := FindMagicPages(shifted, base, base, ps, magic); r != nil {
		t.Fatalf("magic at the wrong phase reported: %+v", r)
	}
	// A single differing byte deep in the page clears the suspicion.
	page := make([]byte, ps)
	fillPhase(page, magic, 0)
	page[ps-1] ^= 1
	if r := FindMagicPages(page, base, base, ps, magic); r != nil {
		t.Fatalf("page differing in its last byte reported: %+v", r)
	}
	if r := FindMagicPages(page, base-1, base, ps, magic); r != nil {
		t.Fatalf("address below the region: %+v", r)
	}
	dev := NewDevice(nullProvider{})
	dev.FindMagicPages(region, base, base, ps, magic)
	if n := dev.Stats().SuspectedFaults; n != 3 {
		t.Fatalf("suspected faults counted %d, want 3 pages", n)
	}
}

func TestFillPhase(t *testing.T) {
	p := uint64(0x0807060504030201)
	for j := 0; j < 16; j++ {
		b := make([]byte, 21)
		fillPhase(b, p, j)
		for i, x := range b {
			if want := byte((i+j)%8 + 1); x != want {
				t.Fatalf("phase %d byte %d = %d, want %d", j, i, x, want)
			}
		}
		if !matchPhase(b, p, j) || matchPhase(b, p, j+1) {
			t.Fatalf("matchPhase disagrees with fillPhase at phase %d", j)
		}
	}
}

func vmLocked(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmLck:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	t.Skip("no VmLck in /proc/self/status")
	return 0
}

func TestRegisterPins(t *testing.T) {
	dev := NewDevice(nullProvider{})
	defer dev.Close()
	pd := dev.AllocPD()
	buf, err := AllocBuffer(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer FreeBuffer(buf)
	before := vmLocked(t)
	a, err := pd.Register(buf, AccessLocalWrite)
	if err != nil {
		t.Skipf("mlock not permitted here: %v", err)
	}
	if got := vmLocked(t) - before; got != 1<<20 {
		t.Fatalf("locked %d bytes after registering 1 MiB", got)
	}
	// A second region over half of it: deregistering the first keeps that
	// half locked (mlock does not nest).
	b, err := pd.Register(buf[:512<<10], AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if a.LKey() == b.LKey() || a.RKey() == b.RKey() || !a.Pinned() || a.Magic() != 0 {
		t.Fatalf("keys %#x/%#x %#x/%#x pinned %v magic %#x", a.LKey(), b.LKey(), a.RKey(), b.RKey(), a.Pinned(), a.Magic())
	}
	if err := a.Deregister(); err != nil {
		t.Fatal(err)
	}
	if got := vmLocked(t) - before; got != 512<<10 {
		t.Fatalf("locked %d bytes with a 512 KiB region left", got)
	}
	b.Deregister()
	if got := vmLocked(t) - before; got != 0 {
		t.Fatalf("locked %d bytes after deregistering everything", got)
	}
	if st := dev.Stats(); st.RegisteredBytes != 0 || st.Registrations != 2 {
		t.Fatalf("stats after deregistration %+v", st)
	}
	// The keys of a deregistered region are dead.
	if _, st := pd.localSlice(a.SGE(0, 8), false); st != StatusLocalProtection {
		t.Fatalf("local access through a dead key: %s", st)
	}
	if _, _, ok := pd.remoteRegion(b.RKey(), b.Addr(), 8, AccessRemoteRead); ok {
		t.Fatal("remote access through a dead key")
	}
}

func TestRegisterRefuses(t *testing.T) {
	dev := NewDevice(nullProvider{}, WithPinning(false))
	defer dev.Close()
	pd := dev.AllocPD()
	if _, err := pd.Register(nil, AccessLocalWrite); err == nil {
		t.Fatal("registered an empty buffer")
	}
	if _, err := pd.Register(make([]byte, 8), Access(1<<7)); err == nil {
		t.Fatal("registered with unknown access bits")
	}
	if _, err := pd.Register(make([]byte, 8), AccessRemoteWrite); err == nil {
		t.Fatal("remote write without local write")
	}
	mr, err := pd.Register(make([]byte, 64), AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if err := pd.Close(); err == nil {
		t.Fatal("closed a PD with a live region")
	}
	// The NIC engine's checks, before any copy.
	checks := []struct {
		rkey uint32
		addr uint64
		n    uint32
		need Access
		ok   bool
	}{
		{mr.RKey(), mr.Addr(), 64, AccessRemoteRead, true},
		{mr.RKey(), mr.Addr() + 63, 1, AccessRemoteRead, true},
		{mr.RKey(), mr.Addr() + 63, 2, AccessRemoteRead, false},
		{mr.RKey(), mr.Addr() - 1, 1, AccessRemoteRead, false},
		{mr.RKey(), mr.Addr(), 65, AccessRemoteRead, false},
		{mr.RKey(), mr.Addr() + 8, 0xffffffff, AccessRemoteRead, false},
		{mr.RKey(), ^uint64(0), 2, AccessRemoteRead, false},
		{mr.RKey(), mr.Addr(), 8, AccessRemoteWrite, false},
		{mr.RKey() + 1, mr.Addr(), 8, AccessRemoteRead, false},
	}
	for i, c := range checks {
		if _, _, ok := pd.remoteRegion(c.rkey, c.addr, c.n, c.need); ok != c.ok {
			t.Fatalf("check %d %+v: ok=%v", i, c, ok)
		}
	}
	// Another PD's queue pairs cannot use the key.
	if _, _, ok := dev.AllocPD().remoteRegion(mr.RKey(), mr.Addr(), 8, AccessRemoteRead); ok {
		t.Fatal("rkey honoured in another protection domain")
	}
	mr.Deregister()
	if err := pd.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestBufferPool(t *testing.T) {
	dev := NewDevice(nullProvider{}, WithPinning(false))
	defer dev.Close()
	pd := dev.AllocPD()
	pool, err := NewBufferPool(pd, AccessLocalWrite, WithSlabSize(1<<20), WithMaxBytes(3<<20))
	if err != nil {
		t.Fatal(err)
	}
	a, err := pool.Get(5000) // 8 KiB class
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Bytes()) != 5000 || a.SGE().Length != 5000 || a.SGE().LKey != a.LKey() || a.SGE().Addr != a.Addr() {
		t.Fatalf("buffer %d bytes, SGE %+v", len(a.Bytes()), a.SGE())
	}
	b, _ := pool.Get(8192)
	if b.MR() != a.MR() || b.Addr() == a.Addr() {
		t.Fatal("same-class buffers should share a slab at different addresses")
	}
	c, _ := pool.Get(4096) // another class: another slab
	st := pool.Stats()
	if st.Slabs != 2 || st.Registrations != 2 || st.Gets != 3 || st.RegistrationsAvoided != 1 || st.InUseBytes != 8192+8192+4096 || st.BytesRegistered != 2<<20 {
		t.Fatalf("stats %+v", st)
	}
	// Writes through the SGE's address land in Bytes.
	if _, status := pd.localSlice(a.SGE(), true); status != StatusSuccess {
		t.Fatalf("pool buffer SGE refused: %s", status)
	}
	a.Release()
	a2, _ := pool.Get(7000)
	if a2.Addr() != a.Addr() {
		t.Fatal("a released buffer was not reused")
	}
	if pool.Stats().Registrations != 2 {
		t.Fatal("a reused buffer registered again")
	}
	if _, err := pool.Get(MaxBufferClass + 1); err == nil {
		t.Fatal("buffer beyond the largest class")
	}
	big, err := pool.Get(MaxBufferClass) // third slab: 3 MiB, the cap
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Get(MaxBufferClass); err == nil {
		t.Fatal("pool went beyond WithMaxBytes")
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewPrometheusCollector(dev, pool))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if m.GetCounter() != nil {
				values[mf.GetName()] = m.GetCounter().GetValue()
			} else {
				values[mf.GetName()] = m.GetGauge().GetValue()
			}
		}
	}
	if values["nprdma_fabric_pool_slabs"] != 3 || values["nprdma_fabric_pool_registrations_avoided_total"] != 2 || values["nprdma_fabric_registered_bytes"] != 3<<20 {
		t.Fatalf("metrics %v", values)
	}
	if err := pool.Close(); err == nil {
		t.Fatal("closed a pool with buffers in use")
	}
	for _, x := range []*Buffer{a2, b, c, big} {
		x.Release()
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("double release did not panic")
			}
		}()
		b.Release()
	}()
	if err := pool.Close(); err != nil {
		t.Fatal(err)
	}
	if dev.Stats().RegisteredBytes != 0 {
		t.Fatal("pool slabs still registered after Close")
	}
}

func TestCQ(t *testing.T) {
	dev := NewDevice(nullProvider{})
	cq := dev.NewCQ(2, WithBusyPoll(time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var wcs [4]WC
	if _, err := cq.Wait(ctx, wcs[:]); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait with a cancelled context: %v", err)
	}
	go cq.push(WC{ID: 1}, WC{ID: 2})
	n, err := cq.Wait(context.Background(), wcs[:])
	if err != nil || n == 0 || wcs[0].ID != 1 {
		t.Fatalf("wait: %d %v %+v", n, err, wcs[:n])
	}
	if n == 1 {
		if cq.Poll(wcs[:]) != 1 || wcs[0].ID != 2 {
			t.Fatal("second completion lost")
		}
	}
	if !cq.push(WC{ID: 3}, WC{ID: 4}) || cq.push(WC{ID: 5}) {
		t.Fatal("push past the depth should report the overflow")
	}
	if cq.Poll(wcs[:]) != 2 || wcs[0].ID != 3 || wcs[1].ID != 4 {
		t.Fatalf("kept completions %+v", wcs[:2])
	}
	if _, err := cq.Wait(context.Background(), wcs[:]); !errors.Is(err, ErrCQOverflow) {
		t.Fatalf("wait after overflow: %v", err)
	}
	pd := dev.AllocPD()
	qp, err := pd.NewQP(QPConfig{SendCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	if err := cq.Close(); err == nil {
		t.Fatal("closed a CQ in use")
	}
	qp.Close()
	cq2 := dev.NewCQ(4)
	done := make(chan error, 1)
	go func() { _, err := cq2.Wait(context.Background(), wcs[:]); done <- err }()
	time.Sleep(time.Millisecond)
	cq2.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("waiter on a closed CQ: %v", err)
	}
}

func TestAllocBuffer(t *testing.T) {
	b, err := AllocBuffer(5000)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 5000 || cap(b)%osPageSize != 0 || uintptrOf(b)%uintptr(osPageSize) != 0 {
		t.Fatalf("buffer len %d cap %d at %#x", len(b), cap(b), uintptrOf(b))
	}
	b[4999] = 1
	if err := FreeBuffer(b); err != nil {
		t.Fatal(err)
	}
	if _, err := AllocBuffer(0); err == nil {
		t.Fatal("allocated 0 bytes")
	}
}

func TestStrings(t *testing.T) {
	if s := (AccessLocalWrite | AccessRemoteRead).String(); s != "local-write|remote-read" {
		t.Fatal(s)
	}
	for s := StatusSuccess; s <= StatusBadResponse; s++ {
		if strings.HasPrefix(s.String(), "status(") {
			t.Fatalf("status %d has no name", s)
		}
	}
	for o := OpSend; o <= OpRecvRDMAWithImm; o++ {
		if strings.HasPrefix(o.String(), "opcode(") {
			t.Fatalf("opcode %d has no name", o)
		}
	}
	if QPStateRTS.String() != "ready-to-send" || Opcode(99).String() != "opcode(99)" {
		t.Fatal("state or unknown opcode name")
	}
}

func TestSchemesDispatchByAddress(t *testing.T) {
	def, unix := namedProvider{name: "def"}, namedProvider{name: "unix"}
	s := NewSchemes(def, map[string]link.Provider{"unix": unix})
	for addr, want := range map[string]link.Provider{"unix:/run/x.sock": unix, "127.0.0.1:4420": def, "[::1]:1": def, "name": def} {
		if got := s.For(addr); got.Name() != want.Name() {
			t.Fatalf("%q: provider %s, want %s", addr, got.Name(), want.Name())
		}
	}
	if s.Name() != "def" {
		t.Fatalf("name %q", s.Name())
	}
}

type namedProvider struct {
	nullProvider
	name string
}

func (p namedProvider) Name() string { return p.name }

// The software NIC's internals, reached through the user-facing types.

func (pd *PD) localSlice(s SGE, needWrite bool) ([]byte, Status) {
	return pd.drv.(*softPD).localSlice(s, needWrite)
}

func (pd *PD) remoteRegion(rkey uint32, addr uint64, n uint32, need Access) (*softMR, int, bool) {
	return pd.drv.(*softPD).remoteRegion(rkey, addr, n, need)
}

func (cq *CQ) push(wcs ...WC) bool { return cq.drv.(*softCQ).push(wcs...) }
