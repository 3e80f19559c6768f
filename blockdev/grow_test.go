package blockdev

import (
	"errors"
	"os"
	"testing"
)

func TestFileGrow(t *testing.T) {
	d := openTemp(t, 1<<20)
	old := patterned(64<<10, 0, 3)
	if _, err := d.WriteAt(old, 0); err != nil {
		t.Fatal(err)
	}
	// Through a decorator, as the target holds its devices.
	f := NewFaulty(d)
	if err := Grow(f, 4<<20); err != nil {
		t.Fatal(err)
	}
	if d.Size() != 4<<20 || f.Size() != 4<<20 {
		t.Fatalf("size after Grow: %d (decorator %d), want %d", d.Size(), f.Size(), 4<<20)
	}
	if st, err := os.Stat(d.Path()); err != nil || st.Size() != 4<<20 {
		t.Fatalf("file after Grow: %v, %v", st, err)
	}
	if a := allocated(t, d.Path()); a > 1<<20 {
		t.Errorf("the grown range takes space: %d bytes allocated", a)
	}
	got := AlignedBuffer(64 << 10)
	if _, err := d.ReadAt(got, 3<<20); err != nil {
		t.Fatal(err)
	}
	if !isZero(got) {
		t.Fatal("the grown range does not read zeros")
	}
	p := patterned(64<<10, 3<<20, 4)
	if _, err := d.WriteAt(p, 3<<20); err != nil {
		t.Fatalf("write in the grown range: %v", err)
	}
	if _, err := d.ReadAt(got, 3<<20); err != nil {
		t.Fatal(err)
	}
	checkBytes(t, "grown range", got, p)
	if _, err := d.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	checkBytes(t, "old range", got, old)

	if err := d.Grow(1 << 20); err == nil {
		t.Fatal("Grow to a smaller size succeeded")
	}
	if err := d.Grow(4<<20 + 512); !errors.Is(err, ErrUnaligned) {
		t.Fatalf("Grow to an unaligned size: %v, want ErrUnaligned", err)
	}
	if d.Size() != 4<<20 {
		t.Fatalf("size changed by refused Grows: %d", d.Size())
	}
	if err := Grow(newMemDevice(4096), 8192); err == nil {
		t.Fatal("Grow of a device that cannot grow succeeded")
	}
}

func TestFileGrowReadOnlyAndClosed(t *testing.T) {
	path := createTemp(t, 1<<20)
	ro, err := Open(path, WithReadOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if err := ro.Grow(2 << 20); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("Grow of a read-only device: %v, want ErrReadOnly", err)
	}
	d, err := Open(path, WithoutExclusive())
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if err := d.Grow(2 << 20); !errors.Is(err, ErrClosed) {
		t.Fatalf("Grow of a closed device: %v, want ErrClosed", err)
	}
}
