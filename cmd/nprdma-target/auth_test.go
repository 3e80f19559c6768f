package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/tcp"
	"github.com/nprdma/nprdma/nvme/dhchap"
)

const authHostNQN = "nqn.2024-01.io.nprdma:auth-proc-host"

func writeKeyFile(t *testing.T, path string, s *dhchap.Secret, mode os.FileMode) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(s.Encode()+"\n"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestGenDHCHAPKey(t *testing.T) {
	run := func(args ...string) (string, error) {
		app := newApp()
		var out bytes.Buffer
		app.Writer = &out
		err := app.Run(append([]string{"nprdma-target", "gen-dhchap-key"}, args...))
		return out.String(), err
	}
	for _, tc := range []struct {
		args []string
		hash dhchap.HashID
		n    int
	}{{nil, 0, 32}, {[]string{"--hmac", "2"}, 2, 48}, {[]string{"--hmac", "3", "--key-length", "32"}, 3, 32}, {[]string{"-m", "1", "-l", "64"}, 1, 64}} {
		out, err := run(tc.args...)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		s, err := dhchap.ParseSecret(out)
		if err != nil || s.Hash() != tc.hash || s.KeyLen() != tc.n {
			t.Fatalf("%v: %q: %v", tc.args, out, err)
		}
	}
	a, _ := run()
	b, _ := run()
	if a == b {
		t.Fatal("two random secrets are equal")
	}
	key := strings.Repeat("00112233", 8)
	out, err := run("--hmac", "1", "--secret", key)
	want, _ := dhchap.NewSecret(bytes.Repeat([]byte{0, 0x11, 0x22, 0x33}, 8), 1)
	if err != nil || strings.TrimSpace(out) != want.Encode() {
		t.Fatalf("--secret: %q %v", out, err)
	}
	for _, bad := range [][]string{{"--hmac", "4"}, {"--key-length", "40"}, {"--secret", "zz"}, {"--secret", key, "--key-length", "48"}} {
		if _, err := run(bad...); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	path := filepath.Join(t.TempDir(), "new.key")
	if out, err := run("--hmac", "2", "--output", path); err != nil || out != "" {
		t.Fatalf("--output: %q %v", out, err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("--output file: %v %v", st, err)
	}
	if s, err := dhchap.ReadSecretFile(path); err != nil || s.Hash() != 2 {
		t.Fatalf("--output file: %v", err)
	}
	if _, err := run("--output", path); err == nil {
		t.Fatal("--output overwrote an existing file")
	}
}

func TestParseHostFiles(t *testing.T) {
	specs, err := parseHostFiles([]string{"nqn.a=/k/a", "nqn.b=/k/b"}, []string{"nqn.b=/k/cb"})
	if err != nil || len(specs) != 2 || specs[1] != (hostSecretSpec{Host: "nqn.b", SecretFile: "/k/b", CtrlSecretFile: "/k/cb"}) {
		t.Fatalf("%+v %v", specs, err)
	}
	for _, bad := range [][2][]string{{{"nqn.a"}, nil}, {{"=x"}, nil}, {{"nqn.a=/x", "nqn.a=/y"}, nil}, {nil, {"nqn.c=/x"}}} {
		if _, err := parseHostFiles(bad[0], bad[1]); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

func connectAs(t *testing.T, addr string, s *dhchap.Secret) (*initiator.Controller, error) {
	t.Helper()
	dev := nprdma.NewDevice(tcp.New(), nprdma.WithPinning(false))
	t.Cleanup(func() { dev.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := initiator.Connect(ctx, dev, addr, testNQN, initiator.WithIOQueues(1), initiator.WithHostNQN(authHostNQN),
		initiator.WithStateFile(filepath.Join(t.TempDir(), "hostid")), initiator.WithDHCHAPSecret(s),
		initiator.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), initiator.WithControllerLossTimeout(time.Second))
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// TestSecretsReloadOnSIGHUP runs the real target with a host key file:
// the host authenticates; the file gets a new secret and the target a
// SIGHUP; the old secret is refused from then on, the new one works, and
// the connection made before goes on. A key file open to others stops the
// start, and nothing secret is ever logged.
func TestSecretsReloadOnSIGHUP(t *testing.T) {
	dir := t.TempDir()
	makeBacking(t, dir, 16<<20)
	keyPath := filepath.Join(dir, "host.key")
	old, _ := dhchap.GenerateSecret(dhchap.HashSHA256, 0, nil)
	writeKeyFile(t, keyPath, old, 0o644)
	args := []string{"--backing", filepath.Join(dir, "disk.img"), "--memory", "4MiB", "--listen", "127.0.0.1:0",
		"--nqn", testNQN, "--allow-host", authHostNQN, "--dhchap-secret-file", authHostNQN + "=" + keyPath,
		"--data-dir", filepath.Join(dir, "data"), "--log-level", "info"}
	if out := runTargetFails(t, args...); !strings.Contains(out, "chmod 600") {
		t.Fatalf("a 0644 key file: %s", out)
	}
	writeKeyFile(t, keyPath, old, 0o600)
	p := startTargetProc(t, args...)
	first, err := connectAs(t, p.addr, old)
	if err != nil {
		t.Fatal(err)
	}
	n, err := first.Namespace(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte{0x5c}, 8192)
	if _, err := n.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}

	replaced, _ := dhchap.GenerateSecret(dhchap.HashSHA512, 0, nil)
	writeKeyFile(t, keyPath, replaced, 0o600)
	p.cmd.Process.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.output(), "secrets reloaded") {
		if time.Now().After(deadline) {
			t.Fatalf("no reload logged:\n%s", p.output())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := connectAs(t, p.addr, old); !errors.Is(err, dhchap.ErrRejected) {
		t.Fatalf("the old secret after the reload: %v, want dhchap.ErrRejected", err)
	}
	second, err := connectAs(t, p.addr, replaced)
	if err != nil {
		t.Fatalf("the new secret: %v", err)
	}
	n2, err := second.Namespace(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []*initiator.Namespace{n, n2} {
		got := make([]byte, len(data))
		if _, err := ns.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read after the reload: %v (equal %v)", err, bytes.Equal(got, data))
		}
	}
	// A reload that fails keeps the secrets in force.
	os.Chmod(keyPath, 0o644)
	p.cmd.Process.Signal(syscall.SIGHUP)
	for !strings.Contains(p.output(), "not reloaded") {
		if time.Now().After(deadline.Add(10 * time.Second)) {
			t.Fatalf("no failed reload logged:\n%s", p.output())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := connectAs(t, p.addr, replaced); err != nil {
		t.Fatalf("after a failed reload: %v", err)
	}
	log := p.output()
	for _, s := range []*dhchap.Secret{old, replaced} {
		if strings.Contains(log, s.Encode()[10:40]) {
			t.Fatal("a secret is in the target's log")
		}
	}
	if !strings.Contains(log, "host failed to authenticate") || !strings.Contains(log, "host authenticated") {
		t.Fatalf("the refused host is not logged:\n%s", log)
	}
}
