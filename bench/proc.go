package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// MemStatus is the resident memory of a process from /proc/<pid>/status.
type MemStatus struct {
	RSS int64 // VmRSS: resident now, bytes
	HWM int64 // VmHWM: peak resident since start (or the last reset), bytes
}

// ReadMemStatus reads VmRSS and VmHWM of pid (0 means this process).
func ReadMemStatus(pid int) (MemStatus, error) {
	path := "/proc/self/status"
	if pid != 0 {
		path = fmt.Sprintf("/proc/%d/status", pid)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return MemStatus{}, fmt.Errorf("memory status of pid %d: %w", pid, err)
	}
	ms := MemStatus{RSS: meminfoBytes(b, "VmRSS"), HWM: meminfoBytes(b, "VmHWM")}
	if ms.RSS == 0 && ms.HWM == 0 {
		// Kernel threads and zombies have no Vm* lines.
		return ms, fmt.Errorf("memory status of pid %d: no VmRSS/VmHWM in %s", pid, path)
	}
	return ms, nil
}

// RSSSampler samples a process's VmRSS periodically and keeps the peak. The
// kernel's own VmHWM is the better peak when the whole life of the process
// is of interest; sampling bounds a phase of it.
type RSSSampler struct {
	pid   int
	every *periodic

	mu      sync.Mutex
	peak    int64
	last    MemStatus
	samples int
	err     error
}

// StartRSSSampler samples pid (0 = this process) every interval (50 ms if 0).
func StartRSSSampler(pid int, interval time.Duration) *RSSSampler {
	if interval <= 0 {
		interval = 50 * time.Millisecond
	}
	s := &RSSSampler{pid: pid}
	s.every = startPeriodic(interval, s.sample)
	return s
}

// periodic calls a sampling function now, every interval, and once more
// when stopped: the loop of the bench's process samplers.
type periodic struct {
	sample   func()
	stopOnce sync.Once
	quit     chan struct{}
	done     chan struct{}
}

func startPeriodic(interval time.Duration, sample func()) *periodic {
	p := &periodic{sample: sample, quit: make(chan struct{}), done: make(chan struct{})}
	sample()
	go func() {
		defer close(p.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-p.quit:
				return
			case <-t.C:
				sample()
			}
		}
	}()
	return p
}

// stop ends the loop and takes the final sample (on the first call only).
func (p *periodic) stop() {
	p.stopOnce.Do(func() {
		close(p.quit)
		<-p.done
		p.sample()
	})
}

func (s *RSSSampler) sample() {
	ms, err := ReadMemStatus(s.pid)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if s.err == nil {
			s.err = err
		}
		return
	}
	s.last = ms
	s.peak = max(s.peak, ms.RSS)
	s.samples++
}

// RSSReport is what an RSSSampler saw.
type RSSReport struct {
	PeakRSS int64     // highest sampled VmRSS, bytes
	Last    MemStatus // the final reading (its HWM is the kernel's peak)
	Samples int
}

// Stop ends sampling, takes a final sample and reports. The error is the
// first failed read (for example, the process exited), if no read succeeded.
func (s *RSSSampler) Stop() (RSSReport, error) {
	s.every.stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	r := RSSReport{PeakRSS: s.peak, Last: s.last, Samples: s.samples}
	if s.samples == 0 {
		return r, s.err
	}
	return r, nil
}

// Child is a process an experiment started (nprdma-target,
// nprdma-initiator attach, nbdkit, nbdfuse, the swap-rss child): the
// bench's one way to run a process it measures or measures against. Only
// its own PID is ever signalled. It dies with the bench (PR_SET_PDEATHSIG),
// so an interrupted run leaves nothing behind.
type Child struct {
	// Name names the process in errors.
	Name string
	cmd  *exec.Cmd

	mu    sync.Mutex
	out   bytes.Buffer // stdout and stderr, first MiB
	lines []func(string) bool

	done     chan struct{}
	waitErr  error
	stopOnce sync.Once
}

