package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"sync"
)

// debianPackages names the Debian package that ships each external tool the
// benchmarks run, so that a missing tool is reported with the fix.
var debianPackages = map[string]string{
	"fio":                "fio",
	"nbdkit":             "nbdkit",
	"nbdinfo":            "libnbd-bin",
	"nbdcopy":            "libnbd-bin",
	"nbdfuse":            "libnbd-bin",
	"nbdsh":              "python3-libnbd",
	"nbd-server":         "nbd-server",
	"nbd-client":         "nbd-client",
	"losetup":            "util-linux",
	"mkfs.ext4":          "e2fsprogs",
	"fusermount3":        "fuse3",
	"qemu-system-x86_64": "qemu-system-x86",
	"ib_read_lat":        "perftest",
	"git":                "git",
}

// DebianPackage returns the package that ships tool ("" if unknown).
func DebianPackage(tool string) string { return debianPackages[tool] }

// MissingToolError says which tool is missing and how to install it.
type MissingToolError struct {
	Tool    string
	Package string
}

func (e *MissingToolError) Error() string {
	if e.Package == "" {
		return fmt.Sprintf("%s not found in PATH", e.Tool)
	}
	return fmt.Sprintf("%s not found in PATH: install the Debian package %s (apt-get install %s)", e.Tool, e.Package, e.Package)
}

// ErrMissingTool matches every *MissingToolError with errors.Is.
var ErrMissingTool = errors.New("tool not found")

func (e *MissingToolError) Is(target error) bool { return target == ErrMissingTool }

// FindTool returns the path of an external tool or a *MissingToolError.
func FindTool(name string) (string, error) {
	path, err := exec.LookPath(name)
	if err != nil {
		return "", &MissingToolError{Tool: name, Package: debianPackages[name]}
	}
	return path, nil
}

// Tools finds external tools and, when allowed, installs the Debian packages
// of missing ones: the benchmarks install and start their peers themselves so
// that `make bench` works on a fresh machine of the project's kind.
type Tools struct {
	// Install allows apt-get install of missing packages (needs root).
	Install bool
	Log     *slog.Logger

	mu      sync.Mutex
	updated bool
}

// Require returns the paths of the named tools, installing missing ones if
// allowed. The error names every tool still missing and its package.
func (t *Tools) Require(ctx context.Context, names ...string) ([]string, error) {
	paths := make([]string, len(names))
	var missing []*MissingToolError
	for i, n := range names {
		p, err := FindTool(n)
		if err != nil {
			missing = append(missing, err.(*MissingToolError))
			continue
		}
		paths[i] = p
	}
	if len(missing) == 0 {
		return paths, nil
	}
	if t != nil && t.Install && os.Geteuid() == 0 {
		var pkgs []string
		for _, m := range missing {
			if m.Package != "" && !slices.Contains(pkgs, m.Package) {
				pkgs = append(pkgs, m.Package)
			}
		}
		if len(pkgs) > 0 {
			if err := t.aptInstall(ctx, pkgs); err != nil {
				return nil, err
			}
			return t.requireNoInstall(names)
		}
	}
	errs := make([]error, len(missing))
	for i, m := range missing {
		errs[i] = m
	}
	return nil, errors.Join(errs...)
}

func (t *Tools) requireNoInstall(names []string) ([]string, error) {
	return (*Tools)(nil).Require(context.Background(), names...)
}

func (t *Tools) aptInstall(ctx context.Context, pkgs []string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	log := t.Log
	if log == nil {
		log = slog.Default()
	}
	install := func() ([]byte, error) {
		args := append([]string{"install", "-y", "-qq", "--no-install-recommends"}, pkgs...)
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		return cmd.CombinedOutput()
	}
	log.Info("installing missing benchmark peers", "packages", pkgs)
	out, err := install()
	if err != nil && !t.updated {
		// A fresh machine has no package lists yet.
		t.updated = true
		if uout, uerr := exec.CommandContext(ctx, "apt-get", "update", "-qq").CombinedOutput(); uerr != nil {
			return fmt.Errorf("apt-get update: %w: %s", uerr, tail(uout, 400))
		}
		out, err = install()
	}
	if err != nil {
		return fmt.Errorf("apt-get install %v: %w: %s", pkgs, err, tail(out, 400))
	}
	return nil
}

// tail returns the last n bytes of b as a string, for error messages.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
