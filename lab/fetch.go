package lab

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// CacheDir is where fetched kernels are kept: $NPRDMA_LAB_CACHE, or
// nprdma-lab under the system's temporary directory, so that every
// checkout on a machine shares one copy and nothing outside /tmp changes.
func CacheDir() string {
	if d := os.Getenv("NPRDMA_LAB_CACHE"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "nprdma-lab")
}

// kernelTree is the unpacked, depmod-indexed tree of k in the cache. It
// exists only once complete: it is built beside it and renamed into place.
func kernelTree(k kernel) string {
	return filepath.Join(CacheDir(), "kernels", k.cacheName())
}

// Fetch makes the named kernel ready in the cache (see CacheDir), fetching
// and unpacking its packages if they are not there yet, and returns the
// unpacked tree. Progress goes to log (may be nil). It is quick when the
// kernel is cached, and safe to call from several processes at once: one
// fetches while the others wait on the cache's lock.
func Fetch(ctx context.Context, name string, log io.Writer) (string, error) {
	k, err := lookupKernel(name)
	if err != nil {
		return "", err
	}
	return fetch(ctx, k, log)
}

func fetch(ctx context.Context, k kernel, log io.Writer) (string, error) {
	if log == nil {
		log = io.Discard
	}
	tree := kernelTree(k)
	if _, err := os.Stat(tree); err == nil {
		return tree, nil
	}
	if err := os.MkdirAll(filepath.Join(CacheDir(), "kernels"), 0o755); err != nil {
		return "", fmt.Errorf("lab: cache: %w", err)
	}
	unlock, err := lockFile(ctx, filepath.Join(CacheDir(), "lock"), func() {
		fmt.Fprintf(log, "lab: waiting for another process fetching into %s\n", CacheDir())
	})
	if err != nil {
		return "", err
	}
	defer unlock()
	// Another process may have finished while this one waited.
	if _, err := os.Stat(tree); err == nil {
		return tree, nil
	}
	// Left by a fetch that was killed; nobody else holds the lock.
	stale, _ := filepath.Glob(filepath.Join(CacheDir(), "kernels", ".tmp-*"))
	for _, s := range stale {
		os.RemoveAll(s)
	}
	start := time.Now()
	fmt.Fprintf(log, "lab: fetching kernel %s (%s) into %s\n", k.Name, k.Release, CacheDir())
	tmp, err := os.MkdirTemp(filepath.Join(CacheDir(), "kernels"), ".tmp-")
	if err != nil {
		return "", fmt.Errorf("lab: cache: %w", err)
	}
	defer os.RemoveAll(tmp)
	debs, err := aptDownload(ctx, k, tmp)
	if err != nil {
		return "", err
	}
	unpacked := filepath.Join(tmp, "tree")
	for _, deb := range debs {
		if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", deb, unpacked).CombinedOutput(); err != nil {
			return "", fmt.Errorf("lab: unpack %s: %v: %s", filepath.Base(deb), err, bytes.TrimSpace(out))
		}
		os.Remove(deb)
	}
	if _, err := os.Stat(filepath.Join(unpacked, k.Image)); err != nil {
		return "", fmt.Errorf("lab: kernel %s: no image at %s in its packages (is the pin in lab/kernels.go right?)", k.Name, k.Image)
	}
	// Decompressed here once, natively: busybox insmod would decompress
	// each module under TCG at every boot (about a second per boot).
	if err := decompressModules(ctx, filepath.Join(unpacked, k.modulesDir())); err != nil {
		return "", err
	}
	// busybox modprobe reads modules.dep and modules.alias as busybox
	// depmod writes them.
	base := filepath.Join(unpacked, k.Root)
	if out, err := exec.CommandContext(ctx, "busybox", "depmod", "-b", base, k.Release).CombinedOutput(); err != nil {
		return "", fmt.Errorf("lab: depmod %s: %v: %s", k.Release, err, bytes.TrimSpace(out))
	}
	if err := os.Rename(unpacked, tree); err != nil {
		return "", fmt.Errorf("lab: cache: %w", err)
	}
	fmt.Fprintf(log, "lab: kernel %s ready in %.1fs\n", k.Name, time.Since(start).Seconds())
	return tree, nil
}

