package bench

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// CPU placement matters more than anything else on this kind of machine:
// waking a thread on the other vCPU costs ~50 µs, on the same one ~10 µs. So
// every experiment reports, for each process involved, which CPUs it was
// allowed on and which it was seen running on.

// ParseCPUList parses a Linux CPU list such as "0-2,5".
func ParseCPUList(s string) ([]int, error) {
	var cpus []int
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, fmt.Errorf("CPU list is empty")
	}
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("CPU list %q: bad CPU %q", s, lo)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("CPU list %q: bad range %q", s, part)
			}
		}
		for c := a; c <= b; c++ {
			cpus = append(cpus, c)
		}
	}
	slices.Sort(cpus)
	return slices.Compact(cpus), nil
}

// FormatCPUList writes CPUs in the Linux list format ("0-2,5").
func FormatCPUList(cpus []int) string {
	c := slices.Clone(cpus)
	slices.Sort(c)
	c = slices.Compact(c)
	var parts []string
	for i := 0; i < len(c); {
		j := i
		for j+1 < len(c) && c[j+1] == c[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(c[i]))
		} else {
			parts = append(parts, strconv.Itoa(c[i])+"-"+strconv.Itoa(c[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// Affinity returns the CPUs the task pid may run on (sched_getaffinity); pid
// 0 is the calling thread.
func Affinity(pid int) ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(pid, &set); err != nil {
		return nil, fmt.Errorf("sched_getaffinity of pid %d: %w", pid, err)
	}
	var cpus []int
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// PinProcess restricts every thread of process pid to cpus. Threads the
// process creates later inherit the mask of their creator, so pinning the Go
// process once covers the threads its runtime starts afterwards, and child
// processes it starts inherit it too.
func PinProcess(pid int, cpus []int) error {
	if len(cpus) == 0 {
		return errors.New("pin: no CPUs given")
	}
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	tids, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return fmt.Errorf("pin pid %d: %w", pid, err)
	}
	for _, t := range tids {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("pin thread %d of pid %d to CPUs %s: %w", tid, pid, FormatCPUList(cpus), err)
		}
	}
	return nil
}

// StartPinned starts cmd restricted to cpus from its first instruction: the
// child inherits the affinity of the thread that forks it, so the fork runs
// on a locked thread narrowed to cpus for that moment. (taskset narrows its
// own mask only after it has started, so a sampler could see it on another
// CPU first.) With no cpus it is cmd.Start.
func StartPinned(cmd *exec.Cmd, cpus []int) error {
	if len(cpus) == 0 {
		return cmd.Start()
	}
	var set, saved unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	runtime.LockOSThread()
	if err := unix.SchedGetaffinity(0, &saved); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("sched_getaffinity: %w", err)
	}
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("pin to CPUs %s: %w", FormatCPUList(cpus), err)
	}
	err := cmd.Start()
	// A thread whose mask cannot be restored stays locked: the runtime ends
	// it with this goroutine rather than reuse it narrowed.
	if unix.SchedSetaffinity(0, &saved) == nil {
		runtime.UnlockOSThread()
	}
	return err
}

// Placement records where one process of an experiment ran.
type Placement struct {
	Role    string     `json:"role"`
	PID     int        `json:"pid,omitempty"`
	Allowed string     `json:"allowed"` // affinity mask at start, as a CPU list
	Pinned  bool       `json:"pinned"`  // the bench restricted it (--cpus, or StartPinned for a child)
	RanOn   []CPUShare `json:"ran_on,omitempty"`
	Samples int        `json:"samples"` // thread-samples behind RanOn
}

// CPUShare is how often a process's threads were seen on one CPU.
type CPUShare struct {
	CPU     int     `json:"cpu"`
	Samples int     `json:"samples"`
	Share   float64 `json:"share"`
}

// Observed renders RanOn, e.g. "cpu0 62%, cpu1 38% (840 samples)".
func (p Placement) Observed() string {
	if p.Samples == 0 {
		return "not sampled"
	}
	parts := make([]string, 0, len(p.RanOn))
	for _, s := range p.RanOn {
		parts = append(parts, fmt.Sprintf("cpu%d %.0f%%", s.CPU, s.Share*100))
	}
	return fmt.Sprintf("%s (%d samples)", strings.Join(parts, ", "), p.Samples)
}

// Merge adds q's samples to p (the same role measured in several rounds).
func (p *Placement) Merge(q Placement) {
	if p.Role == "" {
		p.Role = q.Role
	}
	if p.Allowed == "" {
		p.Allowed = q.Allowed
	} else if q.Allowed != "" && q.Allowed != p.Allowed && !strings.Contains(p.Allowed, " / ") {
		p.Allowed += " / " + q.Allowed
	}
	p.Pinned = p.Pinned || q.Pinned
	if p.PID == 0 {
		p.PID = q.PID
	} else if q.PID != 0 && q.PID != p.PID {
		p.PID = 0 // several processes: no single PID to report
	}
	counts := map[int]int{}
	for _, s := range p.RanOn {
		counts[s.CPU] += s.Samples
	}
	for _, s := range q.RanOn {
		counts[s.CPU] += s.Samples
	}
	p.RanOn, p.Samples = shares(counts)
}

func shares(counts map[int]int) ([]CPUShare, int) {
	total := 0
	cpus := make([]int, 0, len(counts))
	for c, n := range counts {
		cpus = append(cpus, c)
		total += n
	}
	slices.Sort(cpus)
	out := make([]CPUShare, 0, len(cpus))
	for _, c := range cpus {
		out = append(out, CPUShare{CPU: c, Samples: counts[c], Share: float64(counts[c]) / float64(max(total, 1))})
	}
	return out, total
}

// CPUSampler watches a process and its descendants and counts, for every
// thread that used CPU time since the previous sample, the CPU it last ran
// on (/proc/<pid>/task/<tid>/stat, field "processor"). Sampling every 100 ms
// costs a few file reads, far below what it measures.
type CPUSampler struct {
	pid     int
	allowed string
	every   *periodic

	mu      sync.Mutex
	counts  map[int]int
	cputime map[int]uint64 // tid → activity counter at the previous sample
}

// StartCPUSampler starts sampling pid every interval (100 ms if 0).
func StartCPUSampler(pid int, interval time.Duration) *CPUSampler {
	if interval <= 0 {
		interval = 100 * time.Millisecond
	}
	s := &CPUSampler{pid: pid, counts: map[int]int{}, cputime: map[int]uint64{}}
	if cpus, err := Affinity(pid); err == nil {
		s.allowed = FormatCPUList(cpus)
	}
	s.every = startPeriodic(interval, s.sample)
	return s
}

func (s *CPUSampler) sample() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, pid := range descendants(s.pid) {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			continue
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			dir := filepath.Join("/proc", strconv.Itoa(pid), "task", t.Name())
			st, err := readTaskStat(filepath.Join(dir, "stat"))
			if err != nil {
				continue
			}
			// schedstat counts CPU time in ns and every time slice, so it
			// sees a thread that ran for a few microseconds; stat's ticks
			// (10 ms) are the fallback.
			active := st.cputime
			if ss, err := readSchedstat(filepath.Join(dir, "schedstat")); err == nil {
				active = ss
			}
			prev, seen := s.cputime[tid]
			s.cputime[tid] = active
			if seen && active > prev {
				s.counts[st.processor]++
			}
		}
	}
}

