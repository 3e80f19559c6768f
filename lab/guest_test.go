package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The lab's own guest tests. Each boots a guest (a few seconds under TCG);
// they run in parallel, which also proves that concurrent runs keep apart.

func TestGuestStepsAndExitCode(t *testing.T) {
	t.Parallel()
	Require(t)
	env := `it's "quoted" $HOME \n`
	res, err := Run(context.Background(), Spec{
		Env: map[string]string{"GREETING": env},
		Script: `step first
sleep 600 & # left running: the run still ends when the script does
printf '%s\n' "$GREETING" >"$LAB_OUT/greeting"
echo one
step second
echo two
sh -c 'exit 7'
echo never
`,
		Log: testLog{t},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(res.Dir)
	if res.ExitCode != 7 || res.FailedStep != "second" {
		t.Fatalf("exit %d, failed step %q; want 7, \"second\"; output:\n%s", res.ExitCode, res.FailedStep, res.Output)
	}
	if len(res.Steps) != 2 || res.Steps[0].Name != "first" || !res.Steps[0].OK || res.Steps[1].Name != "second" || res.Steps[1].OK {
		t.Fatalf("steps %+v; want first OK, second failed", res.Steps)
	}
	for _, want := range []string{"one\n", "two\n", `"sh -c 'exit 7'" failed with status 7`} {
		if !strings.Contains(res.Output, want) {
			t.Errorf("output lacks %q:\n%s", want, res.Output)
		}
	}
	if strings.Contains(res.Output, "never") {
		t.Errorf("the script went on after the failing command:\n%s", res.Output)
	}
	got, err := os.ReadFile(filepath.Join(res.Dir, "greeting"))
	if err != nil || string(got) != env+"\n" {
		t.Errorf("$LAB_OUT/greeting = %q, %v; want the Env value %q", got, err, env+"\n")
	}
	if res.Boot <= 0 {
		t.Errorf("Boot = %v", res.Boot)
	}
	t.Logf("boot %v", res.Boot.Round(time.Millisecond))
}

func TestGuestModuleThatFailsToLoad(t *testing.T) {
	t.Parallel()
	Require(t)
	res, err := Run(context.Background(), Spec{
		Modules: []string{"nbd", "no_such_module"},
		Script:  "step never\n",
		Log:     testLog{t},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(res.Dir)
	if res.ExitCode == 0 || res.FailedStep != "modprobe no_such_module" {
		t.Fatalf("exit %d, failed step %q; want non-zero, \"modprobe no_such_module\"; output:\n%s", res.ExitCode, res.FailedStep, res.Output)
	}
	if len(res.Steps) != 2 || !res.Steps[0].OK || res.Steps[0].Name != "modprobe nbd" {
		t.Fatalf("steps %+v; want modprobe nbd OK, then modprobe no_such_module failed (and no script)", res.Steps)
	}
}

// A test binary built with `go test -c` on this machine runs in the guest
// at its host path (copied to /dev/shm first, as the lab advises).
func TestGuestGoTestBinary(t *testing.T) {
	t.Parallel()
	Require(t)
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to build the test binary")
	}
	bin := filepath.Join(t.TempDir(), "inguest.test")
	if out, err := exec.Command("go", "test", "-c", "-o", bin, "./testdata/inguest").CombinedOutput(); err != nil {
		t.Fatalf("go test -c: %v\n%s", err, out)
	}
	res := RunT(t, Spec{
		Env: map[string]string{"BIN": bin},
		Script: `step copy
cp "$BIN" /dev/shm/inguest.test
step test
/dev/shm/inguest.test -test.v -test.run '^TestInGuest$'
`,
	})
	if !strings.Contains(res.Output, "--- PASS: TestInGuest") || !strings.Contains(res.Output, "\nPASS\n") {
		t.Fatalf("no PASS from the test binary:\n%s", res.Output)
	}
	k, _ := lookupKernel("")
	got, err := os.ReadFile(filepath.Join(res.Dir, "inguest-release"))
	if err != nil || strings.TrimSpace(string(got)) != k.Release {
		t.Fatalf("the binary reported kernel %q, %v; want %q", got, err, k.Release)
	}
}

// The kernel's own NVMe/TCP target and host in one guest: nvmet-tcp over a
// file through configfs (nvmet_export), nvme-cli connecting to 127.0.0.1,
// data written and read back identical, then nothing left behind.
func TestGuestNVMeTCPLoop(t *testing.T) {
	t.Parallel()
	Require(t)
	res := RunT(t, Spec{
		Modules: []string{"nvmet-tcp", "nvme-tcp"},
		Env:     map[string]string{"NQN": "nqn.2026-11.io.nprdma:lab-loop"},
		Script: `step export
truncate -s 64M /dev/shm/ns.img
nvmet_export "$NQN" /dev/shm/ns.img tcp 127.0.0.1 4420
step connect
nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$NQN"
dev=$(nvme_ns_dev "$NQN")
step write
head -c 16M /dev/urandom >/dev/shm/pattern
dd if=/dev/shm/pattern of="$dev" bs=1M oflag=direct status=none
step read
dd if="$dev" of=/dev/shm/back bs=1M count=16 iflag=direct status=none
cmp /dev/shm/pattern /dev/shm/back
step disconnect
nvme disconnect -n "$NQN" | tee "$LAB_OUT/disconnect"
! ls /dev/nvme*n* 2>/dev/null
step clear
nvmet_clear
[ -z "$(ls -A /sys/kernel/config/nvmet/subsystems)" ]
[ -z "$(ls -A /sys/kernel/config/nvmet/ports)" ]
`,
	})
	got, _ := os.ReadFile(filepath.Join(res.Dir, "disconnect"))
	if !strings.Contains(string(got), "disconnected 1 controller") {
		t.Fatalf("nvme disconnect said %q", got)
	}
	for _, s := range res.Steps {
		t.Logf("step %-10s %v (guest clock, TCG)", s.Name, s.Duration.Round(time.Millisecond))
	}
}

// The modules the other guest tests need load on the default kernel, and
// Soft-RoCE comes up over eth0 (without on-demand paging: that needs 7.3).
func TestGuestModules(t *testing.T) {
	t.Parallel()
	Require(t)
	res := RunT(t, Spec{
		Modules: []string{"ublk_drv", "nbd", "rdma_rxe", "nvme-rdma", "nvmet-rdma"},
		Script: `step devices
grep -q '^CONFIG_BLK_DEV_UBLK=m' "/boot/config-$(uname -r)"
[ -c /dev/ublk-control ]
[ -b /dev/nbd0 ]
step rxe
rxe_up
ibv_devices | grep -w rxe0
ibv_devinfo -v -d rxe0 >"$LAB_OUT/devinfo"
`,
	})
	devinfo, err := os.ReadFile(filepath.Join(res.Dir, "devinfo"))
	if err != nil || !strings.Contains(string(devinfo), "PORT_ACTIVE") {
		t.Fatalf("ibv_devinfo: %v\n%s", err, devinfo)
	}
	if strings.Contains(string(devinfo), "ODP_SUPPORT") {
		t.Errorf("rxe on %s reports on-demand paging; docs/lab.md says only 7.3 has it", defaultKernel)
	}
}

// Soft-RoCE on 7.3 reports on-demand paging.
func TestGuestRxeODP(t *testing.T) {
	t.Parallel()
	RequireKernel(t, "7.3")
	res := RunT(t, Spec{
		Kernel:  "7.3",
		Modules: []string{"rdma_rxe"},
		Script: `step rxe
rxe_up
ibv_devinfo -v -d rxe0 >"$LAB_OUT/devinfo"
`,
	})
	devinfo, err := os.ReadFile(filepath.Join(res.Dir, "devinfo"))
	if err != nil || !strings.Contains(string(devinfo), "ODP_SUPPORT") {
		t.Fatalf("ibv_devinfo on 7.3 shows no ODP_SUPPORT: %v\n%s", err, devinfo)
	}
}

// A port of this machine's 127.0.0.1 (and nothing else) reaches a server
// in the guest; the guest reaches nothing on this machine by itself.
func TestGuestForward(t *testing.T) {
	t.Parallel()
	Require(t)
	hostPort, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	// Without the lab's restriction, the guest would reach this through
	// the user network's gateway 10.0.2.2.
	bait, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer bait.Close()
	baitPort := bait.Addr().(*net.TCPAddr).Port

	type outcome struct {
		res *Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := Run(context.Background(), Spec{
			Forward: []Forward{{HostPort: hostPort, GuestPort: 7000}},
			Env:     map[string]string{"BAIT": fmt.Sprint(baitPort)},
			Script: `step serve
busybox nc -l -p 7000 -e /bin/cat
step isolated
if timeout 3 bash -c 'exec 3<>/dev/tcp/10.0.2.2/$BAIT'; then
	echo "the guest reached this machine's port $BAIT"
	exit 1
fi
`,
			Log: testLog{t},
		})
		done <- outcome{res, err}
	}()

	echoed := false
	var listeners []string
	for deadline := time.Now().Add(3 * time.Minute); !echoed && time.Now().Before(deadline); {
		select {
		case o := <-done:
			t.Fatalf("the guest ended before the echo: %v %+v", o.err, o.res)
		default:
		}
		echoed = echoOnce(hostPort)
		if echoed {
			// QEMU still listens for the forward now.
			listeners = tcpListeners(hostPort)
		} else {
			time.Sleep(300 * time.Millisecond)
		}
	}
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	defer os.RemoveAll(o.res.Dir)
	if !echoed {
		t.Fatal("never reached the guest's server through the forward")
	}
	if o.res.ExitCode != 0 {
		t.Fatalf("guest script failed in step %q:\n%s", o.res.FailedStep, o.res.Output)
	}
	if len(listeners) == 0 {
		t.Fatal("found no listening socket for the forward")
	}
	for _, l := range listeners {
		if l != "127.0.0.1" {
			t.Errorf("the forward listens on %s; want 127.0.0.1 only", l)
		}
	}
	bait.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Millisecond))
	if c, err := bait.Accept(); err == nil {
		c.Close()
		t.Error("the guest connected to this machine through the gateway")
	}
	if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", hostPort), time.Second); err == nil {
		c.Close()
		t.Error("the forward still listens after Run returned")
	}
}

