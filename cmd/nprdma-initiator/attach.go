package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/initiator/attach"
	"github.com/nprdma/nprdma/initiator/blockio"
	"github.com/nprdma/nprdma/internal/command"
	nvmetcp "github.com/nprdma/nprdma/nvme/tcp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/urfave/cli/v2"
)

// runDirFlag is shared by attach, detach and list: where attachment records live.
func runDirFlag() cli.Flag {
	return &cli.StringFlag{Name: "run-dir", EnvVars: []string{"NPRDMA_RUN_DIR"}, Value: attach.DefaultRunDir(),
		Usage: "directory of the attachment records (attach/NAME.json), default NBD sockets, daemon logs and FUSE mount points"}
}

func attachCommand() *cli.Command {
	return &cli.Command{
		Name:      "attach",
		Usage:     "attach a remote namespace locally: a block device (--mode ublk, nbd-kernel or fuse) or an NBD socket (--mode nbd)",
		UsageText: "nprdma-initiator attach --target ADDR --nqn NQN [--nsid N] [--mode ublk|nbd-kernel|fuse|nbd|auto] [--name NAME] [--daemon] [--json]",
		Description: "Connects to the subsystem and serves the namespace until SIGINT or SIGTERM (or `nprdma-initiator detach`),\n" +
			"then flushes, tears everything down and exits 0. It prints one line saying what to use:\n" +
			"  ublk:       /dev/ublkbN, a ublk block device this process serves (root; kernel with ublk_drv).\n" +
			"              If the process dies, the device waits for the next attach of the same name, which resumes it.\n" +
			"  nbd-kernel: /dev/nbdN, the kernel's NBD client over socket pairs to this process (root; kernel with nbd).\n" +
			"  fuse:       /dev/loopN (direct I/O) over a FUSE file (direct I/O) (root).\n" +
			"  nbd:        an NBD server on a unix socket (--socket; optionally --tcp on loopback), e.g.\n" +
			"              fio --ioengine=nbd --uri='nbd+unix:///NAME?socket=SOCKET' ...; nbdinfo, nbdcopy, qemu\n" +
			"  auto:       the first of ublk, nbd-kernel, fuse the machine offers, else nbd; it says which and why.\n" +
			"              --socket or --tcp without --mode mean nbd.\n" +
			"On the block devices mkfs, mount and fio work as on any disk; flushes reach the target's Flush, discards\n" +
			"its Dataset Management. While the device is mounted a teardown is refused (the process keeps serving and\n" +
			"says so); SIGUSR1 (what `detach --force` sends) unmounts it lazily and tears down anyway.\n" +
			"If the target stays unreachable past --ctrl-loss-timeout, or serves another namespace under the NSID\n" +
			"after a restart, I/O fails with EIO from then on, list shows the attachment as lost or namespace-changed,\n" +
			"and the teardown exits 1 only if writes or trims it acknowledged were never covered by a flush.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "target", Aliases: []string{"t"}, Required: true, Usage: "target address, host:port (with --transport tcp the port defaults to 4420), or unix:PATH, a target's shared-memory socket on this host (--transport nprdma)"},
			&cli.StringFlag{Name: "nqn", Aliases: []string{"n"}, Required: true, Usage: "subsystem NQN (see discover)"},
			&cli.UintFlag{Name: "nsid", Value: 1, Usage: "namespace ID"},
			&cli.StringFlag{Name: "mode", Value: string(attach.ModeAuto), Usage: "ublk (/dev/ublkbN), nbd-kernel (/dev/nbdN), fuse (FUSE file + /dev/loopN), nbd (NBD socket) or auto"},
			&cli.StringFlag{Name: "name", Usage: "name of the attachment, for list and detach (default: NQN tail and namespace, e.g. default-ns1)"},
			&cli.StringFlag{Name: "socket", Usage: "unix socket of the NBD server (default: RUN-DIR/NAME.sock)"},
			&cli.StringFlag{Name: "tcp", Usage: "also serve NBD on this loopback TCP address (e.g. 127.0.0.1:10809)"},
			runDirFlag(),
			&cli.BoolFlag{Name: "daemon", Aliases: []string{"d"}, Usage: "run in the background: return once attached (output to RUN-DIR/NAME.log); stop it with detach"},
			&cli.BoolFlag{Name: "json", Usage: "print the attachment as JSON (one line) instead of a sentence"},
			&cli.StringFlag{Name: "metrics-addr", Usage: "serve Prometheus metrics (nprdma_initiator_*, nprdma_attach_*, nprdma_nbd_*) on this address, e.g. 127.0.0.1:9421 (port 0: any; the record says which)"},
			&cli.IntFlag{Name: "io-queues", Usage: "I/O queues to the target, and hardware queues of a ublk device or connections of nbd-kernel (0: one per CPU)"},
			&cli.IntFlag{Name: "queue-depth", Value: initiator.DefaultQueueDepth, Usage: "entries per I/O queue to the target and per queue of a ublk or nbd-kernel device"},
			&cli.DurationFlag{Name: "ctrl-loss-timeout", Value: initiator.DefaultLossTimeout, Usage: "how long I/O waits for a reconnect before failing (the attachment is then lost: list says so)"},
			&cli.DurationFlag{Name: "keep-alive", Value: initiator.DefaultKeepAlive, Usage: "keep-alive timeout asked of the target (keep-alives every half of it)"},
			&cli.BoolFlag{Name: "two-sided", Usage: "read with NVMe Read commands only (no one-sided reads; a baseline)"},
		},
		Action: attachAction,
	}
}

