package lab

import (
	"bufio"
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

//go:embed guest
var guestFiles embed.FS

// Spec describes one guest run.
type Spec struct {
	// Kernel names a pinned kernel: "6.12" (the default) or "7.3" (adds
	// Soft-RoCE on-demand paging). KernelNames lists them.
	Kernel string
	// Modules are loaded with modprobe, in order, before the script; each
	// is a step named "modprobe NAME", so one that fails to load is the
	// failed step.
	Modules []string
	// Script is a bash script run as root in the guest under
	// `set -eEo pipefail`, in $LAB_OUT, with the lab's helpers (step,
	// nvmet_export, nvmet_clear, rxe_up) defined.
	Script string
	// Env is exported to the script. LAB_OUT, LAB_DIR and LAB_KERNEL are
	// set by the lab.
	Env map[string]string
	// MemMiB is the guest's RAM (default 2048).
	MemMiB int
	// CPUs is the guest's vCPUs (default 2).
	CPUs int
	// Forward are TCP ports of this machine's 127.0.0.1 forwarded into the
	// guest (QEMU hostfwd). Nothing else of the guest's network reaches
	// beyond it: the user network is restricted.
	Forward []Forward
	// Timeout bounds the whole run, boot included (default 5 minutes).
	Timeout time.Duration
	// Log, if set, receives the guest's console line by line as it runs
	// (kernel messages, the script's output, "lab: step NAME" as each step
	// starts). It is written from one goroutine at a time.
	Log io.Writer

	started func(pid int) // this package's tests learn QEMU's PID
}

// Forward is one QEMU host forward: 127.0.0.1:HostPort on this machine
// reaches the guest's port GuestPort (TCP). FreePort picks a HostPort.
type Forward struct{ HostPort, GuestPort int }

// Result is what a guest run gave back.
type Result struct {
	ExitCode int
	// Output is the script's standard output and error, including the
	// module steps' and the lab's "lab: step NAME" lines. When the guest
	// was stopped before the script ended, it is the console after boot.
	Output     string
	Steps      []Step
	FailedStep string // the step running when the script failed; "" if none
	// Dir is the run's shared directory on this machine: $LAB_OUT in the
	// guest, at the same path. Run leaves it for the caller to read and
	// remove; RunT removes it when the test ends.
	Dir string
	// Boot is the time from starting QEMU to the guest being ready to run
	// the script (modules not yet loaded), on this machine's clock.
	Boot time.Duration
}

// Step is one step of a guest script. Duration is measured in the guest
// (under TCG: compare only with other steps).
type Step struct {
	Name     string
	Duration time.Duration
	OK       bool
}

// Defaults of a Spec.
const (
	DefaultMemMiB  = 2048
	DefaultCPUs    = 2
	DefaultTimeout = 5 * time.Minute
)

// ErrTimeout is wrapped by Run's error when the guest ran out of time.
var ErrTimeout = errors.New("guest timed out")

var (
	moduleRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

func (s Spec) withDefaults() (Spec, error) {
	if s.MemMiB == 0 {
		s.MemMiB = DefaultMemMiB
	}
	if s.CPUs == 0 {
		s.CPUs = DefaultCPUs
	}
	if s.Timeout == 0 {
		s.Timeout = DefaultTimeout
	}
	if s.MemMiB < 256 || s.CPUs < 1 || s.Timeout < 0 {
		return s, fmt.Errorf("lab: spec: MemMiB %d (>= 256), CPUs %d (>= 1), Timeout %v (>= 0)", s.MemMiB, s.CPUs, s.Timeout)
	}
	for _, m := range s.Modules {
		if !moduleRE.MatchString(m) {
			return s, fmt.Errorf("lab: spec: module name %q", m)
		}
	}
	for k := range s.Env {
		if !envKeyRE.MatchString(k) || strings.HasPrefix(k, "LAB_") || strings.HasPrefix(k, "BASH") {
			return s, fmt.Errorf("lab: spec: environment variable name %q", k)
		}
	}
	for _, f := range s.Forward {
		if f.HostPort <= 0 || f.HostPort > 65535 || f.GuestPort <= 0 || f.GuestPort > 65535 {
			return s, fmt.Errorf("lab: spec: forward %d -> %d: ports are 1..65535", f.HostPort, f.GuestPort)
		}
	}
	return s, nil
}

// Run boots a guest, loads s.Modules, runs s.Script and powers the guest
// off. Its error says the run did not complete: the lab could not start
// (no QEMU, no kernel: see Available), the guest did not boot, it stopped
// or timed out (wrapping ErrTimeout) or ctx ended (wrapping ctx.Err()).
// When the script had started, the Result is returned with the error,
// naming the step that was running. A script that exits non-zero is not an
// error: see Result.ExitCode and FailedStep. QEMU is killed by its PID
// before Run returns, on every path; if this process dies, the kernel
// kills it (parent-death signal).
func Run(ctx context.Context, s Spec) (*Result, error) {
	return run(ctx, s, false)
}

// Shell boots a guest with s's kernel, modules and environment, runs
// s.Script if any, then gives this process's terminal to an interactive
// bash in the guest until it exits or Ctrl-A x quits QEMU.
func Shell(ctx context.Context, s Spec) error {
	res, err := run(ctx, s, true)
	if res != nil {
		os.RemoveAll(res.Dir)
	}
	return err
}

func run(ctx context.Context, s Spec, shell bool) (*Result, error) {
	s, err := s.withDefaults()
	if err != nil {
		return nil, err
	}
	k, err := lookupKernel(s.Kernel)
	if err != nil {
		return nil, err
	}
	if err := available(k); err != nil {
		return nil, err
	}
	tree := kernelTree(k)
	initrd, err := initramfsFor(k, tree)
	if err != nil {
		return nil, fmt.Errorf("lab: initramfs: %w", err)
	}
	labDir, err := os.MkdirTemp("", "nprdma-lab-run-")
	if err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	defer os.RemoveAll(labDir)
	outDir, err := os.MkdirTemp("", "nprdma-lab-out-")
	if err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	keepOut := false
	defer func() {
		if !keepOut {
			os.RemoveAll(outDir)
		}
	}()
	for _, d := range []string{labDir, outDir, tree} {
		if strings.ContainsAny(d, " \t\n\"'\\") {
			return nil, fmt.Errorf("lab: path %q: the kernel command line carries it, so it must have no spaces or quotes", d)
		}
	}
	if err := writeRunFiles(labDir, outDir, k, s, initrd, shell); err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}

	ctx, cancel := context.WithTimeout(ctx, s.Timeout)
	defer cancel()
	cmd := exec.Command("qemu-system-x86_64", qemuArgs(k, tree, labDir, outDir, s, shell)...)
	// The parent-death signal goes with the thread that started QEMU: see start.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr limitedBuffer
	cmd.Stderr = &stderr
	// The console: the terminal for a shell, else a pipe read below.
	var console, consoleW *os.File
	if shell {
		cmd.Stdin, cmd.Stdout = os.Stdin, os.Stdout
		cmd.Stderr = io.MultiWriter(os.Stderr, &stderr)
	} else {
		if console, consoleW, err = os.Pipe(); err != nil {
			return nil, fmt.Errorf("lab: %w", err)
		}
		defer console.Close()
		cmd.Stdout = consoleW
	}

	begin := time.Now()
	waited, err := start(cmd)
	if consoleW != nil {
		consoleW.Close() // QEMU holds the write end
	}
	if err != nil {
		return nil, fmt.Errorf("lab: start QEMU: %w", err)
	}
	// On every path out of here, panics included.
	defer cmd.Process.Kill()
	if s.started != nil {
		s.started(cmd.Process.Pid)
	}

	var cons consoleReader
	cons.log = s.Log
	cons.begin = begin
	readDone := make(chan struct{})
	if console != nil {
		go func() {
			defer close(readDone)
			cons.read(console)
		}()
	} else {
		close(readDone)
	}

	var waitErr error
	var stopped error // why the lab stopped the guest
	select {
	case waitErr = <-waited:
	case <-ctx.Done():
		cmd.Process.Kill()
		waitErr = <-waited
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			stopped = fmt.Errorf("%w after %v", ErrTimeout, time.Since(begin).Round(time.Millisecond))
		} else {
			stopped = ctx.Err()
		}
	}
	end := time.Now()
	<-readDone

	res := &Result{ExitCode: -1, Dir: outDir, Boot: cons.boot}
	if output, err := os.ReadFile(filepath.Join(labDir, "output")); err == nil {
		res.Output = string(output)
	} else {
		// The guest was stopped before it wrote the output file: what the
		// console showed after boot (kernel messages included).
		res.Output = cons.afterBoot.String()
	}
	steps, _ := os.ReadFile(filepath.Join(labDir, "steps"))
	var open bool
	res.Steps, open = parseSteps(string(steps), cons.clockOffset, cons.stepSeen, end)
	status, statusErr := os.ReadFile(filepath.Join(labDir, "status"))
	if stopped == nil && statusErr == nil {
		if res.ExitCode, err = strconv.Atoi(strings.TrimSpace(string(status))); err != nil {
			return nil, fmt.Errorf("lab: guest status %q", status)
		}
	}
	if res.ExitCode != 0 || open {
		res.FailedStep = lastFailed(res.Steps)
	}
	keepOut = true
	if shell {
		if stopped != nil {
			return res, fmt.Errorf("lab: guest shell: %w", stopped)
		}
		return res, nil
	}

	where := "before the first step"
	switch {
	case res.FailedStep != "":
		where = fmt.Sprintf("in step %q", res.FailedStep)
	case cons.boot == 0:
		where = "while booting"
	}
	switch {
	case stopped != nil:
		err = fmt.Errorf("lab: guest (kernel %s) stopped %s: %w; console ends:\n%s", k.Name, where, stopped, cons.tail())
	case statusErr != nil:
		err = fmt.Errorf("lab: guest (kernel %s) ended %s without finishing the script (QEMU: %v %s); console ends:\n%s",
			k.Name, where, waitErr, strings.TrimSpace(stderr.String()), cons.tail())
	}
	if err != nil {
		if cons.boot == 0 && res.Output == "" {
			keepOut = false
			return nil, err
		}
		return res, err
	}
	return res, nil
}