// echoOnce sends a line through the forward and reports whether the
// guest's echo server sent it back. QEMU accepts before the guest listens,
// then closes: that is a false.
func echoOnce(port int) bool {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "ping through the forward\n"); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && line == "ping through the forward\n"
}

// tcpListeners lists the local addresses of sockets listening on port
// (IPv4 and IPv6), from /proc/net/tcp{,6}.
func tcpListeners(port int) []string {
	var addrs []string
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fields := strings.Fields(line)
			if len(fields) < 4 || fields[3] != "0A" { // TCP_LISTEN
				continue
			}
			hexAddr, hexPort, _ := strings.Cut(fields[1], ":")
			var p int
			fmt.Sscanf(hexPort, "%X", &p)
			if p != port {
				continue
			}
			addrs = append(addrs, procNetIP(hexAddr).String())
		}
	}
	return addrs
}

// procNetIP decodes an address of /proc/net/tcp{,6}: 32-bit words in host
// (little-endian) order.
func procNetIP(h string) net.IP {
	var ip net.IP
	for i := 0; i+8 <= len(h); i += 8 {
		var w uint32
		fmt.Sscanf(h[i:i+8], "%X", &w)
		ip = append(ip, byte(w), byte(w>>8), byte(w>>16), byte(w>>24))
	}
	return ip
}