// attachRequest is what attach was asked for, with auto and the defaults
// resolved.
type attachRequest struct {
	mode   attach.Mode
	reason string // why auto chose mode
	name   string
	dir    *attach.Dir
}

func resolveAttach(cc *cli.Context) (attachRequest, error) {
	mode, err := attach.ParseMode(cc.String("mode"))
	if err != nil {
		return attachRequest{}, fmt.Errorf("--mode: %w", err)
	}
	wantsNBD := cc.String("socket") != "" || cc.String("tcp") != ""
	var reason string
	switch {
	case mode == attach.ModeAuto && wantsNBD && !cc.IsSet("mode"):
		mode, reason = attach.ModeNBD, "mode nbd: --socket/--tcp given"
	case mode == attach.ModeAuto:
		mode, reason = attach.ChooseMode(attach.ProbeKernel())
	case mode != attach.ModeNBD && wantsNBD:
		return attachRequest{}, errors.New("--socket and --tcp are for --mode nbd")
	}
	dir, err := attach.OpenDir(cc.String("run-dir"))
	if err != nil {
		return attachRequest{}, err
	}
	name := cc.String("name")
	if name == "" {
		name = dir.FreeName(attach.DefaultName(cc.String("nqn"), uint32(cc.Uint("nsid"))))
	}
	if err := attach.ValidName(name); err != nil {
		return attachRequest{}, fmt.Errorf("--name: %w", err)
	}
	return attachRequest{mode: mode, reason: reason, name: name, dir: dir}, nil
}

func attachAction(cc *cli.Context) error {
	req, err := resolveAttach(cc)
	if err != nil {
		return err
	}
	if cc.Bool("daemon") {
		return startDaemon(cc, req)
	}
	return serveAttachment(cc, req)
}

// session is the controller of an attachment with its transport: closing
// it closes both.
type session struct {
	*initiator.Controller
	release func() // the transport's, after the controller is closed
}

func (s session) Close() error {
	err := s.Controller.Close()
	s.release()
	return err
}

// serveAttachment is the attach process proper: claim the name, connect,
// expose the namespace, and serve until a signal's teardown succeeds
// (attach.Attachment does the life cycle; this is the wiring).
func serveAttachment(cc *cli.Context, req attachRequest) error {
	markReadyFDCloseOnExec()
	say := sayer(cc)
	log, err := command.Logger(cc)
	if err != nil {
		return err
	}
	frontend, err := attach.FrontendOf(req.mode)
	if err != nil {
		return err
	}
	self, err := attach.Self()
	if err != nil {
		return err
	}
	rec := attach.Record{
		Name: req.name, PID: self.PID, ProcStart: self.Start, Started: time.Now().UTC().Truncate(time.Second),
		Mode: req.mode, Target: targetAddr(cc, nvmetcp.Port), NQN: cc.String("nqn"), NSID: uint32(cc.Uint("nsid")),
		LogFile: os.Getenv(envDaemonLog),
	}
	var reg *prometheus.Registry
	if addr := cc.String("metrics-addr"); addr != "" {
		reg = command.NewRegistry()
		metrics, err := command.ServeMetrics(addr, command.MetricsHandler(reg))
		if err != nil {
			return err
		}
		defer metrics.Close()
		rec.MetricsAddr = metrics.Addr()
	}
	if req.reason != "" {
		say(req.reason)
	}
	a, err := attach.Claim(req.dir, rec, say)
	if err != nil {
		return err
	}
	if r := a.Resuming(); r != nil {
		say(fmt.Sprintf("resuming %s, whose attach process %d is gone", r.Use(), r.PID))
	}

	// Signals: during setup any of them cancels it; afterwards they are
	// teardown requests.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1)
	defer signal.Stop(sigs)
	requests := make(chan attach.Request, 1)
	setupCtx, cancelSetup := context.WithCancel(cc.Context)
	defer cancelSetup()
	setupDone, watchDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watchDone)
		select {
		case s := <-sigs:
			requests <- teardownRequest(s)
			cancelSetup()
		case <-setupDone:
		}
	}()
	endSetup := func() {
		close(setupDone)
		<-watchDone // a signal it took is in requests now
	}

	if err := setUp(setupCtx, cc, a, frontend, log, reg, say); err != nil {
		endSetup()
		a.Abort()
		if len(requests) > 0 {
			return fmt.Errorf("attach %s: interrupted while setting up", req.name)
		}
		return fmt.Errorf("attach %s: %w", req.name, err)
	}
	endSetup()
	if err := announce(cc, a.Record()); err != nil {
		// The parent of a daemon is gone (interrupted): nobody was told
		// about this attachment, so it must not stay.
		a.Abort()
		return fmt.Errorf("attach %s: %w", req.name, err)
	}
	go func() {
		for s := range sigs {
			requests <- teardownRequest(s)
		}
	}()
	return a.Run(cc.Context, requests)
}

