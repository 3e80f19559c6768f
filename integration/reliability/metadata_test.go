package reliability_test

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/internal/banner"
	"github.com/nprdma/nprdma/target"
)

// The metadata store failing under a serving target (docs/reliability.md
// §2, "The metadata store"): the real nprdma-target serves a backing file
// that lives outside --data-dir, a host writes, then the data directory
// fails. Each test checks that the failure shows on /healthz and in the
// metrics while the host's I/O goes on, that SIGTERM ends the process
// within --shutdown-timeout + 1 s with status 1 and a message saying what
// was and was not persisted, and that a restart on a healthy directory
// reports an unclean stop and serves the same namespace, with the same
// identity and every write.

// metaShutdownTimeout is the --shutdown-timeout of these tests. The bound
// asserted is the one the issue states, this plus 1 s: the stop itself
// takes milliseconds here (nothing in flight, 8 MiB to flush), so the
// margin is for a loaded machine scheduling the process's exit.
const metaShutdownTimeout = 3 * time.Second

// metaTarget is a target process whose metadata store is about to fail.
type metaTarget struct {
	backing, dataDir, listen, metrics string
	p                                 *targetProc
}

func (m *metaTarget) args() []string {
	return append(targetArgs(m.backing, m.dataDir, m.listen, "4MiB"), "--metrics-addr", m.metrics,
		"--metadata-probe-interval", "100ms", "--shutdown-timeout", metaShutdownTimeout.String())
}