// deadlineCtx is a context whose deadline passes when the test says so.
type deadlineCtx struct {
	context.Context
	once sync.Once
	done chan struct{}
}

func (c *deadlineCtx) Done() <-chan struct{} { return c.done }
func (c *deadlineCtx) expire()               { c.once.Do(func() { close(c.done) }) }
func (c *deadlineCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// lineWatch calls fn once the console shows a line containing want.
type lineWatch struct {
	t    *testing.T
	want string
	fn   func()
}

func (w lineWatch) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	if strings.Contains(string(p), w.want) {
		w.fn()
	}
	return len(p), nil
}

// A guest that hangs in a step is killed when its time is up, and the
// error and the Result name that step.
func TestGuestHangTimesOutInStep(t *testing.T) {
	t.Parallel()
	Require(t)
	ctx := &deadlineCtx{Context: context.Background(), done: make(chan struct{})}
	var pid int
	res, err := Run(ctx, Spec{
		Script:  "step ready\ntrue\nstep hang\nsleep 600\n",
		Log:     lineWatch{t, "lab: step hang", ctx.expire},
		started: func(p int) { pid = p },
	})
	if !errors.Is(err, ErrTimeout) || !strings.Contains(fmt.Sprint(err), `in step "hang"`) {
		t.Fatalf("err = %v; want a timeout in step \"hang\"", err)
	}
	if res == nil {
		t.Fatal("no Result for a run whose script had started")
	}
	defer os.RemoveAll(res.Dir)
	if res.FailedStep != "hang" || res.ExitCode != -1 {
		t.Errorf("failed step %q, exit %d; want \"hang\", -1", res.FailedStep, res.ExitCode)
	}
	if !strings.Contains(res.Output, "lab: step hang") {
		t.Errorf("output of the stopped run lacks the hanging step:\n%s", res.Output)
	}
	if n := len(res.Steps); n != 2 || !res.Steps[0].OK || res.Steps[1].OK || res.Steps[1].Duration <= 0 {
		t.Errorf("steps %+v; want ready OK, hang open with a duration", res.Steps)
	}
	assertGone(t, pid)
}

