package swap

import (
	"bytes"
	"sync/atomic"
	"testing"
)

// TestTryReadAtServesResidentPagesOnly: TryReadAt copies resident pages
// (also across a page boundary and from a zero page) and refuses, without
// faulting anything in, a range with an absent page, a busy page, or a page
// the policy does not track yet; ReadAt then serves the same range.
func TestTryReadAtServesResidentPagesOnly(t *testing.T) {
	r, _ := newRegion(t, 32*PageSize, WithBudget(32*PageSize))
	mustWrite(t, r, append(pagePattern(3, 1), pagePattern(4, 1)...), 3*PageSize)
	p := make([]byte, PageSize)
	if !r.TryReadAt(p, 3*PageSize+100) {
		t.Fatal("TryReadAt refused two resident pages")
	}
	expectBytes(t, "TryReadAt across pages 3-4", p, append(pagePattern(3, 1), pagePattern(4, 1)...)[100:100+PageSize])

	before := r.Stats()
	if r.TryReadAt(p, 4*PageSize+100) {
		t.Fatal("TryReadAt served a range whose second page is absent")
	}
	if r.TryReadAt(p, 9*PageSize) {
		t.Fatal("TryReadAt served an absent page")
	}
	if after := r.Stats(); after.MajorFaults+after.MinorFaults != before.MajorFaults+before.MinorFaults {
		t.Fatalf("TryReadAt faulted pages in: %+v -> %+v", before, after)
	}
	if s := atomic.LoadUint64(&r.States()[9]); s&StatePresent != 0 {
		t.Fatalf("page 9 present after a refused TryReadAt: state %#x", s)
	}
	// A zero page, faulted in by ReadAt, is served as zeros.
	mustRead(t, r, PageSize, 9*PageSize)
	p[0] = 1
	if !r.TryReadAt(p, 9*PageSize) || !bytes.Equal(p, make([]byte, PageSize)) {
		t.Fatal("TryReadAt of a resident zero page: refused or not zeros")
	}

	w := &r.States()[3]
	atomic.OrUint64(w, StateBusy)
	if r.TryReadAt(p, 3*PageSize) {
		t.Fatal("TryReadAt served a busy page")
	}
	atomic.AndUint64(w, ^StateBusy)
	atomic.AndUint64(w, ^StateTracked)
	if r.TryReadAt(p, 3*PageSize) {
		t.Fatal("TryReadAt served an untracked page (tracking it takes the policy's lock)")
	}
	expectBytes(t, "ReadAt after a refused TryReadAt", mustRead(t, r, PageSize, 3*PageSize), pagePattern(3, 1))
	if s := atomic.LoadUint64(w); s&StateTracked == 0 {
		t.Fatalf("ReadAt left page 3 untracked: state %#x", s)
	}
	if !r.TryReadAt(p, 3*PageSize) {
		t.Fatal("TryReadAt refused page 3 once tracked again")
	}
	if r.TryReadAt(p, 31*PageSize+1) {
		t.Fatal("TryReadAt served a range beyond the region")
	}
}

// TestTryWriteAtWritesResidentPagesOnly: TryWriteAt writes resident pages
// (marking them dirty, so that Flush writes them back), refuses an absent
// or busy page, or a page whose dirty-set shard lock is held, having written
// nothing, and never leaves a page busy.
func TestTryWriteAtWritesResidentPagesOnly(t *testing.T) {
	r, dev := newRegion(t, 32*PageSize, WithBudget(32*PageSize))
	mustWrite(t, r, append(pagePattern(3, 1), pagePattern(4, 1)...), 3*PageSize)
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	data := append(pagePattern(3, 2), pagePattern(4, 2)...)
	if !r.TryWriteAt(data[50:50+PageSize], 3*PageSize+50) {
		t.Fatal("TryWriteAt refused two resident pages")
	}
	want := append(pagePattern(3, 1), pagePattern(4, 1)...)
	copy(want[50:], data[50:50+PageSize])
	expectBytes(t, "after TryWriteAt", mustRead(t, r, 2*PageSize, 3*PageSize), want)
	if d := r.Stats().Dirty; d != 2 {
		t.Fatalf("%d dirty pages after TryWriteAt over two, want 2", d)
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	onDevice := make([]byte, 2*PageSize)
	if _, err := dev.ReadAt(onDevice, 3*PageSize); err != nil {
		t.Fatal(err)
	}
	expectBytes(t, "device after Flush", onDevice, want)

	// Refusals write nothing.
	if r.TryWriteAt(data, 4*PageSize) {
		t.Fatal("TryWriteAt wrote a range whose second page is absent")
	}
	w := &r.States()[3]
	atomic.OrUint64(w, StateBusy)
	if r.TryWriteAt(data[:PageSize], 3*PageSize) {
		t.Fatal("TryWriteAt wrote a busy page")
	}
	atomic.AndUint64(w, ^StateBusy)
	_, sh := r.dirty.shard(3)
	sh.mu.Lock()
	ok := r.TryWriteAt(data[:PageSize], 3*PageSize)
	sh.mu.Unlock()
	if ok {
		t.Fatal("TryWriteAt wrote with its dirty-set shard's lock held elsewhere")
	}
	expectBytes(t, "after refused TryWriteAts", mustRead(t, r, 2*PageSize, 3*PageSize), want)
	if s := atomic.LoadUint64(w); s&StateBusy != 0 {
		t.Fatalf("page 3 left busy: state %#x", s)
	}
	if d := r.Stats().Dirty; d != 0 {
		t.Fatalf("%d dirty pages after refused TryWriteAts, want 0", d)
	}
	if r.TryWriteAt(data[:2], 32*PageSize-1) {
		t.Fatal("TryWriteAt wrote beyond the region")
	}
}
