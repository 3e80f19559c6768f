package blockio

import (
	"fmt"
	"sync"
)

// lockStripes is the number of block locks of an aligned backend. A block
// maps to stripe index%lockStripes, so unrelated blocks share a stripe only
// rarely, and the lock table stays a fixed 6 KiB whatever the backend's size.
const lockStripes = 256

// Stripe lock modes, ordered so that the stronger one wins when a request
// needs the same stripe for two blocks.
const (
	unlocked uint8 = iota
	shared
	exclusive
)

// aligned turns arbitrary byte ranges into block-aligned calls to the backend
// underneath. Partial blocks at the edges of a write, trim or write-zeroes
// are read, modified and written back whole.
//
// Read-modify-write loses data unless nothing else changes the block between
// the read and the write-back, so: an edge block is held exclusively during
// its read-modify-write, and every block a request changes whole is held
// shared. Whole-block writers thus run concurrently with each other, and
// only wait for (or hold off) a read-modify-write of one of their blocks.
// Reads take no lock: each block is written whole, so a read overlapping a
// write sees what the backend's own ordering gives it, as with any disk.
type aligned struct {
	b     Backend // its Size may grow (a namespace the target resized)
	bs    int64
	locks [lockStripes]sync.RWMutex
	bufs  sync.Pool // *[]byte of one block, for edges
}

// NewAligned returns b accepting any offset and length within its size; b
// itself is returned when it already accepts any alignment. The result's
// BlockSize is 1; NativeBlockSize still reports b's.
func NewAligned(b Backend) Backend {
	if b.BlockSize() <= 1 {
		return b
	}
	a := &aligned{b: b, bs: int64(b.BlockSize())}
	a.bufs.New = func() any {
		buf := make([]byte, a.bs)
		return &buf
	}
	return a
}

func (a *aligned) Size() int64     { return a.b.Size() }
func (a *aligned) BlockSize() int  { return 1 }
func (a *aligned) Unwrap() Backend { return a.b }
func (a *aligned) Flush() error    { return a.b.Flush() }

func (a *aligned) check(op string, off, length int64) error {
	if size := a.b.Size(); !CheckRange(off, length, size) {
		return rangeError("aligned backend", op, off, length,
			fmt.Errorf("%w (size %d)", ErrOutOfRange, size))
	}
	return nil
}

func (a *aligned) isAligned(off, length int64) bool {
	return off%a.bs == 0 && length%a.bs == 0
}

// span splits [off, off+length) into a partial head block, whole middle
// blocks [midStart, midEnd) and a partial tail block. headBlk/tailBlk are -1
// when there is no partial block at that end; when the range lies inside one
// block, it is the head and tail is -1.
func (a *aligned) span(off, length int64) (headBlk, midStart, midEnd, tailBlk int64) {
	end := off + length
	headBlk, tailBlk = -1, -1
	midStart = (off + a.bs - 1) / a.bs * a.bs
	midEnd = end / a.bs * a.bs
	if midStart > midEnd { // inside one block
		return off / a.bs * a.bs, 0, 0, -1
	}
	if off%a.bs != 0 {
		headBlk = off / a.bs * a.bs
	}
	if end%a.bs != 0 {
		tailBlk = midEnd
	}
	return headBlk, midStart, midEnd, tailBlk
}

// plan records the stripe locks a request needs.
type plan struct {
	mode [lockStripes]uint8
}

func (p *plan) need(blockOff, bs int64, m uint8) {
	i := (blockOff / bs) % lockStripes
	p.mode[i] = max(p.mode[i], m)
}

// planFor holds the middle blocks shared and the partial edges exclusively.
func (a *aligned) planFor(headBlk, midStart, midEnd, tailBlk int64) plan {
	var p plan
	nMid := (midEnd - midStart) / a.bs
	if nMid >= lockStripes {
		for i := range p.mode {
			p.mode[i] = shared
		}
	} else {
		for blk := midStart; blk < midEnd; blk += a.bs {
			p.need(blk, a.bs, shared)
		}
	}
	if headBlk >= 0 {
		p.need(headBlk, a.bs, exclusive)
	}
	if tailBlk >= 0 {
		p.need(tailBlk, a.bs, exclusive)
	}
	return p
}

// acquire locks stripes in ascending order, so two requests can never wait
// for each other.
func (a *aligned) acquire(p *plan) {
	for i, m := range p.mode {
		switch m {
		case shared:
			a.locks[i].RLock()
		case exclusive:
			a.locks[i].Lock()
		}
	}
}

func (a *aligned) release(p *plan) {
	for i, m := range p.mode {
		switch m {
		case shared:
			a.locks[i].RUnlock()
		case exclusive:
			a.locks[i].Unlock()
		}
	}
}

