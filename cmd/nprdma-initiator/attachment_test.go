package main

// End-to-end tests of attach, list and detach: the CLI runs as real
// processes (this test binary re-executed, see TestMain) against a target
// served by the test process, with a namespace four times its DRAM budget.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/initiator/attach"
	"github.com/nprdma/nprdma/internal/fiotest"
	"github.com/nprdma/nprdma/internal/promtest"
	"github.com/nprdma/nprdma/nprdma/tcp"
	"github.com/nprdma/nprdma/target"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// envRunMain makes the test binary run the program instead of the tests.
const envRunMain = "NPRDMA_INITIATOR_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(envRunMain) == "1" {
		main()
		os.Exit(0)
	}
	// Attachments of tests that run the app in-process must not land in
	// the machine's /run/nprdma; the CLI tests below pass their own.
	dir, err := os.MkdirTemp("", "nprdma-initiator-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("NPRDMA_RUN_DIR", filepath.Join(dir, "run"))
	if os.Getenv("NPRDMA_STATE_DIR") == "" {
		os.Setenv("NPRDMA_STATE_DIR", filepath.Join(dir, "state"))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const (
	cliHost   = "nqn.2024-01.io.nprdma:attach-test-host"
	cliSubNQN = "nqn.2024-01.io.nprdma:attach-test"
	nsSize    = 256 << 20 // four times the target's DRAM budget
)

// cliEnv is a target in this process and a run directory for the CLI.
type cliEnv struct {
	t      *testing.T
	tg     *target.Target
	addr   string
	reg    *prometheus.Registry
	runDir string
	dir    string   // the target's backing and metadata
	also   []string // listen addresses after the first (shm)
}

func newCLIEnv(t *testing.T, also ...string) *cliEnv {
	t.Helper()
	e := &cliEnv{t: t, also: also}
	dir := t.TempDir()
	e.dir = dir
	e.startTarget("127.0.0.1:0", dir, nsSize)
	t.Cleanup(func() { e.tg.Close() }) // after the attachments are gone (cleanups run last-in first-out)
	e.runDir = filepath.Join(dir, "run")
	t.Cleanup(e.cleanUp)
	return e
}

// startTarget starts the env's target on listen, with its metadata and a
// namespace 1 of size bytes (four times its budget) in dir: a new namespace
// identity unless dir held one.
func (e *cliEnv) startTarget(listen, dir string, size int64) {
	t := e.t
	t.Helper()
	reg := prometheus.NewRegistry()
	tg, err := target.New(target.WithProvider(tcp.New()), target.WithListen(append([]string{listen}, e.also...)...),
		target.WithDataDir(filepath.Join(dir, "meta")), target.WithMetrics(reg),
		target.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	sub, err := tg.AddSubsystem(target.SubsystemConfig{NQN: cliSubNQN, AllowHosts: []string{cliHost}})
	if err != nil {
		tg.Close()
		t.Fatal(err)
	}
	path := filepath.Join(dir, "ns.img")
	if err := blockdev.Create(path, size); err != nil {
		tg.Close()
		t.Fatal(err)
	}
	dev, err := blockdev.Open(path)
	if err != nil {
		tg.Close()
		t.Fatal(err)
	}
	if _, err := sub.AddNamespace(target.NamespaceConfig{NSID: 1, Backing: dev, Budget: size / 4}); err != nil {
		dev.Close()
		tg.Close()
		t.Fatal(err)
	}
	if err := tg.Start(); err != nil {
		tg.Close()
		t.Fatal(err)
	}
	e.tg, e.addr, e.reg = tg, tg.Addr(), reg
}

// restartOnOtherBacking closes the target and starts another on its address
// with another namespace under the same NSID (a fresh backing of size
// bytes, a new NGUID): what the initiator must not take for its namespace.
func (e *cliEnv) restartOnOtherBacking(size int64) {
	e.t.Helper()
	e.tg.Close()
	e.startTarget(e.addr, e.t.TempDir(), size)
}

// restartInPlace stops the target, with a clean shutdown (every dirty page
// flushed, recorded) or not (to the next process, a crash), and starts
// another on the same address, backing and data directory.
func (e *cliEnv) restartInPlace(clean bool) {
	e.t.Helper()
	if clean {
		if err := e.tg.Shutdown(context.Background()); err != nil {
			e.t.Fatal(err)
		}
	} else {
		e.tg.Close()
	}
	e.startTarget(e.addr, e.dir, nsSize)
}

// cleanUp detaches whatever a failed test left attached; processes that
// do not go are killed (they are this test's own).
func (e *cliEnv) cleanUp() {
	d, err := attach.DirAt(e.runDir)
	if err != nil {
		return
	}
	recs, _ := d.List()
	if len(recs) == 0 {
		return
	}
	if _, stderr, err := e.run("detach", "--all", "--force", "--timeout", "30s"); err != nil {
		e.t.Logf("cleanup: detach --all --force: %v\n%s", err, stderr)
	}
	recs, _ = d.List()
	for _, r := range recs {
		if r.Process().Alive() {
			syscall.Kill(r.PID, syscall.SIGKILL)
			for deadline := time.Now().Add(10 * time.Second); r.Process().Alive() && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
		}
		d.Reap(r, false)
	}
}

// command is the CLI as a process, with the test's host NQN and run directory.
func (e *cliEnv) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"--hostnqn", cliHost}, args...)...)
	cmd.Env = append(os.Environ(), envRunMain+"=1", "NPRDMA_RUN_DIR="+e.runDir)
	return cmd
}

