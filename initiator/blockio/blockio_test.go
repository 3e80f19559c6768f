package blockio

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

const testBlock = 4096

func TestMemoryEnforcesAlignmentAndRange(t *testing.T) {
	m := NewMemory(16*testBlock, testBlock)
	buf := make([]byte, testBlock)
	cases := []struct {
		name string
		err  error
		call func() error
	}{
		{"read unaligned offset", ErrUnaligned, func() error { _, err := m.ReadAt(buf, 1); return err }},
		{"write unaligned length", ErrUnaligned, func() error { _, err := m.WriteAt(buf[:100], 0); return err }},
		{"read past end", ErrOutOfRange, func() error { _, err := m.ReadAt(buf, 16*testBlock); return err }},
		{"trim past end", ErrOutOfRange, func() error { return m.Trim(15*testBlock, 2*testBlock) }},
		{"negative offset", ErrOutOfRange, func() error { return m.WriteZeroes(-testBlock, testBlock) }},
	}
	for _, c := range cases {
		err := c.call()
		if !errors.Is(err, c.err) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.err)
		}
		if Errno(err) != syscall.EINVAL {
			t.Errorf("%s: Errno = %v, want EINVAL", c.name, Errno(err))
		}
	}
}

func TestMemoryCountsAndFails(t *testing.T) {
	m := NewMemory(4*testBlock, testBlock)
	data := bytes.Repeat([]byte{7}, testBlock)
	if _, err := m.WriteAtFUA(data, testBlock); err != nil {
		t.Fatal(err)
	}
	if err := m.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := m.Trim(0, testBlock); err != nil {
		t.Fatal(err)
	}
	got := m.Stats()
	want := MemoryStats{FUAWrites: 1, Flushes: 1, Trims: 1, BytesWritten: testBlock}
	if got != want {
		t.Fatalf("stats %+v, want %+v", got, want)
	}
	m.FailWith(syscall.ENOSPC)
	_, err := m.WriteAt(data, 0)
	if Errno(err) != syscall.ENOSPC {
		t.Fatalf("write while failing: %v (errno %v), want ENOSPC", err, Errno(err))
	}
	if Errno(m.Flush()) != syscall.ENOSPC {
		t.Fatal("flush while failing did not fail with ENOSPC")
	}
	m.FailWith(nil)
	if _, err := m.ReadAt(data, testBlock); err != nil || data[0] != 7 {
		t.Fatalf("read after recovery: %v, byte %d", err, data[0])
	}
}

func TestErrnoDefaults(t *testing.T) {
	if Errno(nil) != 0 {
		t.Fatal("Errno(nil) != 0")
	}
	if got := Errno(errors.New("opaque")); got != syscall.EIO {
		t.Fatalf("opaque error maps to %v, want EIO", got)
	}
	if got := Errno(fmt.Errorf("x: %w", ErrReadOnly)); got != syscall.EROFS {
		t.Fatalf("read-only maps to %v, want EROFS", got)
	}
}

func TestNewAlignedPassesThroughByteGranularBackends(t *testing.T) {
	m := NewMemory(8, 1)
	if NewAligned(m) != Backend(m) {
		t.Fatal("NewAligned wrapped a backend that needs no alignment")
	}
	a := NewAligned(NewMemory(8*testBlock, testBlock))
	if a.BlockSize() != 1 || NativeBlockSize(a) != testBlock {
		t.Fatalf("aligned BlockSize %d, NativeBlockSize %d", a.BlockSize(), NativeBlockSize(a))
	}
}

// TestAlignedMatchesReference runs random unaligned operations through the
// decorator and through a plain byte slice, and compares every read and the
// final contents. The Memory backend underneath rejects any unaligned call,
// so a wrong split shows up as an error.
func TestAlignedMatchesReference(t *testing.T) {
	const size = 64 * testBlock
	mem := NewMemory(size, testBlock)
	a := NewAligned(mem)
	ref := make([]byte, size)
	rng := rand.New(rand.NewPCG(1, 2))
	randRange := func() (int64, int64) {
		off := rng.Int64N(size)
		var n int64
		switch rng.IntN(3) {
		case 0:
			n = rng.Int64N(64) // tiny, often inside one block
		case 1:
			n = rng.Int64N(3 * testBlock)
		default:
			n = rng.Int64N(20 * testBlock)
		}
		return off, min(n, size-off)
	}
	for i := range 3000 {
		off, n := randRange()
		switch op := rng.IntN(5); op {
		case 0, 1:
			p := make([]byte, n)
			for j := range p {
				p[j] = byte(rng.Uint32())
			}
			var err error
			if op == 0 {
				_, err = a.WriteAt(p, off)
			} else {
				_, err = a.WriteAtFUA(p, off)
			}
			if err != nil {
				t.Fatalf("op %d: write [%d,+%d): %v", i, off, n, err)
			}
			copy(ref[off:], p)
		case 2:
			p := make([]byte, n)
			if _, err := a.ReadAt(p, off); err != nil {
				t.Fatalf("op %d: read [%d,+%d): %v", i, off, n, err)
			}
			if !bytes.Equal(p, ref[off:off+n]) {
				t.Fatalf("op %d: read [%d,+%d) differs from the reference", i, off, n)
			}
		case 3:
			if err := a.Trim(off, n); err != nil {
				t.Fatalf("op %d: trim [%d,+%d): %v", i, off, n, err)
			}
			clear(ref[off : off+n])
		case 4:
			if err := a.WriteZeroes(off, n); err != nil {
				t.Fatalf("op %d: write zeroes [%d,+%d): %v", i, off, n, err)
			}
			clear(ref[off : off+n])
		}
	}
	if !bytes.Equal(mem.Snapshot(), ref) {
		t.Fatal("final contents differ from the reference")
	}
	st := mem.Stats()
	if st.Trims == 0 || st.WriteZeroes == 0 || st.FUAWrites == 0 {
		t.Fatalf("whole-block trims/zeroes/FUA writes never reached the backend: %+v", st)
	}
}

