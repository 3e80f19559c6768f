package fuseblk

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nprdma/nprdma/initiator/blockio"
	"github.com/nprdma/nprdma/internal/fiotest"
	"github.com/nprdma/nprdma/internal/leaktest"
	"github.com/nprdma/nprdma/internal/mountinfo"
)

const testBlock = 4096

// requireFUSE skips unless this process can mount FUSE (and, with loop,
// bind loop devices).
func requireFUSE(t *testing.T, loop bool) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (FUSE direct mount and loop devices)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse: the kernel has no FUSE")
	}
	if loop {
		if _, err := os.Stat("/dev/loop-control"); err != nil {
			t.Skip("no /dev/loop-control: the kernel has no loop devices")
		}
	}
}

func requireTool(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("%s is not installed (scripts/deps.sh installs it)", name)
	}
}

// attachMemory attaches a fresh memory backend and detaches it (forcibly,
// if a test left it mounted) when the test ends.
func attachMemory(t *testing.T, size int64, opts ...Option) (*Attachment, *blockio.Memory) {
	t.Helper()
	requireFUSE(t, true)
	mem := blockio.NewMemory(size, testBlock)
	a, err := Attach(context.Background(), mem, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Detach(true); err != nil {
			t.Errorf("cleanup: %v", err)
			// Do not leave a dead mount behind for the next test.
			unix.Unmount(a.MountPoint(), unix.MNT_DETACH)
			os.Remove(a.MountPoint())
		}
	})
	return a, mem
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	requireTool(t, name)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = t.TempDir() // tools may leave state files behind
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func pattern(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 5))
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(rng.Uint32())
	}
	return p
}

// alignedBuf returns a page-aligned buffer for O_DIRECT.
func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	skip := (4096 - int(uintptr(unsafe.Pointer(&b[0]))&4095)) & 4095
	return b[skip : skip+n]
}

func sysfsValue(t *testing.T, dev, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), path))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestLoopDeviceServesTheBackend(t *testing.T) {
	const size = 8 << 20
	a, mem := attachMemory(t, size)
	dev := a.LoopDevice()
	if !strings.HasPrefix(dev, "/dev/loop") {
		t.Fatalf("loop device %q", dev)
	}
	if !a.DirectIO() || sysfsValue(t, dev, "loop/dio") != "1" {
		t.Fatal("direct I/O is not on for the loop device")
	}
	if got := sysfsValue(t, dev, "queue/logical_block_size"); got != "4096" {
		t.Fatalf("logical block size %s, want 4096", got)
	}
	if got := sysfsValue(t, dev, "size"); got != "16384" { // 512-byte sectors
		t.Fatalf("loop device size %s sectors, want 16384", got)
	}

	want := pattern(size, 1)
	if _, err := mem.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(dev, os.O_RDWR|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := alignedBuf(size)
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, want) {
		t.Fatal("loop device reads differ from the backend")
	}
	chunk := alignedBuf(256 << 10)
	copy(chunk, pattern(len(chunk), 2))
	if _, err := f.WriteAt(chunk, 1<<20); err != nil {
		t.Fatal(err)
	}
	copy(want[1<<20:], chunk)
	if !bytes.Equal(mem.Snapshot(), want) {
		t.Fatal("write through the loop device did not land in the backend")
	}
}

