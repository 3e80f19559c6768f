package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/initiator/attach"
	"github.com/nprdma/nprdma/initiator/blockio"
	"github.com/nprdma/nprdma/initiator/fuseblk"
	"github.com/nprdma/nprdma/initiator/nbd"
	nvmetcp "github.com/nprdma/nprdma/nvme/tcp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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
		Usage:     "attach a remote namespace locally: an NBD socket (--mode nbd) or a block device /dev/loopN (--mode fuse)",
		UsageText: "nprdma-initiator attach --target ADDR --nqn NQN [--nsid N] [--mode nbd|fuse|auto] [--name NAME] [--daemon] [--json]",
		Description: "Connects to the subsystem and serves the namespace until SIGINT or SIGTERM (or `nprdma-initiator detach`),\n" +
			"then flushes, tears everything down and exits 0. It prints one line saying what to use:\n" +
			"  nbd:  an NBD server on a unix socket (--socket; optionally --tcp on loopback), e.g.\n" +
			"        fio --ioengine=nbd --uri='nbd+unix:///NAME?socket=SOCKET' ...; nbdinfo, nbdcopy, qemu\n" +
			"  fuse: /dev/loopN (direct I/O) over a FUSE file (direct I/O); mkfs, mount, fio --filename=/dev/loopN.\n" +
			"        Needs root. fsync reaches the target's Flush, discard its Dataset Management.\n" +
			"  auto: fuse where it can work (root, /dev/fuse, /dev/loop-control), else nbd; it says which and why.\n" +
			"        --socket or --tcp without --mode mean nbd.\n" +
			"While the loop device is mounted a teardown is refused (the process keeps serving and says so);\n" +
			"SIGUSR1 (what `detach --force` sends) unmounts it lazily and tears down anyway.\n" +
			"If the target stays unreachable past --ctrl-loss-timeout, or serves another namespace under the NSID\n" +
			"after a restart, I/O fails with EIO from then on, list shows the attachment as lost or namespace-changed,\n" +
			"and the teardown exits 1 only if writes or trims it acknowledged were never covered by a flush.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "target", Aliases: []string{"t"}, Required: true, Usage: "target address, host:port (with --transport tcp the port defaults to 4420), or unix:PATH, a target's shared-memory socket on this host (--transport nprdma)"},
			&cli.StringFlag{Name: "nqn", Aliases: []string{"n"}, Required: true, Usage: "subsystem NQN (see discover)"},
			&cli.UintFlag{Name: "nsid", Value: 1, Usage: "namespace ID"},
			&cli.StringFlag{Name: "mode", Value: string(attach.ModeAuto), Usage: "nbd (NBD socket), fuse (FUSE file + /dev/loopN, root) or auto"},
			&cli.StringFlag{Name: "name", Usage: "name of the attachment, for list and detach (default: NQN tail and namespace, e.g. default-ns1)"},
			&cli.StringFlag{Name: "socket", Usage: "unix socket of the NBD server (default: RUN-DIR/NAME.sock)"},
			&cli.StringFlag{Name: "tcp", Usage: "also serve NBD on this loopback TCP address (e.g. 127.0.0.1:10809)"},
			runDirFlag(),
			&cli.BoolFlag{Name: "daemon", Aliases: []string{"d"}, Usage: "run in the background: return once attached (output to RUN-DIR/NAME.log); stop it with detach"},
			&cli.BoolFlag{Name: "json", Usage: "print the attachment as JSON (one line) instead of a sentence"},
			&cli.StringFlag{Name: "metrics-addr", Usage: "serve Prometheus metrics (nprdma_initiator_*, nprdma_attach_*, nprdma_nbd_*) on this address, e.g. 127.0.0.1:9421 (port 0: any; the record says which)"},
			&cli.IntFlag{Name: "io-queues", Usage: "I/O queues (0: one per CPU)"},
			&cli.IntFlag{Name: "queue-depth", Value: initiator.DefaultQueueDepth, Usage: "entries per I/O queue"},
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
	case mode == attach.ModeFUSE && wantsNBD:
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

