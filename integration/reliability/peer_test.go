package reliability_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/internal/promtest"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/tcp"
)

// procTarget starts the real target on a fresh 8 MiB backing file at a
// fixed loopback address (so that it can come back there).
func procTarget(t *testing.T) (args []string, p *targetProc) {
	t.Helper()
	dir := t.TempDir()
	backing := filepath.Join(dir, "disk.img")
	if err := blockdev.Create(backing, 8<<20); err != nil {
		t.Fatal(err)
	}
	args = targetArgs(backing, filepath.Join(dir, "data"), freeAddr(t), "2MiB")
	return args, startTargetProc(t, args...)
}

// connectProc connects an in-process initiator to a target process.
func connectProc(t *testing.T, addr string, opts ...initiator.Option) (*initiator.Controller, *initiator.Namespace) {
	t.Helper()
	dev := nprdma.NewDevice(tcp.New(), nprdma.WithPinning(false))
	t.Cleanup(func() { dev.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := initiator.Connect(ctx, dev, addr, subNQN, hostOptions("peer", opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	n, err := c.Namespace(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	return c, n
}

// TestInitiatorRidesOutTargetSIGKILL: the real target is killed with
// SIGKILL and restarted on the same address, backing file and data
// directory within the controller-loss timeout: a read and a write issued
// during the outage wait, then complete after the reconnect with the right
// data; the host reconnected once and got a new rkey.
func TestInitiatorRidesOutTargetSIGKILL(t *testing.T) {
	args, p := procTarget(t)
	c, n := connectProc(t, p.addr, initiator.WithControllerLossTimeout(30*time.Second),
		initiator.WithQPTimeout(2*time.Second), initiator.WithReconnectDelay(50*time.Millisecond))
	data := make([]byte, 1<<20)
	fillPattern(data, 0, 21)
	if _, err := n.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := n.Flush(); err != nil {
		t.Fatal(err)
	}
	before, err := n.RegionDescriptor(context.Background())
	if err != nil || before == nil {
		t.Fatalf("region descriptor: %v", err)
	}

	p.kill(syscall.SIGKILL)
	killed := time.Now()
	got := make([]byte, 1<<20)
	more := make([]byte, 256<<10)
	fillPattern(more, 2<<20, 22)
	readDone, writeDone := make(chan error, 1), make(chan error, 1)
	go func() { _, err := n.ReadAt(got, 0); readDone <- err }()
	go func() { _, err := n.WriteAt(more, 2<<20); writeDone <- err }()
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-readDone:
		t.Fatalf("a read completed while the target was dead: %v", err)
	case err := <-writeDone:
		t.Fatalf("a write completed while the target was dead: %v", err)
	default:
	}
	startTargetProc(t, args...)
	for what, ch := range map[string]chan error{"read": readDone, "write": writeDone} {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatalf("%s issued during the outage: %v", what, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s issued during the outage did not complete after the restart", what)
		}
	}
	outage := time.Since(killed)
	if !bytes.Equal(got, data) {
		t.Fatal("the read issued during the outage returned wrong data")
	}
	back := make([]byte, len(more))
	if _, err := n.ReadAt(back, 2<<20); err != nil || !bytes.Equal(back, more) {
		t.Fatalf("the write issued during the outage: %v", err)
	}
	if err := n.Flush(); err != nil {
		t.Fatal(err)
	}
	after, err := n.RegionDescriptor(context.Background())
	if err != nil || after == nil || after.RKey == before.RKey {
		t.Fatalf("region descriptor after the restart: %+v (before %+v), %v", after, before, err)
	}
	if got := c.Stats().Reconnects; got != 1 {
		t.Fatalf("%d reconnects, want 1", got)
	}
	t.Logf("I/O issued during the outage completed %v after the SIGKILL (restart included)", outage.Round(time.Millisecond))
}

// TestLossTimeoutFailsIOInBoundedTime: a target that stays dead (SIGKILL)
// or hangs (SIGSTOP: the connections stay open and silent) makes I/O fail
// with ErrControllerLost — naming the subsystem, the address and the
// timeout — once the controller-loss timeout has passed, not hang; later
// calls fail at once.
func TestLossTimeoutFailsIOInBoundedTime(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGSTOP} {
		t.Run(sig.String(), func(t *testing.T) {
			const loss = 2 * time.Second
			_, p := procTarget(t)
			_, n := connectProc(t, p.addr, initiator.WithControllerLossTimeout(loss),
				initiator.WithQPTimeout(time.Second), initiator.WithKeepAlive(time.Second),
				initiator.WithReconnectDelay(50*time.Millisecond))
			buf := make([]byte, 64<<10)
			if _, err := n.WriteAt(buf, 0); err != nil {
				t.Fatal(err)
			}
			p.kill(sig)
			if sig == syscall.SIGSTOP {
				defer p.kill(syscall.SIGKILL) // a stopped process dies of SIGKILL too
				// kill(2) returns before the signal has stopped every thread.
				if !eventually(10*time.Second, func() bool { return processState(p.cmd.Process.Pid) == "T" }) {
					t.Fatalf("target not stopped: state %q", processState(p.cmd.Process.Pid))
				}
			}
			start := time.Now()
			done := make(chan error, 1)
			go func() { _, err := n.ReadAt(buf, 0); done <- err }()
			var err error
			select {
			case err = <-done:
			case <-time.After(loss + 30*time.Second):
				t.Fatalf("a read against a %s target still waits after %v", sig, time.Since(start))
			}
			took := time.Since(start)
			if !errors.Is(err, initiator.ErrControllerLost) {
				t.Fatalf("read against a %s target: %v, want ErrControllerLost", sig, err)
			}
			for _, want := range []string{subNQN, p.addr, loss.String()} {
				if !strings.Contains(err.Error(), want) {
					t.Fatalf("error %q does not name %s", err, want)
				}
			}
			start = time.Now()
			if _, err := n.WriteAt(buf, 0); !errors.Is(err, initiator.ErrControllerLost) || time.Since(start) > 5*time.Second {
				t.Fatalf("a later write: %v after %v", err, time.Since(start))
			}
			t.Logf("%s target: read failed after %v with %v", sig, took.Round(time.Millisecond), err)
		})
	}
}

// TestTargetSurvivesInitiatorSIGKILL: an initiator process killed with
// SIGKILL in the middle of its I/O leaves nothing behind on the target —
// its controller, queue pairs, connections, region registrations, pool
// buffers and goroutines are released — while another host, connected
// throughout, keeps working with verified data.
func TestTargetSurvivesInitiatorSIGKILL(t *testing.T) {
	r := newTarget(t, tcpFabric, []subSpec{{NQN: subNQN, AllowAny: true, NS: []nsSpec{{NSID: 1, Size: 16 << 20, Budget: 4 << 20}}}})
	devB, _ := r.hostDevice(t)
	nb := openNamespace(t, r.connect(t, devB, subNQN, "bystander"), 1)
	type snapshot struct {
		controllers, goroutines   int
		qps, unpinned, registered int64
		connections, poolInUse    float64
	}
	snap := func() snapshot {
		runtime.GC()
		ds := r.tg.Device().Stats()
		// The data pool keeps the slabs it grew for the killed host's
		// transfers (for reuse, bounded by the pool); what must come back
		// is every other registration (the queues' receive buffers) and
		// the pool's buffers in use.
		queueBytes := ds.RegisteredBytes - int64(promtest.Sum(t, r.reg, "nprdma_fabric_pool_registered_bytes"))
		return snapshot{r.tg.Controllers(), runtime.NumGoroutine(), ds.QPs, ds.UnpinnedBytes, queueBytes,
			promtest.Sum(t, r.reg, "nprdma_target_connections"), promtest.Sum(t, r.reg, "nprdma_fabric_pool_in_use_bytes")}
	}
	if _, err := nb.ReadAt(make([]byte, blockSize), 8<<20); err != nil { // registers the bystander's region
		t.Fatal(err)
	}
	base := snap()

	for round := 0; round < 3; round++ {
		b := startBystander(t, "bystander", nb, 8<<20, 8<<20)
		child := exec.Command(os.Args[0], "-test.run=^$")
		child.Env = append(os.Environ(), childEnv+"=initiator", "NPRDMA_RELIABILITY_ADDR="+r.tg.Addr())
		out, err := child.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		child.Stderr = os.Stderr
		if err := child.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		running := make(chan struct{})
		go func() {
			sc := bufio.NewScanner(out)
			once := sync.Once{}
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "running") {
					once.Do(func() { close(running) })
				}
			}
			child.Wait()
			close(exited)
		}()
		t.Cleanup(func() { child.Process.Kill(); <-exited })
		select {
		case <-running:
		case <-exited:
			t.Fatal("the child initiator exited before doing I/O")
		case <-time.After(60 * time.Second):
			t.Fatal("the child initiator did not start its I/O")
		}
		if r.tg.Controllers() != base.controllers+1 {
			t.Fatalf("%d controllers with the child connected, want %d", r.tg.Controllers(), base.controllers+1)
		}
		time.Sleep(time.Duration(50+rand.IntN(200)) * time.Millisecond) // mid-I/O
		child.Process.Signal(syscall.SIGKILL)
		<-exited
		killed := time.Now()
		if !eventually(15*time.Second, func() bool {
			s := snap()
			return s.controllers == base.controllers && s.qps == base.qps && s.unpinned == base.unpinned && s.connections == base.connections
		}) {
			t.Fatalf("round %d: the killed host's resources are still held: %+v, before %+v", round, snap(), base)
		}
		released := time.Since(killed)
		b.waitRounds(t, 10)
		b.check(t, 10)
		var s snapshot
		ok := eventually(15*time.Second, func() bool {
			s = snap()
			return s.goroutines <= base.goroutines && s.controllers == base.controllers && s.qps == base.qps &&
				s.unpinned == base.unpinned && s.registered == base.registered && s.connections == base.connections &&
				s.poolInUse == base.poolInUse
		})
		if !ok {
			t.Fatalf("round %d: after the kill %+v, before %+v\n%s", round, s, base, goroutineDump())
		}
		t.Logf("round %d: killed host's controller, queues and registrations released %v after SIGKILL; target back to %+v",
			round, released.Round(time.Millisecond), s)
	}
}

// processState is the state letter of process pid (/proc/PID/stat: R, S,
// T for stopped, ...), or "" if it cannot be read.
func processState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// The command name is in parentheses and may contain spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return ""
	}
	return string(b[i+2])
}