func TestFsyncOfLoopDeviceReachesFlush(t *testing.T) {
	a, mem := attachMemory(t, 4<<20)
	f, err := os.OpenFile(a.LoopDevice(), os.O_RDWR|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := alignedBuf(testBlock)
	if _, err := f.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	before, beforeFUSE := mem.Stats().Flushes, a.Stats().Flushes
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if mem.Stats().Flushes <= before || a.Stats().Flushes <= beforeFUSE {
		t.Fatalf("fsync of %s did not reach Backend.Flush (flushes %d → %d)", a.LoopDevice(), before, mem.Stats().Flushes)
	}
}

func TestDiscardReachesTrim(t *testing.T) {
	requireTool(t, "blkdiscard")
	const size = 8 << 20
	a, mem := attachMemory(t, size)
	data := pattern(size, 3)
	mem.WriteAt(data, 0)

	before := mem.Stats()
	run(t, "blkdiscard", "-o", "1048576", "-l", "1048576", a.LoopDevice())
	after := mem.Stats()
	if after.Trims <= before.Trims || a.Stats().Trims == 0 {
		t.Fatalf("blkdiscard did not reach Backend.Trim (trims %d → %d)", before.Trims, after.Trims)
	}
	clear(data[1<<20 : 2<<20])

	// Zeroing (BLKZEROOUT, no unmap) arrives as fallocate(ZERO_RANGE).
	run(t, "blkdiscard", "-z", "-o", "4194304", "-l", "65536", a.LoopDevice())
	if st := mem.Stats(); st.WriteZeroes != after.WriteZeroes+1 || a.Stats().WriteZeroes != 1 {
		t.Fatalf("blkdiscard -z did not reach Backend.WriteZeroes once (write zeroes %d → %d)", after.WriteZeroes, st.WriteZeroes)
	}
	clear(data[4<<20 : 4<<20+65536])
	if !bytes.Equal(mem.Snapshot(), data) {
		t.Fatal("discarded or zeroed ranges do not read back zeros, or other data changed")
	}
}

func TestFioVerifyOnLoopDevice(t *testing.T) {
	requireTool(t, "fio")
	a, _ := attachMemory(t, 32<<20)
	out := run(t, "fio",
		"--name=loop", "--filename="+a.LoopDevice(), "--direct=1", "--ioengine=libaio",
		"--rw=randwrite", "--bs=4k", "--iodepth=32", "--numjobs=2",
		"--size=8M", "--offset_increment=16M",
		"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--verify_state_save=0",
		"--group_reporting", "--output-format=json")
	if err := fiotest.CheckVerify([]byte(out), 16<<20); err != nil {
		t.Fatal(err)
	}
}

func TestExt4OnLoopDevice(t *testing.T) {
	requireTool(t, "mkfs.ext4")
	requireTool(t, "e2fsck")
	a, mem := attachMemory(t, 64<<20)
	dev := a.LoopDevice()
	run(t, "mkfs.ext4", "-q", "-F", dev)
	if mem.Stats().Trims == 0 {
		t.Error("mkfs.ext4 discarded nothing (its discard should reach Backend.Trim)")
	}

	mnt := t.TempDir()
	files := map[string][]byte{
		"small":          []byte("hello, nprdma\n"),
		"dir/medium.bin": pattern(300_000, 4),
		"large.bin":      pattern(5<<20, 5),
	}
	mountExt4 := func() {
		t.Helper()
		if err := unix.Mount(dev, mnt, "ext4", 0, ""); err != nil {
			t.Fatalf("mount %s: %v", dev, err)
		}
	}
	umount := func() {
		t.Helper()
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Fatalf("umount %s: %v", mnt, err)
		}
	}
	mountExt4()
	os.Mkdir(filepath.Join(mnt, "dir"), 0o755)
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(mnt, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	unix.Sync()
	umount()

	mountExt4() // a fresh mount: the data comes from the device, not the page cache
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(mnt, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s read back wrong after remount: %v", name, err)
		}
	}
	umount()
	run(t, "e2fsck", "-fn", dev)
}

func TestDetachRefusesWhileMountedUnlessForced(t *testing.T) {
	requireTool(t, "mkfs.ext4")
	requireFUSE(t, true)
	baseline := runtime.NumGoroutine()
	mem := blockio.NewMemory(32<<20, testBlock)
	a, err := Attach(context.Background(), mem)
	if err != nil {
		t.Fatal(err)
	}
	dev, file, fuseDir := a.LoopDevice(), a.File(), a.MountPoint()
	run(t, "mkfs.ext4", "-q", "-F", dev)
	mnt := t.TempDir()
	if err := unix.Mount(dev, mnt, "ext4", 0, ""); err != nil {
		a.Detach(true)
		t.Fatal(err)
	}

	err = a.Detach(false)
	var mounted *MountedError
	if !errors.As(err, &mounted) || mounted.Device != dev || len(mounted.MountPoints) != 1 || mounted.MountPoints[0] != mnt {
		a.Detach(true)
		t.Fatalf("Detach while mounted: %v", err)
	}
	if !strings.Contains(err.Error(), mnt) {
		t.Errorf("error does not name the mount point: %v", err)
	}
	// Refusing changed nothing: still mounted, still bound, still served.
	if !isMountPoint(mnt) || a.LoopDevice() != dev {
		t.Fatal("a refused Detach tore something down")
	}
	if err := os.WriteFile(filepath.Join(mnt, "f"), []byte("still here"), 0o644); err != nil {
		t.Fatal(err)
	}

	if err := a.Detach(true); err != nil {
		t.Fatalf("forced Detach: %v", err)
	}
	assertTornDown(t, mnt, file, fuseDir)
	leaktest.WaitGoroutines(t, baseline, 20*time.Second)
}