// StartChild starts argv (pinned to cpus when given) with env
// added to the bench's environment.
func StartChild(name string, argv []string, cpus []int, env ...string) (*Child, error) {
	c := &Child{Name: name, done: make(chan struct{})}
	c.cmd = exec.Command(argv[0], argv[1:]...)
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if len(env) > 0 {
		c.cmd.Env = append(os.Environ(), env...)
	}
	pr, pw := io.Pipe()
	c.cmd.Stdout, c.cmd.Stderr = pw, pw
	if err := StartPinned(c.cmd, cpus); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			c.line(sc.Text())
		}
		io.Copy(io.Discard, pr)
	}()
	go func() {
		c.waitErr = c.cmd.Wait()
		// Every line is seen before the exit is: waiters then find the
		// last words of a process that died.
		pw.Close()
		<-read
		close(c.done)
	}()
	return c, nil
}

func (c *Child) line(l string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.out.Len() < 1<<20 {
		c.out.WriteString(l + "\n")
	}
	kept := c.lines[:0]
	for _, w := range c.lines {
		if !w(l) {
			kept = append(kept, w)
		}
	}
	c.lines = kept
}

// WaitLine waits until a line of output satisfies match (lines seen before
// the call are searched too), the process exits, ctx ends or timeout
// passes; it returns the matching line.
func (c *Child) WaitLine(ctx context.Context, timeout time.Duration, match func(string) bool) (string, error) {
	got := make(chan string, 1)
	c.mu.Lock()
	for _, l := range strings.Split(c.out.String(), "\n") {
		if l != "" && match(l) {
			c.mu.Unlock()
			return l, nil
		}
	}
	c.lines = append(c.lines, func(l string) bool {
		if match(l) {
			got <- l
			return true
		}
		return false
	})
	c.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case l := <-got:
		return l, nil
	case <-c.done:
		select {
		case l := <-got:
			return l, nil
		default:
		}
		return "", fmt.Errorf("%s exited (%v) before it was ready: %s", c.Name, c.waitErr, c.Output(1200))
	case <-t.C:
		return "", fmt.Errorf("%s not ready after %v: %s", c.Name, timeout, c.Output(1200))
	case <-ctx.Done():
		return "", fmt.Errorf("%s: %w", c.Name, ctx.Err())
	}
}

// Output is the end of what the process wrote (stdout and stderr, the
// first MiB of it), at most n bytes; all of it when n ≤ 0.
func (c *Child) Output(n int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := strings.TrimSpace(c.out.String())
	if n > 0 && len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return s
}

// PID is the process ID: the only process the bench signals.
func (c *Child) PID() int { return c.cmd.Process.Pid }

// Exited reports whether the process has exited.
func (c *Child) Exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Run waits for the process to exit by itself and returns how it ended
// (nil for exit status 0); when ctx ends first, the process is killed.
func (c *Child) Run(ctx context.Context) error {
	select {
	case <-c.done:
	case <-ctx.Done():
		_ = c.Stop(syscall.SIGKILL, time.Minute)
		return fmt.Errorf("%s: %w", c.Name, ctx.Err())
	}
	if c.waitErr != nil {
		return fmt.Errorf("%s: %w: %s", c.Name, c.waitErr, c.Output(1200))
	}
	return nil
}

// Wait waits up to d for the process to exit by itself.
func (c *Child) Wait(d time.Duration) bool {
	select {
	case <-c.done:
		return true
	case <-time.After(d):
		return false
	}
}

// Stop sends sig (SIGTERM for a clean shutdown), waits up to grace, then
// SIGKILLs. It reports an unclean exit: the process had to be killed, or it
// did not exit 0 on the signal.
func (c *Child) Stop(sig syscall.Signal, grace time.Duration) error {
	var err error
	c.stopOnce.Do(func() {
		select {
		case <-c.done:
			return
		default:
		}
		_ = c.cmd.Process.Signal(sig)
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-c.done:
			if c.waitErr != nil {
				err = fmt.Errorf("%s on %v: %v: %s", c.Name, sig, c.waitErr, c.Output(600))
			}
		case <-t.C:
			_ = c.cmd.Process.Kill()
			<-c.done
			err = fmt.Errorf("%s did not exit within %v of %v: killed", c.Name, grace, sig)
		}
	})
	return err
}
