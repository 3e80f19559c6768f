// Package mountinfo reads /proc/self/mountinfo (proc(5)): which devices
// are mounted where in this process's mount namespace. attach and fuseblk
// use it to find the mounts that keep a loop device or a FUSE file busy.
package mountinfo

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Path is the mount table of the calling process.
const Path = "/proc/self/mountinfo"

// maxLine bounds one line; the kernel's lines are far shorter even with
// long paths and many options.
const maxLine = 1 << 20

// Entry is one mount, one line of mountinfo:
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//	ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
//
// Paths and names are unescaped (the kernel writes space, tab, newline and
// backslash as \ooo).
type Entry struct {
	ID, ParentID int
	Major, Minor uint32 // the device of the filesystem (st_dev of files on it)
	Root         string // the directory of the filesystem mounted here
	MountPoint   string
	FSType       string // e.g. "ext4", "fuse.nprdma"
	Source       string // e.g. "/dev/loop3"; may be empty
}

// Dev is the device number of the mounted filesystem, as in stat's st_dev
// or a block device's st_rdev.
func (e Entry) Dev() uint64 { return unix.Mkdev(e.Major, e.Minor) }

// Read parses the calling process's mount table.
func Read() ([]Entry, error) {
	f, err := os.Open(Path)
	if err != nil {
		return nil, fmt.Errorf("mountinfo: %w", err)
	}
	defer f.Close()
	return Parse(f)
}

// Parse reads a mountinfo file. A line that does not have the format
// (proc(5)) fails the whole parse: a mount table read wrongly could make a
// caller think a busy device is free.
func Parse(r io.Reader) ([]Entry, error) {
	var out []Entry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	for n := 1; sc.Scan(); n++ {
		e, err := parseLine(sc.Text())
		if err != nil {
			return nil, fmt.Errorf("mountinfo line %d: %w", n, err)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("mountinfo: %w", err)
	}
	return out, nil
}

// parseLine splits on single spaces, not runs of white space: the kernel
// separates fields with exactly one and escapes spaces inside them, and a
// mount with an empty source ("- tmpfs  rw") must not shift the fields.
func parseLine(line string) (Entry, error) {
	f := strings.Split(line, " ")
	// The separator ends the optional fields, which start after the sixth.
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if sep < 0 || sep+3 > len(f) {
		return Entry{}, fmt.Errorf("malformed line %q: want ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS ... - FSTYPE SOURCE ...", line)
	}
	id, err1 := strconv.Atoi(f[0])
	parent, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || id < 0 || parent < 0 {
		return Entry{}, fmt.Errorf("mount IDs %q %q are not numbers", f[0], f[1])
	}
	maj, min, ok := strings.Cut(f[2], ":")
	major, err1 := strconv.ParseUint(maj, 10, 32)
	minor, err2 := strconv.ParseUint(min, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return Entry{}, fmt.Errorf("bad device %q: want MAJOR:MINOR", f[2])
	}
	e := Entry{ID: id, ParentID: parent, Major: uint32(major), Minor: uint32(minor),
		Root: Unescape(f[3]), MountPoint: Unescape(f[4]), FSType: Unescape(f[sep+1]), Source: Unescape(f[sep+2])}
	if e.MountPoint == "" || e.FSType == "" {
		return Entry{}, fmt.Errorf("malformed line %q: empty mount point or filesystem type", line)
	}
	return e, nil
}

// Unescape undoes the kernel's octal escapes (\040 for a space, \134 for
// a backslash); a backslash not followed by three octal digits stays.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// IsMountPoint reports whether dir is a mount point in this process's
// mount namespace.
func IsMountPoint(dir string) (bool, error) {
	mounts, err := Read()
	if err != nil {
		return false, err
	}
	for _, m := range mounts {
		if m.MountPoint == dir {
			return true, nil
		}
	}
	return false, nil
}

// MountPointsOf returns where the filesystem of device dev (a block
// device's st_rdev) is mounted, in mount order: innermost last.
func MountPointsOf(dev uint64) ([]string, error) {
	mounts, err := Read()
	if err != nil {
		return nil, err
	}
	return PointsOf(mounts, dev), nil
}

// PointsOf returns the mount points of device dev among mounts, in order.
func PointsOf(mounts []Entry, dev uint64) []string {
	var out []string
	for _, m := range mounts {
		if m.Dev() == dev {
			out = append(out, m.MountPoint)
		}
	}
	return out
}
