package e2ebench

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/bench"
	"github.com/nprdma/nprdma/bench/blockdevbench"
	"github.com/nprdma/nprdma/initiator/blockio"
	"github.com/nprdma/nprdma/initiator/nbd"
)

// TestZipfDrawsTheDistribution: the generator's empirical shares of the
// hottest ranks match P(k) = (k+1)^-θ / ζ(n, θ) within sampling error, the
// tail is drawn too, and nothing falls outside [0, n).
func TestZipfDrawsTheDistribution(t *testing.T) {
	const n, draws = 1000, 400_000
	z, err := newZipf(n, 0.99)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	counts := make([]int, n)
	for range draws {
		k := z.rank(r)
		if k < 0 || k >= n {
			t.Fatalf("rank %d outside [0, %d)", k, n)
		}
		counts[k]++
	}
	// Compare the hottest ranks and bands of colder ones with the law.
	bands := [][2]int64{{0, 1}, {1, 2}, {2, 3}, {2, 10}, {10, 100}, {100, 1000}}
	for _, b := range bands {
		var want float64
		got := 0
		for k := b[0]; k < b[1]; k++ {
			want += z.share(k)
			got += counts[k]
		}
		share := float64(got) / draws
		sigma := math.Sqrt(want * (1 - want) / draws)
		if math.Abs(share-want) > 5*sigma {
			t.Errorf("ranks [%d, %d): share %.4f, want %.4f", b[0], b[1], share, want)
		}
	}
	if counts[n-1]+counts[n-2]+counts[n-3] == 0 {
		t.Error("the coldest ranks were never drawn")
	}
	// The law itself: P(0)/P(9) = 10^θ.
	if got, want := z.share(0)/z.share(9), math.Pow(10, 0.99); math.Abs(got-want) > 1e-9*want {
		t.Errorf("P(0)/P(9) = %g, want %g", got, want)
	}
	if _, err := newZipf(1000, 1.2); err == nil {
		t.Error("theta above 1 accepted (math/rand's Zipf is the tool for that)")
	}
}

// TestPermutationIsABijection: rank scattering maps 0..n-1 onto 0..n-1
// for sizes with various factors, including namespaces of r×2^k pages.
func TestPermutationIsABijection(t *testing.T) {
	for _, n := range []int64{2, 3, 7, 1000, 1024, 5 * 32768, 3 * 4096} {
		p := newPermutation(n)
		seen := make([]bool, n)
		for k := range n {
			v := p.at(k)
			if v < 0 || v >= n || seen[v] {
				t.Fatalf("n %d: rank %d maps to %d (out of range or taken)", n, k, v)
			}
			seen[v] = true
		}
	}
	// Large namespaces take the slow path of mulmod: check it against
	// math/big.
	r := rand.New(rand.NewPCG(3, 4))
	for range 1000 {
		m := r.Int64N(1<<50) + 2
		a, b := r.Int64N(m), r.Int64N(m)
		want := new(big.Int).Mod(new(big.Int).Mul(big.NewInt(a), big.NewInt(b)), big.NewInt(m)).Int64()
		if got := mulmod(a, b, m); got != want {
			t.Fatalf("mulmod(%d, %d, %d) = %d, want %d", a, b, m, got, want)
		}
	}
}

// TestMemoryForLeavesTheBudgetResident: the --memory the capacity
// experiment passes leaves exactly the intended bytes (within a page)
// after swap's free margin, min(budget/16, 4096) pages.
func TestMemoryForLeavesTheBudgetResident(t *testing.T) {
	for _, b := range []int64{16 << 20, 128 << 20, 240 << 20, 256 << 20, 1 << 30, 4 << 30} {
		m := memoryFor(b)
		pages := m / pageSize
		margin := min(max(pages/16, 1), 4096)
		resident := (pages - margin) * pageSize
		if resident < b || resident > b+2*pageSize {
			t.Errorf("memoryFor(%d) = %d: %d bytes resident after a %d-page margin, want %d", b, m, resident, margin, b)
		}
	}
}

