package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Machine describes the host a run was made on. Figures from different
// machines are not comparable; ratios within one run are.
type Machine struct {
	CPUModel    string `json:"cpu_model"`
	CPUs        int    `json:"cpus"`
	OnlineCPUs  string `json:"online_cpus"`
	MemoryBytes int64  `json:"memory_bytes"`
	Kernel      string `json:"kernel"`
	OS          string `json:"os"`
	Virtualized bool   `json:"virtualized"`
	GoVersion   string `json:"go_version"`
	GOMAXPROCS  int    `json:"gomaxprocs"`
}

// DetectMachine reads the machine description from /proc, /sys and uname.
// Fields it cannot read stay empty rather than failing the run.
func DetectMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), GOMAXPROCS: runtime.GOMAXPROCS(0)}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			key, val, ok := strings.Cut(sc.Text(), ":")
			if !ok {
				continue
			}
			switch strings.TrimSpace(key) {
			case "model name":
				if m.CPUModel == "" {
					m.CPUModel = strings.TrimSpace(val)
				}
			case "flags":
				m.Virtualized = m.Virtualized || strings.Contains(" "+val+" ", " hypervisor ")
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/sys/devices/system/cpu/online"); err == nil {
		m.OnlineCPUs = strings.TrimSpace(string(b))
		if cpus, err := ParseCPUList(m.OnlineCPUs); err == nil {
			m.CPUs = len(cpus)
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		m.MemoryBytes = meminfoBytes(b, "MemTotal")
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Sysname[:]) + " " + unix.ByteSliceToString(u.Release[:])
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`)
			}
		}
	}
	return m
}

// meminfoBytes returns a "Key: N kB" field of /proc/meminfo in bytes.
func meminfoBytes(meminfo []byte, key string) int64 {
	for line := range bytes.Lines(meminfo) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok || string(k) != key {
			continue
		}
		fields := strings.Fields(string(v))
		if len(fields) == 0 {
			return 0
		}
		n, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return 0
		}
		if len(fields) > 1 && fields[1] == "kB" {
			n *= 1024
		}
		return n
	}
	return 0
}

// String is the one-line description the report prints.
func (m Machine) String() string {
	virt := ""
	if m.Virtualized {
		virt = " (virtual machine)"
	}
	return fmt.Sprintf("%s, %d CPUs (online %s)%s, %s RAM, %s, %s, %s, GOMAXPROCS=%d",
		orUnknown(m.CPUModel), m.CPUs, orUnknown(m.OnlineCPUs), virt, FormatBytes(m.MemoryBytes),
		orUnknown(m.Kernel), orUnknown(m.OS), m.GoVersion, m.GOMAXPROCS)
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// FormatBytes writes a byte count with a binary unit: 512 B, 4 KiB, 1.5 GiB.
func FormatBytes(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	v := float64(n)
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%d B", n)
	}
	return strconv.FormatFloat(roundSig3(v), 'f', -1, 64) + " " + units[i]
}

// GitRevision returns the short commit of the work tree at dir, with
// "+dirty" when the tree differs from it (modified or new, not ignored,
// files: code not yet committed is still code the figures depend on), or ""
// when dir is not a git work tree or git is missing.
func GitRevision(ctx context.Context, dir string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "git", "-C", dir, "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return ""
	}
	rev := strings.TrimSpace(string(out))
	status, err := exec.CommandContext(ctx, "git", "-C", dir, "status", "--porcelain").Output()
	if err == nil && len(bytes.TrimSpace(status)) > 0 {
		rev += "+dirty"
	}
	return rev
}
