package main

import (
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestMeasureGOMAXPROCS runs the target with --gomaxprocs 2 (the CPUs) and
// 32 (the default) and drives 32 concurrent 4 KiB random reads over a
// namespace 64 times the DRAM budget, so that nearly every read is a major
// fault the target serves with a blocking pread from a goroutine. It logs
// the IOPS of each (NPRDMA_LONG=1; docs/target.md quotes it). Reported,
// never asserted.
func TestMeasureGOMAXPROCS(t *testing.T) {
	if os.Getenv("NPRDMA_LONG") != "1" {
		t.Skip("measurement: set NPRDMA_LONG=1")
	}
	dir := t.TempDir()
	const size = 256 << 20
	f, err := os.Create(filepath.Join(dir, "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for off := 0; off < size; off += len(chunk) {
		rand.Read(chunk)
		f.Write(chunk)
	}
	f.Sync()
	f.Close()
	for _, procs := range []int{2, 32, 2, 32} {
		args := append(targetArgs(dir), "--gomaxprocs", fmt.Sprint(procs))
		p := startTargetProc(t, args...)
		_, n, done := connectNS(t, p.addr)
		var ops atomic.Int64
		stop := time.Now().Add(4 * time.Second)
		var wg sync.WaitGroup
		for w := 0; w < 32; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := mrand.New(mrand.NewPCG(uint64(w), 1))
				buf := make([]byte, 4096)
				for time.Now().Before(stop) {
					if _, err := n.ReadAt(buf, rng.Int64N(size/4096)*4096); err != nil {
						t.Error(err)
						return
					}
					ops.Add(1)
				}
			}()
		}
		wg.Wait()
		done()
		p.cmd.Process.Kill()
		p.wait(t)
		t.Logf("--gomaxprocs %2d: %6.0f reads/s (32 readers, nearly all major faults)", procs, float64(ops.Load())/4)
	}
}
