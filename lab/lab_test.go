package lab

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Tests of the lab's parts that need no guest.

type cpioEntry struct {
	name  string
	mode  int
	data  string
	major int
	minor int
}

// readCpio parses a newc archive as the kernel does, up to its trailer.
func readCpio(t *testing.T, b []byte) []cpioEntry {
	t.Helper()
	var out []cpioEntry
	off := 0
	field := func(i int) int {
		v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
		if err != nil {
			t.Fatalf("cpio header field %d at %d: %v", i, off, err)
		}
		return int(v)
	}
	align := func(n int) int { return (n + 3) &^ 3 }
	for {
		if off%4 != 0 || string(b[off:off+6]) != "070701" {
			t.Fatalf("no newc header at %d", off)
		}
		mode, size, rmaj, rmin, namesize := field(1), field(6), field(9), field(10), field(11)
		name := string(b[off+110 : off+110+namesize-1])
		dataOff := align(off + 110 + namesize)
		if name == "TRAILER!!!" {
			return out
		}
		out = append(out, cpioEntry{name, mode, string(b[dataOff : dataOff+size]), rmaj, rmin})
		off = align(dataOff + size)
	}
}

func TestCpioWriter(t *testing.T) {
	var w cpioWriter
	w.dir("bin")
	w.charDev("dev/console", 5, 1)
	w.file("bin/x", []byte("hello"), 0o755)
	w.file("init", []byte("abcd"), 0o700)
	got := readCpio(t, w.finish())
	want := []cpioEntry{
		{"bin", 0o040755, "", 0, 0},
		{"dev/console", 0o020600, "", 5, 1},
		{"bin/x", 0o100755, "hello", 0, 0},
		{"init", 0o100700, "abcd", 0, 0},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("archive holds\n%+v\nwant\n%+v", got, want)
	}
}

