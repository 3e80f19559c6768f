package fuseblk

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	major, minor uint32
	mountPoint   string
	fsType       string
	source       string
}

// readMounts parses /proc/self/mountinfo.
func readMounts() ([]mountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseMountinfo(f)
}

// parseMountinfo parses the mountinfo format (proc(5)):
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
func parseMountinfo(r io.Reader) ([]mountEntry, error) {
	var out []mountEntry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" && i >= 6 {
				sep = i
				break
			}
		}
		if len(fields) < 7 || sep < 0 || sep+2 >= len(fields) {
			return nil, fmt.Errorf("mountinfo: malformed line %q", sc.Text())
		}
		majMin := strings.SplitN(fields[2], ":", 2)
		if len(majMin) != 2 {
			return nil, fmt.Errorf("mountinfo: bad device %q", fields[2])
		}
		major, err1 := strconv.ParseUint(majMin[0], 10, 32)
		minor, err2 := strconv.ParseUint(majMin[1], 10, 32)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("mountinfo: bad device %q", fields[2])
		}
		out = append(out, mountEntry{
			major: uint32(major), minor: uint32(minor),
			mountPoint: unescapeMountinfo(fields[4]),
			fsType:     fields[sep+1],
			source:     unescapeMountinfo(fields[sep+2]),
		})
	}
	return out, sc.Err()
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
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

// MountPointsOf returns where the block device with device number dev is
// mounted, innermost mounts last.
func MountPointsOf(dev uint64) ([]string, error) {
	mounts, err := readMounts()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range mounts {
		if m.major == unix.Major(dev) && m.minor == unix.Minor(dev) {
			out = append(out, m.mountPoint)
		}
	}
	return out, nil
}

// isMountPoint reports whether dir is a mount point of this process's
// namespace.
func isMountPoint(dir string) bool {
	mounts, err := readMounts()
	if err != nil {
		return false
	}
	for _, m := range mounts {
		if m.mountPoint == dir {
			return true
		}
	}
	return false
}
