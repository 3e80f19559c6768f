package blockdev

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// pattern fills p with bytes that depend on the device offset of each byte
// and on seed, so that a read from the wrong place or a stale write shows.
func pattern(p []byte, off int64, seed byte) {
	for i := range p {
		x := uint64(off) + uint64(i)
		p[i] = byte(x>>12) ^ byte(x>>3) ^ seed ^ byte(x)
	}
}

func patterned(n int, off int64, seed byte) []byte {
	p := AlignedBuffer(n)
	pattern(p, off, seed)
	return p
}

// checkBytes fails t at the first byte where got differs from want.
func checkBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	if len(got) != len(want) {
		t.Fatalf("%s: got %d bytes, want %d", what, len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: first difference at byte %d: got %#x, want %#x", what, i, got[i], want[i])
		}
	}
}

func isZero(p []byte) bool {
	for _, b := range p {
		if b != 0 {
			return false
		}
	}
	return true
}

// testLogger sends a device's log lines to the test log and keeps them.
type testLogger struct {
	t     testing.TB
	mu    sync.Mutex
	lines []string
}

func (l *testLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.lines = append(l.lines, string(p))
	l.mu.Unlock()
	l.t.Logf("log: %s", strings.TrimSpace(string(p)))
	return len(p), nil
}

func (l *testLogger) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "")
}

func newTestLogger(t testing.TB) (*testLogger, Option) {
	l := &testLogger{t: t}
	return l, WithLogger(slog.New(slog.NewTextHandler(l, nil)))
}

// createTemp makes a sparse file of size bytes in a per-test directory.
func createTemp(t testing.TB, size int64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "backing.img")
	if err := Create(path, size); err != nil {
		t.Fatal(err)
	}
	return path
}

// openTemp creates a file of size bytes and opens it; it is closed at the
// end of the test.
func openTemp(t testing.TB, size int64, opts ...Option) *File {
	t.Helper()
	d, err := Open(createTemp(t, size), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// allocated returns the bytes a file occupies on disk.
func allocated(t testing.TB, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// wantErr checks that err is a *Error with the given operation, naming path,
// and matching target with errors.Is.
func wantErr(t testing.TB, err error, op, path string, target error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s %s: no error, want %v", op, path, target)
	}
	if !errors.Is(err, target) {
		t.Fatalf("%s %s: error %q does not wrap %v", op, path, err, target)
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("%s %s: error %q (%T) is not a *blockdev.Error", op, path, err, err)
	}
	if e.Op != op || e.Path != path {
		t.Fatalf("error %q has op %q path %q, want %q %q", err, e.Op, e.Path, op, path)
	}
	if !strings.Contains(err.Error(), path) {
		t.Fatalf("error %q does not name %s", err, path)
	}
}

// needLoop skips the test where loop devices cannot be made.
func needLoop(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("loop devices need root")
	}
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Skip("losetup not installed (util-linux)")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop device support: %v", err)
	}
}

// attachLoop attaches a loop device to file and detaches it when the test
// ends. losetup -f can lose a race for a free device to another program;
// it is retried a few times.
func attachLoop(t testing.TB, file string, readOnly bool) string {
	t.Helper()
	needLoop(t)
	args := []string{"-f", "--show"}
	if readOnly {
		args = append(args, "-r")
	}
	args = append(args, file)
	var lastErr error
	for range 5 {
		out, err := exec.Command("losetup", args...).CombinedOutput()
		if err == nil {
			dev := strings.TrimSpace(string(out))
			t.Cleanup(func() {
				if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
					t.Errorf("losetup -d %s: %v: %s", dev, err, out)
				}
			})
			return dev
		}
		lastErr = fmt.Errorf("losetup %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		time.Sleep(50 * time.Millisecond)
	}
	t.Skipf("cannot attach a loop device: %v", lastErr)
	return ""
}

// memDevice is an in-memory Device for decorator tests.
type memDevice struct {
	mu      sync.Mutex
	data    []byte
	closed  bool
	flushes int
}

func newMemDevice(size int) *memDevice { return &memDevice{data: make([]byte, size)} }

func (m *memDevice) io(op string, p []byte, off int64, write bool) (int, error) {
	if err := CheckRange(m, op, off, int64(len(p))); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, &Error{Op: op, Path: m.Path(), Off: off, Len: int64(len(p)), Err: ErrClosed}
	}
	if write {
		return copy(m.data[off:], p), nil
	}
	return copy(p, m.data[off:]), nil
}

func (m *memDevice) ReadAt(p []byte, off int64) (int, error) { return m.io("read", p, off, false) }
func (m *memDevice) WriteAt(p []byte, off int64) (int, error) {
	return m.io("write", p, off, true)
}
func (m *memDevice) WriteAtFUA(p []byte, off int64) (int, error) {
	return m.io("write-fua", p, off, true)
}
func (m *memDevice) Flush() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.flushes++
	return nil
}
func (m *memDevice) Discard(off, length int64) error {
	if err := CheckRange(m, "discard", off, length); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.data[off : off+length])
	return nil
}
func (m *memDevice) Size() int64    { return int64(len(m.data)) }
func (m *memDevice) BlockSize() int { return 512 }
func (m *memDevice) Path() string   { return "mem" }
func (m *memDevice) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}
