package fuseblk

import (
	"context"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/nprdma/nprdma/initiator/blockio"
)

// fallocate mode bits (linux/falloc.h) the kernel passes through FUSE: the
// loop driver punches holes for discards and zeroes ranges for
// REQ_OP_WRITE_ZEROES.
const (
	fallocKeepSize  = 0x01
	fallocPunchHole = 0x02
	fallocZeroRange = 0x10
)

// diskNode is the one regular file of the filesystem: the backend's bytes.
// Every open gets FOPEN_DIRECT_IO, so no data is ever held in the page
// cache: each read and write of the file is a backend call, and the loop
// device's flushes therefore cover everything written.
type diskNode struct {
	fs.Inode
	b        blockio.Backend // accepts any alignment
	size     *atomic.Int64   // the backend's size as served (Attachment.Resize)
	readOnly bool
	mtime    time.Time
	obs      *observer
}

var (
	_ fs.NodeOpener    = (*diskNode)(nil)
	_ fs.NodeReader    = (*diskNode)(nil)
	_ fs.NodeWriter    = (*diskNode)(nil)
	_ fs.NodeFsyncer   = (*diskNode)(nil)
	_ fs.NodeFlusher   = (*diskNode)(nil)
	_ fs.NodeAllocater = (*diskNode)(nil)
	_ fs.NodeGetattrer = (*diskNode)(nil)
	_ fs.NodeSetattrer = (*diskNode)(nil)
	_ fs.NodeStatfser  = (*diskNode)(nil)
)

func (n *diskNode) fillAttr(a *fuse.Attr) {
	a.Mode = syscall.S_IFREG | 0o600
	if n.readOnly {
		a.Mode = syscall.S_IFREG | 0o400
	}
	size := n.size.Load()
	a.Size = uint64(size)
	a.Blocks = uint64(size+511) / 512
	a.Blksize = 4096
	a.Nlink = 1
	a.SetTimes(nil, &n.mtime, &n.mtime)
}

func (n *diskNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.fillAttr(&out.Attr)
	return 0
}

// Setattr accepts changes that mean nothing for a block device (times,
// mode) but refuses to change the size: the backend's size is the file's.
func (n *diskNode) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if size, ok := in.GetSize(); ok && int64(size) != n.size.Load() {
		return syscall.EPERM
	}
	n.fillAttr(&out.Attr)
	return 0
}

func (n *diskNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if n.readOnly && flags&(syscall.O_WRONLY|syscall.O_RDWR) != 0 {
		return nil, 0, syscall.EROFS
	}
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

func (n *diskNode) Read(ctx context.Context, f fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	size := n.size.Load()
	if off >= size {
		return fuse.ReadResultData(nil), 0
	}
	dest = dest[:min(int64(len(dest)), size-off)]
	if _, err := n.b.ReadAt(dest, off); err != nil {
		return nil, n.obs.fail("read", off, int64(len(dest)), err)
	}
	return fuse.ReadResultData(dest), 0
}

// Write stores data; a write crossing the end is cut short there (the caller
// sees a short write), one starting at or past the end fails with ENOSPC.
func (n *diskNode) Write(ctx context.Context, f fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if n.readOnly {
		return 0, syscall.EROFS
	}
	size := n.size.Load()
	if off >= size && len(data) > 0 {
		return 0, syscall.ENOSPC
	}
	data = data[:min(int64(len(data)), size-off)]
	if _, err := n.b.WriteAt(data, off); err != nil {
		return 0, n.obs.fail("write", off, int64(len(data)), err)
	}
	return uint32(len(data)), 0
}

// Fsync is how the loop device's REQ_OP_FLUSH arrives (vfs_fsync on the
// backing file).
func (n *diskNode) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	if n.readOnly {
		return 0 // nothing was written through this file
	}
	if err := n.b.Flush(); err != nil {
		return n.obs.fail("flush", 0, 0, err)
	}
	n.obs.flushes.Add(1)
	return 0
}

// Flush runs on every close of a descriptor: flushing there gives
// close-to-open durability, and closes of the backing file are rare (the
// loop device keeps it open).
func (n *diskNode) Flush(ctx context.Context, f fs.FileHandle) syscall.Errno {
	return n.Fsync(ctx, f, 0)
}

// Allocate serves fallocate(2): hole punching is a Trim, zeroing a range is
// WriteZeroes, and plain preallocation is a no-op because every byte of the
// backend always exists. Anything else is EOPNOTSUPP (never ENOSYS, which
// would make the kernel stop sending fallocate, and with it discard).
func (n *diskNode) Allocate(ctx context.Context, f fs.FileHandle, off uint64, size uint64, mode uint32) syscall.Errno {
	if n.readOnly {
		return syscall.EROFS
	}
	start, length := int64(off), int64(size)
	if start < 0 || length < 0 {
		return syscall.EINVAL
	}
	end := n.size.Load()
	switch mode {
	case 0, fallocKeepSize:
		if !blockio.CheckRange(start, length, end) {
			if mode == 0 {
				return syscall.EFBIG // cannot grow
			}
		}
		return 0
	case fallocPunchHole | fallocKeepSize:
		length = clampLength(start, length, end)
		if length == 0 {
			return 0
		}
		if err := n.b.Trim(start, length); err != nil {
			return n.obs.fail("trim", start, length, err)
		}
		n.obs.trims.Add(1)
		return 0
	case fallocZeroRange, fallocZeroRange | fallocKeepSize:
		if mode == fallocZeroRange && !blockio.CheckRange(start, length, end) {
			return syscall.EFBIG
		}
		length = clampLength(start, length, end)
		if length == 0 {
			return 0
		}
		if err := n.b.WriteZeroes(start, length); err != nil {
			return n.obs.fail("write zeroes", start, length, err)
		}
		n.obs.zeroes.Add(1)
		return 0
	}
	return syscall.EOPNOTSUPP
}

// clampLength cuts [off, off+length) at size, as KEEP_SIZE operations do.
func clampLength(off, length, size int64) int64 {
	if off >= size {
		return 0
	}
	return min(length, size-off)
}

// Statfs reports a 4 KiB block size: the loop driver takes its discard
// granularity from it.
func (n *diskNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	fillStatfs(out, n.size.Load())
	return 0
}

func fillStatfs(out *fuse.StatfsOut, size int64) {
	out.Bsize = 4096
	out.Frsize = 4096
	out.Blocks = uint64(size) / 4096
	out.NameLen = 255
}

// rootNode is the directory holding the disk file.
type rootNode struct {
	fs.Inode
	size *atomic.Int64 // the disk's
}

var _ fs.NodeStatfser = (*rootNode)(nil)

func (r *rootNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	fillStatfs(out, r.size.Load())
	return 0
}
