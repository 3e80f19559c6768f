package blockdev

import (
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// Tests on a real block device: a loop device over a file in the test's
// directory (losetup -f), detached when the test ends.

const loopSize = 8 << 20

func openLoop(t *testing.T, opts ...Option) (*File, string) {
	t.Helper()
	backing := createTemp(t, loopSize)
	dev := attachLoop(t, backing, false)
	d, err := Open(dev, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, backing
}

func TestLoopRoundTrip(t *testing.T) {
	d, _ := openLoop(t)
	if !d.IsBlockDevice() || !d.Direct() {
		t.Fatalf("%s: block device %v, O_DIRECT %v", d.Path(), d.IsBlockDevice(), d.Direct())
	}
	if d.Size() != loopSize {
		t.Fatalf("size %d (BLKGETSIZE64), want %d", d.Size(), loopSize)
	}
	if bs := d.BlockSize(); bs != 512 && bs != PageSize {
		t.Fatalf("logical block size %d (BLKSSZGET)", bs)
	}
	roundTrip(t, d)
	_, err := d.ReadAt(AlignedBuffer(PageSize), loopSize)
	wantErr(t, err, "read", d.Path(), ErrOutOfRange)
	_, err = d.ReadAt(AlignedBuffer(2 * PageSize)[1:][:d.BlockSize()], 0)
	wantErr(t, err, "read", d.Path(), ErrUnaligned)
}

func TestLoopDiscardReadsZeros(t *testing.T) {
	d, backing := openLoop(t)
	data := patterned(loopSize, 0, 12)
	if _, err := d.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	before := allocated(t, backing)
	const off, n = 2 << 20, 4 << 20
	if err := d.Discard(off, n); err != nil {
		t.Fatal(err)
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	got := AlignedBuffer(loopSize)
	if _, err := d.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !isZero(got[off : off+n]) {
		t.Fatal("discarded range does not read back zeros")
	}
	checkBytes(t, "before the discarded range", got[:off], data[:off])
	checkBytes(t, "after the discarded range", got[off+n:], data[off+n:])
	// The loop driver turns the deallocating Write Zeroes into a hole in its
	// file: the space really is given back.
	after := allocated(t, backing)
	t.Logf("backing file: %d bytes allocated before the discard, %d after", before, after)
	if before-after < n {
		t.Fatalf("discard of %d bytes freed only %d in the loop device's file", n, before-after)
	}
}

func TestLoopDiscardZeroOutFallback(t *testing.T) {
	// A device without a deallocating Write Zeroes refuses the punch; the
	// range is then zeroed with BLKZEROOUT.
	d, _ := openLoop(t)
	data := patterned(loopSize, 0, 13)
	if _, err := d.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	d.sys.fallocate = func(int, uint32, int64, int64) error { return unix.EOPNOTSUPP }
	zeroOuts := 0
	realZeroOut := d.sys.zeroOut
	d.sys.zeroOut = func(fd int, off, length int64) error {
		zeroOuts++
		return realZeroOut(fd, off, length)
	}
	const off, n = PageSize, 64 * PageSize
	if err := d.Discard(off, n); err != nil {
		t.Fatal(err)
	}
	if zeroOuts != 1 {
		t.Fatalf("BLKZEROOUT issued %d times, want once", zeroOuts)
	}
	got := AlignedBuffer(loopSize)
	if _, err := d.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !isZero(got[off : off+n]) {
		t.Fatal("range zeroed with BLKZEROOUT does not read back zeros")
	}
	checkBytes(t, "outside the zeroed range", got[off+n:], data[off+n:])

	d.sys.zeroOut = func(int, int64, int64) error { return unix.EIO }
	err := d.Discard(0, PageSize)
	wantErr(t, err, "discard", d.Path(), syscall.EIO)
	if !strings.Contains(err.Error(), "BLKZEROOUT") {
		t.Fatalf("error %q does not say which request failed", err)
	}
}

func TestLoopReadOnly(t *testing.T) {
	backing := createTemp(t, loopSize)
	want := patterned(PageSize, 0, 14)
	rw, err := Open(backing)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rw.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	rw.Close()
	dev := attachLoop(t, backing, true)

	// The kernel lets a read-only block device be opened read-write; Open
	// must refuse and say why rather than fail every write later.
	_, err = Open(dev)
	wantErr(t, err, "open", dev, ErrReadOnly)
	if !strings.Contains(err.Error(), "WithReadOnly") {
		t.Fatalf("error %q does not say what to do", err)
	}

	d, err := Open(dev, WithReadOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	got := AlignedBuffer(PageSize)
	if _, err := d.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	checkBytes(t, "read-only loop device", got, want)
	_, err = d.WriteAt(got, 0)
	wantErr(t, err, "write", dev, ErrReadOnly)
}

func TestLoopExclusive(t *testing.T) {
	d, _ := openLoop(t)
	// A second writable open would let two owners write the same blocks.
	_, err := Open(d.Path())
	wantErr(t, err, "open", d.Path(), syscall.EBUSY)
	if !strings.Contains(err.Error(), "in use") {
		t.Fatalf("error %q does not say the device is in use", err)
	}
	for _, opt := range []Option{WithoutExclusive(), WithReadOnly()} {
		shared, err := Open(d.Path(), opt)
		if err != nil {
			t.Fatalf("non-exclusive open next to an exclusive one: %v", err)
		}
		shared.Close()
	}
}

func TestLoopMinSize(t *testing.T) {
	backing := createTemp(t, loopSize)
	dev := attachLoop(t, backing, false)
	_, err := Open(dev, WithMinSize(2*loopSize))
	wantErr(t, err, "open", dev, ErrTooSmall)
	// The failed open released its exclusive claim.
	d, err := Open(dev, WithMinSize(loopSize))
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
}