// start starts cmd from a goroutine locked to its OS thread, which stays
// until QEMU has exited: Linux sends the parent-death signal when the
// thread that forked the child ends, and the Go runtime ends threads.
// The returned channel yields Wait's result.
func start(cmd *exec.Cmd) (<-chan error, error) {
	started := make(chan error, 1)
	waited := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Never unlocked: the thread ends with this goroutine, after Wait.
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		waited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return waited, nil
}

func qemuArgs(k kernel, tree, labDir, outDir string, s Spec, shell bool) []string {
	mode := "run"
	serial := []string{"-serial", "stdio", "-monitor", "none"}
	if shell {
		mode = "shell"
		// Ctrl-A x quits; Ctrl-A c reaches QEMU's monitor.
		serial = []string{"-serial", "mon:stdio"}
	}
	cmdline := strings.Join([]string{
		"console=ttyS0", "quiet", "loglevel=4", "panic=-1",
		// A slowly emulated timer fails the IO-APIC timer check on a
		// loaded machine ("IO-APIC + timer doesn't work!": a panic).
		"no_timer_check",
		"labmode=" + mode, "labdir=" + labDir, "labout=" + outDir,
		"labmods=" + filepath.Join(tree, filepath.Dir(k.modulesDir())),
		"labconfig=" + filepath.Join(tree, k.Config),
	}, " ")
	// For debugging the guest's boot: loglevel=7, initcall_debug, ...
	if extra := os.Getenv("NPRDMA_LAB_APPEND"); extra != "" {
		cmdline += " " + extra
	}
	netdev := "user,id=n0,restrict=on"
	for _, f := range s.Forward {
		netdev += fmt.Sprintf(",hostfwd=tcp:127.0.0.1:%d-:%d", f.HostPort, f.GuestPort)
	}
	args := []string{
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-machine", "q35",
		// One host thread runs all the guest's vCPUs in turn. With a
		// thread per vCPU (MTTCG) a loaded machine sometimes panicked
		// the guest while booting (int3 Oops in code being patched by
		// another vCPU), and a cycle took more CPU time (6.3-7.4 s against
		// 5.3-5.8 s).
		"-accel", "tcg,thread=single", "-cpu", "max",
		"-smp", strconv.Itoa(s.CPUs), "-m", strconv.Itoa(s.MemMiB),
		"-kernel", filepath.Join(tree, k.Image),
		"-initrd", filepath.Join(labDir, "initrd"),
		"-append", cmdline,
		"-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
		"-virtfs", "local,path=" + labDir + ",mount_tag=lab,security_model=none,multidevs=remap",
		"-virtfs", "local,path=" + outDir + ",mount_tag=out,security_model=none,multidevs=remap",
		"-netdev", netdev, "-device", "virtio-net-pci,netdev=n0,romfile=",
		"-device", "virtio-rng-pci",
	}
	return append(args, serial...)
}