func (e *cliEnv) run(args ...string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := e.command(ctx, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

func (e *cliEnv) mustRun(args ...string) (stdout, stderr string) {
	e.t.Helper()
	out, errOut, err := e.run(args...)
	if err != nil {
		e.t.Fatalf("%v: %v\nstdout: %s\nstderr: %s", args, err, out, errOut)
	}
	return out, errOut
}

// attachDaemon attaches the namespace in the background and returns its record.
func (e *cliEnv) attachDaemon(name string, args ...string) attach.Record {
	e.t.Helper()
	out, _ := e.mustRun(append([]string{"attach", "--target", e.addr, "--nqn", cliSubNQN, "--name", name,
		"--daemon", "--json", "--io-queues", "2"}, args...)...)
	var rec attach.Record
	if err := json.Unmarshal([]byte(out), &rec); err != nil {
		e.t.Fatalf("attach --json printed %q: %v", out, err)
	}
	if rec.Name != name || rec.State != attach.StateAttached || !rec.Process().Alive() || rec.Size != nsSize || rec.Target != e.addr {
		e.t.Fatalf("attach record: %+v", rec)
	}
	return rec
}

// commandsAbove reports whether the target's count of opcode exceeds n.
// The target counts a command before it sends the completion, so a host
// that saw its command finish finds it counted.
func (e *cliEnv) commandsAbove(opcode string, n float64) bool {
	e.t.Helper()
	return e.commands(opcode) > n
}

// commands is how many commands of an opcode ("flush", "dataset-management")
// the target completed.
func (e *cliEnv) commands(opcode string) float64 {
	e.t.Helper()
	return promtest.Sum(e.t, e.reg, "nprdma_target_commands_total", "opcode", opcode)
}

// assertGone checks that an attachment left nothing behind: no process, no
// record, no socket or TCP listener, no loop device bound to its file, no
// FUSE mount or directory, no log.
func (e *cliEnv) assertGone(rec attach.Record) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for rec.Process().Alive() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if rec.Process().Alive() {
		e.t.Errorf("%s: attach process %d still running", rec.Name, rec.PID)
	}
	d, _ := attach.DirAt(e.runDir)
	if _, err := d.Load(rec.Name); !errors.Is(err, os.ErrNotExist) {
		e.t.Errorf("%s: record left: %v", rec.Name, err)
	}
	for _, p := range []string{rec.Socket, rec.FUSEMount} {
		if p == "" {
			continue
		}
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			e.t.Errorf("%s: %s left behind (%v)", rec.Name, p, err)
		}
	}
	if rec.TCPAddr != "" {
		if c, err := net.DialTimeout("tcp", rec.TCPAddr, time.Second); err == nil {
			c.Close()
			e.t.Errorf("%s: something still listens on %s", rec.Name, rec.TCPAddr)
		}
	}
	if rec.FUSEMount != "" {
		if mounted, err := attach.IsMountPoint(rec.FUSEMount); err != nil || mounted {
			e.t.Errorf("%s: FUSE mount %s still mounted (%v)", rec.Name, rec.FUSEMount, err)
		}
	}
	if rec.Device != "" {
		if f, err := attach.LoopBackingFile(rec.Device); err != nil || f == rec.FUSEFile {
			e.t.Errorf("%s: %s still bound to %q (%v)", rec.Name, rec.Device, f, err)
		}
	}
}

func needTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (scripts/deps.sh installs it)", tool)
		}
	}
}

// needLoop skips unless a loop device over a FUSE file can be made here.
func needLoop(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the fuse mode needs root (loop devices)")
	}
	for _, p := range []string{"/dev/fuse", "/dev/loop-control"} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("%s is missing: no FUSE or loop devices here", p)
		}
	}
}

func runTool(t *testing.T, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = t.TempDir() // fio, for one, leaves files in its working directory
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// fioVerify runs random 4 KiB writes then verified reads (crc32c), 2 jobs
// at QD 32 over 32 MiB each, and checks fio wrote and verified 64 MiB.
func fioVerify(t *testing.T, target ...string) {
	t.Helper()
	args := append([]string{"--name=verify", "--rw=randwrite", "--bs=4k", "--iodepth=32", "--numjobs=2",
		"--size=32m", "--offset_increment=32m", "--verify=crc32c", "--verify_fatal=1", "--verify_state_save=0",
		"--group_reporting", "--output-format=json"}, target...)
	out := runTool(t, "fio", args...)
	if err := fiotest.CheckVerify([]byte(out), 64<<20); err != nil {
		t.Fatal(err)
	}
}

func patternFile(t *testing.T, size int64, seed int64) (string, [32]byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pattern")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	w := io.MultiWriter(f, h)
	if _, err := io.CopyN(w, rand.New(rand.NewSource(seed)), size); err != nil {
		t.Fatal(err)
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return path, sum
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

// TestAttachNBDModeWithTools: attach --mode nbd in the background, then
// nbdinfo, nbdcopy and fio through the socket; detach leaves nothing.
func TestAttachNBDModeWithTools(t *testing.T) {
	needTools(t, "nbdinfo", "nbdcopy", "fio")
	e := newCLIEnv(t)
	rec := e.attachDaemon("t-nbd", "--mode", "nbd", "--tcp", "127.0.0.1:0")
	if rec.Mode != attach.ModeNBD || rec.Socket != filepath.Join(e.runDir, "t-nbd.sock") ||
		rec.URI != "nbd+unix:///t-nbd?socket="+rec.Socket || !strings.HasPrefix(rec.TCPURI, "nbd://127.0.0.1:") {
		t.Fatalf("record: %+v", rec)
	}

	// nbdinfo: the size and exactly the capabilities implemented.
	var info struct {
		Exports []map[string]any `json:"exports"`
	}
	if err := json.Unmarshal([]byte(runTool(t, "nbdinfo", "--json", rec.URI)), &info); err != nil || len(info.Exports) != 1 {
		t.Fatalf("nbdinfo --json: %v %+v", err, info)
	}
	x := info.Exports[0]
	if x["export-size"] != float64(nsSize) {
		t.Errorf("nbdinfo export-size %v, want %d", x["export-size"], nsSize)
	}
	for flag, want := range map[string]bool{"can_flush": true, "can_fua": true, "can_trim": true, "can_zero": true,
		"can_multi_conn": true, "is_read_only": false, "can_cache": false, "can_fast_zero": false} {
		if x[flag] != want {
			t.Errorf("nbdinfo %s = %v, want %v", flag, x[flag], want)
		}
	}
	if got := strings.TrimSpace(runTool(t, "nbdinfo", "--size", rec.TCPURI)); got != strconv.Itoa(nsSize) {
		t.Errorf("nbdinfo --size over TCP: %s", got)
	}

	// A known pattern over the whole export (4x the target's budget), then
	// the whole export back: the same bytes. The flush reaches the target.
	flushes := e.commands("flush")
	src, want := patternFile(t, nsSize, 1)
	runTool(t, "nbdcopy", "--flush", src, rec.URI)
	if !e.commandsAbove("flush", flushes) {
		t.Error("nbdcopy --flush did not reach the target's Flush")
	}
	back := filepath.Join(t.TempDir(), "back")
	runTool(t, "nbdcopy", rec.URI, back)
	if fileSum(t, back) != want {
		t.Fatal("nbdcopy of the whole export differs from the pattern written")
	}
	os.Remove(back)

	// Trim reaches Dataset Management.
	dsm := e.commands("dataset-management")
	runTool(t, "fio", "--name=trim", "--ioengine=nbd", "--uri="+rec.URI, "--rw=trim", "--bs=1m", "--size=4m")
	if !e.commandsAbove("dataset-management", dsm) {
		t.Error("a trim through NBD did not reach the target's Dataset Management")
	}

	fioVerify(t, "--ioengine=nbd", "--uri="+rec.URI)

	// A name that matches nothing fails the command, but the others
	// given with it are still detached.
	_, stderr, err := e.run("detach", "no-such-attachment", rec.Socket)
	if err == nil || !strings.Contains(stderr, `no attachment named "no-such-attachment"`) || !strings.Contains(stderr, "detached t-nbd") {
		t.Errorf("detach of an unknown name and t-nbd: %v, said: %s", err, stderr)
	}
	e.assertGone(rec)
	if _, err := os.Stat(rec.LogFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a cleanly detached daemon left its log %s", rec.LogFile)
	}
}

// TestAttachFUSEModeFilesystem: attach --mode fuse gives /dev/loopN with
// direct I/O; fio verifies through it, discard and fsync reach the target,
// an ext4 made on it checks clean; detach refuses while it is mounted and
// --force tears it down leaving nothing.
func TestAttachFUSEModeFilesystem(t *testing.T) {
	needLoop(t)
	needTools(t, "fio", "mkfs.ext4", "e2fsck", "blkdiscard")
	e := newCLIEnv(t)
	rec := e.attachDaemon("t-fuse", "--mode", "fuse")
	dev := rec.Device
	if rec.Mode != attach.ModeFUSE || !strings.HasPrefix(dev, "/dev/loop") || rec.FUSEMount != filepath.Join(e.runDir, "mnt", "t-fuse") {
		t.Fatalf("record: %+v", rec)
	}
	sys := filepath.Join("/sys/block", filepath.Base(dev))
	if b, _ := os.ReadFile(filepath.Join(sys, "loop", "dio")); strings.TrimSpace(string(b)) != "1" {
		t.Errorf("%s: direct I/O is %q, want 1", dev, b)
	}
	if b, _ := os.ReadFile(filepath.Join(sys, "size")); strings.TrimSpace(string(b)) != strconv.Itoa(nsSize/512) {
		t.Errorf("%s: %s sectors, want %d", dev, b, nsSize/512)
	}

	fioVerify(t, "--filename="+dev, "--ioengine=libaio", "--direct=1")

	dsm := e.commands("dataset-management")
	runTool(t, "blkdiscard", "--offset", "0", "--length", strconv.Itoa(4<<20), dev)
	if !e.commandsAbove("dataset-management", dsm) {
		t.Error("blkdiscard did not reach the target's Dataset Management")
	}
	flushes := e.commands("flush")
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if !e.commandsAbove("flush", flushes) {
		t.Error("fsync of the loop device did not reach the target's Flush")
	}

	// A filesystem: make, mount, write files, unmount, check, remount, read.
	runTool(t, "mkfs.ext4", "-q", "-F", dev)
	mnt := t.TempDir()
	mount := func() {
		t.Helper()
		if err := unix.Mount(dev, mnt, "ext4", 0, ""); err != nil {
			t.Fatalf("mount %s: %v", dev, err)
		}
	}
	mount()
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	files := map[string][]byte{}
	rng := rand.New(rand.NewSource(2))
	for i, size := range []int{100 << 10, 1 << 20, 3<<20 + 17} {
		b := make([]byte, size)
		rng.Read(b)
		name := filepath.Join(mnt, fmt.Sprintf("dir%d", i%2), fmt.Sprintf("file%d", i))
		os.MkdirAll(filepath.Dir(name), 0o755)
		if err := os.WriteFile(name, b, 0o644); err != nil {
			t.Fatal(err)
		}
		files[name] = b
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatalf("umount: %v", err)
	}
	runTool(t, "e2fsck", "-fn", dev)
	mount()
	for name, want := range files {
		if got, err := os.ReadFile(name); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s read back differs (%v)", name, err)
		}
	}

	// The unmount guard: refused while mounted, naming the mount point, and
	// the attachment keeps working.
	_, stderr, err := e.run("detach", rec.Name)
	if err == nil || !strings.Contains(stderr, dev+" is mounted at "+mnt) || !strings.Contains(stderr, "--force") {
		t.Fatalf("detach of a mounted device: %v\n%s", err, stderr)
	}
	if !rec.Process().Alive() {
		t.Fatal("the attach process ended although detach refused")
	}
	if err := os.WriteFile(filepath.Join(mnt, "after-refusal"), []byte("still here"), 0o644); err != nil {
		t.Fatalf("filesystem unusable after a refused detach: %v", err)
	}

	_, stderr = e.mustRun("detach", "--force", dev)
	if !strings.Contains(stderr, "detached t-fuse") {
		t.Errorf("detach --force said: %s", stderr)
	}
	if mounted, _ := attach.IsMountPoint(mnt); mounted {
		t.Error("the filesystem on the loop device is still mounted after detach --force")
	}
	e.assertGone(rec)
}

// TestAttachAutoSaysWhatItChose: attach --mode auto takes the mode
// attach.ChooseMode picks for this machine and says why on stderr: fuse
// here (root, /dev/fuse and /dev/loop-control, and a kernel with neither
// ublk nor the NBD client; the guest lab checks that it picks ublk there).
func TestAttachAutoSaysWhatItChose(t *testing.T) {
	mode, why := attach.ChooseMode(attach.ProbeKernel())
	if mode != attach.ModeFUSE && mode != attach.ModeNBD {
		t.Skipf("auto chooses %s here; this test attaches in the modes of machines without ublk and NBD", mode)
	}
	e := newCLIEnv(t)
	out, stderr := e.mustRun("attach", "--target", e.addr, "--nqn", cliSubNQN, "--name", "t-auto", "--daemon", "--json", "--mode", "auto")
	var rec attach.Record
	if err := json.Unmarshal([]byte(out), &rec); err != nil {
		t.Fatalf("attach --json printed %q: %v", out, err)
	}
	if rec.Mode != mode || !strings.Contains(stderr, why) {
		t.Fatalf("auto attached in mode %s, saying:\n%s\nwant mode %s and %q", rec.Mode, stderr, mode, why)
	}
	if mode == attach.ModeFUSE && !strings.Contains(why, "auto chose fuse (a loop device over a FUSE file): this kernel has neither ublk") {
		t.Errorf("the reason: %q", why)
	}
	e.mustRun("detach", "t-auto")
	e.assertGone(rec)
}

// TestListAndDetachDeadAttachments: list shows both modes with target and
// mode; a name in use is refused; attachments whose process was killed are
// dropped by list, which cleans up what they left.
func TestListAndDetachDeadAttachments(t *testing.T) {
	e := newCLIEnv(t)
	recs := []attach.Record{e.attachDaemon("l-nbd", "--mode", "nbd")}
	fuse := os.Geteuid() == 0
	for _, p := range []string{"/dev/fuse", "/dev/loop-control"} {
		if _, err := os.Stat(p); err != nil {
			fuse = false
		}
	}
	if fuse {
		recs = append(recs, e.attachDaemon("l-fuse", "--mode", "fuse"))
	} else {
		t.Log("no root, FUSE or loop devices: listing the nbd attachment only")
	}

	out, _ := e.mustRun("list")
	for _, r := range recs {
		line := ""
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, r.Name+" ") {
				line = l
			}
		}
		for _, want := range []string{string(r.Mode), r.Use(), e.addr, cliSubNQN, strconv.Itoa(r.PID), "256 MiB"} {
			if !strings.Contains(line, want) {
				t.Errorf("list line of %s lacks %q:\n%s", r.Name, want, out)
			}
		}
	}
	out, _ = e.mustRun("list", "--json")
	var listed []attach.Record
	if err := json.Unmarshal([]byte(out), &listed); err != nil || len(listed) != len(recs) {
		t.Fatalf("list --json: %v\n%s", err, out)
	}
	byName := map[string]attach.Record{}
	for _, r := range listed {
		byName[r.Name] = r
	}
	for _, want := range recs {
		r := byName[want.Name]
		if r.Mode != want.Mode || r.Target != e.addr || r.NQN != cliSubNQN || r.Use() != want.Use() || r.PID != want.PID {
			t.Errorf("list --json has %+v, want %+v", r, want)
		}
	}

	_, stderr, err := e.run("attach", "--target", e.addr, "--nqn", cliSubNQN, "--name", "l-nbd", "--mode", "nbd", "--daemon")
	if err == nil || !strings.Contains(stderr, `"l-nbd" already exists`) {
		t.Errorf("attach under a live name: %v\n%s", err, stderr)
	}

	// Kill the attach processes: list drops them and cleans up.
	for _, r := range recs {
		if err := syscall.Kill(r.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range recs {
		for deadline := time.Now().Add(10 * time.Second); r.Process().Alive(); {
			if time.Now().After(deadline) {
				t.Fatalf("pid %d survived SIGKILL", r.PID)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	out, stderr = e.mustRun("list")
	if !strings.Contains(out, "nothing is attached") {
		t.Errorf("list after the processes died:\n%s", out)
	}
	for _, r := range recs {
		want := fmt.Sprintf("dropped %s: its process (pid %d) is gone", r.Name, r.PID)
		if !strings.Contains(stderr, want) {
			t.Errorf("list did not say %q:\n%s", want, stderr)
		}
		if r.LogFile != "" {
			os.Remove(r.LogFile) // kept by design for the post-mortem
		}
		e.assertGone(r)
	}
	if fuse && !strings.Contains(stderr, "unmounted the dead FUSE mount") {
		t.Errorf("list did not clean up the dead FUSE mount:\n%s", stderr)
	}

	if _, stderr := e.mustRun("detach", "--all"); !strings.Contains(stderr, "nothing is attached") {
		t.Errorf("detach --all with nothing attached: %s", stderr)
	}
	if _, stderr, err := e.run("detach", "nope"); err == nil || !strings.Contains(stderr, `no attachment named "nope"`) {
		t.Errorf("detach nope: %v %s", err, stderr)
	}
}

// startForeground starts a foreground `attach --json` with args and returns
// it with the record it printed once attached, and its stderr.
func (e *cliEnv) startForeground(ctx context.Context, args ...string) (*exec.Cmd, attach.Record, *bytes.Buffer) {
	e.t.Helper()
	cmd := e.command(ctx, append([]string{"attach", "--json"}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	stderr := new(bytes.Buffer)
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadBytes('\n')
	var rec attach.Record
	if err == nil {
		err = json.Unmarshal(line, &rec)
	}
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		e.t.Fatalf("attach printed %q: %v\n%s", line, err, stderr)
	}
	return cmd, rec, stderr
}

// TestAttachForegroundSignal: a foreground attach prints its record once
// attached and, on SIGINT, tears down and exits 0.
func TestAttachForegroundSignal(t *testing.T) {
	e := newCLIEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd, rec, stderr := e.startForeground(ctx, "--target", e.addr, "--nqn", cliSubNQN, "--socket", filepath.Join(t.TempDir(), "fg.sock"))
	// --socket without --mode means nbd; the default name comes from the NQN.
	if rec.PID != cmd.Process.Pid || rec.Mode != attach.ModeNBD || rec.Name != "attach-test-ns1" {
		t.Fatalf("record: %+v", rec)
	}
	if _, err := os.Stat(rec.Socket); err != nil {
		t.Fatalf("socket: %v", err)
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("attach after SIGINT: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "detached attach-test-ns1") {
		t.Errorf("attach said:\n%s", stderr.String())
	}
	e.assertGone(rec)
}

// TestAttachDaemonFailureIsReported: a daemon that cannot attach makes
// attach --daemon fail with the child's error, leaving nothing behind.
func TestAttachDaemonFailureIsReported(t *testing.T) {
	e := newCLIEnv(t)
	_, stderr, err := e.run("attach", "--target", e.addr, "--nqn", "nqn.2024-01.io.nprdma:no-such-subsystem",
		"--mode", "nbd", "--name", "bad", "--daemon", "--ctrl-loss-timeout", "1s")
	if err == nil || !strings.Contains(stderr, "attach bad failed") || !strings.Contains(stderr, "no-such-subsystem") {
		t.Fatalf("attach --daemon to an unknown subsystem: %v\n%s", err, stderr)
	}
	d, _ := attach.DirAt(e.runDir)
	if recs, _ := d.List(); len(recs) != 0 {
		t.Errorf("records left: %+v", recs)
	}
	for _, p := range []string{d.SocketPath("bad"), d.LogPath("bad")} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind", p)
		}
	}
}
