package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/internal/banner"
	"github.com/nprdma/nprdma/internal/command"
	"github.com/nprdma/nprdma/internal/providers"
	"github.com/nprdma/nprdma/internal/sizes"
	"github.com/nprdma/nprdma/nprdma/shm"
	"github.com/nprdma/nprdma/target"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/urfave/cli/v2"
)

// defaultGOMAXPROCS: see docs/target.md ("GOMAXPROCS"). Goroutines blocked
// in pread of the backing device hold their P until sysmon hands it off, so
// with GOMAXPROCS = #CPU a burst of major faults starves the data path;
// more Ps than CPUs cost nothing while they are idle.
const defaultGOMAXPROCS = 32

// minMemory is the smallest --memory accepted: less is a typo (a missing
// unit), not a cache.
const minMemory = 1 << 20

func serve(cc *cli.Context) error {
	// Catch the signals before anything is served: a SIGTERM that arrives
	// during start-up must still end in a clean shutdown.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	for _, name := range []string{"busy-poll", "max-keep-alive", "shutdown-timeout", "fence-timeout", "metadata-probe-interval"} {
		if d := cc.Duration(name); d < 0 {
			return fmt.Errorf("--%s %v: negative", name, d)
		}
	}
	if cc.Duration("fence-timeout") == 0 {
		return errors.New("--fence-timeout 0s: must be positive (a lost queue's writes are waited for at most this long)")
	}
	switch n := cc.Int("gomaxprocs"); {
	case n < 0:
		return fmt.Errorf("--gomaxprocs %d: negative (0 keeps the runtime's default)", n)
	case n > 0:
		runtime.GOMAXPROCS(n)
	}
	log, err := command.Logger(cc)
	if err != nil {
		return err
	}
	fabric, err := providers.Names{providers.TCP, providers.Verbs, providers.Loop}.Open(cc.String("provider"), providers.SettingsFrom(cc))
	if err != nil {
		return err
	}
	fabricOpt := target.WithProvider(fabric.Provider)
	if fabric.Device != nil {
		fabricOpt = target.WithDevice(fabric.Device)
	}
	frames, err := frameMode(cc.String("frames"))
	if err != nil {
		return err
	}
	lims, err := limitsFromFlags(cc.Int)
	if err != nil {
		return err
	}
	memory, err := command.SizeFlag(cc, "memory")
	if err != nil {
		return err
	}
	if memory < minMemory {
		return fmt.Errorf("--memory %s: at least %s (the DRAM all namespaces may use together)", cc.String("memory"), sizes.Format(minMemory))
	}
	subs, err := subsystemsFromFlags(cc)
	if err != nil {
		return err
	}
	if cc.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (commands: gen-dhchap-key; flags start with --)", cc.Args().First())
	}
	if cc.Bool("allow-any-host") && len(cc.StringSlice("allow-host")) > 0 {
		return fmt.Errorf("--allow-host and --allow-any-host exclude each other: with both, any host would get in")
	}
	if err := lims.checkNamespaces(subs); err != nil {
		return err
	}
	dataDir := cc.String("data-dir")
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return fmt.Errorf("--data-dir: %w", err)
	}
	if len(subs) == 0 && !cc.Bool("no-default-namespace") {
		// The embedded default: a sparse file under the data directory.
		size, err := command.SizeFlag(cc, "default-size")
		if err != nil {
			return err
		}
		path := filepath.Join(dataDir, "default.img")
		st, err := os.Stat(path)
		switch {
		case errors.Is(err, os.ErrNotExist):
			if err := blockdev.Create(path, size); err != nil {
				return fmt.Errorf("--default-size: %w", err)
			}
			log.Info("created the default backing file", "path", path, "size", sizes.Format(size))
		case err == nil && st.Size() != size && cc.IsSet("default-size"):
			// Its data is the namespace: never resized behind the user's back.
			log.Warn("the default backing file exists: serving it at its own size, --default-size ignored",
				"path", path, "size", sizes.Format(st.Size()), "default-size", sizes.Format(size))
		}
		hostKeys, err := parseHostFiles(cc.StringSlice("dhchap-secret-file"), cc.StringSlice("dhchap-ctrl-secret-file"))
		if err != nil {
			return err
		}
		subs = []subsystemSpec{{NQN: cc.String("nqn"), AllowHosts: cc.StringSlice("allow-host"),
			AllowAnyHost: cc.Bool("allow-any-host"), DHCHAP: hostKeys, Namespaces: []namespaceSpec{{NSID: 1, Backing: path}}}}
	}
	keys, err := keyringFor(subs, log)
	if err != nil {
		return err
	}
	// Caught from here on: SIGHUP's default would kill the target.
	var served atomic.Pointer[target.Target]
	defer reloadOnSIGHUP(keys, &served, log)()

	openBacking := func(path string) (blockdev.Device, error) {
		openOpts := []blockdev.Option{blockdev.WithLogger(log)}
		if cc.Bool("io-uring") {
			openOpts = append(openOpts, blockdev.WithIOUring())
		}
		return blockdev.Open(path, openOpts...)
	}
	mgmt, err := manageFromFlags(cc, dataDir)
	if err != nil {
		return err
	}
	opts := []target.Option{fabricOpt, target.WithListen(cc.StringSlice("listen")...),
		target.WithFrames(frames), target.WithFrameShare(cc.Float64("frame-share")),
		target.WithListenNVMeTCP(cc.String("listen-nvme-tcp")),
		target.WithListenNVMeTCPDiscovery(cc.String("listen-nvme-tcp-discovery")),
		target.WithDataDir(filepath.Join(dataDir, "meta")), target.WithLogger(log),
		target.WithQueueDepth(cc.Int("queue-depth")), target.WithBackingOpener(openBacking),
		target.WithVolumeDir(mgmt.volumeDir)}
	opts = append(opts, lims.options()...)
	if cc.Bool("pin") {
		opts = append(opts, target.WithPinnedBudget(memory))
	} else {
		opts = append(opts, target.WithMemory(memory))
	}
	if d := cc.Duration("busy-poll"); d > 0 {
		opts = append(opts, target.WithBusyPoll(d))
	}
	if d := cc.Duration("max-keep-alive"); d > 0 {
		opts = append(opts, target.WithKeepAliveTimeout(d))
	}
	opts = append(opts, target.WithFenceTimeout(cc.Duration("fence-timeout")),
		target.WithMetadataProbeInterval(cc.Duration("metadata-probe-interval")))
	if keys != nil {
		opts = append(opts, target.WithKeyring(keys))
	}
	var reg *prometheus.Registry
	if cc.String("metrics-addr") != "" {
		reg = command.NewRegistry()
		opts = append(opts, target.WithMetrics(reg))
	}

	// Open every backing first: the budget split needs their sizes.
	type opened struct {
		sub  int
		spec namespaceSpec
		dev  blockdev.Device
	}
	var devs []opened
	closeAll := func() {
		for _, o := range devs {
			o.dev.Close()
		}
	}
	for i, s := range subs {
		for _, ns := range s.Namespaces {
			dev, err := openBacking(ns.Backing)
			if err != nil {
				closeAll()
				return fmt.Errorf("backing %s: %w", ns.Backing, err)
			}
			if st, err := os.Stat(ns.Backing); err == nil && st.Mode().IsRegular() && st.Size() > dev.Size() {
				log.Warn("backing file size is not a whole number of 4 KiB pages: its tail is not served",
					"path", ns.Backing, "size", st.Size(), "served", dev.Size())
			}
			devs = append(devs, opened{i, ns, dev})
		}
	}
	tg, err := target.New(opts...)
	if err != nil {
		closeAll()
		return err
	}
	served.Store(tg)
	// The namespaces the management API created keep the budgets they were
	// given; the configuration's share what they leave.
	managed, err := tg.ManagedBudgets()
	if err != nil {
		tg.Close()
		closeAll()
		return err
	}
	if managed > memory && !cc.Bool("pin") {
		tg.Close()
		closeAll()
		return fmt.Errorf("--memory %s: the namespaces created through the management API hold DRAM budgets of %s together: raise --memory", sizes.Format(memory), sizes.Format(managed))
	}
	var devSizes, fixed []int64
	for _, o := range devs {
		devSizes = append(devSizes, o.dev.Size())
		fixed = append(fixed, o.spec.budget)
	}
	budgets, err := target.SplitBudget(max(memory-managed, 0), devSizes, fixed)
	if err != nil {
		tg.Close()
		closeAll()
		return fmt.Errorf("--memory: %w", err)
	}
	var summary []string
	handed := 0
	for i, s := range subs {
		sub, err := tg.AddSubsystem(target.SubsystemConfig{NQN: s.NQN, AllowHosts: s.AllowHosts, AllowAnyHost: s.AllowAnyHost})
		if err != nil {
			tg.Close()
			closeAll()
			return err
		}
		for j, o := range devs {
			if o.sub != i {
				continue
			}
			n, err := sub.AddNamespace(target.NamespaceConfig{NSID: o.spec.NSID, Backing: o.dev, Budget: budgets[j]})
			handed++
			if err != nil {
				tg.Close()
				for _, rest := range devs[handed:] {
					rest.dev.Close()
				}
				return err
			}
			dram := "DRAM " + sizes.Format(budgets[j])
			switch {
			case n.Pinned():
				dram = "held in pinned DRAM"
			case !n.OneSided():
				dram = "larger than the pinned DRAM left: two-sided only"
			}
			summary = append(summary, fmt.Sprintf("%s ns %d = %s (%s, %s)", s.NQN, n.NSID(), o.spec.Backing, sizes.Format(n.Size()), dram))
		}
		if !s.AllowAnyHost && len(sub.Hosts()) == 0 {
			log.Warn("no host may connect to this subsystem: add --allow-host NQN or --allow-any-host", "subsystem", s.NQN)
		}
	}
	restored, err := tg.RestoreManaged()
	if err != nil {
		tg.Close()
		return err
	}
	for _, what := range restored.Namespaces {
		summary = append(summary, what+" (created through the management API)")
	}
	if len(restored.Subsystems)+len(restored.Namespaces)+len(restored.Skipped) > 0 {
		log.Info("restored what the management API created", "subsystems", len(restored.Subsystems),
			"namespaces", len(restored.Namespaces), "skipped", restored.Skipped)
	}
	if len(summary) == 0 {
		summary = append(summary, "no namespace yet")
	}
	if err := tg.Start(); err != nil {
		tg.Close()
		return err
	}
	stopManage, err := mgmt.serve(tg, log)
	if err != nil {
		tg.Close()
		return err
	}
	var metrics *command.Endpoint
	if reg != nil {
		metrics, err = command.ServeMetrics(cc.String("metrics-addr"), metricsHandler(reg, tg))
		if err != nil {
			tg.Close()
			return err
		}
		log.Info("metrics", "url", metrics.URL("/metrics"), "health", metrics.URL("/healthz"), "ready", metrics.URL("/readyz"))
	}
	mode := "unpinned (NP-RDMA)"
	if tg.UsesFrames() {
		mode = fmt.Sprintf("frames (%.0f%% of each namespace's budget pinned at start)", 100*cc.Float64("frame-share"))
	}
	if cc.Bool("pin") {
		mode = "PINNED baseline (" + sizes.Format(memory) + " pinned at start)"
	}
	fmt.Fprint(os.Stderr, banner.Lines(strings.Join(summary, "; "), providerSummary(cc.String("provider"), tg.Addrs()), tg.Addr(), mode, tg.PreviousRun().String()))
	if a := tg.NVMeTCPAddr(); a != "" {
		fmt.Fprint(os.Stderr, banner.NVMeTCPLine(a, tg.NVMeTCPDiscoveryAddr()))
	}

	<-ctx.Done()
	// Keep catching SIGTERM and SIGINT until the flush is done: a second one
	// (a double Ctrl-C, or a supervisor such as timeout(1) that signals the
	// process and its group) must not kill the target halfway through its
	// flush. The flush is bounded by --shutdown-timeout; SIGKILL still stops
	// at once.
	again := make(chan os.Signal, 1)
	signal.Notify(again, syscall.SIGTERM, syscall.SIGINT)
	defer func() {
		signal.Stop(again) // no send after it returns, so the close is safe
		close(again)
	}()
	stop()
	timeout := cc.Duration("shutdown-timeout")
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	go func() {
		for sig := range again {
			log.Warn("already shutting down: flushing first (SIGKILL stops at once, keeping only flushed writes)", "signal", sig.String())
		}
	}()
	log.Info("shutting down: draining and flushing", "timeout", timeout)
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// The metrics server answers until the end (/readyz says "shutting
	// down"), then is closed at once: waiting for its clients would take
	// from the bound.
	stopManage()
	err = tg.Shutdown(sctx)
	if metrics != nil {
		metrics.Close()
	}
	if err != nil {
		// Steps still running (a device or the metadata store that does
		// not answer) end with the process. The error says what was and
		// was not persisted.
		return err
	}
	log.Info("shut down cleanly")
	return nil
}

