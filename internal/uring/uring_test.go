package uring

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"unsafe"
)

const opNop = 0 // IORING_OP_NOP

func newRing(t *testing.T, p Params) *Ring {
	t.Helper()
	r, err := New(p)
	if err != nil {
		t.Skipf("no io_uring here: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// A full queue refuses more entries; after Submit the kernel has consumed
// them and every completion comes back once with its user data, in both
// entry sizes.
func TestPrepareSubmitComplete(t *testing.T) {
	for _, sqe128 := range []bool{false, true} {
		r := newRing(t, Params{Entries: 8, SQE128: sqe128})
		for round := range 3 {
			for i := range r.Entries() {
				e := r.Prepare()
				if e == nil {
					t.Fatalf("SQE128 %v: queue full after %d of %d entries", sqe128, i, r.Entries())
				}
				e.Opcode, e.UserData = opNop, uint64(round*100+i)
				// The command area ends at the entry's end: writing the
				// last entry's whole stays inside the mapping.
				if want := map[bool]int{false: 16, true: 80}[sqe128]; len(r.Cmd(e)) != want {
					t.Fatalf("SQE128 %v: command area of %d bytes, want %d", sqe128, len(r.Cmd(e)), want)
				}
				for j := range r.Cmd(e) {
					r.Cmd(e)[j] = 0xff
				}
			}
			if r.Prepare() != nil {
				t.Fatalf("SQE128 %v: Prepare past the queue's size", sqe128)
			}
			if n, err := r.Submit(uint32(r.Entries())); err != nil || n != r.Entries() {
				t.Fatalf("SQE128 %v: Submit = %d, %v", sqe128, n, err)
			}
			if r.Pending() != 0 {
				t.Fatalf("SQE128 %v: %d entries left after Submit", sqe128, r.Pending())
			}
			seen := map[uint64]bool{}
			r.Completions(func(c CQE) {
				if c.Res != 0 || seen[c.UserData] {
					t.Errorf("SQE128 %v: completion %+v (seen before: %v)", sqe128, c, seen[c.UserData])
				}
				seen[c.UserData] = true
			})
			for i := range r.Entries() {
				if !seen[uint64(round*100+i)] {
					t.Errorf("SQE128 %v round %d: no completion for entry %d", sqe128, round, i)
				}
			}
		}
	}
}

// Reads and writes of a file through the ring move the bytes and report
// the kernel's result; an error comes back as a negative errno.
func TestReadWriteFile(t *testing.T) {
	r := newRing(t, Params{Entries: 4})
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := bytes.Repeat([]byte("uring!"), 700)
	got := make([]byte, len(want))
	do := func(op uint8, fd int, p []byte, off uint64) int32 {
		e := r.Prepare()
		*e = SQE{Opcode: op, FD: int32(fd), Off: off, Addr: uint64(uintptr(unsafe.Pointer(&p[0]))), Len: uint32(len(p)), UserData: 7}
		if _, err := r.Submit(1); err != nil {
			t.Fatal(err)
		}
		var res int32
		if r.Completions(func(c CQE) { res = c.Res }) != 1 {
			t.Fatal("not one completion")
		}
		return res
	}
	if n := do(OpWrite, int(f.Fd()), want, 100); n != int32(len(want)) {
		t.Fatalf("write: %d", n)
	}
	if n := do(OpRead, int(f.Fd()), got, 100); n != int32(len(want)) || !bytes.Equal(got, want) {
		t.Fatalf("read: %d, equal %v", n, bytes.Equal(got, want))
	}
	if n := do(OpRead, -1, got, 0); n != -9 { // EBADF
		t.Fatalf("read of descriptor -1: %d, want -EBADF", n)
	}
}