func TestAlignedRejectsOutOfRange(t *testing.T) {
	a := NewAligned(NewMemory(4*testBlock, testBlock))
	p := make([]byte, 10)
	if _, err := a.ReadAt(p, 4*testBlock-5); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("read crossing the end: %v", err)
	}
	if _, err := a.WriteAt(p, -1); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("write at -1: %v", err)
	}
	if err := a.Trim(1, 1<<62); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("huge trim: %v", err)
	}
}

func TestAlignedPropagatesBackendErrors(t *testing.T) {
	mem := NewMemory(4*testBlock, testBlock)
	a := NewAligned(mem)
	mem.FailWith(syscall.EIO)
	if _, err := a.WriteAt([]byte{1, 2, 3}, 5); Errno(err) != syscall.EIO {
		t.Fatalf("edge write with failing backend: %v", err)
	}
	if _, err := a.ReadAt(make([]byte, 3), 5); Errno(err) != syscall.EIO {
		t.Fatalf("edge read with failing backend: %v", err)
	}
	if err := a.Trim(0, 2*testBlock); Errno(err) != syscall.EIO {
		t.Fatalf("trim with failing backend: %v", err)
	}
}

// TestAlignedConcurrentEdgeWrites has many goroutines write disjoint byte
// ranges that share blocks (including ranges straddling a block boundary and
// whole middle blocks). Without the per-block locks, two read-modify-writes
// of one block overwrite each other and bytes come back stale.
func TestAlignedConcurrentEdgeWrites(t *testing.T) {
	const blocks = 4
	mem := NewMemory(blocks*testBlock, testBlock)
	a := NewAligned(mem)
	for round := range 20 {
		// Slice [0, blocks*testBlock) into random disjoint pieces.
		rng := rand.New(rand.NewPCG(uint64(round), 7))
		var cuts []int64
		for off := int64(0); off < blocks*testBlock; {
			cuts = append(cuts, off)
			off += 1 + rng.Int64N(testBlock/2)
			if rng.IntN(8) == 0 {
				off += testBlock // some pieces cover whole blocks
			}
		}
		cuts = append(cuts, blocks*testBlock)
		fill := byte(round + 1)
		var wg sync.WaitGroup
		errs := make(chan error, len(cuts))
		for i := 0; i+1 < len(cuts); i++ {
			off, end := cuts[i], min(cuts[i+1], blocks*testBlock)
			if off >= end {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := bytes.Repeat([]byte{fill}, int(end-off))
				if _, err := a.WriteAt(p, off); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		got := mem.Snapshot()
		for i, b := range got {
			if b != fill {
				t.Fatalf("round %d: byte %d is %d, want %d: a concurrent edge write was lost", round, i, b, fill)
			}
		}
	}
}

func TestInstrumentCountsOperations(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	mem := NewMemory(4*testBlock, testBlock)
	b := Instrument(mem, m, "test")
	p := make([]byte, testBlock)
	for range 3 {
		if _, err := b.WriteAt(p, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.ReadAt(p, 5); err == nil {
		t.Fatal("unaligned read succeeded on the raw memory backend")
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	if NativeBlockSize(b) != testBlock {
		t.Fatal("Instrument hides the native block size")
	}
	want := map[string]float64{
		"nprdma_attach_ops_total/write":       3,
		"nprdma_attach_bytes_total/write":     3 * testBlock,
		"nprdma_attach_ops_total/read":        1,
		"nprdma_attach_op_errors_total/read":  1,
		"nprdma_attach_ops_total/flush":       1,
		"nprdma_attach_op_errors_total/write": 0,
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, metric := range f.GetMetric() {
			var op string
			for _, l := range metric.GetLabel() {
				if l.GetName() == "op" {
					op = l.GetValue()
				}
			}
			key := f.GetName() + "/" + op
			if c := metric.GetCounter(); c != nil {
				got[key] = c.GetValue()
			}
			if h := metric.GetHistogram(); h != nil {
				got[key] = float64(h.GetSampleCount())
			}
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if got["nprdma_attach_op_duration_seconds/write"] != 3 {
		t.Errorf("write latency histogram has %v samples, want 3", got["nprdma_attach_op_duration_seconds/write"])
	}
	if _, err := NewMetrics(reg); err == nil {
		t.Error("registering the attach metrics twice on one registry succeeded")
	}
}
