package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
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
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/tcp"
	"github.com/nprdma/nprdma/nprdma/verbs"
	"github.com/nprdma/nprdma/target"
)

// The tests run the real command as a child process: the test binary
// re-executes itself with this variable set and runs main.
const runMainEnv = "NPRDMA_TARGET_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestHelpDocumentsEveryFlag(t *testing.T) {
	app := newApp()
	var out bytes.Buffer
	app.Writer = &out
	if err := app.Run([]string{"nprdma-target", "--help"}); err != nil {
		t.Fatal(err)
	}
	help := out.String()
	for _, f := range app.Flags {
		for _, name := range f.Names() {
			if name == "help" || name == "h" {
				continue
			}
			if !strings.Contains(help, "--"+name) {
				t.Errorf("--help does not mention --%s", name)
			}
		}
	}
	for _, want := range []string{"GiB", "default: \"1GiB\"", "127.0.0.1:4420", "comparison", "SIGTERM"} {
		if !strings.Contains(help, want) {
			t.Errorf("--help does not say %q", want)
		}
	}
}

func TestParseBacking(t *testing.T) {
	ns, err := parseBacking("/dev/x,nsid=7,budget=64MiB")
	if err != nil || ns.Backing != "/dev/x" || ns.NSID != 7 || ns.budget != 64<<20 {
		t.Fatalf("parseBacking: %+v %v", ns, err)
	}
	for _, bad := range []string{",nsid=1", "/x,nsid=0", "/x,nsid=abc", "/x,color=red", "/x,budget"} {
		if _, err := parseBacking(bad); err == nil {
			t.Errorf("parseBacking(%q) accepted", bad)
		}
	}
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	os.WriteFile(good, []byte(`{"subsystems":[{"nqn":"nqn.2024-01.io.nprdma:a","allow_hosts":["nqn.2024-01.io.nprdma:h"],
		"namespaces":[{"nsid":1,"backing":"/a"},{"backing":"/b","budget":"1GiB"}]}]}`), 0o644)
	c, err := loadConfig(good)
	if err != nil || len(c.Subsystems) != 1 || len(c.Subsystems[0].Namespaces) != 2 || c.Subsystems[0].Namespaces[1].budget != 1<<30 {
		t.Fatalf("loadConfig: %+v %v", c, err)
	}
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"subsystems":[{"nqn":"x","namespaces":[{"nsid":1}]}]}`), 0o644)
	if _, err := loadConfig(bad); err == nil {
		t.Fatal("namespace without backing accepted")
	}
	os.WriteFile(bad, []byte(`{"subsystems":[],"color":1}`), 0o644)
	if _, err := loadConfig(bad); err == nil {
		t.Fatal("unknown field accepted")
	}
	for json, want := range map[string]string{
		`{"subsystems":[]}`: "no subsystem",
		`{}`:                "no subsystem",
		`{"subsystems":[{"nqn":"x","namespaces":[]}]}`:                                                           "subsystem x has no namespace",
		`{"subsystems":[{"nqn":"x","allow_hosts":["h"],"allow_any_host":true,"namespaces":[{"backing":"/a"}]}]}`: "exclude each other",
	} {
		os.WriteFile(bad, []byte(json), 0o644)
		if _, err := loadConfig(bad); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("config %s: %v, want %q", json, err, want)
		}
	}
}

// targetProc is the command running as a child process.
type targetProc struct {
	cmd    *exec.Cmd
	addr   string // once started
	banner string // once started
	out    *banner.Watcher
	done   chan error
}

func startTargetProc(t *testing.T, args ...string) *targetProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &targetProc{cmd: cmd, done: make(chan error, 1)}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-p.done
		}
	})
	p.out = banner.Watch(stderr)
	go func() {
		<-p.out.Done()
		p.done <- cmd.Wait()
	}()
	select {
	case <-p.out.Ready():
		p.addr, p.banner = p.out.Addr(), p.out.Banner()
		return p
	case err := <-p.done:
		p.done <- err
		t.Fatalf("target exited before serving (%v):\n%s", err, p.output())
	case <-time.After(60 * time.Second):
		t.Fatalf("target did not start:\n%s", p.output())
	}
	return nil
}

func (p *targetProc) output() string { return p.out.Log() }

// wait waits for the process to exit and returns its exit code.
func (p *targetProc) wait(t *testing.T) int {
	t.Helper()
	select {
	case err := <-p.done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(60 * time.Second):
		t.Fatalf("target did not exit:\n%s", p.output())
		return -1
	}
}

const testNQN = "nqn.2024-01.io.nprdma:proc"

func connectNS(t *testing.T, addr string) (*initiator.Controller, *initiator.Namespace, func()) {
	t.Helper()
	dev := nprdma.NewDevice(tcp.New(), nprdma.WithPinning(false))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := initiator.Connect(ctx, dev, addr, testNQN, initiator.WithIOQueues(2),
		initiator.WithStateFile(filepath.Join(t.TempDir(), "hostid")),
		initiator.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		initiator.WithControllerLossTimeout(time.Second), initiator.WithQPTimeout(time.Second))
	if err != nil {
		dev.Close()
		t.Fatal(err)
	}
	n, err := c.Namespace(ctx, 1)
	if err != nil {
		c.Close()
		dev.Close()
		t.Fatal(err)
	}
	return c, n, func() { c.Close(); dev.Close() }
}

func fill(p []byte, off int64, seed uint64) {
	for i := 0; i < len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], uint64(off+int64(i))*2654435761^seed)
	}
}

func targetArgs(dir string) []string {
	return []string{"--backing", filepath.Join(dir, "disk.img"), "--memory", "4MiB", "--listen", "127.0.0.1:0",
		"--nqn", testNQN, "--allow-any-host", "--data-dir", filepath.Join(dir, "data"), "--log-level", "warn"}
}

func makeBacking(t *testing.T, dir string, size int64) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

// TestSIGTERMDrainsFlushesAndExitsZero: unflushed writes acknowledged before
// SIGTERM are on the backing file after the process exits 0, and the next
// start finds the shutdown clean.
func TestSIGTERMDrainsFlushesAndExitsZero(t *testing.T) {
	dir := t.TempDir()
	makeBacking(t, dir, 16<<20)
	p := startTargetProc(t, targetArgs(dir)...)
	if !strings.Contains(p.banner, banner.PreviousRun+target.PreviousRunNone.String()) {
		t.Fatalf("first start: %q", p.banner)
	}
	_, n, done := connectNS(t, p.addr)
	data := make([]byte, 1<<20)
	fill(data, 4<<20, 1)
	if _, err := n.WriteAt(data, 4<<20); err != nil { // no flush: volatile
		t.Fatal(err)
	}
	// SIGTERM with the host still connected (its own disconnect would make
	// the controller flush): the target's shutdown must flush by itself.
	p.cmd.Process.Signal(syscall.SIGTERM)
	code := p.wait(t)
	done()
	if code != 0 {
		t.Fatalf("exit code %d after SIGTERM:\n%s", code, p.output())
	}
	f, err := os.ReadFile(filepath.Join(dir, "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(f[4<<20:5<<20], data) {
		t.Fatal("writes acknowledged before SIGTERM are not on the backing file")
	}
	// The restart also takes --io-uring: the data is served back through
	// a backing opened with it.
	p2 := startTargetProc(t, append(targetArgs(dir), "--io-uring")...)
	if !strings.Contains(p2.banner, banner.PreviousRun+target.PreviousRunClean.String()) {
		t.Fatalf("restart after SIGTERM: %q", p2.banner)
	}
	_, n2, done2 := connectNS(t, p2.addr)
	got := make([]byte, len(data))
	if _, err := n2.ReadAt(got, 4<<20); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back after the restart with --io-uring: %v, equal %v", err, bytes.Equal(got, data))
	}
	done2()
	p2.cmd.Process.Signal(syscall.SIGINT)
	if code := p2.wait(t); code != 0 {
		t.Fatalf("exit code %d after SIGINT", code)
	}
}

// TestBackingOptionsOnTheCommandLine: --backing PATH,nsid=N,budget=SIZE
// reaches the target whole (the CLI library must not split it at the
// commas), and two --backing flags give two namespaces.
func TestBackingOptionsOnTheCommandLine(t *testing.T) {
	dir := t.TempDir()
	makeBacking(t, dir, 16<<20)
	other := filepath.Join(dir, "other.img")
	if err := blockdev.Create(other, 8<<20); err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(dir, "disk.img")
	p := startTargetProc(t, "--backing", disk+",nsid=3,budget=2MiB", "--backing", other+",nsid=5", "--memory", "6MiB",
		"--listen", "127.0.0.1:0", "--nqn", testNQN, "--allow-any-host", "--data-dir", filepath.Join(dir, "data"), "--log-level", "warn")
	for _, want := range []string{"ns 3 = " + disk + " (16.0 MiB, DRAM 2.0 MiB)", "ns 5 = " + other + " (8.0 MiB, DRAM 4.0 MiB)"} {
		if !strings.Contains(p.banner, want) {
			t.Errorf("banner lacks %q:\n%s", want, p.banner)
		}
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

// runTargetFails runs the command, which must exit 1 before serving, and
// returns what it printed.
func runTargetFails(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("%v: exit %v, want 1:\n%s", args, err, out)
	}
	return string(out)
}

// TestStartFailuresAreClearAndLeaveNoTrace: a backing served twice (in one
// target, or by a target already running) is refused with a clear error
// instead of two caches of one file overwriting each other; a start that
// fails (here: the listen address in use) does not make the next start
// report a crash.
func TestStartFailuresAreClearAndLeaveNoTrace(t *testing.T) {
	dir := t.TempDir()
	makeBacking(t, dir, 16<<20)
	disk := filepath.Join(dir, "disk.img")
	data := filepath.Join(dir, "data")
	common := []string{"--listen", "127.0.0.1:0", "--nqn", testNQN, "--allow-any-host", "--data-dir", data, "--log-level", "warn"}
	out := runTargetFails(t, append([]string{"--backing", disk, "--backing", disk + ",nsid=2"}, common...)...)
	if !strings.Contains(out, "backing "+disk) || !strings.Contains(out, "in use") {
		t.Fatalf("the same backing twice:\n%s", out)
	}
	p := startTargetProc(t, targetArgs(dir)...)
	out = runTargetFails(t, append([]string{"--backing", disk}, common...)...)
	if !strings.Contains(out, "in use") {
		t.Fatalf("a backing another target serves:\n%s", out)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	// The listen address in use: the start fails after the metadata store
	// was opened; the next start still reads the shutdown before it as clean.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	args := targetArgs(dir)
	for i := range args {
		if args[i] == "127.0.0.1:0" {
			args[i] = busy.Addr().String()
		}
	}
	runTargetFails(t, args...)
	restartReports(t, dir, target.PreviousRunClean, "after a failed start")
}

// restartReports starts the target on dir again, checks that its banner
// reports the previous run as want, and stops it.
func restartReports(t *testing.T, dir string, want target.PreviousRun, what string) {
	t.Helper()
	p := startTargetProc(t, targetArgs(dir)...)
	if !strings.Contains(p.banner, banner.PreviousRun+want.String()) {
		t.Fatalf("%s: %q", what, p.banner)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t); code != 0 {
		t.Fatalf("%s: exit code %d after SIGTERM", what, code)
	}
}

// TestBadFlagsNameTheirFlag: a size, duration or flag combination that
// cannot be meant is refused, and the error names the flag.
func TestBadFlagsNameTheirFlag(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ args []string }{
		{[]string{"--memory", "0"}},
		{[]string{"--memory", "10"}},
		{[]string{"--memory", "NaN"}},
		{[]string{"--default-size", "1000"}},
		{[]string{"--default-size", "NaN"}},
		{[]string{"--busy-poll", "-1s"}},
		{[]string{"--shutdown-timeout", "-1s"}},
		{[]string{"--fence-timeout", "0s"}},
		{[]string{"--fence-timeout", "-1s"}},
		{[]string{"--gomaxprocs", "-2"}},
		{[]string{"--allow-host", "nqn.2014-08.org.nvmexpress:uuid:1", "--allow-any-host"}},
	} {
		args := append([]string{"--listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"), "--log-level", "warn"}, c.args...)
		out := runTargetFails(t, args...)
		if !strings.Contains(out, c.args[0]) {
			t.Errorf("%v: the error does not name the flag:\n%s", c.args, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "default.img")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused --default-size left a default backing file: %v", err)
	}
}

// TestProviderVerbsSaysWhatIsMissing: on a machine without rdma-core or an
// RDMA device, --provider verbs refuses to start and names what is missing.
func TestProviderVerbsSaysWhatIsMissing(t *testing.T) {
	if _, err := verbs.Devices(); err == nil {
		t.Skip("this machine has an RDMA device")
	}
	dir := t.TempDir()
	out := runTargetFails(t, "--provider", "verbs", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"), "--log-level", "warn")
	if !strings.Contains(out, "--provider verbs") || !containsAny(out, "no RDMA device", "libibverbs", "librdmacm", "without verbs support") {
		t.Fatalf("--provider verbs without RDMA said:\n%s", out)
	}
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// TestSecondSignalDuringFlushIsIgnored: a second SIGINT or SIGTERM arriving
// while the target flushes (a double Ctrl-C, or timeout(1) signalling the
// process and its group) is logged and does not cut the flush short: exit 0,
// every acknowledged write on the backing file, a clean shutdown recorded.
func TestSecondSignalDuringFlushIsIgnored(t *testing.T) {
	dir := t.TempDir()
	const size = 64 << 20
	makeBacking(t, dir, size)
	args := append(targetArgs(dir), "--memory", "64MiB", "--log-level", "info")
	p := startTargetProc(t, args...)
	_, n, done := connectNS(t, p.addr)
	data := make([]byte, 48<<20) // unflushed, all resident: the shutdown's flush writes it
	fill(data, 0, 3)
	for off := 0; off < len(data); off += 1 << 20 {
		if _, err := n.WriteAt(data[off:off+1<<20], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(p.output(), "shutting down: draining and flushing") {
		if time.Now().After(deadline) {
			t.Fatalf("no shutdown log line:\n%s", p.output())
		}
		time.Sleep(time.Millisecond)
	}
	p.cmd.Process.Signal(syscall.SIGINT)
	p.cmd.Process.Signal(syscall.SIGTERM)
	code := p.wait(t)
	done()
	if code != 0 {
		t.Fatalf("exit code %d after a second signal during the flush:\n%s", code, p.output())
	}
	f, err := os.ReadFile(filepath.Join(dir, "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(f[:len(data)], data) {
		t.Fatal("writes acknowledged before the signals are not on the backing file")
	}
	restartReports(t, dir, target.PreviousRunClean, "restart")
}

// TestRestartAfterSIGKILLKeepsFlushedData: everything flushed before a
// SIGKILL reads back after a restart on the same backing and data dir, and
// the namespace keeps its NGUID.
func TestRestartAfterSIGKILLKeepsFlushedData(t *testing.T) {
	dir := t.TempDir()
	const size = 16 << 20
	makeBacking(t, dir, size)
	p := startTargetProc(t, targetArgs(dir)...)
	_, n, done := connectNS(t, p.addr)
	nguid := n.NGUID()
	data := make([]byte, size)
	fill(data, 0, 7)
	// Four times the 4 MiB budget: most of it is written back by eviction,
	// the rest by the flush.
	for off := 0; off < size; off += 1 << 20 {
		if _, err := n.WriteAt(data[off:off+1<<20], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Flush(); err != nil {
		t.Fatal(err)
	}
	done()
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.wait(t)

	p2 := startTargetProc(t, targetArgs(dir)...)
	if !strings.Contains(p2.banner, banner.PreviousRun+target.PreviousRunUnclean.String()) {
		t.Fatalf("restart after SIGKILL: %q", p2.banner)
	}
	_, n2, done2 := connectNS(t, p2.addr)
	defer done2()
	if n2.NGUID() != nguid {
		t.Fatalf("NGUID changed across the restart: %x -> %x", nguid, n2.NGUID())
	}
	got := make([]byte, size)
	for off := 0; off < size; off += 1 << 20 {
		if _, err := n2.ReadAt(got[off:off+1<<20], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, data) {
		t.Fatal("flushed data lost across SIGKILL and restart")
	}
}

// TestMetricsEndpoint scrapes --metrics-addr after some I/O: the target's,
// the swap observer's and the fabric's series are there and moved, and
// /healthz and /readyz say all is well.
func TestMetricsEndpoint(t *testing.T) {
	dir := t.TempDir()
	makeBacking(t, dir, 8<<20)
	args := append(targetArgs(dir), "--metrics-addr", "127.0.0.1:0", "--log-level", "info")
	p := startTargetProc(t, args...)
	out := p.output()
	i := strings.Index(out, "url=http://")
	if i < 0 {
		t.Fatalf("no metrics url logged:\n%s", out)
	}
	url := strings.Fields(out[i+len("url="):])[0]
	_, n, done := connectNS(t, p.addr)
	defer done()
	if _, err := n.WriteAt(make([]byte, 64<<10), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := n.ReadAt(make([]byte, 64<<10), 0); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{
		`nprdma_target_commands_total{opcode="write",status="success"}`,
		`nprdma_target_controllers 1`,
		`nprdma_target_connections 3`,
		`nprdma_target_command_latency_seconds_bucket{opcode="identify"`,
		`nprdma_swap_`,
		`nprdma_fabric_one_sided_reads_total{device="target"}`,
		`go_goroutines`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	base := strings.TrimSuffix(url, "/metrics")
	for path, want := range map[string]string{"/healthz": "ok\n", "/readyz": "ready\n"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != want {
			t.Errorf("%s: %d %q, want 200 %q", path, resp.StatusCode, body, want)
		}
	}
	if !strings.Contains(text, "nprdma_target_metadata_healthy 1\n") {
		t.Error("metrics lack nprdma_target_metadata_healthy 1")
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit %d", code)
	}
}
