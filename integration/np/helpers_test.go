package np_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/integration/np/npread"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nprdma/shm"
	"github.com/nprdma/nprdma/nprdma/tcp"
	"github.com/nprdma/nprdma/swap"
)

const pageSize = swap.PageSize

func longTests() bool { return os.Getenv("NPRDMA_LONG") == "1" }

// provider is one nprdma transport the tests run on.
type provider struct {
	name   string
	new    func() nprdma.Provider
	listen string // address for Device.Listen
	// region are the options a region served on it needs (shm reads
	// shareable regions in place).
	region []swap.Option
}

var providers = []provider{
	{"loop", func() nprdma.Provider { return loop.New() }, "", nil},
	{"tcp", func() nprdma.Provider { return tcp.New() }, "127.0.0.1:0", nil},
	{"shm", func() nprdma.Provider { return shm.New() }, "", []swap.Option{swap.WithShareable()}},
}

// regionOpts are p's region options followed by opts.
func (p provider) regionOpts(opts ...swap.Option) []swap.Option {
	return append(append([]swap.Option(nil), p.region...), opts...)
}

// pagesRead is how many pages of unpinned regions were read for READs: by
// the target's NIC engine, and by the initiator in place (shm).
func pagesRead(tg *target, in *initiator) uint64 {
	return tg.dev.Stats().UnpinnedPagesRead + in.dev.Stats().LocalPagesRead
}

// magicServed is how many of them were delivered as the magic page.
func magicServed(tg *target, in *initiator) uint64 {
	return tg.dev.Stats().MagicPagesServed + in.dev.Stats().LocalMagicPages
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(discard{}, &slog.HandlerOptions{Level: slog.LevelError}))
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// newRegion creates a swap region of pages pages over a fresh sparse file,
// closed (before the file) when the test ends.
func newRegion(t testing.TB, pages int, opts ...swap.Option) *swap.Region {
	t.Helper()
	return openRegion(t, newBacking(t, int64(pages)*pageSize), opts...)
}

// newBacking creates a sparse backing file of size bytes and opens it,
// closed when the test ends.
func newBacking(t testing.TB, size int64) *blockdev.File {
	t.Helper()
	path := filepath.Join(t.TempDir(), "backing")
	if err := blockdev.Create(path, size); err != nil {
		t.Fatal(err)
	}
	dev, err := blockdev.Open(path, blockdev.WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

// openRegion creates a region over dev, closed when the test ends (Close
// twice is harmless, so a test may close it earlier).
func openRegion(t testing.TB, dev blockdev.Device, opts ...swap.Option) *swap.Region {
	t.Helper()
	r, err := swap.New(dev, append([]swap.Option{swap.WithLogger(quietLogger())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("close region: %v", err)
		}
	})
	return r
}

// target is the serving side: a device whose PD holds the unpinned region
// over a swap.Region, and a slow-path server listening on the provider.
type target struct {
	dev    *nprdma.Device
	mr     *nprdma.MR
	srv    *npread.Server
	addr   string
	region *swap.Region
}

// initiator is the reading side: a device with a PD requesters dial from.
type initiator struct {
	dev *nprdma.Device
	pd  *nprdma.PD
}

// setup registers region unpinned on a new device of p, starts a slow-path
// server, and opens the initiator's device on the same provider. Everything
// is torn down (before the region) when the test ends.
func setup(t testing.TB, p provider, region *swap.Region, opts ...npread.ServerOption) (*target, *initiator) {
	t.Helper()
	prov := p.new()
	tg := &target{dev: nprdma.NewDevice(prov, nprdma.WithName("np-target")), region: region}
	in := &initiator{dev: nprdma.NewDevice(prov, nprdma.WithName("np-initiator"))}
	in.pd = in.dev.AllocPD()
	// Cleanups run last-in first-out: the devices close after the server,
	// and both before the region (registered earlier by the caller).
	t.Cleanup(func() { in.dev.Close(); tg.dev.Close() })
	var err error
	if tg.mr, err = tg.dev.AllocPD().RegisterUnpinned(region, nprdma.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	opts = append([]npread.ServerOption{npread.WithFaultCounts(swapFaults(region))}, opts...)
	if tg.srv, err = npread.NewServer(tg.mr, region, opts...); err != nil {
		t.Fatal(err)
	}
	ln, err := tg.dev.Listen(p.listen)
	if err != nil {
		t.Fatal(err)
	}
	tg.addr = ln.Addr()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- tg.srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
		ln.Close()
		tg.srv.Close()
	})
	return tg, in
}

func swapFaults(r *swap.Region) func() (uint64, uint64) {
	return func() (uint64, uint64) { s := r.Stats(); return s.MinorFaults, s.MajorFaults }
}

// dial connects a requester, closed when the test ends.
func (in *initiator) dial(t testing.TB, tg *target, opts ...npread.Option) *npread.Requester {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rq, err := npread.Dial(ctx, in.pd, tg.addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rq.Close() })
	return rq
}