// attachment is a running attach: what it serves and how to take it down.
type attachment struct {
	cc     *cli.Context
	req    attachRequest
	rec    attach.Record
	stderr io.Writer
	log    *slog.Logger // the initiator's, the NBD server's and FUSE's: --log-level

	release func() // the transport's, after ctrl is closed
	ctrl    *initiator.Controller
	ns      *initiator.Namespace
	stats   initiator.Stats // the controller's counters at teardown
	metrics *http.Server

	// nbd mode
	srv      *nbd.Server
	serveErr chan error // one value per Serve call when it returns
	serving  int
	// fuse mode
	fuse *fuseblk.Attachment
}

func (a *attachment) say(format string, args ...any) {
	fmt.Fprintf(a.stderr, "nprdma-initiator: "+format+"\n", args...)
}

// serveAttachment is the attach process proper: claim the name, connect,
// serve, and on a signal tear down and remove the record.
func serveAttachment(cc *cli.Context, req attachRequest) error {
	markReadyFDCloseOnExec()
	self, err := attach.Self()
	if err != nil {
		return err
	}
	a := &attachment{cc: cc, req: req, stderr: cc.App.ErrWriter, serveErr: make(chan error, 2)}
	a.rec = attach.Record{
		Name: req.name, State: attach.StateStarting, PID: self.PID, ProcStart: self.Start, Started: time.Now().UTC().Truncate(time.Second),
		Mode: req.mode, Target: targetAddr(cc, nvmetcp.Port), NQN: cc.String("nqn"), NSID: uint32(cc.Uint("nsid")),
		LogFile: os.Getenv(envDaemonLog),
	}
	if req.reason != "" {
		a.say("%s", req.reason)
	}
	if err := req.dir.Claim(a.rec); err != nil {
		return err
	}

	// Signals: during setup any of them cancels it; afterwards they are
	// teardown requests, read from sigs.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1)
	defer signal.Stop(sigs)
	setupCtx, cancelSetup := context.WithCancel(cc.Context)
	defer cancelSetup()
	interrupted := make(chan os.Signal, 1)
	setupDone, watchDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watchDone)
		select {
		case s := <-sigs:
			interrupted <- s
			cancelSetup()
		case <-setupDone:
		}
	}()
	endSetup := func() {
		close(setupDone)
		<-watchDone // a signal it took is in interrupted now
	}

	if err := a.setUp(setupCtx); err != nil {
		endSetup()
		a.tearDown(true)
		req.dir.Remove(req.name)
		if len(interrupted) > 0 {
			return fmt.Errorf("attach %s: interrupted while setting up", req.name)
		}
		return fmt.Errorf("attach %s: %w", req.name, err)
	}
	endSetup()
	a.rec.State = attach.StateAttached
	if err := req.dir.Save(a.rec); err != nil {
		a.tearDown(true)
		req.dir.Remove(req.name)
		return err
	}
	if err := a.announce(); err != nil {
		// The parent of a daemon is gone (interrupted): nobody was told
		// about this attachment, so it must not stay.
		a.tearDown(true)
		req.dir.Remove(req.name)
		return fmt.Errorf("attach %s: %w", req.name, err)
	}

	// Serve until asked to stop. A refused teardown (the loop device is
	// mounted, or held open elsewhere) leaves everything as it was.
	var pending os.Signal
	select {
	case pending = <-interrupted:
	default:
	}
	// Its I/O failing for good (EIO), it serves on until detached, but
	// lets list say so.
	lost, changed := a.ctrl.Lost(), a.ns.Changed()
	dead := func() {
		if a.noteDeath() {
			a.say("%s: %s; its I/O fails with EIO until it is detached: %s", req.name, deadCause(a.rec), a.rec.LostReason)
		}
	}
	for {
		force := false
		var cause string
		switch {
		case pending != nil:
			force, cause = pending == syscall.SIGUSR1, pending.String()
			pending = nil
		default:
			select {
			case s := <-sigs:
				force, cause = s == syscall.SIGUSR1, s.String()
			case <-cc.Context.Done():
				// The embedding program is finishing: nobody is left
				// to retry a refused teardown.
				force, cause = true, "context done"
			case err := <-a.serveErr:
				a.serving--
				force, cause = true, fmt.Sprintf("NBD server stopped: %v", err)
			case <-lost:
				lost = nil
				dead()
				continue
			case <-changed:
				changed = nil
				dead()
				continue
			case <-a.ns.LossReported():
				a.notePossiblyLost()
				continue
			case <-a.ns.Resized():
				a.noteResized()
				continue
			}
		}
		mode := "detaching"
		if force {
			mode = "detaching (forced)"
		}
		a.say("%s: %s", cause, mode)
		refused, terr := a.tearDown(force)
		if refused {
			a.rec.DetachAttempts++
			a.rec.DetachError = terr.Error()
			if err := req.dir.Save(a.rec); err != nil {
				a.say("%v", err)
			}
			a.say("still attached: %v. Unmount it and detach again, or detach --force (SIGUSR1).", terr)
			continue
		}
		a.reportStats()
		if terr != nil {
			// Keep the record so that list and detach see the failure and
			// clean up what is left. Not a refusal (DetachAttempts): the
			// process exits, and detach must wait for that to reap it.
			a.rec.DetachError = terr.Error()
			req.dir.Save(a.rec)
			a.tellOutcome()
			return fmt.Errorf("detach %s: %w", req.name, terr)
		}
		a.tellOutcome()
		if err := req.dir.Remove(req.name); err != nil {
			return err
		}
		if a.rec.LogFile != "" {
			os.Remove(a.rec.LogFile) // a clean run leaves nothing behind
		}
		if a.rec.Dead() {
			a.say("detached %s: %s", req.name, detachedDead(a.rec))
			return nil
		}
		a.say("detached %s", req.name)
		return nil
	}
}

