package bench

import (
	"bufio"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestCPUList(t *testing.T) {
	for in, want := range map[string][]int{
		"0": {0}, "0-1": {0, 1}, "0-2,5": {0, 1, 2, 5}, " 3,1,1 ": {1, 3}, "4-4": {4},
	} {
		got, err := ParseCPUList(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("ParseCPUList(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "a", "3-1", "-1", "1-", "1,,2"} {
		if _, err := ParseCPUList(bad); err == nil {
			t.Errorf("ParseCPUList(%q) accepted", bad)
		}
	}
	for _, tc := range []struct {
		in   []int
		want string
	}{{[]int{0, 1, 2, 5}, "0-2,5"}, {[]int{3}, "3"}, {[]int{7, 1, 0, 1}, "0-1,7"}, {nil, ""}} {
		if got := FormatCPUList(tc.in); got != tc.want {
			t.Errorf("FormatCPUList(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestAffinityOfThisProcess(t *testing.T) {
	cpus, err := Affinity(0)
	if err != nil {
		t.Fatal(err)
	}
	if len(cpus) == 0 {
		t.Fatal("this thread may run on no CPU")
	}
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		t.Skipf("no /sys/devices/system/cpu/online: %v", err)
	}
	online, _ := ParseCPUList(string(b))
	for _, c := range cpus {
		if !slices.Contains(online, c) {
			t.Fatalf("affinity %v includes CPU %d, not online (%v)", cpus, c, online)
		}
	}
	if _, err := Affinity(1 << 30); err == nil {
		t.Fatal("Affinity of a PID that cannot exist succeeded")
	}
}

func TestParseTaskStat(t *testing.T) {
	// The command name may contain spaces and parentheses.
	line := "4242 (evil ) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 1 0 100 1000 10 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0"
	st, err := parseTaskStat(line)
	if err != nil {
		t.Fatal(err)
	}
	if st.state != 'S' || st.cputime != 12 || st.processor != 1 {
		t.Fatalf("parsed %+v, want state S, cputime 7+5, processor 1", st)
	}
	for _, bad := range []string{"no paren", "1 (x) S 1 2", "1 (x) S " + strings.Repeat("z ", 40)} {
		if _, err := parseTaskStat(bad); err == nil {
			t.Errorf("parseTaskStat(%q) accepted", bad)
		}
	}
}

// startBusyChild starts `sh -c` running a busy loop in a grandchild and
// returns the child and the grandchild's PID; both are ended at cleanup, by
// PID.
func startBusyChild(t *testing.T) (*exec.Cmd, int) {
	t.Helper()
	cmd := exec.Command("sh", "-c", "while :; do :; done & echo $!; wait")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start sh: %v", err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	grandchild, perr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || perr != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("reading the grandchild PID: %v %v", err, perr)
	}
	t.Cleanup(func() {
		syscall.Kill(grandchild, syscall.SIGKILL)
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd, grandchild
}

func TestCPUSamplerSeesDescendants(t *testing.T) {
	cmd, grandchild := startBusyChild(t)
	if !slices.Contains(descendants(cmd.Process.Pid), grandchild) {
		t.Fatalf("descendants(%d) = %v, lacks the busy grandchild %d", cmd.Process.Pid, descendants(cmd.Process.Pid), grandchild)
	}
	s := StartCPUSampler(cmd.Process.Pid, 10*time.Millisecond)
	// Only the grandchild runs (the shell waits), so every sample is of it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		time.Sleep(50 * time.Millisecond)
		s.mu.Lock()
		n := 0
		for _, c := range s.counts {
			n += c
		}
		s.mu.Unlock()
		if n >= 5 || time.Now().After(deadline) {
			break
		}
	}
	p := s.Stop()
	if p.Samples < 5 {
		t.Fatalf("sampler saw %d samples of a busy loop", p.Samples)
	}
	allowed, _ := ParseCPUList(p.Allowed)
	total := 0.0
	for _, sh := range p.RanOn {
		if !slices.Contains(allowed, sh.CPU) {
			t.Fatalf("ran on CPU %d outside its affinity %s", sh.CPU, p.Allowed)
		}
		total += sh.Share
	}
	if total < 0.999 || total > 1.001 {
		t.Fatalf("shares add up to %v", total)
	}
	if !strings.Contains(p.Observed(), "samples)") {
		t.Fatalf("Observed() = %q", p.Observed())
	}
	// Stop twice is harmless.
	s.Stop()
}

func TestPinProcess(t *testing.T) {
	allowed, err := Affinity(0)
	if err != nil {
		t.Fatal(err)
	}
	target := allowed[len(allowed)-1]
	cmd, grandchild := startBusyChild(t)
	if err := PinProcess(grandchild, []int{target}); err != nil {
		t.Fatal(err)
	}
	got, err := Affinity(grandchild)
	if err != nil || !slices.Equal(got, []int{target}) {
		t.Fatalf("after pinning to %d: affinity %v, %v", target, got, err)
	}
	s := StartCPUSampler(grandchild, 10*time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	p := s.Stop()
	for _, sh := range p.RanOn {
		if sh.CPU != target {
			t.Fatalf("pinned to %d but seen on %d: %+v", target, sh.CPU, p)
		}
	}
	if p.Allowed != strconv.Itoa(target) {
		t.Fatalf("placement allowed %q, want %d", p.Allowed, target)
	}
	if err := PinProcess(cmd.Process.Pid, nil); err == nil {
		t.Fatal("pinning to no CPU accepted")
	}
	if err := PinProcess(1<<30, []int{0}); err == nil {
		t.Fatal("pinning a PID that cannot exist succeeded")
	}
}

func TestStartPinned(t *testing.T) {
	allowed, err := Affinity(0)
	if err != nil {
		t.Fatal(err)
	}
	threads := func() map[string]string {
		masks := map[string]string{}
		tasks, _ := os.ReadDir("/proc/self/task")
		for _, task := range tasks {
			if tid, err := strconv.Atoi(task.Name()); err == nil {
				if cpus, err := Affinity(tid); err == nil {
					masks[task.Name()] = FormatCPUList(cpus)
				}
			}
		}
		return masks
	}
	target := allowed[len(allowed)-1]
	for range 20 {
		// The child's first command reads the mask it started with.
		cmd := exec.Command("grep", "Cpus_allowed_list", "/proc/self/status")
		var out strings.Builder
		cmd.Stdout = &out
		if err := StartPinned(cmd, []int{target}); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(strings.TrimPrefix(out.String(), "Cpus_allowed_list:")); got != strconv.Itoa(target) {
			t.Fatalf("child started with CPUs %q, want %d", got, target)
		}
	}
	// No thread of this process is left narrowed.
	for tid, mask := range threads() {
		if mask != FormatCPUList(allowed) {
			t.Fatalf("thread %s left on CPUs %s, process allowed %v", tid, mask, allowed)
		}
	}
	if err := StartPinned(exec.Command("true"), []int{1 << 20}); err == nil {
		t.Fatal("pinning to a CPU that does not exist succeeded")
	}
}

func TestPlacementMerge(t *testing.T) {
	var p Placement
	p.Merge(Placement{Role: "fio", PID: 10, Allowed: "0-1", RanOn: []CPUShare{{CPU: 0, Samples: 3}}, Samples: 3})
	p.Merge(Placement{Role: "fio", PID: 11, Allowed: "0-1", Pinned: true, RanOn: []CPUShare{{CPU: 0, Samples: 1}, {CPU: 1, Samples: 4}}, Samples: 5})
	want := Placement{Role: "fio", PID: 0, Allowed: "0-1", Pinned: true,
		RanOn: []CPUShare{{CPU: 0, Samples: 4, Share: 0.5}, {CPU: 1, Samples: 4, Share: 0.5}}, Samples: 8}
	if !reflect.DeepEqual(p, want) {
		t.Fatalf("merged %+v, want %+v", p, want)
	}
	if got := p.Observed(); got != "cpu0 50%, cpu1 50% (8 samples)" {
		t.Fatalf("Observed = %q", got)
	}
	if got := (Placement{}).Observed(); got != "not sampled" {
		t.Fatalf("Observed of nothing = %q", got)
	}
}
