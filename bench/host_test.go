package bench

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestReadMemStatusSeesGrowth(t *testing.T) {
	before, err := ReadMemStatus(0)
	if err != nil {
		t.Fatal(err)
	}
	if before.RSS <= 0 || before.HWM < before.RSS {
		t.Fatalf("RSS %d, HWM %d", before.RSS, before.HWM)
	}
	s := StartRSSSampler(os.Getpid(), 5*time.Millisecond)
	const size = 64 << 20
	buf := make([]byte, size)
	for i := 0; i < size; i += 4096 {
		buf[i] = 1 // touch every page so it becomes resident
	}
	after, err := ReadMemStatus(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	rep, err := s.Stop()
	runtime.KeepAlive(buf)
	if err != nil {
		t.Fatal(err)
	}
	if after.RSS-before.RSS < size/2 {
		t.Fatalf("touching 64 MiB grew RSS by %d bytes only", after.RSS-before.RSS)
	}
	if rep.PeakRSS < after.RSS-size/4 || rep.Samples < 2 || rep.Last.HWM < after.RSS {
		t.Fatalf("sampler report %+v after RSS %d", rep, after.RSS)
	}
}

func TestReadMemStatusErrors(t *testing.T) {
	if _, err := ReadMemStatus(1 << 30); err == nil || !strings.Contains(err.Error(), "pid 1073741824") {
		t.Fatalf("missing pid: %v", err)
	}
	// An exited process: the sampler reports the failure when it saw nothing.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skipf("cannot run true: %v", err)
	}
	s := StartRSSSampler(cmd.Process.Pid, time.Millisecond)
	if _, err := s.Stop(); err == nil {
		t.Fatal("sampling an exited process reported no error")
	}
}

func TestMeminfoBytes(t *testing.T) {
	in := []byte("MemTotal:       24000000 kB\nMemFree: 1 kB\nHugePages_Total:       4\nBad:\n")
	if got := meminfoBytes(in, "MemTotal"); got != 24000000*1024 {
		t.Fatalf("MemTotal = %d", got)
	}
	if got := meminfoBytes(in, "HugePages_Total"); got != 4 {
		t.Fatalf("unitless field = %d", got)
	}
	if meminfoBytes(in, "Bad") != 0 || meminfoBytes(in, "Missing") != 0 {
		t.Fatal("absent or empty fields must read 0")
	}
}

func TestDetectMachine(t *testing.T) {
	m := DetectMachine()
	if m.CPUs < 1 || m.MemoryBytes <= 0 || !strings.HasPrefix(m.Kernel, "Linux ") || m.GoVersion != runtime.Version() || m.GOMAXPROCS < 1 {
		t.Fatalf("DetectMachine = %+v", m)
	}
	if s := m.String(); !strings.Contains(s, "CPUs") || !strings.Contains(s, "RAM") {
		t.Fatalf("String = %q", s)
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 512: "512 B", 4096: "4 KiB", 1 << 30: "1 GiB", 1536 << 20: "1.5 GiB", 24 << 30: "24 GiB"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestGitRevision(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed (Debian package git)")
	}
	ctx := context.Background()
	dir := t.TempDir()
	if got := GitRevision(ctx, dir); got != "" {
		t.Fatalf("not a repository, revision %q", got)
	}
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "commit.gpgsign=false"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git("init", "-q")
	os.WriteFile(filepath.Join(dir, "f"), []byte("1"), 0o644)
	git("add", "f")
	git("commit", "-q", "-m", "one")
	head := git("rev-parse", "--short=12", "HEAD")
	if got := GitRevision(ctx, dir); got != head {
		t.Fatalf("clean tree: %q, want %q", got, head)
	}
	os.WriteFile(filepath.Join(dir, ".gitignore"), []byte("ignored\n"), 0o644)
	git("add", ".gitignore")
	git("commit", "-q", "-m", "two")
	head = git("rev-parse", "--short=12", "HEAD")
	os.WriteFile(filepath.Join(dir, "ignored"), []byte("x"), 0o644)
	if got := GitRevision(ctx, dir); got != head {
		t.Fatalf("ignored files must not mark the tree dirty: %q", got)
	}
	os.WriteFile(filepath.Join(dir, "new"), []byte("x"), 0o644)
	if got := GitRevision(ctx, dir); got != head+"+dirty" {
		t.Fatalf("new file: %q, want %q", got, head+"+dirty")
	}
	os.Remove(filepath.Join(dir, "new"))
	os.WriteFile(filepath.Join(dir, "f"), []byte("2"), 0o644)
	if got := GitRevision(ctx, dir); got != head+"+dirty" {
		t.Fatalf("modified tree: %q, want %q", got, head+"+dirty")
	}
}

func TestFindToolNamesThePackage(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := FindTool("fio")
	var missing *MissingToolError
	if !errors.As(err, &missing) || !errors.Is(err, ErrMissingTool) {
		t.Fatalf("FindTool(fio) with an empty PATH: %v", err)
	}
	if err.Error() != "fio not found in PATH: install the Debian package fio (apt-get install fio)" {
		t.Fatalf("message %q", err)
	}
	if _, err := FindTool("no-such-tool-xyz"); err == nil || err.Error() != "no-such-tool-xyz not found in PATH" {
		t.Fatalf("unknown tool: %v", err)
	}
	tools := &Tools{Install: false}
	_, err = tools.Require(context.Background(), "nbdinfo", "nbdkit")
	for _, want := range []string{"install the Debian package libnbd-bin", "install the Debian package nbdkit"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Require error %v lacks %q", err, want)
		}
	}
	if DebianPackage("nbdcopy") != "libnbd-bin" || DebianPackage("unknown") != "" {
		t.Fatal("DebianPackage mapping wrong")
	}
}

func TestRequireFindsInstalledTools(t *testing.T) {
	dir := t.TempDir()
	tool := filepath.Join(dir, "fio")
	if err := os.WriteFile(tool, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	paths, err := (*Tools)(nil).Require(context.Background(), "fio")
	if err != nil || len(paths) != 1 || paths[0] != tool {
		t.Fatalf("Require = %v, %v", paths, err)
	}
}
