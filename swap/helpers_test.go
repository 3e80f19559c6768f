package swap

import (
	"bytes"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
)

// quietLogger keeps expected warnings (injected failures) out of test output.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(discard{}, &slog.HandlerOptions{Level: slog.LevelError}))
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// newBackingFile creates a sparse backing file of size bytes and returns its
// path.
func newBackingFile(t testing.TB, size int64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "backing")
	if err := blockdev.Create(path, size); err != nil {
		t.Fatal(err)
	}
	return path
}

func openDevice(t testing.TB, path string) *blockdev.File {
	t.Helper()
	dev, err := blockdev.Open(path, blockdev.WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

// shareAll makes the tests' regions shareable (TestShareable runs tests so).
var shareAll bool

// testOptions are the options every test region gets, before its own.
func testOptions(opts ...Option) []Option {
	base := []Option{WithLogger(quietLogger())}
	if shareAll {
		base = append(base, WithShareable())
	}
	return append(base, opts...)
}

// newRegion creates a region over a fresh sparse file of size bytes.
func newRegion(t testing.TB, size int64, opts ...Option) (*Region, *blockdev.File) {
	t.Helper()
	dev := openDevice(t, newBackingFile(t, size))
	opts = testOptions(opts...)
	r, err := New(dev, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, dev
}

// pagePattern fills a page-sized buffer with bytes derived from page and tag,
// so that any misplaced or stale page is detected.
func pagePattern(page int, tag byte) []byte {
	b := make([]byte, PageSize)
	for i := range b {
		b[i] = byte(page*7+i*13) ^ tag
	}
	copy(b, fmt.Sprintf("page %d tag %d|", page, tag))
	return b
}

func mustWrite(t testing.TB, r *Region, p []byte, off int64) {
	t.Helper()
	if n, err := r.WriteAt(p, off); err != nil || n != len(p) {
		t.Fatalf("WriteAt(%d bytes at %d) = %d, %v", len(p), off, n, err)
	}
}

func mustRead(t testing.TB, r *Region, n int, off int64) []byte {
	t.Helper()
	p := make([]byte, n)
	if got, err := r.ReadAt(p, off); err != nil || got != n {
		t.Fatalf("ReadAt(%d bytes at %d) = %d, %v", n, off, got, err)
	}
	return p
}

func expectBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		t.Fatalf("%s: differs at byte %d of %d (got %x..., want %x...)", what, i, len(want),
			got[i:min(i+16, len(got))], want[i:min(i+16, len(want))])
	}
}

// residentMonitor samples Stats().Resident until stopped and remembers the
// peak, so tests can assert the budget held throughout.
type residentMonitor struct {
	peak atomic.Int64
	stop chan struct{}
	done sync.WaitGroup
}

func watchResident(r *Region) *residentMonitor {
	m := &residentMonitor{stop: make(chan struct{})}
	m.done.Add(1)
	go func() {
		defer m.done.Done()
		for {
			if res := r.Stats().Resident; res > m.peak.Load() {
				m.peak.Store(res)
			}
			select {
			case <-m.stop:
				return
			case <-time.After(50 * time.Microsecond):
			}
		}
	}()
	return m
}

func (m *residentMonitor) finish() int64 {
	close(m.stop)
	m.done.Wait()
	return m.peak.Load()
}

var rawSink atomic.Uint32

// touch reads b[i] in a way the compiler cannot drop, to provoke a fault.
func touch(b []byte, i int) { rawSink.Add(uint32(b[i])) }
