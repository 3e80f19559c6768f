package swap_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/swap"
)

// A region of 4 MiB over a sparse backing file, with a DRAM budget of 256
// KiB: writing the whole region evicts what does not fit (written back to
// the file first), and reading it back faults those pages in again.
func Example() {
	dir, err := os.MkdirTemp("", "swap-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "backing")
	const size, budget = 4 << 20, 256 << 10
	if err := blockdev.Create(path, size); err != nil {
		panic(err)
	}
	dev, err := blockdev.Open(path)
	if err != nil {
		panic(err)
	}
	defer dev.Close()
	r, err := swap.New(dev, swap.WithBudget(budget))
	if err != nil {
		panic(err)
	}
	defer r.Close()

	// Each 64 KiB chunk holds its own index.
	chunk := make([]byte, 64<<10)
	for off := int64(0); off < size; off += int64(len(chunk)) {
		for i := range chunk {
			chunk[i] = byte(off >> 16)
		}
		if _, err := r.WriteAt(chunk, off); err != nil {
			panic(err)
		}
	}
	got := make([]byte, len(chunk))
	same := true
	for off := int64(0); off < size; off += int64(len(got)) {
		if _, err := r.ReadAt(got, off); err != nil {
			panic(err)
		}
		same = same && bytes.Count(got, []byte{byte(off >> 16)}) == len(got)
	}
	if err := r.Flush(); err != nil { // every dirty page on the file, fdatasync'ed
		panic(err)
	}
	st := r.Stats()
	fmt.Println("read back what was written:", same)
	fmt.Println("resident within the budget:", st.Resident*swap.PageSize <= budget)
	fmt.Println("pages read back from the file:", st.MajorFaults > 0)
	fmt.Println("dirty after the flush:", st.Dirty)
	// Output:
	// read back what was written: true
	// resident within the budget: true
	// pages read back from the file: true
	// dirty after the flush: 0
}
