// Package gobuild builds the module's commands for tests that run them as
// processes: once per test binary, into a temporary directory removed by
// Cleanup. It imports nothing of the project.
package gobuild

import (
	"errors"

	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var built struct {
	mu   sync.Mutex
	dir  string
	bins map[string]string
}

// Command returns the path of the module's ./cmd/NAME, built on first use;
// the environment variable env (e.g. NPRDMA_TARGET_BIN), when set, names a
// binary to use instead. Without the go command the test is skipped.
func Command(t testing.TB, name, env string) string {
	t.Helper()
	if p := os.Getenv(env); env != "" && p != "" {
		return p
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("needs the go command to build %s (or %s naming a built one)", name, env)
	}
	built.mu.Lock()
	defer built.mu.Unlock()
	if p := built.bins[name]; p != "" {
		return p
	}
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if built.dir == "" {
		if built.dir, err = os.MkdirTemp("", "nprdma-bin-"); err != nil {
			t.Fatal(err)
		}
		built.bins = map[string]string{}
	}
	path := filepath.Join(built.dir, name)
	cmd := exec.Command("go", "build", "-o", path, "./cmd/"+name)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/%s: %v\n%s", name, err, out)
	}
	built.bins[name] = path
	return path
}

// Clean removes what Command built; TestMain calls it after m.Run.
func Clean() {
	built.mu.Lock()
	defer built.mu.Unlock()
	if built.dir != "" {
		os.RemoveAll(built.dir)
		built.dir, built.bins = "", nil
	}
}

// moduleRoot is the directory of the go.mod above the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