// Versioned page content. Word 0 is a header naming the page, word 1 the
// version; every other word encodes page, version and its own index, mixed
// with a per-index constant, so that any 8 bytes of a page say which page
// and which version they belong to: a torn page (words of two versions), a
// misplaced one and a stale one are all detectable from any part of it.
// Version 0 is the never-written page: all zeros.
const headerTag = 0x4e50_0000_0000_0000 // "NP" in the top bytes: a header word is never 0

func mix(i int) uint64 {
	z := uint64(i)*0x9e3779b97f4a7c15 + 0x632be59bd9b4e019
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	return z ^ z>>31
}

func pageWord(page int, version uint64, i int) uint64 {
	switch i {
	case 0:
		return headerTag | uint64(page)
	case 1:
		return version
	}
	return (uint64(page)<<40 | (version&0xfffffff)<<12 | uint64(i)) ^ mix(i)
}

// versionedPage is the content of page at version (version ≥ 1).
func versionedPage(page int, version uint64) []byte {
	b := make([]byte, pageSize)
	for i := 0; i < pageSize/8; i++ {
		binary.LittleEndian.PutUint64(b[8*i:], pageWord(page, version, i))
	}
	return b
}

// decodeVersion finds the version of page that the words of data (bytes
// [lo, lo+len(data)) of the page, 8-byte aligned) claim. ok is false when
// only the header is covered (no version in it).
func decodeVersion(page, lo int, data []byte) (version uint64, ok bool, err error) {
	if allZero(data) {
		return 0, true, nil
	}
	for k := 0; k+8 <= len(data); k += 8 {
		i := (lo + k) / 8
		w := binary.LittleEndian.Uint64(data[k:])
		switch i {
		case 0:
			continue
		case 1:
			return w, true, nil
		}
		x := w ^ mix(i)
		if int(x>>40) != page || int(x&0xfff) != i {
			return 0, false, fmt.Errorf("word %d is %#x: not page %d's word %d of any version", i, w, page, i)
		}
		return x >> 12 & 0xfffffff, true, nil
	}
	return 0, false, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// checkPagePart verifies bytes [lo, lo+len(data)) of page: one whole
// version (never torn), at least floor (the newest write completed before
// the read was posted) and at most started (the newest write begun when it
// returned). versioned is false when the part held no version number.
func checkPagePart(page, lo int, data []byte, floor, started uint64) (versioned bool, err error) {
	v, ok, err := decodeVersion(page, lo, data)
	if err != nil {
		return false, err
	}
	if !ok { // header only
		if want := pageWord(page, 0, 0); binary.LittleEndian.Uint64(data) != want {
			return false, fmt.Errorf("header %#x, want %#x", binary.LittleEndian.Uint64(data), want)
		}
		return false, nil
	}
	if v != 0 {
		want := versionedPage(page, v)[lo : lo+len(data)]
		if !bytes.Equal(data, want) {
			k := 0
			for k < len(data) && data[k] == want[k] {
				k++
			}
			return true, fmt.Errorf("torn: bytes [%d, %d) claim version %d, but byte %d is %#x, want %#x",
				lo, lo+len(data), v, lo+k, data[k], want[k])
		}
	}
	if v < floor {
		return true, fmt.Errorf("version %d, older than version %d whose write completed before the READ was posted", v, floor)
	}
	if v > started {
		return true, fmt.Errorf("version %d was never written (newest started: %d)", v, started)
	}
	return true, nil
}

// magicPage is the content of a page that equals the region's magic page:
// byte k is byte k mod 8 of the magic, little endian.
func magicPage(magic uint64) []byte {
	b := make([]byte, pageSize)
	for i := 0; i < pageSize; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], magic)
	}
	return b
}

// vmRSS is this process's resident memory in bytes.
func vmRSS(t testing.TB) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("VmRSS not found in /proc/self/status")
	return 0
}

func mustWrite(t testing.TB, r *swap.Region, p []byte, off int64) {
	t.Helper()
	if n, err := r.WriteAt(p, off); err != nil || n != len(p) {
		t.Fatalf("WriteAt(%d bytes at %d) = %d, %v", len(p), off, n, err)
	}
}

// filePages reports which of the first n pages of f hold data (SEEK_DATA:
// a hole holds no memory).
func filePages(f *os.File, n int) ([]bool, error) {
	out := make([]bool, n)
	fd := int(f.Fd())
	size := int64(n) * pageSize
	for off := int64(0); off < size; {
		at, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err != nil {
			break // ENXIO: nothing after off
		}
		end, err := unix.Seek(fd, at, unix.SEEK_HOLE)
		if err != nil {
			return nil, err
		}
		for pg := at / pageSize; pg < (end+pageSize-1)/pageSize && pg < int64(n); pg++ {
			out[pg] = true
		}
		off = end
	}
	return out, nil
}