// setUp connects, attaches in the requested mode and fills in the record.
func (a *attachment) setUp(ctx context.Context) error {
	cc := a.cc
	var err error
	if a.log, err = newLogger(cc); err != nil {
		return err
	}
	opts := append(hostOptions(cc, a.log), initiator.WithQueueDepth(cc.Int("queue-depth")), initiator.WithControllerLossTimeout(cc.Duration("ctrl-loss-timeout")),
		initiator.WithKeepAlive(cc.Duration("keep-alive")), initiator.WithOneSidedReads(!cc.Bool("two-sided")))
	if n := cc.Int("io-queues"); n > 0 {
		opts = append(opts, initiator.WithIOQueues(n))
	}
	var reg *prometheus.Registry
	if addr := cc.String("metrics-addr"); addr != "" {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		opts = append(opts, initiator.WithMetrics(reg))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("--metrics-addr: %w", err)
		}
		a.metrics = &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
		go a.metrics.Serve(ln)
		a.rec.MetricsAddr = ln.Addr().String()
	}

	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	ch, err := chooseTransport(cctx, cc, a.rec.Target, a.rec.NQN, opts)
	if err != nil {
		cancel()
		return err
	}
	if ch.reason != "" {
		a.say("%s", ch.reason)
	}
	c, err := initiator.ConnectOver(cctx, ch.tr, ch.addr, a.rec.NQN, opts...)
	cancel()
	if err != nil {
		ch.release()
		return err
	}
	a.ctrl, a.release = c, ch.release
	a.ns, err = c.Namespace(ctx, a.rec.NSID)
	if err != nil {
		return err
	}
	a.rec.Size, a.rec.HostNQN = a.ns.Size(), c.HostNQN()

	var backend blockio.Backend = a.ns
	if reg != nil {
		m, err := blockio.NewMetrics(reg)
		if err != nil {
			return err
		}
		backend = blockio.Instrument(backend, m, string(a.req.mode))
	}
	switch a.req.mode {
	case attach.ModeNBD:
		return a.serveNBD(ctx, backend, reg)
	case attach.ModeFUSE:
		return a.attachFUSE(ctx, backend)
	}
	return fmt.Errorf("mode %q", a.req.mode)
}