// subsystemsFromFlags reads --config, or --backing with --nqn and the host
// flags; no subsystem at all means the embedded default.
func subsystemsFromFlags(cc *cli.Context) ([]subsystemSpec, error) {
	if path := cc.String("config"); path != "" {
		if len(cc.StringSlice("backing")) > 0 {
			return nil, fmt.Errorf("--config and --backing exclude each other")
		}
		if len(cc.StringSlice("dhchap-secret-file")) > 0 || len(cc.StringSlice("dhchap-ctrl-secret-file")) > 0 {
			return nil, fmt.Errorf("--config and --dhchap-secret-file exclude each other: name the key files in the config's dhchap entries")
		}
		c, err := loadConfig(path)
		if err != nil {
			return nil, err
		}
		return c.Subsystems, nil
	}
	var nss []namespaceSpec
	for _, b := range cc.StringSlice("backing") {
		ns, err := parseBacking(b)
		if err != nil {
			return nil, err
		}
		nss = append(nss, ns)
	}
	if len(nss) == 0 {
		return nil, nil
	}
	hostKeys, err := parseHostFiles(cc.StringSlice("dhchap-secret-file"), cc.StringSlice("dhchap-ctrl-secret-file"))
	if err != nil {
		return nil, err
	}
	return []subsystemSpec{{NQN: cc.String("nqn"), AllowHosts: cc.StringSlice("allow-host"),
		AllowAnyHost: cc.Bool("allow-any-host"), DHCHAP: hostKeys, Namespaces: nss}}, nil
}

