package blockdev

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const fileSize = 4 << 20

// roundTrip writes several patterned ranges over a baseline pattern and
// checks every byte of the device afterwards, so that a write landing in
// the wrong place or a read from the wrong place both show.
func roundTrip(t *testing.T, d Device) {
	t.Helper()
	size := d.Size()
	base := patterned(int(size), 0, 1)
	if _, err := d.WriteAt(base, 0); err != nil {
		t.Fatal(err)
	}
	want := append([]byte(nil), base...)
	bs := int64(d.BlockSize())
	cases := []struct{ off, n int64 }{
		{0, bs},
		{bs, bs},
		{PageSize, PageSize},
		{3 * PageSize, 2 * PageSize},
		{64 << 10, 64 << 10},
		{1 << 20, 1 << 20},
		{size - PageSize, PageSize},
		{size - (1 << 20), 1 << 20},
	}
	for i, c := range cases {
		p := patterned(int(c.n), c.off, byte(10+i))
		write := d.WriteAt
		if i%2 == 1 {
			write = d.WriteAtFUA
		}
		if n, err := write(p, c.off); err != nil || n != int(c.n) {
			t.Fatalf("write [%d, +%d): n=%d err=%v", c.off, c.n, n, err)
		}
		copy(want[c.off:], p)
		got := AlignedBuffer(int(c.n))
		if n, err := d.ReadAt(got, c.off); err != nil || n != int(c.n) {
			t.Fatalf("read [%d, +%d): n=%d err=%v", c.off, c.n, n, err)
		}
		checkBytes(t, fmt.Sprintf("read back [%d, +%d)", c.off, c.n), got, p)
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	all := AlignedBuffer(int(size))
	if _, err := d.ReadAt(all, 0); err != nil {
		t.Fatal(err)
	}
	checkBytes(t, "whole device", all, want)
}

func TestFileRoundTrip(t *testing.T) {
	t.Run("direct", func(t *testing.T) {
		d := openTemp(t, fileSize)
		if !d.Direct() || d.BlockSize() != PageSize {
			t.Fatalf("file on %s: direct=%v block size %d, want O_DIRECT with %d", filepath.Dir(d.Path()), d.Direct(), d.BlockSize(), PageSize)
		}
		roundTrip(t, d)
	})
	t.Run("buffered", func(t *testing.T) {
		d := openTemp(t, fileSize, WithoutDirectIO())
		if d.Direct() || d.BlockSize() != 512 {
			t.Fatalf("direct=%v block size %d, want buffered with 512", d.Direct(), d.BlockSize())
		}
		roundTrip(t, d)
	})
	t.Run("reopen", func(t *testing.T) {
		// Data written and flushed is there after the device is opened again.
		path := createTemp(t, 1<<20)
		d, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		p := patterned(64<<10, 8192, 7)
		if _, err := d.WriteAt(p, 8192); err != nil {
			t.Fatal(err)
		}
		if err := d.Flush(); err != nil {
			t.Fatal(err)
		}
		d.Close()
		d, err = Open(path, WithReadOnly())
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		got := AlignedBuffer(len(p))
		if _, err := d.ReadAt(got, 8192); err != nil {
			t.Fatal(err)
		}
		checkBytes(t, "after reopen", got, p)
	})
}

func TestFileConcurrentDisjointWrites(t *testing.T) {
	const workers, pagesEach = 16, 32
	d := openTemp(t, workers*pagesEach*PageSize, WithMaxInflight(4))
	var wg sync.WaitGroup
	errs := make(chan error, 2*workers) // at most one per worker and phase
	for w := range workers {
		wg.Go(func() {
			// Interleave the workers' pages so that neighbours on the device
			// belong to different goroutines.
			for i := range pagesEach {
				off := int64(i*workers+w) * PageSize
				write := d.WriteAt
				if i%3 == 0 {
					write = d.WriteAtFUA
				}
				if _, err := write(patterned(PageSize, off, byte(w)), off); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	for w := range workers {
		wg.Go(func() {
			got := AlignedBuffer(PageSize)
			for i := range pagesEach {
				off := int64(i*workers+w) * PageSize
				if _, err := d.ReadAt(got, off); err != nil {
					errs <- err
					return
				}
				want := patterned(PageSize, off, byte(w))
				if string(got) != string(want) {
					errs <- fmt.Errorf("page at %d: not what worker %d wrote", off, w)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestFileMaxInflightBound(t *testing.T) {
	const bound, callers = 3, 10
	d := openTemp(t, callers*PageSize, WithMaxInflight(bound))
	var cur, peak atomic.Int32
	release := make(chan struct{})
	reached := make(chan struct{})
	var once sync.Once
	real := d.sys.pread
	d.sys.pread = func(fd int, p []byte, off int64) (int, error) {
		n := cur.Add(1)
		for {
			old := peak.Load()
			if n <= old || peak.CompareAndSwap(old, n) {
				break
			}
		}
		if n == bound {
			once.Do(func() { close(reached) })
		}
		<-release
		cur.Add(-1)
		return real(fd, p, off)
	}
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			if _, err := d.ReadAt(AlignedBuffer(PageSize), int64(i)*PageSize); err != nil {
				t.Error(err)
			}
		})
	}
	<-reached
	close(release)
	wg.Wait()
	if got := peak.Load(); got != bound {
		t.Fatalf("peak concurrent preads %d, want the bound %d", got, bound)
	}
}

func TestFileShortTransfers(t *testing.T) {
	// pread and pwrite may transfer less than asked or be interrupted;
	// the device repeats them until the whole range is done.
	d := openTemp(t, 1<<20)
	var calls atomic.Int32
	chop := func(real func(int, []byte, int64) (int, error)) func(int, []byte, int64) (int, error) {
		return func(fd int, p []byte, off int64) (int, error) {
			if calls.Add(1)%3 == 0 {
				return 0, unix.EINTR
			}
			return real(fd, p[:min(len(p), PageSize)], off)
		}
	}
	d.sys.pread, d.sys.pwrite = chop(d.sys.pread), chop(d.sys.pwrite)
	p := patterned(64<<10, 4096, 3)
	if n, err := d.WriteAt(p, 4096); err != nil || n != len(p) {
		t.Fatalf("write: n=%d err=%v", n, err)
	}
	got := AlignedBuffer(len(p))
	if n, err := d.ReadAt(got, 4096); err != nil || n != len(p) {
		t.Fatalf("read: n=%d err=%v", n, err)
	}
	checkBytes(t, "chopped round trip", got, p)
	if calls.Load() < 2*16 {
		t.Fatalf("only %d system calls for two 16-page transfers chopped into pages", calls.Load())
	}

	// A transfer that makes no progress is an error, not an endless loop.
	d.sys.pread = func(int, []byte, int64) (int, error) { return 0, nil }
	_, err := d.ReadAt(got, 0)
	wantErr(t, err, "read", d.Path(), ErrOutOfRange)
}

func TestFileCloseWaitsForInflight(t *testing.T) {
	d := openTemp(t, 1<<20)
	entered, release := make(chan struct{}), make(chan struct{})
	real := d.sys.pread
	d.sys.pread = func(fd int, p []byte, off int64) (int, error) {
		close(entered)
		<-release
		return real(fd, p, off)
	}
	want := patterned(PageSize, 0, 9)
	if _, err := d.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	readDone := make(chan error, 1)
	got := AlignedBuffer(PageSize)
	go func() {
		_, err := d.ReadAt(got, 0)
		readDone <- err
	}()
	<-entered
	closeDone := make(chan error, 1)
	go func() { closeDone <- d.Close() }()
	// Give a wrong Close time to return; a right one never does here, so
	// this wait cannot fail a correct implementation on a slow machine.
	select {
	case err := <-closeDone:
		t.Fatalf("Close returned (%v) while a read was still in its system call", err)
	case err := <-readDone:
		t.Fatalf("read finished (%v) before it was released", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-readDone; err != nil {
		t.Fatalf("read in flight during Close: %v", err)
	}
	if err := <-closeDone; err != nil {
		t.Fatal(err)
	}
	checkBytes(t, "read in flight during Close", got, want)
}

func TestFileClosed(t *testing.T) {
	d := openTemp(t, 1<<20)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	p := AlignedBuffer(PageSize)
	_, err := d.ReadAt(p, 0)
	wantErr(t, err, "read", d.Path(), ErrClosed)
	_, err = d.WriteAt(p, 0)
	wantErr(t, err, "write", d.Path(), ErrClosed)
	_, err = d.WriteAtFUA(p, 0)
	wantErr(t, err, "write-fua", d.Path(), ErrClosed)
	wantErr(t, d.Flush(), "flush", d.Path(), ErrClosed)
	wantErr(t, d.Discard(0, PageSize), "discard", d.Path(), ErrClosed)
}

func TestFileDiscardReadsZeros(t *testing.T) {
	const size = 4 << 20
	d := openTemp(t, size)
	data := patterned(size, 0, 5)
	if _, err := d.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	before := allocated(t, d.Path())
	const off, n = 1 << 20, 2 << 20
	if err := d.Discard(off, n); err != nil {
		t.Fatal(err)
	}
	got := AlignedBuffer(size)
	if _, err := d.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !isZero(got[off : off+n]) {
		t.Fatal("discarded range does not read back zeros")
	}
	checkBytes(t, "before the discarded range", got[:off], data[:off])
	checkBytes(t, "after the discarded range", got[off+n:], data[off+n:])
	// A punched hole gives the space back.
	if after := allocated(t, d.Path()); before-after < n {
		t.Fatalf("allocated %d bytes before and %d after discarding %d", before, after, n)
	}
	if err := d.Discard(0, 0); err != nil {
		t.Fatalf("empty discard: %v", err)
	}
}

func TestFileDiscardFallbacks(t *testing.T) {
	for _, tc := range []struct {
		name        string
		unsupported []uint32 // fallocate modes that fail with EOPNOTSUPP
		wantModes   []string
		wantWrites  bool
	}{
		{"punch hole", nil, []string{"punch"}, false},
		{"zero range", []uint32{unix.FALLOC_FL_PUNCH_HOLE}, []string{"punch", "zero"}, false},
		{"write zeros", []uint32{unix.FALLOC_FL_PUNCH_HOLE, unix.FALLOC_FL_ZERO_RANGE}, []string{"punch", "zero"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const size = 3 << 20
			d := openTemp(t, size)
			data := patterned(size, 0, 6)
			if _, err := d.WriteAt(data, 0); err != nil {
				t.Fatal(err)
			}
			var modes []string
			realFallocate := d.sys.fallocate
			d.sys.fallocate = func(fd int, mode uint32, off, length int64) error {
				name := "zero"
				if mode&unix.FALLOC_FL_PUNCH_HOLE != 0 {
					name = "punch"
				}
				modes = append(modes, name)
				for _, u := range tc.unsupported {
					if mode&u != 0 {
						return unix.EOPNOTSUPP
					}
				}
				return realFallocate(fd, mode, off, length)
			}
			var written atomic.Int64
			realPwrite := d.sys.pwrite
			d.sys.pwrite = func(fd int, p []byte, off int64) (int, error) {
				n, err := realPwrite(fd, p, off)
				written.Add(int64(n))
				return n, err
			}
			// Larger than the 1 MiB chunk of writeZeros and not a multiple of it.
			const off, n = PageSize, 2<<20 + 3*PageSize
			if err := d.Discard(off, n); err != nil {
				t.Fatal(err)
			}
			if strings.Join(modes, ",") != strings.Join(tc.wantModes, ",") {
				t.Fatalf("fallocate modes tried %v, want %v", modes, tc.wantModes)
			}
			if got := written.Load(); tc.wantWrites != (got == n) {
				t.Fatalf("zeros written with pwrite: %d bytes (want them written: %v)", got, tc.wantWrites)
			}
			got := AlignedBuffer(size)
			if _, err := d.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			if !isZero(got[off : off+n]) {
				t.Fatal("discarded range does not read back zeros")
			}
			checkBytes(t, "before", got[:off], data[:off])
			checkBytes(t, "after", got[off+n:], data[off+n:])
		})
	}
	t.Run("other errors surface", func(t *testing.T) {
		d := openTemp(t, 1<<20)
		d.sys.fallocate = func(int, uint32, int64, int64) error { return unix.ENOSPC }
		wantErr(t, d.Discard(0, PageSize), "discard", d.Path(), syscall.ENOSPC)
	})
}

func TestFileAlignmentErrors(t *testing.T) {
	d := openTemp(t, 1<<20)
	buf := AlignedBuffer(2 * PageSize)
	cases := []struct {
		name string
		p    []byte
		off  int64
	}{
		{"offset", buf[:PageSize], 512},
		{"negative offset", buf[:PageSize], -PageSize},
		{"length", buf[:PageSize-512], 0},
		{"buffer address", buf[512 : 512+PageSize], 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := d.ReadAt(c.p, c.off)
			wantErr(t, err, "read", d.Path(), ErrUnaligned)
			_, err = d.WriteAt(c.p, c.off)
			wantErr(t, err, "write", d.Path(), ErrUnaligned)
			_, err = d.WriteAtFUA(c.p, c.off)
			wantErr(t, err, "write-fua", d.Path(), ErrUnaligned)
		})
	}
	wantErr(t, d.Discard(512, PageSize), "discard", d.Path(), ErrUnaligned)
	wantErr(t, d.Discard(0, 100), "discard", d.Path(), ErrUnaligned)

	// Buffered I/O has no buffer alignment rule and a 512-byte block.
	b := openTemp(t, 1<<20, WithoutDirectIO())
	want := patterned(512, 512, 2)
	odd := make([]byte, 513)[1:]
	copy(odd, want)
	if _, err := b.WriteAt(odd, 512); err != nil {
		t.Fatalf("buffered write from an unaligned buffer: %v", err)
	}
	got := make([]byte, 600)[3:515]
	if _, err := b.ReadAt(got, 512); err != nil {
		t.Fatal(err)
	}
	checkBytes(t, "buffered, unaligned buffers", got, want)
}

func TestFileOutOfRange(t *testing.T) {
	const size = 1 << 20
	d := openTemp(t, size)
	p := AlignedBuffer(2 * PageSize)
	for _, off := range []int64{size, size - PageSize, size + PageSize, 1 << 40} {
		_, err := d.ReadAt(p, off)
		wantErr(t, err, "read", d.Path(), ErrOutOfRange)
		_, err = d.WriteAt(p, off)
		wantErr(t, err, "write", d.Path(), ErrOutOfRange)
		wantErr(t, d.Discard(off, 2*PageSize), "discard", d.Path(), ErrOutOfRange)
	}
	if _, err := d.ReadAt(p, size-2*PageSize); err != nil {
		t.Fatalf("last two pages: %v", err)
	}
	// The largest length must not overflow the range check.
	wantErr(t, d.Discard(PageSize, 1<<62), "discard", d.Path(), ErrOutOfRange)
}

func TestOpenMissingPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no-such-file")
	_, err := Open(path)
	wantErr(t, err, "open", path, fs.ErrNotExist)
	if !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("error %q does not say the file is missing", err)
	}
}

func TestOpenNotBlockDeviceOrFile(t *testing.T) {
	dir := t.TempDir()
	_, err := Open(dir)
	if err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "not a block device or regular file") {
		t.Fatalf("open of a directory: %v", err)
	}
	if _, err := Open("/dev/null"); err == nil || !strings.Contains(err.Error(), "not a block device or regular file") {
		t.Fatalf("open of a character device: %v", err)
	}
}

func TestFileReadOnly(t *testing.T) {
	path := createTemp(t, 1<<20)
	d, err := Open(path, WithReadOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	p := AlignedBuffer(PageSize)
	_, err = d.WriteAt(p, 0)
	wantErr(t, err, "write", path, ErrReadOnly)
	_, err = d.WriteAtFUA(p, 0)
	wantErr(t, err, "write-fua", path, ErrReadOnly)
	wantErr(t, d.Discard(0, PageSize), "discard", path, ErrReadOnly)
	if _, err := d.ReadAt(p, 0); err != nil {
		t.Fatalf("read from a read-only device: %v", err)
	}
	if err := d.Flush(); err != nil {
		t.Fatalf("flush of a read-only device: %v", err)
	}
}

func TestFileOnReadOnlyFileSystem(t *testing.T) {
	// A read-only bind mount stands in for a read-only file system.
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	path := createTemp(t, 1<<20)
	dir := filepath.Dir(path)
	mnt := t.TempDir()
	if err := unix.Mount(dir, mnt, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("bind mount: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	if err := unix.Mount("", mnt, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Skipf("read-only remount: %v", err)
	}
	roPath := filepath.Join(mnt, filepath.Base(path))
	_, err := Open(roPath)
	wantErr(t, err, "open", roPath, ErrReadOnly)
	if !errors.Is(err, syscall.EROFS) && !strings.Contains(err.Error(), "read-only file system") {
		t.Fatalf("error %q does not say why", err)
	}
	d, err := Open(roPath, WithReadOnly())
	if err != nil {
		t.Fatalf("read-only open on a read-only file system: %v", err)
	}
	d.Close()
}

func TestOpenTooSmall(t *testing.T) {
	path := createTemp(t, 1<<20)
	_, err := Open(path, WithMinSize(2<<20))
	wantErr(t, err, "open", path, ErrTooSmall)
	if !strings.Contains(err.Error(), "1048576 bytes, 2097152 needed") {
		t.Fatalf("error %q does not give both sizes", err)
	}
	d, err := Open(path, WithMinSize(1<<20))
	if err != nil {
		t.Fatalf("exactly the minimum size: %v", err)
	}
	d.Close()
}

func TestOpenRoundsSizeToBlocks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "odd")
	if err := os.WriteFile(path, make([]byte, 3*PageSize+100), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Size() != 3*PageSize {
		t.Fatalf("size %d, want the whole blocks only (%d)", d.Size(), 3*PageSize)
	}
}

// TestTmpfs records what happens on tmpfs, which refused O_DIRECT before
// Linux 6.6 and accepts it since (without any alignment rule of its own).
func TestTmpfs(t *testing.T) {
	var sfs unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &sfs); err != nil || sfs.Type != unix.TMPFS_MAGIC {
		t.Skipf("/dev/shm is not a tmpfs here (%v)", err)
	}
	dir, err := os.MkdirTemp("/dev/shm", "blockdev-test-")
	if err != nil {
		t.Skipf("cannot write to /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "backing.img")
	if err := Create(path, 4<<20); err != nil {
		t.Fatal(err)
	}
	log, logOpt := newTestLogger(t)
	d, err := Open(path, logOpt)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	t.Logf("tmpfs: O_DIRECT=%v, block size %d", d.Direct(), d.BlockSize())
	if !d.Direct() && !strings.Contains(log.text(), "buffered I/O") {
		t.Fatal("fell back to buffered I/O without a log line")
	}
	if d.Direct() && log.text() != "" {
		t.Fatalf("O_DIRECT worked, yet Open logged: %s", log.text())
	}
	roundTrip(t, d)
	if err := d.Discard(PageSize, 8*PageSize); err != nil {
		t.Fatal(err)
	}
	got := AlignedBuffer(8 * PageSize)
	if _, err := d.ReadAt(got, PageSize); err != nil {
		t.Fatal(err)
	}
	if !isZero(got) {
		t.Fatal("discard on tmpfs does not read back zeros")
	}
}

func TestOpenDirectIORefused(t *testing.T) {
	// Where the file system refuses O_DIRECT at open (EINVAL), Open falls
	// back to buffered I/O and says so.
	t.Cleanup(func() { openForIO = openFile })
	var directTries int
	openForIO = func(path string, flags int, direct bool) (*os.File, error) {
		if direct {
			directTries++
			return nil, &os.PathError{Op: "open", Path: path, Err: unix.EINVAL}
		}
		return openFile(path, flags, direct)
	}
	log, logOpt := newTestLogger(t)
	d := openTemp(t, fileSize, logOpt)
	if directTries != 1 || d.Direct() || d.BlockSize() != 512 {
		t.Fatalf("O_DIRECT tried %d times; direct=%v block size %d, want a buffered 512-byte device", directTries, d.Direct(), d.BlockSize())
	}
	if text := log.text(); !strings.Contains(text, "refuses O_DIRECT") || !strings.Contains(text, d.Path()) {
		t.Fatalf("fallback log %q does not name the path and the reason", text)
	}
	if _, _, ok := FdOf(d); !ok {
		t.Fatal("no descriptor")
	}
	roundTrip(t, d)

	// Other open errors are not retried.
	openForIO = func(path string, flags int, direct bool) (*os.File, error) {
		return nil, &os.PathError{Op: "open", Path: path, Err: unix.EIO}
	}
	path := createTemp(t, 1<<20)
	_, err := Open(path)
	wantErr(t, err, "open", path, syscall.EIO)
}

func TestOpenDirectIOAlignmentFromStatx(t *testing.T) {
	t.Cleanup(func() { directIOAlign = fileDirectIOAlign })
	// What statx says about a file on ext4 here, for the record.
	align, supported := fileDirectIOAlign(createTemp(t, PageSize))
	t.Logf("statx DIOALIGN of a file in %s: alignment %d, supported %v", os.TempDir(), align, supported)
	for _, tc := range []struct {
		name       string
		align      int
		supported  bool
		wantDirect bool
		wantLog    string
	}{
		{"unknown", 0, true, true, ""},
		{"512 bytes", 512, true, true, ""},
		{"a page", PageSize, true, true, ""},
		{"unsupported", 0, false, false, "does not support O_DIRECT"},
		{"beyond a page", 2 * PageSize, true, false, "beyond the page size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			directIOAlign = func(string) (int, bool) { return tc.align, tc.supported }
			log, logOpt := newTestLogger(t)
			d := openTemp(t, 1<<20, logOpt)
			if d.Direct() != tc.wantDirect {
				t.Fatalf("direct=%v, want %v", d.Direct(), tc.wantDirect)
			}
			wantBS := 512
			if tc.wantDirect {
				wantBS = PageSize
			}
			if d.BlockSize() != wantBS {
				t.Fatalf("block size %d, want %d", d.BlockSize(), wantBS)
			}
			if text := log.text(); tc.wantLog == "" && text != "" || !strings.Contains(text, tc.wantLog) {
				t.Fatalf("log %q, want it to say %q", text, tc.wantLog)
			}
			p := patterned(PageSize, PageSize, 1)
			if _, err := d.WriteAt(p, PageSize); err != nil {
				t.Fatal(err)
			}
			got := AlignedBuffer(PageSize)
			if _, err := d.ReadAt(got, PageSize); err != nil {
				t.Fatal(err)
			}
			checkBytes(t, "round trip", got, p)
		})
	}
}

func TestCreate(t *testing.T) {
	t.Run("sparse", func(t *testing.T) {
		const size = 1 << 30
		path := createTemp(t, size)
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() != size {
			t.Fatalf("size %d, want %d", st.Size(), size)
		}
		if a := allocated(t, path); a > 64<<10 {
			t.Fatalf("a new 1 GiB backing file occupies %d bytes; want it sparse", a)
		}
		d, err := Open(path, WithMinSize(size))
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		got := AlignedBuffer(PageSize)
		if _, err := d.ReadAt(got, size-PageSize); err != nil || !isZero(got) {
			t.Fatalf("last page of a new file: err=%v zero=%v", err, isZero(got))
		}
	})
	t.Run("existing file kept, grown, never shrunk", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "ns.img")
		data := patterned(2<<20, 0, 4)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := Create(path, 1<<20); err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(path)
		checkBytes(t, "after Create with a smaller size", got, data)
		if err := Create(path, 4<<20); err != nil {
			t.Fatal(err)
		}
		got, _ = os.ReadFile(path)
		if len(got) != 4<<20 {
			t.Fatalf("size %d after growing to %d", len(got), 4<<20)
		}
		checkBytes(t, "old data after growing", got[:len(data)], data)
		if !isZero(got[len(data):]) {
			t.Fatal("grown part is not zero")
		}
	})
	t.Run("errors", func(t *testing.T) {
		dir := t.TempDir()
		for _, size := range []int64{0, -PageSize, PageSize + 1} {
			path := filepath.Join(dir, "bad")
			err := Create(path, size)
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "multiple of") {
				t.Fatalf("Create size %d: %v", size, err)
			}
		}
		err := Create(dir, PageSize)
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Fatalf("Create on a directory: %v", err)
		}
		missing := filepath.Join(dir, "no", "such", "dir", "f")
		if err := Create(missing, PageSize); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
			t.Fatalf("Create in a missing directory: %v", err)
		}
		// Larger than the file system allows (EFBIG): the file it created is
		// gone again, so a later Create of a sane size starts afresh; a file
		// that was there before is kept.
		huge := filepath.Join(dir, "huge")
		if err := Create(huge, 1<<62); err == nil {
			t.Skipf("%s holds a 4 EiB sparse file (tmpfs does): no way to make Create fail here", dir)
		}
		if _, err := os.Stat(huge); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("a failed Create left its file behind: %v", err)
		}
		kept := filepath.Join(dir, "kept")
		if err := os.WriteFile(kept, []byte("data"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := Create(kept, 1<<62); err == nil {
			t.Fatal("Create of 4 EiB succeeded on the second try")
		}
		if got, err := os.ReadFile(kept); err != nil || string(got) != "data" {
			t.Fatalf("a failed Create changed an existing file: %q, %v", got, err)
		}
	})
}

func TestFdOfThroughDecorators(t *testing.T) {
	d := openTemp(t, 1<<20)
	m, err := NewMetered(NewFaulty(d), nil)
	if err != nil {
		t.Fatal(err)
	}
	stack := NewFaulty(m)
	fd, direct, ok := FdOf(stack)
	if !ok || fd != d.Fd() || direct != d.Direct() {
		t.Fatalf("FdOf through Faulty(Metered(Faulty(File))) = %d, %v, %v; want %d, %v, true", fd, direct, ok, d.Fd(), d.Direct())
	}
	// The descriptor really is the file's: a pread through it sees a write
	// made through the stack.
	want := patterned(PageSize, PageSize, 8)
	if _, err := stack.WriteAt(want, PageSize); err != nil {
		t.Fatal(err)
	}
	got := AlignedBuffer(PageSize)
	if _, err := unix.Pread(int(fd), got, PageSize); err != nil {
		t.Fatal(err)
	}
	checkBytes(t, "pread through FdOf", got, want)
	if _, _, ok := FdOf(NewFaulty(newMemDevice(PageSize))); ok {
		t.Fatal("FdOf found a descriptor under an in-memory device")
	}
	if _, _, ok := FdOf(nil); ok {
		t.Fatal("FdOf(nil) reported a descriptor")
	}
}

func TestWriteAtFUAFallback(t *testing.T) {
	// Where pwritev2(RWF_DSYNC) is refused, a FUA write becomes a write and
	// an fdatasync, and the refusal is remembered.
	d := openTemp(t, 1<<20)
	var dsyncCalls atomic.Int32
	d.sys.pwriteDsync = func(int, []byte, int64) (int, error) {
		dsyncCalls.Add(1)
		return 0, unix.EOPNOTSUPP
	}
	for i := range 3 {
		off := int64(i) * PageSize
		p := patterned(PageSize, off, 11)
		if n, err := d.WriteAtFUA(p, off); err != nil || n != PageSize {
			t.Fatalf("FUA write %d: n=%d err=%v", i, n, err)
		}
		got := AlignedBuffer(PageSize)
		if _, err := d.ReadAt(got, off); err != nil {
			t.Fatal(err)
		}
		checkBytes(t, "FUA write through the fallback", got, p)
	}
	if n := dsyncCalls.Load(); n != 1 {
		t.Fatalf("pwritev2(RWF_DSYNC) tried %d times, want once", n)
	}
}

// TestWritableFileIsClaimedExclusively: a file opened writable is locked
// (flock) until it is closed, so a second writable Open, in this process or
// another, fails with ErrInUse and names the file; read-only opens and
// WithoutExclusive are not refused.
func TestWritableFileIsClaimedExclusively(t *testing.T) {
	path := createTemp(t, 1<<20)
	d, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(path)
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), path) {
		t.Fatalf("second writable open: %v, want ErrInUse naming %s", err, path)
	}
	for _, opt := range []Option{WithReadOnly(), WithoutExclusive()} {
		d2, err := Open(path, opt)
		if err != nil {
			t.Fatalf("open with %T while claimed: %v", opt, err)
		}
		d2.Close()
	}
	d.Close()
	d3, err := Open(path)
	if err != nil {
		t.Fatalf("open after the claim's Close: %v", err)
	}
	d3.Close()
}