// writeRunFiles writes what the guest reads from the lab share: the
// initramfs (read by QEMU), stage 2, the library, the environment, the
// runner (module steps, then the script) and the script.
func writeRunFiles(labDir, outDir string, k kernel, s Spec, initrd []byte, shell bool) error {
	files := map[string][]byte{"initrd": initrd}
	for _, name := range []string{"stage2", "lib.sh", "shellrc"} {
		b, err := guestFiles.ReadFile("guest/" + name)
		if err != nil {
			return err
		}
		files[name] = b
	}
	var env strings.Builder
	vars := map[string]string{"LAB_DIR": labDir, "LAB_OUT": outDir, "LAB_KERNEL": k.Name}
	for key, v := range s.Env {
		vars[key] = v
	}
	if shell {
		if t := os.Getenv("TERM"); t != "" {
			vars["TERM"] = t
		}
		if rows, cols, ok := terminalSize(); ok {
			vars["LAB_ROWS"], vars["LAB_COLS"] = strconv.Itoa(rows), strconv.Itoa(cols)
		}
	}
	keys := make([]string, 0, len(vars))
	for key := range vars {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		fmt.Fprintf(&env, "export %s=%s\n", key, shellQuote(vars[key]))
	}
	files["env"] = []byte(env.String())

	var runner strings.Builder
	runner.WriteString(". \"$LAB_DIR/lib.sh\"\nset -eEo pipefail\n")
	for _, m := range s.Modules {
		fmt.Fprintf(&runner, "step 'modprobe %s'\nmodprobe %s\n", m, m)
	}
	runner.WriteString("_lab_step_end 0\ncd \"$LAB_OUT\"\n. \"$LAB_DIR/script\"\n")
	files["runner"] = []byte(runner.String())
	files["script"] = []byte(s.Script)
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(labDir, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// shellQuote quotes s for bash: single quotes, each ' written as '\”.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

var initramfsCache struct {
	sync.Mutex
	m map[string][]byte
}

// initramfsFor builds k's initramfs once per process.
func initramfsFor(k kernel, tree string) ([]byte, error) {
	initramfsCache.Lock()
	defer initramfsCache.Unlock()
	if b, ok := initramfsCache.m[tree]; ok {
		return b, nil
	}
	b, err := buildInitramfs(k, tree)
	if err != nil {
		return nil, err
	}
	if initramfsCache.m == nil {
		initramfsCache.m = map[string][]byte{}
	}
	initramfsCache.m[tree] = b
	return b, nil
}

// parseSteps reads the guest's step records ("start SECONDS NAME", "end
// SECONDS STATUS"). A step still open when the guest stopped lasted until
// end (this machine's clock; offset maps the guest's clock to it) and is
// reported open. The clock offset taken at boot includes that line's trip
// through the console, which may exceed a later line's; where it leaves the
// open step no duration, the step lasted at least from seen (when this
// machine's console showed it; zero if unknown) until end.
func parseSteps(records string, offset time.Duration, seen, end time.Time) (steps []Step, open bool) {
	var started time.Time
	for _, line := range strings.Split(records, "\n") {
		kind, rest, _ := strings.Cut(line, " ")
		secs, arg, _ := strings.Cut(rest, " ")
		t, err := parseEpoch(secs)
		if err != nil {
			continue
		}
		switch kind {
		case "start":
			steps = append(steps, Step{Name: arg})
			started, open = t, true
		case "end":
			if !open || len(steps) == 0 {
				continue
			}
			last := &steps[len(steps)-1]
			last.Duration = t.Sub(started)
			last.OK = arg == "0"
			open = false
		}
	}
	if open {
		d := end.Sub(started.Add(offset))
		if d <= 0 && !seen.IsZero() {
			d = end.Sub(seen)
		}
		if d > 0 {
			steps[len(steps)-1].Duration = d
		}
	}
	return steps, open
}

// parseEpoch parses bash's $EPOCHREALTIME (seconds.microseconds).
func parseEpoch(s string) (time.Time, error) {
	sec, frac, _ := strings.Cut(s, ".")
	n, err := strconv.ParseInt(sec, 10, 64)
	if err != nil {
		return time.Time{}, err
	}
	var us int64
	if frac != "" {
		frac = (frac + "000000")[:6]
		if us, err = strconv.ParseInt(frac, 10, 64); err != nil {
			return time.Time{}, err
		}
	}
	return time.Unix(n, us*1000), nil
}

// lastFailed is the name of the last step that did not end well.
func lastFailed(steps []Step) string {
	for i := len(steps) - 1; i >= 0; i-- {
		if !steps[i].OK {
			return steps[i].Name
		}
	}
	return ""
}

// consoleReader follows the guest's serial console: it passes each line to
// log, keeps the last lines for error messages, and notes when the guest
// reports it has booted (and its clock then).
type consoleReader struct {
	log         io.Writer
	begin       time.Time
	boot        time.Duration
	clockOffset time.Duration // this machine's clock minus the guest's
	stepSeen    time.Time     // when the last "lab: step NAME" line arrived
	last        []string
	afterBoot   strings.Builder // the console after the boot marker, up to 1 MiB
}

const (
	bootMarker = "nprdma-lab: booted "
	stepMarker = "lab: step "
)

func (c *consoleReader) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if i := strings.Index(line, bootMarker); i >= 0 && c.boot == 0 {
			now := time.Now()
			c.boot = now.Sub(c.begin)
			if t, err := parseEpoch(strings.TrimSpace(line[i+len(bootMarker):])); err == nil {
				c.clockOffset = now.Sub(t)
			}
		}
		if c.boot != 0 && c.afterBoot.Len() < 1<<20 && !strings.HasPrefix(line, bootMarker) {
			c.afterBoot.WriteString(line + "\n")
		}
		if strings.HasPrefix(line, stepMarker) {
			c.stepSeen = time.Now()
		}
		if len(c.last) == 40 {
			c.last = c.last[1:]
		}
		c.last = append(c.last, line)
		if c.log != nil {
			io.WriteString(c.log, line+"\n")
		}
	}
	// A console line longer than the buffer ends reading; drain the rest
	// so QEMU never blocks on a full pipe.
	io.Copy(io.Discard, r)
}

func (c *consoleReader) tail() string {
	return strings.Join(c.last, "\n")
}

// limitedBuffer keeps the first 64 KiB written to it (QEMU's errors).
type limitedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if room := 64<<10 - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (l *limitedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
