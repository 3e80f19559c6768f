// Package caps tells which Linux capabilities this process holds, for tests
// that need one a sandbox may withhold from root. It imports nothing of the
// project.
package caps

import (
	"os"
	"strconv"
	"strings"
)

// Effective reports whether capability c (unix.CAP_*) is in this process's
// effective set.
func Effective(c int) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && n&(1<<c) != 0
		}
	}
	return false
}