func (a *aligned) ReadAt(p []byte, off int64) (int, error) {
	length := int64(len(p))
	if err := a.check("read", off, length); err != nil {
		return 0, err
	}
	if length == 0 {
		return 0, nil
	}
	if a.isAligned(off, length) {
		return a.b.ReadAt(p, off)
	}
	headBlk, midStart, midEnd, tailBlk := a.span(off, length)
	if headBlk >= 0 {
		if err := a.readPart(p, off, headBlk); err != nil {
			return 0, err
		}
	}
	if midEnd > midStart {
		if _, err := a.b.ReadAt(p[midStart-off:midEnd-off], midStart); err != nil {
			return 0, err
		}
	}
	if tailBlk >= 0 {
		if err := a.readPart(p, off, tailBlk); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// readPart fills the part of p (which starts at off) that lies in the block
// at blk.
func (a *aligned) readPart(p []byte, off, blk int64) error {
	bufp := a.bufs.Get().(*[]byte)
	defer a.bufs.Put(bufp)
	buf := *bufp
	if _, err := a.b.ReadAt(buf, blk); err != nil {
		return err
	}
	lo, hi := max(off, blk), min(off+int64(len(p)), blk+a.bs)
	copy(p[lo-off:hi-off], buf[lo-blk:hi-blk])
	return nil
}

func (a *aligned) WriteAt(p []byte, off int64) (int, error) {
	return a.write(p, off, false)
}

func (a *aligned) WriteAtFUA(p []byte, off int64) (int, error) {
	return a.write(p, off, true)
}

func (a *aligned) write(p []byte, off int64, fua bool) (int, error) {
	length := int64(len(p))
	if err := a.check("write", off, length); err != nil {
		return 0, err
	}
	if length == 0 {
		return 0, nil
	}
	headBlk, midStart, midEnd, tailBlk := a.span(off, length)
	pl := a.planFor(headBlk, midStart, midEnd, tailBlk)
	a.acquire(&pl)
	defer a.release(&pl)

	put := func(data []byte, at int64) error {
		var err error
		if fua {
			_, err = a.b.WriteAtFUA(data, at)
		} else {
			_, err = a.b.WriteAt(data, at)
		}
		return err
	}
	edge := func(blk int64) error {
		return a.modify(blk, off, length, fua, func(part []byte, partOff int64) {
			copy(part, p[partOff-off:])
		})
	}
	if headBlk >= 0 {
		if err := edge(headBlk); err != nil {
			return 0, err
		}
	}
	if midEnd > midStart {
		if err := put(p[midStart-off:midEnd-off], midStart); err != nil {
			return 0, err
		}
	}
	if tailBlk >= 0 {
		if err := edge(tailBlk); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// modify reads the block at blk, lets change rewrite the part of it that lies
// in [off, off+length) (change gets that part and its absolute offset), and
// writes the block back. The caller holds the block's stripe exclusively.
func (a *aligned) modify(blk, off, length int64, fua bool, change func(part []byte, partOff int64)) error {
	bufp := a.bufs.Get().(*[]byte)
	defer a.bufs.Put(bufp)
	buf := *bufp
	if _, err := a.b.ReadAt(buf, blk); err != nil {
		return err
	}
	lo, hi := max(off, blk), min(off+length, blk+a.bs)
	change(buf[lo-blk:hi-blk], lo)
	var err error
	if fua {
		_, err = a.b.WriteAtFUA(buf, blk)
	} else {
		_, err = a.b.WriteAt(buf, blk)
	}
	return err
}

func (a *aligned) Trim(off, length int64) error {
	return a.zeroRange("trim", off, length, a.b.Trim)
}

func (a *aligned) WriteZeroes(off, length int64) error {
	return a.zeroRange("write zeroes", off, length, a.b.WriteZeroes)
}

// zeroRange applies whole (trim or write zeroes) to the whole blocks of the
// range and zeroes the partial edges by read-modify-write, so that the whole
// range reads back zeros either way.
func (a *aligned) zeroRange(op string, off, length int64, whole func(off, length int64) error) error {
	if err := a.check(op, off, length); err != nil {
		return err
	}
	if length == 0 {
		return nil
	}
	headBlk, midStart, midEnd, tailBlk := a.span(off, length)
	pl := a.planFor(headBlk, midStart, midEnd, tailBlk)
	a.acquire(&pl)
	defer a.release(&pl)
	zero := func(part []byte, _ int64) { clear(part) }
	if headBlk >= 0 {
		if err := a.modify(headBlk, off, length, false, zero); err != nil {
			return err
		}
	}
	if midEnd > midStart {
		if err := whole(midStart, midEnd-midStart); err != nil {
			return err
		}
	}
	if tailBlk >= 0 {
		if err := a.modify(tailBlk, off, length, false, zero); err != nil {
			return err
		}
	}
	return nil
}