// Spec.Timeout covers the boot: a guest that cannot boot in time is
// killed and reported as such.
func TestGuestTimeoutWhileBooting(t *testing.T) {
	t.Parallel()
	Require(t)
	var pid int
	res, err := Run(context.Background(), Spec{
		Script:  "true\n",
		Timeout: 500 * time.Millisecond,
		started: func(p int) { pid = p },
	})
	if !errors.Is(err, ErrTimeout) || !strings.Contains(fmt.Sprint(err), "while booting") {
		t.Fatalf("err = %v; want a timeout while booting", err)
	}
	if res != nil {
		t.Errorf("a Result %+v for a guest that never booted", res)
	}
	assertGone(t, pid)
}

// assertGone fails the test if the process pid still exists.
func assertGone(t *testing.T, pid int) {
	t.Helper()
	if pid == 0 {
		t.Fatal("QEMU's PID was never reported")
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("QEMU (pid %d) still exists after Run returned (kill 0: %v)", pid, err)
	}
}

// QEMU dies with the process that started it, however that process ends
// (here: os.Exit in the middle of a run, as when a test binary times out).
func TestGuestQEMUDiesWithItsProcess(t *testing.T) {
	if os.Getenv("NPRDMA_LAB_HELPER") == "exit-mid-run" {
		Run(context.Background(), Spec{Script: "sleep 600\n", started: func(pid int) {
			fmt.Printf("qemu pid %d\n", pid)
			os.Exit(3)
		}})
		return
	}
	t.Parallel()
	Require(t)
	cmd := exec.Command(os.Args[0], "-test.run", "^TestGuestQEMUDiesWithItsProcess$")
	cmd.Env = append(os.Environ(), "NPRDMA_LAB_HELPER=exit-mid-run")
	out, _ := cmd.Output()
	var pid int
	if _, err := fmt.Sscanf(string(out), "qemu pid %d", &pid); err != nil {
		t.Fatalf("helper printed %q", out)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		// Killed: gone, or dead and not yet reaped by its new parent.
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) || isZombie(pid) {
			return
		}
	}
	syscall.Kill(pid, syscall.SIGKILL)
	t.Fatalf("QEMU (pid %d) outlived the process that started it", pid)
}

func isZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, after, _ := strings.Cut(string(b), ") ")
	return strings.HasPrefix(after, "Z")
}
