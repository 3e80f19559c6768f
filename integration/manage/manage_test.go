// Package manage_test drives nprdma-target's management API as an operator
// does: the real binary, its ctl commands, a host attached with the real
// nprdma-initiator and fio on it.
package manage_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/internal/fiotest"
	"github.com/nprdma/nprdma/internal/gobuild"
	"github.com/nprdma/nprdma/internal/targettest"
	"github.com/nprdma/nprdma/target/manage"
)

const subNQN = "nqn.2026-11.io.nprdma:manage-it"

func TestMain(m *testing.M) {
	code := m.Run()
	gobuild.Clean()
	os.Exit(code)
}

// ctl runs nprdma-target ctl against p's socket and returns its standard
// output, or its error with standard error.
func ctl(t *testing.T, p *targettest.Proc, args ...string) ([]byte, error) {
	t.Helper()
	bin := gobuild.Command(t, "nprdma-target", "NPRDMA_TARGET_BIN")
	cmd := exec.Command(bin, append([]string{"ctl", "--socket", p.Socket}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("ctl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

func mustCtl(t *testing.T, p *targettest.Proc, args ...string) []byte {
	t.Helper()
	out, err := ctl(t, p, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func inventory(t *testing.T, p *targettest.Proc) manage.Inventory {
	t.Helper()
	var inv manage.Inventory
	if err := json.Unmarshal(mustCtl(t, p, "list"), &inv); err != nil {
		t.Fatal(err)
	}
	return inv
}

// stable is the inventory's configuration, as JSON.
func stable(t *testing.T, p *targettest.Proc) string {
	t.Helper()
	b, _ := json.MarshalIndent(inventory(t, p).Configuration(), "", " ")
	return string(b)
}

// startTarget runs a target whose configuration serves one 64 MiB file as
// namespace 1 of subNQN to any host.
func startTarget(t *testing.T, dir string, args ...string) *targettest.Proc {
	t.Helper()
	backing := filepath.Join(dir, "config-ns1.img")
	if _, err := os.Stat(backing); err != nil {
		if err := blockdev.Create(backing, 64<<20); err != nil {
			t.Fatal(err)
		}
	}
	return targettest.Start(t, filepath.Join(dir, "data"), targettest.FreeAddr(t),
		append([]string{"--backing", backing, "--nqn", subNQN, "--allow-any-host", "--memory", "256MiB"}, args...)...)
}

// TestManageWhileFioVerifies: fio writes and verifies namespace 1 through
// an NBD attachment while ctl creates, grows and deletes namespaces beside
// it, in its subsystem (its host gets the notices) and in another; fio sees
// no error. The delete is refused while the host is connected and goes
// through with --force.
func TestManageWhileFioVerifies(t *testing.T) {
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("fio is not installed (scripts/deps.sh installs it)")
	}
	if out, err := exec.Command("fio", "--enghelp=nbd").CombinedOutput(); err != nil || !strings.Contains(string(out), "uri") {
		t.Skipf("fio has no nbd engine: %s", out)
	}
	dir := t.TempDir()
	p := startTarget(t, dir)
	ini := gobuild.Command(t, "nprdma-initiator", "NPRDMA_INITIATOR_BIN")
	sock, runDir := filepath.Join(dir, "ns1.sock"), filepath.Join(dir, "run")
	attach := exec.Command(ini, "--hostid-file", filepath.Join(dir, "hostid"), "attach", "--mode", "nbd", "--target", p.Addr,
		"--nqn", subNQN, "--nsid", "1", "--name", "ns1", "--socket", sock, "--run-dir", runDir, "--daemon")
	if out, err := attach.CombinedOutput(); err != nil {
		t.Fatalf("attach: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command(ini, "detach", "--run-dir", runDir, "--force", "ns1").Run() })

	fio := exec.Command("fio", "--name=verify", "--ioengine=nbd", "--uri=nbd+unix:///ns1?socket="+sock,
		"--rw=randwrite", "--bs=4k", "--iodepth=16", "--numjobs=2", "--size=16m", "--offset_increment=16m",
		"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--verify_state_save=0",
		"--group_reporting", "--output-format=json")
	fio.Dir = t.TempDir()
	var fioOut bytes.Buffer
	fio.Stdout, fio.Stderr = &fioOut, &fioOut
	if err := fio.Start(); err != nil {
		t.Fatal(err)
	}
	fioDone := make(chan error, 1)
	go func() { fioDone <- fio.Wait() }()

	const other = "nqn.2026-11.io.nprdma:other"
	mustCtl(t, p, "create-subsys", other, "--allow-any-host")
	cycles := 0
	for running := true; running; {
		mustCtl(t, p, "create-ns", subNQN, "--name", "beside", "--size", "8MiB")
		mustCtl(t, p, "create-ns", other, "--name", "elsewhere", "--size", "8MiB")
		mustCtl(t, p, "resize-ns", subNQN, "2", "--size", "24MiB")
		mustCtl(t, p, "resize-ns", other, "1", "--size", "16MiB")
		if _, err := ctl(t, p, "delete-ns", subNQN, "2"); err == nil || !strings.Contains(err.Error(), "connected") {
			t.Fatalf("delete-ns while the host is connected: %v, want a refusal naming it", err)
		}
		mustCtl(t, p, "delete-ns", subNQN, "2", "--force")
		mustCtl(t, p, "delete-ns", other, "1")
		select {
		case err := <-fioDone:
			fioDone <- err
			running = false
		default:
			cycles++
		}
	}
	if err := <-fioDone; err != nil {
		t.Fatalf("fio: %v\n%s", err, fioOut.String())
	}
	if err := fiotest.CheckVerify(fioOut.Bytes(), 32<<20); err != nil {
		t.Fatal(err)
	}
	if cycles == 0 {
		t.Fatal("fio ended before a create, resize and delete cycle did: nothing ran beside it")
	}
	t.Logf("%d create/resize/delete cycles while fio wrote and verified 32 MiB", cycles)
}

// TestCtlRestartRestoresTheSame: what ctl created (a subsystem with hosts,
// namespaces on files the target made and one it was given, one of them
// grown) is served the same after a SIGTERM and a restart, with its data.
func TestCtlRestartRestoresTheSame(t *testing.T) {
	dir := t.TempDir()
	p := startTarget(t, dir)
	const other = "nqn.2026-11.io.nprdma:kept"
	mustCtl(t, p, "create-subsys", other, "--host", "nqn.2026-11.io.nprdma:h1")
	mustCtl(t, p, "add-host", other, "nqn.2026-11.io.nprdma:h2")
	mustCtl(t, p, "create-ns", other, "--name", "a", "--size", "4MiB", "--budget", "1MiB")
	given := filepath.Join(dir, "given.img")
	if err := blockdev.Create(given, 2<<20); err != nil {
		t.Fatal(err)
	}
	mustCtl(t, p, "create-ns", subNQN, "--name", "given", "--nsid", "7", "--backing", given)
	mustCtl(t, p, "resize-ns", other, "1", "--size", "12MiB")
	want := stable(t, p)
	p.Stop(t)
	p = startTarget(t, dir)
	if got := stable(t, p); got != want {
		t.Fatalf("after the restart:\n%s\nbefore:\n%s", got, want)
	}
	if !strings.Contains(p.Log(), "created through the management API") {
		t.Errorf("the banner does not name the restored namespaces:\n%s", p.Log())
	}
}

// TestCtlBadRequestsChangeNothing: refusals reach the operator as clear
// errors with exit status 1, a malformed request as a JSON-RPC parse error,
// and none changes what is served.
func TestCtlBadRequestsChangeNothing(t *testing.T) {
	dir := t.TempDir()
	p := startTarget(t, dir)
	mustCtl(t, p, "create-ns", subNQN, "--name", "taken", "--size", "1MiB")
	small := filepath.Join(dir, "small.img")
	if err := blockdev.Create(small, 1<<20); err != nil {
		t.Fatal(err)
	}
	want := stable(t, p)
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"create-ns", subNQN, "--name", "taken", "--size", "1MiB"}, "name is taken"},
		{[]string{"create-ns", subNQN, "--name", "big", "--backing", small, "--size", "2MiB"}, "beyond the 1048576 bytes of backing"},
		{[]string{"create-ns", subNQN, "--name", "odd", "--size", "1.5k"}, "multiples of 4096"},
		{[]string{"remove-host", subNQN, "nqn.2026-11.io.nprdma:stranger"}, "allow-list"},
		{[]string{"delete-ns", subNQN, "1"}, "remove it there"},
		{[]string{"resize-ns", subNQN, "2", "--size", "64KiB"}, "only grow"},
		{[]string{"create-subsys", subNQN}, "exists already"},
		{[]string{"create-ns", subNQN}, "a size is required"},
		{[]string{"resize-ns", subNQN, "zero", "--size", "1MiB"}, "not in 1..4294967294"},
	} {
		_, err := ctl(t, p, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), "exit status 1") {
			t.Errorf("ctl %v: %v, want exit status 1 saying %q", c.args, err, c.says)
		}
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", p.Socket)
	}}}
	resp, err := hc.Post("http://unix/rpc", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"nvmf_subsystem_add_ns","params":{"nqn":`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"code":-32700`) {
		t.Errorf("malformed JSON: %s, want a parse error", b)
	}
	if got := stable(t, p); got != want {
		t.Fatalf("bad requests changed the inventory:\n%s", got)
	}

	// The metadata store gone: every change refused, saying why.
	if err := os.RemoveAll(filepath.Join(p.DataDir, "meta")); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"create-ns", subNQN, "--name", "new", "--size", "1MiB"}, {"resize-ns", subNQN, "2", "--size", "2MiB"},
		{"add-host", subNQN, "nqn.2026-11.io.nprdma:h3"}, {"create-subsys", "nqn.2026-11.io.nprdma:new"}} {
		if _, err := ctl(t, p, args...); err == nil || !strings.Contains(err.Error(), "metadata store") {
			t.Errorf("ctl %v with the metadata store removed: %v", args, err)
		}
	}
	if got := stable(t, p); got != want {
		t.Fatalf("refused changes changed the inventory:\n%s", got)
	}
	if code := p.Exit(t); code != 1 || !strings.Contains(p.Log(), "4 refused after the store failed") {
		t.Fatalf("the stop after the store failed: exit %d, want 1 with the refusals counted:\n%s", code, p.Log())
	}
}