// decompressModules replaces every .ko.xz under dir by its .ko.
func decompressModules(ctx context.Context, dir string) error {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".ko.xz") {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("lab: modules: %w", err)
	}
	if _, err := exec.LookPath("xz"); err != nil {
		return errors.New("lab: xz not found (package xz-utils; make deps installs it)")
	}
	const batch = 200
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.NumCPU())
	errs := make([]error, (len(files)+batch-1)/batch)
	for i := 0; i < len(files); i += batch {
		chunk := files[i:min(i+batch, len(files))]
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if out, err := exec.CommandContext(ctx, "xz", append([]string{"-d"}, chunk...)...).CombinedOutput(); err != nil {
				errs[i/batch] = fmt.Errorf("lab: xz -d: %v: %s", err, tail(string(out), 400))
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// aptDownload fetches k's packages into dir with a private apt
// configuration: its own sources list (the one suite k comes from), state
// and cache directories under the lab's cache, so the machine's apt lists
// and status are neither read nor changed. Signatures are checked against
// the Debian archive keyring as usual, and each package against the
// SHA-256 pinned in kernels.go.
func aptDownload(ctx context.Context, k kernel, dir string) ([]string, error) {
	aptDir := filepath.Join(CacheDir(), "apt", k.Suite)
	for _, d := range []string{"lists/partial", "archives/partial", "sources.list.d"} {
		if err := os.MkdirAll(filepath.Join(aptDir, d), 0o755); err != nil {
			return nil, fmt.Errorf("lab: apt: %w", err)
		}
	}
	sources := fmt.Sprintf("deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s %s main\n", mirror(k.Archive), k.Suite)
	if err := os.WriteFile(filepath.Join(aptDir, "sources.list"), []byte(sources), 0o644); err != nil {
		return nil, fmt.Errorf("lab: apt: %w", err)
	}
	if err := os.WriteFile(filepath.Join(aptDir, "status"), nil, 0o644); err != nil {
		return nil, fmt.Errorf("lab: apt: %w", err)
	}
	opts := []string{
		"-q",
		"-o", "Dir::State=" + aptDir,
		"-o", "Dir::State::Lists=" + filepath.Join(aptDir, "lists"),
		"-o", "Dir::State::status=" + filepath.Join(aptDir, "status"),
		"-o", "Dir::Cache=" + aptDir,
		"-o", "Dir::Cache::archives=" + filepath.Join(aptDir, "archives"),
		"-o", "Dir::Etc::sourcelist=" + filepath.Join(aptDir, "sources.list"),
		"-o", "Dir::Etc::sourceparts=" + filepath.Join(aptDir, "sources.list.d"),
		"-o", "APT::Architecture=amd64",
		"-o", "APT::Architectures::=amd64",
		"-o", "Acquire::Languages=none",
		"-o", "Acquire::Retries=3",
		"-o", "Acquire::http::Timeout=30",
		// The files land in the lab's cache, which apt's unprivileged
		// download user may not be able to write.
		"-o", "APT::Sandbox::User=" + currentUser(),
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return nil, errors.New("lab: apt-get not found: the kernel packages are fetched with apt (a Debian machine)")
	}
	run := func(args ...string) error {
		cmd := exec.CommandContext(ctx, "apt-get", append(opts, args...)...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("lab: apt-get %s: %v: %s", args[0], err, tail(string(out), 800))
		}
		return nil
	}
	if err := run("update", "--error-on=any"); err != nil {
		return nil, err
	}
	args := []string{"download"}
	for _, p := range k.Packages {
		args = append(args, p.Name+"="+p.Version)
	}
	if err := run(args...); err != nil {
		return nil, fmt.Errorf("%w (the pinned version may have left %s: docs/lab.md says how to bump it)", err, k.Suite)
	}
	var debs []string
	for _, p := range k.Packages {
		matches, _ := filepath.Glob(filepath.Join(dir, p.Name+"_*.deb"))
		if len(matches) != 1 {
			return nil, fmt.Errorf("lab: apt-get download %s left %d files", p.Name, len(matches))
		}
		sum, err := fileSHA256(matches[0])
		if err != nil {
			return nil, fmt.Errorf("lab: %w", err)
		}
		if sum != p.SHA256 {
			return nil, fmt.Errorf("lab: %s: SHA-256 %s, pinned %s", filepath.Base(matches[0]), sum, p.SHA256)
		}
		debs = append(debs, matches[0])
	}
	return debs, nil
}

// mirror is the URI the machine's apt sources use for a Debian archive
// ("debian" or "debian-security"), so the lab fetches from the same mirror
// (and through the same proxy settings) as the machine's own apt.
func mirror(archive string) string {
	fallback := "http://deb.debian.org/" + archive
	out, err := exec.Command("apt-get", "indextargets", "--format", "$(REPO_URI) $(RELEASE)").Output()
	if err != nil {
		return fallback
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 || !strings.Contains(f[0], "debian") {
			continue
		}
		security := strings.HasSuffix(f[1], "-security")
		if security == (archive == "debian-security") {
			return strings.TrimSuffix(f[0], "/")
		}
	}
	return fallback
}

func currentUser() string {
	if os.Geteuid() == 0 {
		return "root"
	}
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return "_apt"
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// lockFile takes an exclusive flock on path, polling so that ctx can end
// the wait, and calling waiting (if not nil) once when it has to wait. The
// lock goes with the process if it dies.
func lockFile(ctx context.Context, path string, waiting func()) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lab: cache lock: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lab: cache lock %s: %w", path, err)
		}
		if waiting != nil {
			waiting()
			waiting = nil
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lab: waiting for the cache lock %s: %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// tail is the end of s, at most n bytes, starting at a line.
func tail(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return "..." + "\n" + s
}
