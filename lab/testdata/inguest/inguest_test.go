// Package inguest is a test that TestGuestGoTestBinary compiles with
// `go test -c` and runs inside a guest. It lives under testdata so that
// `go test ./...` on this machine does not run it.
package inguest

import (
	"os"
	"path/filepath"
	"testing"
)

// TestInGuest reports the kernel it runs on into $LAB_OUT, where the test
// on this machine reads it.
func TestInGuest(t *testing.T) {
	out := os.Getenv("LAB_OUT")
	if out == "" {
		t.Skip("runs inside the guest lab")
	}
	release, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "inguest-release"), release, 0o644); err != nil {
		t.Fatal(err)
	}
}