// runChild runs a child role of the test binary and returns its exit code.
func runChild(role string) int {
	switch role {
	case "initiator":
		return childInitiator(os.Getenv("NPRDMA_RELIABILITY_ADDR"))
	}
	fmt.Fprintf(os.Stderr, "unknown child role %q\n", role)
	return 2
}

// childInitiator connects to addr and writes and reads [0, 8 MiB) from four
// goroutines in 4 KiB to 1 MiB transfers until it is killed (or 60 s pass,
// so that a child whose parent died does not live on). It prints
// "running" once every goroutine has completed some I/O.
func childInitiator(addr string) int {
	dev := nprdma.NewDevice(tcp.New(), nprdma.WithPinning(false))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := initiator.Connect(ctx, dev, addr, subNQN, hostOptions("doomed")...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child initiator:", err)
		return 1
	}
	n, err := c.Namespace(ctx, 1)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child initiator:", err)
		return 1
	}
	var started sync.WaitGroup
	for g := 0; g < 4; g++ {
		started.Add(1)
		go func() {
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			buf := make([]byte, 1<<20)
			for i := 0; ; i++ {
				size := blockSize << rng.IntN(9) // 4 KiB .. 1 MiB
				off := rng.Int64N((8<<20-int64(size))/blockSize+1) * blockSize
				var err error
				if rng.IntN(2) == 0 {
					_, err = n.WriteAt(buf[:size], off)
				} else {
					_, err = n.ReadAt(buf[:size], off)
				}
				if err != nil {
					fmt.Fprintln(os.Stderr, "child initiator:", err)
					os.Exit(1)
				}
				if i == 3 {
					started.Done()
				}
			}
		}()
	}
	started.Wait()
	fmt.Println("running")
	time.Sleep(60 * time.Second)
	return 0
}