// TestManageTCPWantsTheToken: the TCP endpoint refuses a client without
// the token (HTTP 401, nothing done) and serves ctl with it; a target given
// a token file others may read does not start.
func TestManageTCPWantsTheToken(t *testing.T) {
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("nprdma-test-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := targettest.FreeAddr(t)
	p := startTarget(t, dir, "--manage-listen", addr, "--manage-token-file", token)
	resp, err := http.Post("http://"+addr+"/rpc", "application/json",
		strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"nvmf_create_subsystem","params":{"nqn":"nqn.2026-11.io.nprdma:intruder"}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a request without the token: HTTP %d, want 401", resp.StatusCode)
	}
	bin := gobuild.Command(t, "nprdma-target", "NPRDMA_TARGET_BIN")
	out, err := exec.Command(bin, "ctl", "--addr", addr, "--token-file", token, "create-subsys", "nqn.2026-11.io.nprdma:invited").CombinedOutput()
	if err != nil {
		t.Fatalf("ctl with the token: %v\n%s", err, out)
	}
	for _, s := range inventory(t, p).Subsystems {
		if s.NQN == "nqn.2026-11.io.nprdma:intruder" {
			t.Fatal("the request without the token created its subsystem")
		}
	}
	p.Stop(t)

	os.Chmod(token, 0o644)
	cmd := exec.Command(bin, "--data-dir", filepath.Join(dir, "data2"), "--listen", targettest.FreeAddr(t), "--no-default-namespace",
		"--manage-listen", targettest.FreeAddr(t), "--manage-token-file", token)
	done := make(chan []byte, 1)
	go func() { b, _ := cmd.CombinedOutput(); done <- b }()
	select {
	case b := <-done:
		if !strings.Contains(string(b), "chmod 600") || cmd.ProcessState.ExitCode() != 1 {
			t.Fatalf("a target with a token file others may read: exit %d\n%s", cmd.ProcessState.ExitCode(), b)
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("a target with a token file others may read started")
	}
}