func TestModuleClosure(t *testing.T) {
	dir := t.TempDir()
	dep := `kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/netfs/netfs.ko
kernel/net/9p/9pnet_virtio.ko: kernel/net/9p/9pnet.ko
kernel/net/9p/9pnet.ko:
kernel/fs/netfs/netfs.ko:
kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko
kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko
kernel/net/core/failover.ko:
`
	if err := os.WriteFile(filepath.Join(dir, "modules.dep"), []byte(dep), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := moduleClosure(dir, []string{"9pnet-virtio", "9p", "virtio_net"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"kernel/net/9p/9pnet.ko", "kernel/net/9p/9pnet_virtio.ko", "kernel/fs/netfs/netfs.ko", "kernel/fs/9p/9p.ko",
		"kernel/net/core/failover.ko", "kernel/drivers/net/net_failover.ko", "kernel/drivers/net/virtio_net.ko",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("closure %v\nwant %v", got, want)
	}
	if _, err := moduleClosure(dir, []string{"overlay"}); err == nil || !strings.Contains(err.Error(), "overlay") {
		t.Fatalf("a missing module: err = %v", err)
	}
}

func TestParseSteps(t *testing.T) {
	records := "start 100.000000 first\nend 100.250000 0\nstart 100.250000 second step\nend 101.000000 3\n"
	steps, open := parseSteps(records, 0, time.Time{}, time.Now())
	want := []Step{{"first", 250 * time.Millisecond, true}, {"second step", 750 * time.Millisecond, false}}
	if open || !reflect.DeepEqual(steps, want) {
		t.Fatalf("steps %+v open %v; want %+v closed", steps, open, want)
	}
	if lastFailed(steps) != "second step" {
		t.Fatalf("lastFailed = %q", lastFailed(steps))
	}
	// An open step lasts until the guest was stopped, on this machine's
	// clock: guest time + offset.
	offset := 5 * time.Second
	end := time.Unix(102, 0).Add(offset)
	steps, open = parseSteps("start 100.5 ready\nend 101 0\nstart 101 hang\n", offset, time.Time{}, end)
	if !open || len(steps) != 2 || steps[1].Name != "hang" || steps[1].OK || steps[1].Duration != time.Second {
		t.Fatalf("steps %+v open %v; want hang open for 1s", steps, open)
	}
	if lastFailed(steps) != "hang" {
		t.Fatalf("lastFailed = %q", lastFailed(steps))
	}
	// An offset that places the open step's start after the guest stopped
	// (the boot line's console trip was the slower): it lasted from when
	// the console showed it.
	seen := end.Add(-300 * time.Millisecond)
	steps, open = parseSteps("start 101 ready\nend 101 0\nstart 102.5 hang\n", offset, seen, end)
	if !open || len(steps) != 2 || steps[1].Duration != 300*time.Millisecond {
		t.Fatalf("steps %+v open %v; want hang open for 300ms", steps, open)
	}
}

func TestSpecValidation(t *testing.T) {
	for _, s := range []Spec{
		{Modules: []string{"nvme tcp"}},
		{Modules: []string{"x;reboot"}},
		{Env: map[string]string{"A-B": "1"}},
		{Env: map[string]string{"LAB_OUT": "/"}},
		{Forward: []Forward{{0, 80}}},
		{Forward: []Forward{{8080, 70000}}},
		{MemMiB: 16},
		{CPUs: -1},
	} {
		if _, err := s.withDefaults(); err == nil {
			t.Errorf("%+v: accepted", s)
		}
	}
	s, err := Spec{}.withDefaults()
	if err != nil || s.MemMiB != DefaultMemMiB || s.CPUs != DefaultCPUs || s.Timeout != DefaultTimeout {
		t.Fatalf("defaults: %+v, %v", s, err)
	}
}

func TestKernelPins(t *testing.T) {
	hex := regexp.MustCompile(`^[0-9a-f]{64}$`)
	if KernelNames()[0] != defaultKernel {
		t.Fatalf("KernelNames %v: the default first", KernelNames())
	}
	for _, name := range KernelNames() {
		k, err := lookupKernel(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range k.Packages {
			if !hex.MatchString(p.SHA256) || p.Version == "" || !strings.Contains(p.Name, k.Release) {
				t.Errorf("kernel %s: package %+v", name, p)
			}
		}
		if !strings.Contains(k.Image, k.Release) || !strings.Contains(k.Config, k.Release) {
			t.Errorf("kernel %s: image %s or config %s is not of release %s", name, k.Image, k.Config, k.Release)
		}
	}
	if _, err := lookupKernel("2.6"); err == nil {
		t.Fatal("an unknown kernel was accepted")
	}
}

func TestLockFileExcludes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	unlock, err := lockFile(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	waited := 0
	if _, err := lockFile(ctx, path, func() { waited++ }); !errors.Is(err, context.DeadlineExceeded) || waited != 1 {
		t.Fatalf("second lock while held: err = %v, told of waiting %d times; want it to wait until the context ends, told once", err, waited)
	}
	unlock()
	unlock2, err := lockFile(context.Background(), path, func() { t.Error("waited for a free lock") })
	if err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
	unlock2()
}

// The guest's scripts are at least valid shell.
func TestScriptsParse(t *testing.T) {
	for _, name := range []string{"stage2", "lib.sh", "shellrc"} {
		if out, err := exec.Command("bash", "-n", filepath.Join("guest", name)).CombinedOutput(); err != nil {
			t.Errorf("bash -n guest/%s: %v\n%s", name, err, out)
		}
	}
	if err := checkBusybox(); err != nil {
		t.Skip(err)
	}
	if out, err := exec.Command(busyboxPath, "sh", "-n", "guest/init").CombinedOutput(); err != nil {
		t.Errorf("busybox sh -n guest/init: %v\n%s", err, out)
	}
}

// The runner, the library's steps and the environment file behave on this
// machine's bash as in the guest (no modules: modprobe is the guest's).
func TestRunnerOnHost(t *testing.T) {
	labDir, outDir := t.TempDir(), t.TempDir()
	k, _ := lookupKernel("")
	value := "a 'quoted' \"value\" with $dollar and \\ and\nnewline"
	s := Spec{
		Env: map[string]string{"VALUE": value},
		Script: `printf '%s' "$VALUE" >value
pwd >pwd
step one
step two
echo in two
false
echo never
`,
	}
	if err := writeRunFiles(labDir, outDir, k, s, nil, false); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "-c", `. "$0/env" && exec bash "$0/runner"`, labDir)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("runner: %v; want exit 1\n%s", err, out)
	}
	got, _ := os.ReadFile(filepath.Join(outDir, "value"))
	if string(got) != value {
		t.Errorf("Env value arrived as %q; want %q", got, value)
	}
	if pwd, _ := os.ReadFile(filepath.Join(outDir, "pwd")); strings.TrimSpace(string(pwd)) != outDir {
		t.Errorf("script ran in %q; want $LAB_OUT %q", pwd, outDir)
	}
	records, _ := os.ReadFile(filepath.Join(labDir, "steps"))
	steps, open := parseSteps(string(records), 0, time.Time{}, time.Now())
	if open || len(steps) != 2 || !steps[0].OK || steps[1].OK || steps[1].Name != "two" {
		t.Fatalf("steps %+v open %v from records:\n%s", steps, open, records)
	}
	if !bytes.Contains(out, []byte(`lab: step two: "false" failed with status 1 (line 6)`)) || bytes.Contains(out, []byte("never")) {
		t.Fatalf("output:\n%s", out)
	}
}

func TestConsoleReader(t *testing.T) {
	var log bytes.Buffer
	c := consoleReader{log: &log, begin: time.Now()}
	guestNow := time.Now().Add(-time.Hour) // a guest clock an hour behind
	input := "[    1.0] kernel\r\n" + bootMarker + strconv.FormatFloat(float64(guestNow.UnixMicro())/1e6, 'f', 6, 64) + "\r\nlab: step a\n"
	c.read(strings.NewReader(input))
	if c.boot <= 0 {
		t.Fatal("boot marker not seen")
	}
	if d := c.clockOffset - time.Hour; d < -time.Second || d > time.Second {
		t.Fatalf("clock offset %v; want about 1h", c.clockOffset)
	}
	if !strings.HasSuffix(log.String(), "lab: step a\n") || strings.Contains(log.String(), "\r") {
		t.Fatalf("log %q", log.String())
	}
	if !strings.HasPrefix(c.tail(), "[    1.0] kernel\n") {
		t.Fatalf("tail %q", c.tail())
	}
}