// get fetches path from the metrics server: status and body.
func (m *metaTarget) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + m.metrics + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// runMetadataFailure runs the scenario with the data directory dataDir:
// breakDir makes it fail while the target serves, repair makes it healthy
// again after the process exited; the log and the message must name one of
// causes (the error the store's first failed write met).
func runMetadataFailure(t *testing.T, dataDir string, breakDir, repair func(), causes ...string) {
	dir := t.TempDir()
	m := &metaTarget{backing: filepath.Join(dir, "disk.img"), dataDir: dataDir, listen: freeAddr(t), metrics: freeAddr(t)}
	if err := blockdev.Create(m.backing, 8<<20); err != nil {
		t.Fatal(err)
	}
	m.p = startTargetProc(t, m.args()...)
	_, n := connectProc(t, m.p.addr, initiator.WithControllerLossTimeout(2*time.Second), initiator.WithQPTimeout(2*time.Second))
	nguid := n.NGUID()
	if code, body := m.get(t, "/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/healthz before the failure: %d %q", code, body)
	}
	before := make([]byte, 1<<20)
	fillPattern(before, 0, 1)
	if _, err := n.WriteAt(before, 0); err != nil { // not flushed: the shutdown must
		t.Fatal(err)
	}

	breakDir()
	// The probe (every 100 ms) is the first metadata write this target
	// makes while serving; 30 s is only a bound against a hang.
	var code int
	var body string
	if !eventually(30*time.Second, func() bool { code, body = m.get(t, "/healthz"); return code != http.StatusOK }) {
		t.Fatal("/healthz still ok 30 s after the metadata directory failed")
	}
	cause := ""
	for _, c := range causes {
		if strings.Contains(body, c) {
			cause = c
		}
	}
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "metadata store") || cause == "" ||
		!strings.Contains(body, "block I/O is served") {
		t.Fatalf("/healthz after the failure: %d %q", code, body)
	}
	_, metrics := m.get(t, "/metrics")
	for _, want := range []string{"nprdma_target_metadata_healthy 0", "nprdma_target_metadata_write_errors_total 1"} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("metrics lack %q after the failure", want)
		}
	}
	if code, body := m.get(t, "/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz after the metadata failure: %d %q (hosts may still connect)", code, body)
	}
	// Block I/O goes on: a write, a flush, a read back.
	after := make([]byte, 1<<20)
	fillPattern(after, 2<<20, 2)
	if _, err := n.WriteAt(after, 2<<20); err != nil {
		t.Fatalf("write after the metadata failure: %v", err)
	}
	if err := n.Flush(); err != nil {
		t.Fatalf("flush after the metadata failure: %v", err)
	}
	got := make([]byte, 1<<20)
	if _, err := n.ReadAt(got, 2<<20); err != nil || !bytes.Equal(got, after) {
		t.Fatalf("read back after the metadata failure: %v, equal %v", err, bytes.Equal(got, after))
	}
	more := make([]byte, 1<<20)
	fillPattern(more, 4<<20, 3)
	if _, err := n.WriteAt(more, 4<<20); err != nil { // not flushed either
		t.Fatal(err)
	}

	start := time.Now()
	m.p.kill(syscall.SIGTERM)
	exit := m.p.wait(t, 60*time.Second)
	took := time.Since(start)
	out := m.p.output()
	if took > metaShutdownTimeout+time.Second {
		t.Errorf("exit %v after SIGTERM, beyond --shutdown-timeout %v + 1 s", took.Round(time.Millisecond), metaShutdownTimeout)
	}
	if exit != 1 {
		t.Errorf("exit status %d after a stop with the metadata store failed, want 1", exit)
	}
	for _, want := range []string{"shutdown not clean", "page data: every namespace (1) flushed to its backing device: no acknowledged write is lost",
		"clean-shutdown marker: not written (the metadata store failed)", "host-list and namespace records: 2 written since the start",
		"metadata store: not closed, left to process exit", cause} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if c := strings.Count(out, "metadata store failed:"); c != 1 {
		t.Errorf("the failure was logged %d times, want once", c)
	}
	if t.Failed() {
		t.Fatalf("output:\n%s", out)
	}
	t.Logf("SIGTERM to exit: %v", took.Round(time.Millisecond))
	file, err := os.ReadFile(m.backing)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		off  int64
		data []byte
	}{{0, before}, {2 << 20, after}, {4 << 20, more}} {
		if !bytes.Equal(file[w.off:w.off+int64(len(w.data))], w.data) {
			t.Fatalf("the write at %d acknowledged before SIGTERM is not on the backing file", w.off)
		}
	}

	repair()
	m.p = startTargetProc(t, m.args()...)
	if want := banner.PreviousRun + target.PreviousRunUnclean.String(); !strings.Contains(m.p.banner, want) {
		t.Fatalf("restart on the repaired directory: %q, want %q", m.p.banner, want)
	}
	_, n2 := connectProc(t, m.p.addr)
	if n2.NGUID() != nguid {
		t.Fatalf("namespace identity changed across the restart: %x, was %x", n2.NGUID(), nguid)
	}
	if _, err := n2.ReadAt(got, 4<<20); err != nil || !bytes.Equal(got, more) {
		t.Fatalf("read back after the restart: %v, equal %v", err, bytes.Equal(got, more))
	}
	if code, _ := m.get(t, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz after the restart on a healthy directory: %d", code)
	}
	m.p.kill(syscall.SIGTERM)
	if exit := m.p.wait(t, 60*time.Second); exit != 0 {
		t.Fatalf("exit %d from a clean stop on the repaired directory:\n%s", exit, m.p.output())
	}
}