func TestDetachLeavesNothingBehind(t *testing.T) {
	requireFUSE(t, true)
	baseline := runtime.NumGoroutine()
	mem := blockio.NewMemory(4<<20, testBlock)
	a, err := Attach(context.Background(), mem)
	if err != nil {
		t.Fatal(err)
	}
	file, dir := a.File(), a.MountPoint()
	if devs, _ := LoopDevicesFor(file); len(devs) != 1 || devs[0] != a.LoopDevice() {
		t.Fatalf("loop devices for %s: %v, want [%s]", file, devs, a.LoopDevice())
	}
	flushes := mem.Stats().Flushes
	if err := a.Detach(false); err != nil {
		t.Fatal(err)
	}
	if mem.Stats().Flushes == flushes {
		t.Error("Detach did not flush the backend")
	}
	assertTornDown(t, "", file, dir)
	if err := a.Detach(false); err != nil {
		t.Fatalf("second Detach: %v", err)
	}
	leaktest.WaitGoroutines(t, baseline, 20*time.Second)
}

func TestDetachWhileLoopDeviceIsHeldOpen(t *testing.T) {
	requireFUSE(t, true)
	baseline := runtime.NumGoroutine()
	a, err := Attach(context.Background(), blockio.NewMemory(4<<20, testBlock), WithDetachTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	dev, file, dir := a.LoopDevice(), a.File(), a.MountPoint()
	holder, err := os.OpenFile(dev, os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		a.Detach(true)
		t.Fatal(err)
	}
	defer holder.Close()
	buf := alignedBuf(testBlock)

	if err := a.Detach(false); err == nil || !strings.Contains(err.Error(), "still in use") {
		t.Fatalf("Detach with the device held open: %v", err)
	}
	if _, err := holder.ReadAt(buf, 0); err != nil {
		t.Fatalf("refused Detach broke the device: %v", err)
	}
	if err := a.Detach(true); err == nil || !strings.Contains(err.Error(), dev) {
		t.Fatalf("forced Detach with the device held open reported %v, want a note about %s", err, dev)
	}
	if _, err := holder.ReadAt(buf, 0); err == nil {
		t.Fatal("the held device still reads after a forced Detach")
	}
	holder.Close()
	// Autoclear unbinds the device at its last close.
	for deadline := time.Now().Add(20 * time.Second); ; {
		if devs, _ := LoopDevicesFor(file); len(devs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still bound after its last user closed it", dev)
		}
		time.Sleep(10 * time.Millisecond)
	}
	assertTornDown(t, "", file, dir)
	if err := a.Detach(true); err != nil {
		t.Fatalf("Detach after a forced Detach: %v", err)
	}
	leaktest.WaitGoroutines(t, baseline, 20*time.Second)
}

// TestStaleLoopDeviceIsLeftToItsNewOwner: a detach refused because another
// program held the loop device leaves it to autoclear; once that program
// closes it, the number can serve another attachment. The first attachment's
// later Detach must then neither see the newcomer's mount nor unmount it
// (forced), and must detach cleanly. A review found the forced detach
// unmounting the other attachment's file system.
func TestStaleLoopDeviceIsLeftToItsNewOwner(t *testing.T) {
	requireTool(t, "mkfs.ext4")
	requireFUSE(t, true)
	a, err := Attach(context.Background(), blockio.NewMemory(4<<20, testBlock), WithDetachTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	dev := a.LoopDevice()
	holder, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		a.Detach(true)
		t.Fatal(err)
	}
	if err := a.Detach(false); err == nil || !strings.Contains(err.Error(), "still in use") {
		holder.Close()
		a.Detach(true)
		t.Fatalf("Detach with the device held open: %v", err)
	}
	holder.Close()
	// The newcomer gets the lowest free number: very likely the same device.
	var b *Attachment
	for deadline := time.Now().Add(20 * time.Second); ; {
		if b, err = Attach(context.Background(), blockio.NewMemory(32<<20, testBlock)); err != nil {
			a.Detach(true)
			t.Fatal(err)
		}
		if b.LoopDevice() == dev || time.Now().After(deadline) {
			break
		}
		b.Detach(true) // the old binding was not released yet: try again
		time.Sleep(20 * time.Millisecond)
	}
	defer b.Detach(true)
	if b.LoopDevice() != dev {
		a.Detach(true)
		t.Skipf("the new attachment got %s, not %s: nothing to check", b.LoopDevice(), dev)
	}
	run(t, "mkfs.ext4", "-q", "-F", dev)
	mnt := t.TempDir()
	if err := unix.Mount(dev, mnt, "ext4", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(mnt, 0)
	if err := a.Detach(true); err != nil {
		t.Fatalf("Detach of the first attachment: %v", err)
	}
	if !isMountPoint(mnt) {
		t.Fatal("the first attachment's forced Detach unmounted the new attachment's file system")
	}
	if err := os.WriteFile(filepath.Join(mnt, "f"), []byte("still here"), 0o644); err != nil {
		t.Fatalf("the new attachment's file system after the other's Detach: %v", err)
	}
}

func TestForcedDetachAbortsABusyFUSEFile(t *testing.T) {
	requireFUSE(t, false)
	baseline := runtime.NumGoroutine()
	a, err := Attach(context.Background(), blockio.NewMemory(1<<20, testBlock), WithoutLoop())
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(a.File()) // keeps the mount busy
	if err != nil {
		a.Detach(true)
		t.Fatal(err)
	}
	defer f.Close()
	if err := a.Detach(false); err == nil || !strings.Contains(err.Error(), "still open") {
		a.Detach(true)
		t.Fatalf("Detach of a busy FUSE mount: %v", err)
	}
	if _, err := f.ReadAt(make([]byte, 512), 0); err != nil {
		t.Fatalf("refused Detach broke the file: %v", err)
	}
	if err := a.Detach(true); err != nil {
		t.Fatalf("forced Detach: %v", err)
	}
	if _, err := f.ReadAt(make([]byte, 512), 0); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("read after forced Detach: %v, want ENOTCONN", err)
	}
	assertTornDown(t, "", a.File(), a.MountPoint())
	if mounts, _ := mountinfo.Read(); slicesContainsFsType(mounts, "fusectl") && !fusectlWasMounted {
		t.Error("fusectl left mounted")
	}
	leaktest.WaitGoroutines(t, baseline, 20*time.Second)
}

var fusectlWasMounted = func() bool {
	mounts, _ := mountinfo.Read()
	return slicesContainsFsType(mounts, "fusectl")
}()

func slicesContainsFsType(mounts []mountinfo.Entry, fsType string) bool {
	for _, m := range mounts {
		if m.FSType == fsType {
			return true
		}
	}
	return false
}

// assertTornDown checks that no mount, loop device or directory of an
// attachment is left.
func assertTornDown(t *testing.T, fsMount, file, fuseDir string) {
	t.Helper()
	if fsMount != "" && isMountPoint(fsMount) {
		t.Errorf("%s is still mounted", fsMount)
	}
	if devs, err := LoopDevicesFor(file); err != nil || len(devs) != 0 {
		t.Errorf("loop devices still bound to %s: %v (%v)", file, devs, err)
	}
	if isMountPoint(fuseDir) {
		t.Errorf("FUSE still mounted at %s", fuseDir)
	}
	if _, err := os.Stat(fuseDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("mount directory %s left behind: %v", fuseDir, err)
	}
}

// TestFUSEFileSemantics drives the file directly (no loop device): the
// operations the loop driver and tools use, at odd offsets too.
func TestFUSEFileSemantics(t *testing.T) {
	requireFUSE(t, false)
	const size = 1 << 20
	mem := blockio.NewMemory(size, testBlock)
	a, err := Attach(context.Background(), mem, WithoutLoop(), WithFileName("ns1"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := a.Detach(false); err != nil {
			t.Error(err)
		}
	}()
	if a.LoopDevice() != "" || filepath.Base(a.File()) != "ns1" {
		t.Fatalf("loop %q file %q", a.LoopDevice(), a.File())
	}
	fi, err := os.Stat(a.File())
	if err != nil || fi.Size() != size {
		t.Fatalf("stat: size %d, %v", fi.Size(), err)
	}
	f, err := os.OpenFile(a.File(), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	want := make([]byte, size)
	odd := pattern(10_000, 6)
	if _, err := f.WriteAt(odd, 123); err != nil { // unaligned: read-modify-write
		t.Fatal(err)
	}
	copy(want[123:], odd)
	got := make([]byte, 20_000)
	if _, err := f.ReadAt(got, 100); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want[100:20_100]) {
		t.Fatal("unaligned write/read through the FUSE file returned wrong bytes")
	}

	// Writes stop at the end; the size never changes.
	if n, err := f.WriteAt(make([]byte, 100), size-10); n != 10 && !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write across the end: n=%d err=%v", n, err)
	}
	if _, err := f.WriteAt([]byte{1}, size); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write at the end: %v, want ENOSPC", err)
	}
	if err := f.Truncate(size / 2); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("truncate: %v, want EPERM", err)
	}

	// fallocate: punch hole → Trim, zero range → WriteZeroes, both read zeros.
	before := mem.Stats()
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 8192); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, 8192, 4096); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_COLLAPSE_RANGE, 0, 4096); !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Fatalf("collapse range: %v, want EOPNOTSUPP", err)
	}
	after := mem.Stats()
	if after.Trims != before.Trims+1 || after.WriteZeroes != before.WriteZeroes+1 {
		t.Fatalf("trims %d→%d, write zeroes %d→%d", before.Trims, after.Trims, before.WriteZeroes, after.WriteZeroes)
	}
	clear(want[:12288])
	if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, want[:len(got)]) {
		t.Fatalf("punched/zeroed range: %v", err)
	}

	if err := f.Sync(); err != nil || mem.Stats().Flushes == after.Flushes {
		t.Fatalf("fsync did not reach Backend.Flush: %v", err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil || st.Bsize != 4096 {
		t.Fatalf("statfs block size %d: %v", st.Bsize, err)
	}

	mem.FailWith(syscall.EIO)
	if _, err := f.ReadAt(got[:4096], 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read from a failing backend: %v, want EIO", err)
	}
	mem.FailWith(nil)
	if a.Stats().Errors == 0 {
		t.Fatal("backend failure not counted")
	}
}

func TestReadOnlyAttachment(t *testing.T) {
	a, mem := attachMemory(t, 4<<20, WithReadOnly())
	want := pattern(testBlock, 8)
	mem.WriteAt(want, 0)
	before := mem.Stats()
	if got := sysfsValue(t, a.LoopDevice(), "ro"); got != "1" {
		t.Fatalf("loop device ro=%s, want 1", got)
	}
	if w, err := os.OpenFile(a.LoopDevice(), os.O_RDWR|syscall.O_DIRECT, 0); err == nil {
		_, werr := w.WriteAt(alignedBuf(testBlock), 0)
		w.Close()
		if werr == nil {
			t.Fatal("wrote to a read-only loop device")
		}
	}
	if _, err := os.OpenFile(a.File(), os.O_RDWR, 0); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("opening the read-only file for writing: %v, want EROFS", err)
	}
	f, err := os.OpenFile(a.LoopDevice(), os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := alignedBuf(testBlock)
	if _, err := f.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, want) {
		t.Fatalf("read from the read-only loop device: %v", err)
	}
	if st := mem.Stats(); st.Writes+st.Trims+st.WriteZeroes+st.Flushes != before.Writes+before.Trims+before.WriteZeroes+before.Flushes {
		t.Fatalf("read-only attachment wrote or flushed: %+v, before %+v", st, before)
	}
}

func TestAttachRejectsBadOptions(t *testing.T) {
	mem := blockio.NewMemory(1<<20, testBlock)
	for _, opts := range [][]Option{
		{WithFileName("a/b"), WithoutLoop()},
		{WithLoopBlockSize(1000)},
		{WithLoopBlockSize(8192)},
	} {
		if a, err := Attach(context.Background(), mem, opts...); err == nil {
			a.Detach(true)
			t.Errorf("Attach with bad options succeeded")
		}
	}
	if _, err := Attach(context.Background(), blockio.NewMemory(0, testBlock), WithoutLoop()); err == nil {
		t.Error("Attach of an empty backend succeeded")
	}
}
