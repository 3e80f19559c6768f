// Package e2ebench holds the end-to-end experiments of the bench suite
// (bench/cmd/nprdma-bench), the ones that run the real nprdma-target and
// nprdma-initiator binaries:
//
//   - capacity: 4 KiB read latency and target RSS as the namespace grows
//     from 1x to 8x the target's DRAM budget, against the all-resident run
//     and against what the measured hit ratio predicts;
//   - e2e-fio: the same fio job through nprdma-initiator attach (NBD socket,
//     loop device) and through nbdkit chains with the same number of hops;
//   - startup: time from exec of nprdma-target on a 64 GiB namespace to the
//     first completed remote read, unpinned against the --pin baseline, with
//     nbdkit's start on the same file as a reference.
//
// Every figure is a ratio to a baseline measured in the same run;
// docs/bench-method.md describes the method.
package e2ebench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nprdma/nprdma/bench"
)

// Binaries locates the nprdma commands the experiments run. The suite
// passes the repository root; `make bench` has just built bin/ there.
type Binaries struct {
	// RepoRoot is the module root (holding go.mod and bin/).
	RepoRoot string

	once              sync.Once
	target, initiator string
	err               error
}

// sourceDirs are the packages the commands are built from: a binary older
// than any Go file in them is stale.
var sourceDirs = []string{"cmd", "target", "initiator", "nvme", "nprdma", "swap", "blockdev"}

// Resolve returns the paths of nprdma-target and nprdma-initiator: those in
// RepoRoot/bin when they are newer than every source file they are built
// from, else fresh ones built with `go build` into a directory of env's
// output (a stale binary would measure code that is not in the tree).
func (b *Binaries) Resolve(ctx context.Context, env *bench.Env) (target, initiator string, err error) {
	b.once.Do(func() { b.target, b.initiator, b.err = b.resolve(ctx, env) })
	return b.target, b.initiator, b.err
}

func (b *Binaries) resolve(ctx context.Context, env *bench.Env) (string, string, error) {
	if b.RepoRoot == "" {
		return "", "", fmt.Errorf("e2ebench: the repository root is unknown: run the bench inside the nprdma repository")
	}
	binDir := filepath.Join(b.RepoRoot, "bin")
	tgt, ini := filepath.Join(binDir, "nprdma-target"), filepath.Join(binDir, "nprdma-initiator")
	newest, err := newestSource(b.RepoRoot)
	if err != nil {
		return "", "", err
	}
	fresh := func(p string) bool {
		st, err := os.Stat(p)
		return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 && !st.ModTime().Before(newest)
	}
	if fresh(tgt) && fresh(ini) {
		return tgt, ini, nil
	}
	out, err := env.Dir("bin")
	if err != nil {
		return "", "", err
	}
	env.Logger().Info("e2ebench: bin/ is missing or older than the sources: building the commands", "into", out)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out+string(filepath.Separator), "./cmd/nprdma-target", "./cmd/nprdma-initiator")
	cmd.Dir = b.RepoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("e2ebench: go build of the commands: %w: %s", err, strings.TrimSpace(string(msg)))
	}
	return filepath.Join(out, "nprdma-target"), filepath.Join(out, "nprdma-initiator"), nil
}

// newestSource is the modification time of the newest non-test Go file (or
// go.mod/go.sum) the commands are built from.
func newestSource(root string) (time.Time, error) {
	var newest time.Time
	consider := func(path string) {
		if st, err := os.Stat(path); err == nil && st.ModTime().After(newest) {
			newest = st.ModTime()
		}
	}
	consider(filepath.Join(root, "go.mod"))
	consider(filepath.Join(root, "go.sum"))
	for _, d := range sourceDirs {
		dir := filepath.Join(root, d)
		if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		err := filepath.WalkDir(dir, func(path string, de fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			name := de.Name()
			if de.IsDir() && name == "testdata" {
				return filepath.SkipDir
			}
			if !de.IsDir() && (strings.HasSuffix(name, ".go") || strings.HasSuffix(name, ".c") || strings.HasSuffix(name, ".h")) &&
				!strings.HasSuffix(name, "_test.go") {
				consider(path)
			}
			return nil
		})
		if err != nil {
			return time.Time{}, fmt.Errorf("e2ebench: scan the sources: %w", err)
		}
	}
	return newest, nil
}

// dataSeed keys the content of every backing file the experiments write
// (blockdevbench.FillPage: distinct, incompressible pages).
const dataSeed = 0x6e707264_6d61_0e2e

// pageSize is the I/O size of every measurement and the namespaces' block.
const pageSize = 4096

// pageTag is the first word of page page's content in a file filled with
// blockdevbench.FillPage(seed): checked on every measured read.
func pageTag(seed uint64, page int64) uint64 {
	var rng rand.PCG
	rng.Seed(seed, uint64(page))
	return rng.Uint64()
}

func checkTag(p []byte, page int64) error {
	if got, want := binary.LittleEndian.Uint64(p), pageTag(dataSeed, page); got != want {
		return fmt.Errorf("page %d reads %#016x in its first word, want %#016x: the wrong data came back", page, got, want)
	}
	return nil
}

// noteNoise adds an honest note when per-round values spread by more than
// 10%.
func noteNoise(exp *bench.Experiment, what string, xs []float64) {
	if len(xs) > 1 {
		if s := bench.Spread(xs); s > 0.10 {
			exp.Note("Noisy: %s varied by %.0f%% between rounds (%s).", what, s*100, bench.RoundList(xs))
		}
	}
}

// placements merges placements by role, keeping the order roles first
// appeared in.
type placements struct {
	roles []string
	by    map[string]*bench.Placement
}

func (p *placements) add(pl bench.Placement) {
	if p.by == nil {
		p.by = map[string]*bench.Placement{}
	}
	if q := p.by[pl.Role]; q != nil {
		q.Merge(pl)
		return
	}
	c := pl
	p.by[pl.Role] = &c
	p.roles = append(p.roles, pl.Role)
}

func (p *placements) list() []bench.Placement {
	out := make([]bench.Placement, 0, len(p.roles))
	for _, r := range p.roles {
		out = append(out, *p.by[r])
	}
	return out
}

// sampleDuring samples where each process ran while fn runs and records it
// under its role.
func (p *placements) sampleDuring(procs map[string]int, pinned bool, fn func() error) error {
	type running struct {
		role string
		s    *bench.CPUSampler
	}
	var rs []running
	roles := make([]string, 0, len(procs))
	for r := range procs {
		roles = append(roles, r)
	}
	slices.Sort(roles)
	for _, r := range roles {
		rs = append(rs, running{r, bench.StartCPUSampler(procs[r], 0)})
	}
	err := fn()
	for _, r := range rs {
		pl := r.s.Stop()
		pl.Role, pl.Pinned = r.role, pinned
		p.add(pl)
	}
	return err
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
