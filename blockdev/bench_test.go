package blockdev

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// BenchmarkReadAt4K measures 4 KiB random O_DIRECT reads from N goroutines
// (the queue depth). The file is NPRDMA_BLOCKDEV_BENCH_FILE (an existing file
// or device, opened read-only) or a 256 MiB file written first so that reads
// hit allocated blocks. Timing is reported, never asserted; bench/ has the
// experiment that compares it with fio.
func BenchmarkReadAt4K(b *testing.B) { benchReadAt4K(b) }

// BenchmarkReadAt4KIOUring is BenchmarkReadAt4K through an io_uring.
func BenchmarkReadAt4KIOUring(b *testing.B) { benchReadAt4K(b, WithIOUring()) }

func benchReadAt4K(b *testing.B, opts ...Option) {
	path := os.Getenv("NPRDMA_BLOCKDEV_BENCH_FILE")
	if path == "" {
		path = filepath.Join(b.TempDir(), "bench.img")
		fillBenchFile(b, path, 256<<20)
	}
	d, err := Open(path, append([]Option{WithReadOnly(), WithMaxInflight(0)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	if !d.Direct() {
		b.Logf("%s: no O_DIRECT; reads hit the page cache", path)
	}
	pages := d.Size() / PageSize
	for _, qd := range []int{1, 4, 8, 16, 32, 64, 128} {
		b.Run(fmt.Sprintf("qd=%d", qd), func(b *testing.B) {
			var wg sync.WaitGroup
			start := time.Now()
			for g := range qd {
				n := b.N / qd
				if g < b.N%qd {
					n++
				}
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(g), 42))
					buf := AlignedBuffer(PageSize)
					for range n {
						if _, err := d.ReadAt(buf, rng.Int64N(pages)*PageSize); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "IOPS")
		})
	}
}

func fillBenchFile(b *testing.B, path string, size int64) {
	b.Helper()
	if err := Create(path, size); err != nil {
		b.Fatal(err)
	}
	d, err := Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	chunk := patterned(4<<20, 0, 1)
	for off := int64(0); off < size; off += int64(len(chunk)) {
		if _, err := d.WriteAt(chunk, off); err != nil {
			b.Fatal(err)
		}
	}
	if err := d.Flush(); err != nil {
		b.Fatal(err)
	}
}
