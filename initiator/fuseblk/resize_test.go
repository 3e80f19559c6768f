package fuseblk

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nprdma/nprdma/initiator/blockio"
	"github.com/nprdma/nprdma/internal/caps"
)

// growable is a backend whose size grows when the test says so, as an
// initiator namespace does when the target resizes it.
type growable struct {
	blockio.Backend
	size atomic.Int64
}

func (g *growable) Size() int64 { return g.size.Load() }

// TestResizeGrowsTheMountedLoopDevice: the backend grows under a mounted
// ext4; Resize makes the FUSE file and the loop device follow, resize2fs
// grows the file system online, and a file written into the new space and
// the old one read back after a remount.
func TestResizeGrowsTheMountedLoopDevice(t *testing.T) {
	requireFUSE(t, true)
	requireTool(t, "mkfs.ext4")
	requireTool(t, "resize2fs")
	mem := blockio.NewMemory(96<<20, testBlock)
	g := &growable{Backend: mem}
	g.size.Store(32 << 20)
	a, err := Attach(context.Background(), g)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Detach(true)
	dev := a.LoopDevice()
	sectors := func() int64 {
		n, err := strconv.ParseInt(sysfsValue(t, dev, "size"), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n * 512
	}
	if got := sectors(); got != 32<<20 {
		t.Fatalf("%s is %d bytes", dev, got)
	}
	run(t, "mkfs.ext4", "-q", "-F", dev)
	mnt := t.TempDir()
	if err := unix.Mount(dev, mnt, "ext4", 0, ""); err != nil {
		t.Fatal(err)
	}
	mounted := true
	defer func() {
		if mounted {
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
	}()
	old := pattern(8<<20, 1)
	if err := os.WriteFile(filepath.Join(mnt, "old"), old, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := a.Resize(); err != nil {
		t.Fatalf("Resize with the size unchanged: %v", err)
	}

	g.size.Store(96 << 20)
	if err := a.Resize(); err != nil {
		t.Fatal(err)
	}
	if got := sectors(); got != 96<<20 {
		t.Fatalf("%s is %d bytes after Resize", dev, got)
	}
	if st, err := os.Stat(a.File()); err != nil || st.Size() != 96<<20 {
		t.Fatalf("FUSE file after Resize: %v %v", st, err)
	}
	if caps.Effective(unix.CAP_SYS_RESOURCE) {
		run(t, "resize2fs", dev) // online
	} else {
		// ext4's online resize (EXT4_IOC_RESIZE_FS) wants CAP_SYS_RESOURCE,
		// which some sandboxes withhold from root: grow it unmounted.
		t.Log("no CAP_SYS_RESOURCE: resizing the file system offline")
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Fatal(err)
		}
		run(t, "e2fsck", "-fy", dev)
		run(t, "resize2fs", dev)
		if err := unix.Mount(dev, mnt, "ext4", 0, ""); err != nil {
			t.Fatal(err)
		}
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(mnt, &fs); err != nil {
		t.Fatal(err)
	}
	if total := int64(fs.Blocks) * fs.Bsize; total < 80<<20 {
		t.Fatalf("file system of %d bytes after resize2fs", total)
	}
	big := pattern(40<<20, 2) // more than the old device held
	if err := os.WriteFile(filepath.Join(mnt, "big"), big, 0o644); err != nil {
		t.Fatalf("writing into the grown space: %v", err)
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dev, mnt, "ext4", 0, ""); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]byte{"old": old, "big": big} {
		got, err := os.ReadFile(filepath.Join(mnt, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s after the remount: %v", name, err)
		}
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	mounted = false

	g.size.Store(64 << 20)
	if err := a.Resize(); err == nil {
		t.Fatal("Resize accepted a backend that shrank")
	}
	if err := a.Detach(false); err != nil {
		t.Fatal(err)
	}
	if err := a.Resize(); err == nil || err == syscall.Errno(0) {
		t.Fatal("Resize after Detach succeeded")
	}
}