func (a *attachment) serveNBD(ctx context.Context, backend blockio.Backend, reg *prometheus.Registry) error {
	opts := []nbd.Option{nbd.WithExportName(a.req.name), nbd.WithDescription(fmt.Sprintf("nprdma %s namespace %d", a.rec.NQN, a.rec.NSID)),
		// One Flush covers every connection's writes: they all go to the
		// one namespace of the one controller.
		nbd.WithMultiConn(true), nbd.WithLogger(a.log)}
	if reg != nil {
		opts = append(opts, nbd.WithRegisterer(reg))
	}
	srv, err := nbd.NewServer(backend, opts...)
	if err != nil {
		return err
	}
	socket := a.cc.String("socket")
	if socket == "" {
		socket = a.req.dir.SocketPath(a.req.name)
	}
	ln, err := nbd.ListenUnix(socket)
	if err != nil {
		return err
	}
	var tcp net.Listener
	if addr := a.cc.String("tcp"); addr != "" {
		if tcp, err = nbd.ListenTCP(addr); err != nil {
			ln.Close()
			return fmt.Errorf("--tcp: %w", err)
		}
	}
	a.srv = srv
	a.rec.Socket, a.rec.URI = ln.Addr().String(), nbd.URI(ln.Addr(), a.req.name)
	for _, l := range []net.Listener{ln, tcp} {
		if l == nil {
			continue
		}
		a.serving++
		go func(l net.Listener) { a.serveErr <- srv.Serve(context.Background(), l) }(l)
	}
	if tcp != nil {
		a.rec.TCPAddr, a.rec.TCPURI = tcp.Addr().String(), nbd.URI(tcp.Addr(), a.req.name)
	}
	return nil
}

func (a *attachment) attachFUSE(ctx context.Context, backend blockio.Backend) error {
	mnt := a.req.dir.MountDir(a.req.name)
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return err
	}
	fa, err := fuseblk.Attach(ctx, backend, fuseblk.WithMountDir(mnt), fuseblk.WithLogger(a.log))
	if err != nil {
		os.Remove(mnt)
		return err
	}
	a.fuse = fa
	a.rec.LoopDevice, a.rec.FUSEMount, a.rec.FUSEFile = fa.LoopDevice(), fa.MountPoint(), fa.File()
	return nil
}

