package fuseblk

import "github.com/nprdma/nprdma/internal/mountinfo"

// MountPointsOf returns where the block device with device number dev is
// mounted, innermost mounts last.
func MountPointsOf(dev uint64) ([]string, error) { return mountinfo.MountPointsOf(dev) }

// isMountPoint reports whether dir is a mount point of this process's
// namespace; a table that cannot be read counts as "no".
func isMountPoint(dir string) bool {
	ok, err := mountinfo.IsMountPoint(dir)
	return err == nil && ok
}