// keyringFor reads the key files the subsystems name (nil: none names
// any). A host with a secret that may not connect is only warned about.
func keyringFor(subs []subsystemSpec, log *slog.Logger) (*fileKeyring, error) {
	specs := map[string][]hostSecretSpec{}
	for _, s := range subs {
		for _, h := range s.DHCHAP {
			if !s.AllowAnyHost && !slices.Contains(s.AllowHosts, h.Host) {
				log.Warn("a host has a DH-HMAC-CHAP secret but is not allowed to connect", "host", h.Host, "subsystem", s.NQN)
			}
		}
		if len(s.DHCHAP) > 0 {
			specs[s.NQN] = s.DHCHAP
		}
	}
	if len(specs) == 0 {
		return nil, nil
	}
	k, err := newFileKeyring(specs)
	if err != nil {
		return nil, fmt.Errorf("DH-HMAC-CHAP secrets: %w", err)
	}
	log.Info("DH-HMAC-CHAP: hosts with secrets must authenticate", "hosts", k.Hosts())
	return k, nil
}

// reloadOnSIGHUP reads the key files again on every SIGHUP until the
// returned stop is called: the configuration's (k; nil: there are none) and
// those the management API named, once tg holds the target. A failed
// reload keeps the secrets in force.
func reloadOnSIGHUP(k *fileKeyring, tg *atomic.Pointer[target.Target], log *slog.Logger) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-hup:
				if k != nil {
					if err := k.Reload(); err != nil {
						log.Error("SIGHUP: DH-HMAC-CHAP secrets not reloaded; the previous ones stay in force", "err", err)
					} else {
						log.Info("SIGHUP: DH-HMAC-CHAP secrets reloaded; new connections and re-authentications use them", "hosts", k.Hosts())
					}
				}
				if t := tg.Load(); t != nil {
					if n, err := t.ReloadHostKeys(); err != nil {
						log.Error("SIGHUP: the management API's DH-HMAC-CHAP key files not reloaded; the previous ones stay in force", "err", err)
					} else if n > 0 {
						log.Info("SIGHUP: the management API's DH-HMAC-CHAP key files reloaded", "hosts", n)
					}
				}
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		close(done)
	}
}

// providerSummary names the provider for the banner, with the listeners
// that take other providers (shm, for initiators on this host).
func providerSummary(name string, addrs []string) string {
	var others []string
	for _, a := range addrs[min(1, len(addrs)):] {
		if strings.HasPrefix(a, shm.Scheme) {
			others = append(others, "shm on "+a)
		} else {
			others = append(others, "also on "+a)
		}
	}
	if len(addrs) > 0 && strings.HasPrefix(addrs[0], shm.Scheme) {
		name = "shm"
	}
	if len(others) == 0 {
		return name
	}
	return name + " (" + strings.Join(others, ", ") + ")"
}

// frameMode is the target.FrameMode --frames names.
func frameMode(name string) (target.FrameMode, error) {
	switch name {
	case "auto":
		return target.FramesAuto, nil
	case "always":
		return target.FramesAlways, nil
	case "never":
		return target.FramesNever, nil
	}
	return 0, fmt.Errorf("--frames %q: want auto, always or never", name)
}