// tearDown stops serving, flushes and disconnects. Without force a fuse
// attachment refuses while its loop device is mounted or busy: refused is
// then true and nothing has changed.
func (a *attachment) tearDown(force bool) (refused bool, err error) {
	var errs []error
	if a.fuse != nil {
		if err := a.fuse.Detach(force); err != nil {
			// fuseblk leaves a refused attachment intact; once its FUSE
			// mount is gone, the error is final instead.
			if mounted, _ := attach.IsMountPoint(a.fuse.MountPoint()); mounted && !force {
				return true, err
			}
			if err := a.finalFlushError(err); err != nil {
				errs = append(errs, err)
			}
		}
		a.fuse = nil
		if err := os.Remove(a.req.dir.MountDir(a.req.name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if a.srv != nil {
		a.srv.Close() // graceful: requests in flight complete; the socket file goes
		for ; a.serving > 0; a.serving-- {
			if err := <-a.serveErr; err != nil && !errors.Is(err, nbd.ErrServerClosed) {
				errs = append(errs, err)
			}
		}
		a.srv = nil
		if err := a.ns.Flush(); err != nil {
			if err := a.finalFlushError(err); err != nil {
				errs = append(errs, fmt.Errorf("final flush: %w", err))
			}
		}
	}
	if err := a.restartLossError(); err != nil {
		errs = append(errs, err)
	}
	if a.metrics != nil {
		a.metrics.Close()
		a.metrics = nil
	}
	if a.ctrl != nil {
		a.noteDeath() // the teardown's flush may have found it
		a.stats = a.ctrl.Stats()
		if err := a.ctrl.Close(); err != nil && !errors.Is(err, initiator.ErrClosed) {
			errs = append(errs, err)
		}
		a.release()
		a.ctrl = nil
	}
	return false, errors.Join(errs...)
}

// finalFlushError judges a failed final flush. A controller lost for good,
// or a namespace the target no longer serves, cannot flush, but that loses
// nothing unless the namespace acknowledged writes (or trims) that no
// successful flush covered: only those may have stayed in the target's
// volatile cache. nil means nothing was lost.
func (a *attachment) finalFlushError(err error) error {
	if a.ns == nil || (!errors.Is(err, initiator.ErrControllerLost) && !errors.Is(err, initiator.ErrNamespaceChanged)) {
		return err
	}
	u := a.ns.Unflushed()
	if u.Commands == 0 {
		a.say("%s: the final flush failed, but nothing acknowledged was left unflushed: %v", a.req.name, err)
		return nil
	}
	return fmt.Errorf("%s (%s) that the initiator acknowledged since its last successful flush could not be flushed and may be lost: %w",
		changes(u.Commands), humanSize(u.Bytes), err)
}

// restartLossError reports the changes that were unflushed when the target
// restarted without a clean shutdown (initiator.Namespace.PossiblyLost): a
// final flush on the new target process cannot vouch for them.
func (a *attachment) restartLossError() error {
	if a.ns == nil {
		return nil
	}
	u := a.ns.PossiblyLost()
	if u.Commands == 0 {
		return nil
	}
	return fmt.Errorf("%s (%s) that the initiator acknowledged had not been flushed when the target restarted without a clean shutdown, and may be lost",
		changes(u.Commands), humanSize(u.Bytes))
}

// notePossiblyLost records what a target restart without a clean shutdown
// may have lost, for list, and says it in the log.
func (a *attachment) notePossiblyLost() {
	u := a.ns.PossiblyLost()
	if u.Commands == a.rec.PossiblyLost {
		return
	}
	a.rec.PossiblyLost, a.rec.PossiblyLostBytes, a.rec.PossiblyLostSince = u.Commands, u.Bytes, time.Now().UTC().Truncate(time.Second)
	if err := a.req.dir.Save(a.rec); err != nil {
		a.say("%v", err)
	}
	a.say("%s: %s (%s) that it had acknowledged were not flushed when the target restarted without a clean shutdown, and may be lost; it serves on",
		a.req.name, changes(u.Commands), humanSize(u.Bytes))
}

// changes names n acknowledged writes, trims and write-zeroes.
func changes(n int64) string {
	if n == 1 {
		return "1 write or trim"
	}
	return fmt.Sprintf("%d writes or trims", n)
}

// noteDeath records that the attachment's I/O fails for good, if it does
// and the record does not say so yet, so that list and detach can say since
// when and why: the namespace changed on the target, or the controller is
// lost, whichever came first. It reports whether it recorded it.
func (a *attachment) noteDeath() bool {
	if a.rec.Dead() {
		return false
	}
	var state string
	var since time.Time
	var why error
	if a.ns != nil {
		if t, err := a.ns.Change(); err != nil {
			state, since, why = attach.StateNamespaceChanged, t, err
		}
	}
	if a.ctrl != nil {
		if t, err := a.ctrl.Loss(); err != nil && (why == nil || t.Before(since)) {
			state, since, why = attach.StateLost, t, err
		}
	}
	if why == nil {
		return false
	}
	a.rec.State, a.rec.LostSince, a.rec.LostReason = state, since.UTC().Truncate(time.Second), why.Error()
	if err := a.req.dir.Save(a.rec); err != nil {
		a.say("%v", err)
	}
	return true
}

// tellOutcome hands the final record to the detach commands waiting for
// this process to exit: the record itself is gone by then, or may have
// changed (a loss found by the teardown) after their last look.
func (a *attachment) tellOutcome() {
	if err := a.req.dir.TellOutcome(a.rec); err != nil {
		a.say("telling detach how the teardown ended: %v", err)
	}
}

// announce prints what to use: one sentence, or the record as JSON; and, in
// a daemon, hands the record to the parent waiting for it.
func (a *attachment) announce() error {
	line, _ := json.Marshal(a.rec)
	if a.cc.Bool("json") {
		fmt.Fprintf(a.cc.App.Writer, "%s\n", line)
	} else {
		fmt.Fprintln(a.cc.App.Writer, sentence(a.rec))
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
	what := fmt.Sprintf("namespace %d of %s at %s (%s)", r.NSID, r.NQN, r.Target, humanSize(r.Size))
	switch r.Mode {
	case attach.ModeFUSE:
		return fmt.Sprintf("attached %s as %s: %s", r.Name, r.LoopDevice, what)
	default:
		s := fmt.Sprintf("attached %s as %s: %s", r.Name, r.URI, what)
		if r.TCPURI != "" {
			s += "; also " + r.TCPURI
		}
		return s
	}
}

func (a *attachment) reportStats() {
	s := a.stats
	a.say("%s: %d reads (%.1f%% one-sided), %d suspected faults (%d minor, %d major resolved by the target), %d writes, %d flushes, %d trims",
		a.req.name, s.Reads, 100*s.OneSidedShare(), s.SuspectedPages, s.MinorResolved, s.MajorResolved, s.Writes, s.Flushes, s.Trims)
}