// teardownRequest is what a signal asks of the attach process: SIGUSR1 (what
// detach --force sends) a forced teardown, the others a plain one.
func teardownRequest(s os.Signal) attach.Request {
	return attach.Request{Force: s == syscall.SIGUSR1, Cause: s.String()}
}

// setUp connects and exposes the namespace in the requested mode.
func setUp(ctx context.Context, cc *cli.Context, a *attach.Attachment, frontend attach.Frontend, log *slog.Logger, reg *prometheus.Registry, say func(string)) error {
	rec := a.Record()
	secrets, err := secretOptions(cc)
	if err != nil {
		return err
	}
	opts := append(hostOptions(cc, log), initiator.WithQueueDepth(cc.Int("queue-depth")), initiator.WithControllerLossTimeout(cc.Duration("ctrl-loss-timeout")),
		initiator.WithKeepAlive(cc.Duration("keep-alive")), initiator.WithOneSidedReads(!cc.Bool("two-sided")))
	opts = append(opts, secrets...)
	if n := cc.Int("io-queues"); n > 0 {
		opts = append(opts, initiator.WithIOQueues(n))
	}
	if reg != nil {
		opts = append(opts, initiator.WithMetrics(reg))
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	ch, err := chooseTransport(cctx, cc, rec.Target, rec.NQN, opts)
	if err != nil {
		cancel()
		return err
	}
	if ch.reason != "" {
		say(ch.reason)
	}
	c, err := initiator.ConnectOver(cctx, ch.tr, ch.addr, rec.NQN, opts...)
	cancel()
	if err != nil {
		ch.release()
		return err
	}
	ns, err := c.Namespace(ctx, rec.NSID)
	if err != nil {
		session{c, ch.release}.Close()
		return err
	}
	a.Connected(session{c, ch.release}, ns)

	var backend blockio.Backend = ns
	if reg != nil {
		m, err := blockio.NewMetrics(reg)
		if err != nil {
			return err
		}
		backend = blockio.Instrument(backend, m, string(rec.Mode))
	}
	cfg := attach.Config{
		Description: fmt.Sprintf("nprdma %s namespace %d", rec.NQN, rec.NSID), Logger: log,
		Socket: cc.String("socket"), TCP: cc.String("tcp"),
		Queues: cc.Int("io-queues"), QueueDepth: cc.Int("queue-depth"),
	}
	if reg != nil {
		cfg.Registerer = reg
	}
	return a.Expose(ctx, frontend, backend, cfg)
}

// announce prints what to use: one sentence, or the record as JSON; and, in
// a daemon, hands the record to the parent waiting for it.
func announce(cc *cli.Context, rec attach.Record) error {
	line, _ := json.Marshal(rec)
	if cc.Bool("json") {
		fmt.Fprintf(cc.App.Writer, "%s\n", line)
	} else {
		fmt.Fprintln(cc.App.Writer, sentence(rec))
	}
	if fd := os.Getenv(envDaemonReadyFD); fd != "" {
		n, err := strconv.Atoi(fd)
		if err != nil {
			return fmt.Errorf("%s=%q: %w", envDaemonReadyFD, fd, err)
		}
		f := os.NewFile(uintptr(n), "ready")
		defer f.Close()
		if _, err := f.Write(append(line, '\n')); err != nil {
			return fmt.Errorf("telling the parent we are attached: %w", err)
		}
	}
	return nil
}

// sentence says what is attached and how to use it, in one line.
func sentence(r attach.Record) string {
	use := r.Use()
	if r.ResumedFrom != 0 {
		use += fmt.Sprintf(" (resumed: its attach process %d had died)", r.ResumedFrom)
	}
	s := fmt.Sprintf("attached %s as %s: namespace %d of %s at %s (%s)", r.Name, use, r.NSID, r.NQN, r.Target, attach.HumanSize(r.Size))
	if r.TCPURI != "" {
		s += "; also " + r.TCPURI
	}
	return s
}