// TestNBDReadFromOurServer: the client reads the right bytes from the
// project's NBD server (in-process, loopback TCP), and a read beyond the
// export is refused before it is sent.
func TestNBDReadFromOurServer(t *testing.T) {
	const size = 1 << 20
	mem := blockio.NewMemory(size, pageSize)
	want := make([]byte, pageSize)
	blockdevbench.FillPage(want, dataSeed, 3)
	if _, err := mem.WriteAt(want, 3*pageSize); err != nil {
		t.Fatal(err)
	}
	srv, err := nbd.NewServer(mem)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := nbd.ListenTCP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	got := make([]byte, pageSize)
	if err := nbdRead(context.Background(), "tcp", ln.Addr().String(), got, 3*pageSize); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("nbdRead returned the wrong bytes")
	}
	if err := nbdRead(context.Background(), "tcp", ln.Addr().String(), got, size); err == nil || !strings.Contains(err.Error(), "beyond") {
		t.Fatalf("read beyond the export: %v", err)
	}
}

// TestNBDReadFromNBDKit: the same client against nbdkit (the reference the
// startup experiment polls), whose pattern plugin stores each 8-byte
// offset big-endian at that offset.
func TestNBDReadFromNBDKit(t *testing.T) {
	if _, err := bench.FindTool("nbdkit"); err != nil {
		t.Skipf("nbdkit not installed: %v", err)
	}
	nk, err := bench.StartNBDKit(context.Background(), "pattern", []string{"size=1M"}, bench.WithLoopbackTCP())
	if err != nil {
		t.Fatal(err)
	}
	defer nk.Stop()
	p := make([]byte, pageSize)
	if err := nbdRead(context.Background(), "tcp", nk.Addr, p, 8*pageSize); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(p); i += 8 {
		if got, want := binary.BigEndian.Uint64(p[i:]), uint64(8*pageSize+i); got != want {
			t.Fatalf("word at %d reads %#x, want %#x", 8*pageSize+i, got, want)
		}
	}
}

// TestBinariesAreRebuiltWhenStale: fresh binaries in bin/ are used as they
// are; once a source file is newer, Resolve builds instead (here, in a fake
// module, the build fails and says so).
func TestBinariesAreRebuiltWhenStale(t *testing.T) {
	root := t.TempDir()
	write := func(p, s string, mode os.FileMode, when time.Time) {
		p = filepath.Join(root, p)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(s), mode); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(p, when, when)
	}
	old, now := time.Now().Add(-time.Hour), time.Now()
	write("go.mod", "module example.com/fake\n", 0o644, old)
	write("cmd/nprdma-target/main.go", "package main\n", 0o644, old)
	write("bin/nprdma-target", "#!/bin/sh\n", 0o755, now)
	write("bin/nprdma-initiator", "#!/bin/sh\n", 0o755, now)
	env := &bench.Env{OutDir: t.TempDir()}
	b := &Binaries{RepoRoot: root}
	tgt, ini, err := b.Resolve(context.Background(), env)
	if err != nil || tgt != filepath.Join(root, "bin/nprdma-target") || ini != filepath.Join(root, "bin/nprdma-initiator") {
		t.Fatalf("fresh binaries: %q %q %v", tgt, ini, err)
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go not in PATH")
	}
	write("target/target.go", "package target\n", 0o644, now.Add(time.Minute))
	b = &Binaries{RepoRoot: root}
	if _, _, err := b.Resolve(context.Background(), env); err == nil || !strings.Contains(err.Error(), "go build") {
		t.Fatalf("stale binaries: %v, want a go build attempt", err)
	}
}

// TestPlacementsMergeByRole: samples of one role from several measurements
// add up; roles keep the order they first appeared in.
func TestPlacementsMergeByRole(t *testing.T) {
	var p placements
	p.add(bench.Placement{Role: "b", Samples: 2, RanOn: []bench.CPUShare{{CPU: 0, Samples: 2, Share: 1}}})
	p.add(bench.Placement{Role: "a", Samples: 1, RanOn: []bench.CPUShare{{CPU: 1, Samples: 1, Share: 1}}})
	p.add(bench.Placement{Role: "b", Samples: 2, RanOn: []bench.CPUShare{{CPU: 1, Samples: 2, Share: 1}}})
	l := p.list()
	if len(l) != 2 || l[0].Role != "b" || l[1].Role != "a" || l[0].Samples != 4 {
		t.Fatalf("placements %+v", l)
	}
	err := p.sampleDuring(map[string]int{"self": os.Getpid()}, false, func() error {
		deadline := time.Now().Add(150 * time.Millisecond)
		for time.Now().Before(deadline) {
		}
		return errors.New("measured")
	})
	if err == nil || err.Error() != "measured" {
		t.Fatalf("sampleDuring returned %v, want fn's error", err)
	}
	if l := p.list(); len(l) != 3 || l[2].Role != "self" || l[2].Samples == 0 {
		t.Fatalf("self placement %+v", l)
	}
}