// Stop ends sampling and returns what was seen (Role is left to the caller).
// A final sample is taken so that short runs are not empty.
func (s *CPUSampler) Stop() Placement {
	s.every.stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	ranOn, total := shares(s.counts)
	return Placement{PID: s.pid, Allowed: s.allowed, RanOn: ranOn, Samples: total}
}

// descendants returns pid and all its descendants, via the children files
// of each task (a cheap read, unlike scanning all of /proc).
func descendants(pid int) []int {
	out := []int{pid}
	for i := 0; i < len(out) && len(out) < 4096; i++ {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", out[i]))
		if err != nil {
			continue
		}
		for _, t := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", out[i], t.Name()))
			if err != nil {
				continue
			}
			for f := range strings.FieldsSeq(string(b)) {
				if c, err := strconv.Atoi(f); err == nil {
					out = append(out, c)
				}
			}
		}
	}
	return out
}

type taskStat struct {
	state     byte
	cputime   uint64 // utime + stime in clock ticks
	processor int
}

func readTaskStat(path string) (taskStat, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return taskStat{}, err
	}
	return parseTaskStat(string(b))
}

// parseTaskStat reads /proc/<pid>/stat. The command name (field 2) may
// contain spaces and parentheses, so fields are counted from the last ')'.
func parseTaskStat(s string) (taskStat, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return taskStat{}, fmt.Errorf("stat %q: no command name", s)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); field n is f[n-3].
	const utime, stime, processor = 14 - 3, 15 - 3, 39 - 3
	if len(f) <= processor {
		return taskStat{}, fmt.Errorf("stat: %d fields, need %d", len(f)+2, processor+3)
	}
	u, err1 := strconv.ParseUint(f[utime], 10, 64)
	st, err2 := strconv.ParseUint(f[stime], 10, 64)
	cpu, err3 := strconv.Atoi(f[processor])
	if err := errors.Join(err1, err2, err3); err != nil {
		return taskStat{}, fmt.Errorf("stat: %w", err)
	}
	return taskStat{state: f[0][0], cputime: u + st, processor: cpu}, nil
}

// readSchedstat returns the run time in ns plus the number of time slices of
// a task: a counter that grows whenever the task ran.
func readSchedstat(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return 0, fmt.Errorf("schedstat %q: want 3 fields", b)
	}
	run, err1 := strconv.ParseUint(f[0], 10, 64)
	timeslices, err2 := strconv.ParseUint(f[2], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("schedstat: %w", err)
	}
	return run + timeslices, nil
}
