// Package guesttest builds what guest tests (docs/lab.md) run in the guest:
// Go test binaries and the project's commands, compiled on this machine
// and run in the guest at the same path. It imports nothing of the
// project, and only tests import it.
package guesttest

import (
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	rootOnce sync.Once
	root     string
	rootErr  error
)

// moduleRoot is the directory of the module's go.mod.
func moduleRoot(t testing.TB) string {
	t.Helper()
	rootOnce.Do(func() {
		var out []byte
		out, rootErr = exec.Command("go", "env", "GOMOD").Output()
		root = filepath.Dir(strings.TrimSpace(string(out)))
	})
	if rootErr != nil || root == "" || root == "." {
		t.Skipf("guesttest: no go command to build with (go env GOMOD: %v)", rootErr)
	}
	return root
}

// TestBinary compiles the tests of pkg (a path from the module root, such
// as "./nprdma/verbs") into a binary in a temporary directory of t and
// returns its path.
func TestBinary(t testing.TB, pkg string) string {
	t.Helper()
	dir := moduleRoot(t)
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg)+".test")
	cmd := exec.Command("go", "test", "-c", "-o", bin, pkg)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go test -c %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// Command builds the command pkg (such as "./cmd/nprdma-target") into a
// temporary directory of t and returns the binary's path.
func Command(t testing.TB, pkg string) string {
	t.Helper()
	dir := moduleRoot(t)
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	return bin
}
