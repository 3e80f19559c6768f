package e2ebench

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

	"github.com/nprdma/nprdma/bench"
)

// child is a process an experiment started: nprdma-target, nprdma-initiator
// attach, nbdfuse. Only its own PID is ever signalled. It dies with the
// bench (PR_SET_PDEATHSIG), so an interrupted run leaves nothing behind.
type child struct {
	name string
	cmd  *exec.Cmd

	mu    sync.Mutex
	out   bytes.Buffer // stdout and stderr, first MiB
	lines []func(string) bool

	done     chan struct{}
	waitErr  error
	stopOnce sync.Once
}

// startChild starts argv (pinned to cpus when given) with env
// added to the bench's environment.
func startChild(name string, argv []string, cpus []int, env ...string) (*child, error) {
	c := &child{name: name, done: make(chan struct{})}
	c.cmd = exec.Command(argv[0], argv[1:]...)
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if len(env) > 0 {
		c.cmd.Env = append(os.Environ(), env...)
	}
	pr, pw := io.Pipe()
	c.cmd.Stdout, c.cmd.Stderr = pw, pw
	if err := bench.StartPinned(c.cmd, cpus); err != nil {
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

func (c *child) line(l string) {
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

// waitLine waits until a line of output satisfies match (lines seen before
// the call are searched too), the process exits, ctx ends or timeout
// passes; it returns the matching line.
func (c *child) waitLine(ctx context.Context, timeout time.Duration, match func(string) bool) (string, error) {
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
		return "", fmt.Errorf("%s exited (%v) before it was ready: %s", c.name, c.waitErr, c.output(1200))
	case <-t.C:
		return "", fmt.Errorf("%s not ready after %v: %s", c.name, timeout, c.output(1200))
	case <-ctx.Done():
		return "", fmt.Errorf("%s: %w", c.name, ctx.Err())
	}
}

// output is the end of what the process wrote, at most n bytes.
func (c *child) output(n int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := strings.TrimSpace(c.out.String())
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return s
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// wait waits up to d for the process to exit by itself.
func (c *child) wait(d time.Duration) bool {
	select {
	case <-c.done:
		return true
	case <-time.After(d):
		return false
	}
}

// stop sends sig (SIGTERM for a clean shutdown), waits up to grace, then
// SIGKILLs. It reports an unclean exit: the process had to be killed, or it
// did not exit 0 on the signal.
func (c *child) stop(sig syscall.Signal, grace time.Duration) error {
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
				err = fmt.Errorf("%s on %v: %v: %s", c.name, sig, c.waitErr, c.output(600))
			}
		case <-t.C:
			_ = c.cmd.Process.Kill()
			<-c.done
			err = fmt.Errorf("%s did not exit within %v of %v: killed", c.name, grace, sig)
		}
	})
	return err
}