// TestMetadataDirRemovedWhileServing: the data directory is removed (rm
// -rf), as in the report that found the hang. Badger would go on writing
// into its unlinked files and never close. The records in a removed
// directory are gone with it, so the restart is on a copy taken while the
// target served, as an operator restoring a backup would; its
// clean-shutdown marker is absent, as in the store that was removed.
func TestMetadataDirRemovedWhileServing(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	saved := filepath.Join(t.TempDir(), "meta")
	runMetadataFailure(t, dataDir, func() {
		if err := os.CopyFS(saved, os.DirFS(filepath.Join(dataDir, "meta"))); err != nil {
			t.Fatal(err)
		}
		// The probe may create a file in a directory RemoveAll has just
		// emptied ("directory not empty"): it tries again, as rm -rf would
		// be run again.
		var err error
		for range 50 {
			if err = os.RemoveAll(dataDir); err == nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
	}, func() {
		if err := os.MkdirAll(dataDir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(saved, filepath.Join(dataDir, "meta")); err != nil {
			t.Fatal(err)
		}
	}, "no such file or directory")
}

// TestMetadataDirReadOnlyWhileServing: the file system of the data
// directory turns read-only under the target, as ext4 does with
// errors=remount-ro when it meets an error: the test raises one through
// ext4's trigger_fs_error on a file system of its own on a loop device.
// (A tmpfs cannot stand in: remounting it read-only fails with EBUSY while
// badger holds its files open for writing.) The restart follows e2fsck and
// a fresh mount, as an operator's repair would.
func TestMetadataDirReadOnlyWhileServing(t *testing.T) {
	fs := mountExt4(t)
	trigger := filepath.Join("/sys/fs/ext4", filepath.Base(fs.dev), "trigger_fs_error")
	if _, err := os.Stat(trigger); err != nil {
		t.Skipf("needs ext4's %s to raise a file-system error: %v", trigger, err)
	}
	runMetadataFailure(t, filepath.Join(fs.mnt, "data"), func() {
		if err := os.WriteFile(trigger, []byte("nprdma test: the metadata directory fails\n"), 0o200); err != nil {
			t.Fatal(err)
		}
	}, fs.repair, "read-only file system", "input/output error") // EIO for a write the error caught in flight
}

// ext4FS is an ext4 file system on a loop device over a file, mounted with
// errors=remount-ro.
type ext4FS struct {
	t        *testing.T
	img, dev string
	mnt      string
	mounted  bool
}

// mountExt4 makes and mounts a 64 MiB ext4 file system in the test's
// temporary directory; it is unmounted and its loop device detached when
// the test ends (after the processes the test started are gone). It skips
// without root, the tools or a loop device.
func mountExt4(t *testing.T) *ext4FS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a file system on a loop device")
	}
	for _, tool := range []string{"losetup", "mkfs.ext4", "e2fsck", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (util-linux, e2fsprogs)", tool)
		}
	}
	dir := t.TempDir()
	fs := &ext4FS{t: t, img: filepath.Join(dir, "ext4.img"), mnt: filepath.Join(dir, "mnt")}
	if err := os.Mkdir(fs.mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fs.img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(fs.img, 64<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", fs.img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	out, err := exec.Command("losetup", "--find", "--show", fs.img).CombinedOutput()
	if err != nil {
		t.Skipf("no loop device: losetup: %v %s", err, out)
	}
	fs.dev = strings.TrimSpace(string(out))
	t.Cleanup(func() {
		fs.unmount()
		if out, err := exec.Command("losetup", "-d", fs.dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v %s", fs.dev, err, out)
		}
	})
	fs.mount()
	return fs
}

func (fs *ext4FS) mount() {
	fs.t.Helper()
	if out, err := exec.Command("mount", "-t", "ext4", "-o", "errors=remount-ro", fs.dev, fs.mnt).CombinedOutput(); err != nil {
		fs.t.Fatalf("mount %s: %v %s", fs.dev, err, out)
	}
	fs.mounted = true
}

func (fs *ext4FS) unmount() {
	if !fs.mounted {
		return
	}
	if out, err := exec.Command("umount", fs.mnt).CombinedOutput(); err != nil {
		fs.t.Errorf("umount %s: %v %s", fs.mnt, err, out)
		return
	}
	fs.mounted = false
}

// repair unmounts, checks and mounts again, as after an error that turned
// the file system read-only.
func (fs *ext4FS) repair() {
	fs.t.Helper()
	fs.unmount()
	// Exit status 1: errors corrected; 0: none.
	if out, err := exec.Command("e2fsck", "-fy", fs.dev).CombinedOutput(); err != nil {
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() > 1 {
			fs.t.Fatalf("e2fsck %s: %v\n%s", fs.dev, err, out)
		}
	}
	fs.mount()
}
