// Command nprdma-target serves namespaces over the nprdma fabric: each
// namespace lives in a memory region registered for one-sided remote reads
// without pinning, as large as the namespace and several times larger than
// the DRAM the target may use (--memory); cold pages live on the backing
// device. With --listen-nvme-tcp it serves the same namespaces to standard
// NVMe/TCP hosts. See docs/target.md.
package main

import (
	"os"
	"slices"

	"github.com/urfave/cli/v2"

	"github.com/nprdma/nprdma/internal/command"
	"github.com/nprdma/nprdma/internal/providers"
	"github.com/nprdma/nprdma/target"
)

func main() {
	command.Main(newApp(), interspersed(os.Args))
}

// DefaultNQN names the subsystem when --nqn is not given.
const DefaultNQN = "nqn.2024-01.io.nprdma:default"

func newApp() *cli.App {
	return &cli.App{
		// --backing takes PATH,nsid=N,budget=SIZE: a comma must not split it.
		DisableSliceFlagSeparator: true,
		Name:                      "nprdma-target",
		Usage:                     "serve block devices or files as NVMe namespaces read one-sidedly over the nprdma fabric",
		Description: "Each namespace is kept in a memory region registered for remote reads WITHOUT pinning, as large\n" +
			"as the namespace; at most --memory of it is resident in DRAM, the rest lives on the backing device.\n" +
			"Hosts read with one-sided RDMA READs and fall back to NVMe Read commands for pages that are not\n" +
			"resident. Without --backing or --config a sparse file of --default-size is created under --data-dir.\n" +
			"With --listen-nvme-tcp, stock NVMe/TCP hosts (the Linux kernel's nvme-tcp) reach the same namespaces\n" +
			"with two-sided reads through the same DRAM cache.\n" +
			"SIGTERM or SIGINT: stop accepting, drain the commands in flight, flush every namespace, record a clean\n" +
			"shutdown, exit 0; all of it within --shutdown-timeout. A stop that is not clean (a backing device or the\n" +
			"metadata store failing or not answering) exits 1 by then, saying what was and was not persisted\n" +
			"(another SIGTERM or SIGINT during the flush is logged and ignored; SIGKILL stops at once).\n" +
			"SIGHUP: read the DH-HMAC-CHAP key files again (new connections and re-authentications use them).",
		Flags: append([]cli.Flag{
			&cli.StringSliceFlag{Name: "backing", Usage: "a block device or file to serve, as PATH[,nsid=N][,budget=SIZE] (repeatable: one namespace each, in the subsystem --nqn; budget overrides this namespace's share of --memory)"},
			&cli.StringFlag{Name: "config", Usage: "JSON file describing several subsystems and namespaces (see docs/target.md); used instead of --backing/--nqn/--allow-host"},
			&cli.StringFlag{Name: "memory", Value: "1GiB", Usage: "DRAM budget for all namespaces together, at least 1MiB (units KiB, MiB, GiB, TiB); namespaces without their own budget share it in proportion to their sizes"},
			&cli.StringSliceFlag{Name: "listen", Value: cli.NewStringSlice("127.0.0.1:4420"), Usage: "address to accept nprdma fabric connections on (tcp: host:port; loop: a name; verbs: an address of the RDMA NIC's network interface and a port, e.g. 192.168.1.5:4420, where NVMe/RDMA hosts such as Linux's nvme-rdma connect too); unix:PATH also serves initiators on this host over shared memory on the unix socket PATH, which read the namespaces in place without this process's CPU (repeatable: e.g. --listen 127.0.0.1:4420 --listen unix:/run/nprdma/target.sock; `nprdma-initiator attach` finds the socket through discovery)"},
			&cli.StringFlag{Name: "listen-nvme-tcp", Usage: "also serve the same subsystems to standard NVMe/TCP hosts (Linux nvme connect -t tcp) on `ADDR`, host:port, e.g. 127.0.0.1:4421 (4420 by convention when --listen is elsewhere); reads are two-sided, through the same DRAM cache; the port answers the discovery NQN too (empty: off)"},
			&cli.StringFlag{Name: "listen-nvme-tcp-discovery", Usage: "serve an NVMe/TCP discovery controller, and nothing else, on `ADDR`, host:port (8009 by convention, where nvme discover looks); needs --listen-nvme-tcp, which its log points hosts at (empty: off)"},
			&cli.StringFlag{Name: "nqn", Value: DefaultNQN, Usage: "NQN of the subsystem that holds the --backing namespaces"},
			&cli.StringSliceFlag{Name: "allow-host", Usage: "host NQN allowed to connect to the subsystem (repeatable; hosts not listed are refused)"},
			&cli.BoolFlag{Name: "allow-any-host", Usage: "let every host connect (no access control)"},
			&cli.StringSliceFlag{Name: "dhchap-secret-file", Usage: "HOSTNQN=PATH: that host must authenticate (DH-HMAC-CHAP) on every queue with the secret in PATH, a file of mode 0600 (nprdma-target gen-dhchap-key writes one); repeatable; re-read on SIGHUP"},
			&cli.StringSliceFlag{Name: "dhchap-ctrl-secret-file", Usage: "HOSTNQN=PATH: the controller's secret for that host, with which the target proves itself when the host asks (bidirectional authentication); needs --dhchap-secret-file for the host"},
			&cli.StringFlag{Name: "data-dir", Value: "nprdma-data", Usage: "directory for durable metadata (namespace identity, host lists, clean-shutdown marker; never page data) and the default backing file"},
			&cli.StringFlag{Name: "default-size", Value: "4GiB", Usage: "size of the sparse backing file created under --data-dir when no backing is given"},
			&cli.StringFlag{Name: "metrics-addr", Usage: "serve Prometheus metrics on this address (e.g. 127.0.0.1:9420; empty: off)"},
			command.LogLevelFlag("info"),
			&cli.StringFlag{Name: "provider", Value: "tcp", Usage: "nprdma provider: tcp (software RDMA over TCP), verbs (an RDMA NIC through rdma-core: ConnectX, Soft-RoCE; NVMe/RDMA hosts such as Linux's nvme-rdma connect to it) or loop (in-process; for tests only)"},
			&cli.StringFlag{Name: "frames", Value: "auto", Usage: "how hosts read namespaces one-sided: auto (through frames on an RDMA NIC, which cannot read the unpinned region; the region itself on the software providers), always (frames on any provider, to compare) or never (two-sided only on an RDMA NIC); docs/np-rdma.md §11"},
			&cli.Float64Flag{Name: "frame-share", Value: target.DefaultFrameShare, Usage: "where frames are used: the share of each namespace's DRAM budget held as frames (registered pinned at start), the rest staying the budget of its region"},
			&cli.BoolFlag{Name: "pin", Usage: "baseline for benchmarks only, a conventional RDMA target: at start, allocate the whole --memory and register it PINNED (mlock; seconds per GiB) before serving; a namespace that fits in it is held there wholly and read one-sided, a larger one is served two-sided only from its backing device (no region descriptor); exists for comparison, not for use"},
			&cli.IntFlag{Name: "gomaxprocs", Value: defaultGOMAXPROCS, Usage: "Go scheduler threads (GOMAXPROCS): the target blocks in backing-device reads (major faults) from goroutines, and each blocked goroutine holds one until the runtime hands it off; 0 keeps the runtime's default"},
			&cli.BoolFlag{Name: "io-uring", Usage: "read and write the backing devices through an io_uring while more than 8 operations are in flight (pread and pwrite otherwise, and where the kernel has no io_uring): goroutines waiting for the disk then hold no scheduler thread, an alternative to a large --gomaxprocs (docs/blockdev.md, \"Queue depth and io_uring\")"},
			&cli.IntFlag{Name: "queue-depth", Value: target.DefaultQueueDepth, Usage: "largest I/O queue a host may open (entries)"},
			&cli.DurationFlag{Name: "max-keep-alive", Value: 0, Usage: "cap on the keep-alive timeout hosts ask for (0: 5m0s)"},
			&cli.DurationFlag{Name: "busy-poll", Usage: "spin up to this long (e.g. 50us) for the next command on each queue before sleeping: saves a thread wake-up per command where an idle core is awake, costs a CPU while commands flow; on a small VM whose idle vCPUs halt it can cost latency instead (docs/nprdma.md §3) (0: off)"},
			&cli.DurationFlag{Name: "fence-timeout", Value: target.DefaultFenceTimeout, Usage: "after a host's connection is lost, how long its new writes wait for an old write of the lost queue still changing the same blocks before failing with Namespace Not Ready (a status hosts retry)"},
			&cli.DurationFlag{Name: "shutdown-timeout", Value: 0, Usage: "bound on the whole stop after SIGTERM: commands in flight are waited for at most half of it, the rest is for flushing the namespaces and closing the metadata store; whatever has not finished by then is reported and the exit status is 1 (0: 30s)"},
			&cli.DurationFlag{Name: "metadata-probe-interval", Value: target.DefaultMetadataProbeInterval, Usage: "how often the metadata store's directory under --data-dir is probed (a small file rewritten and synced) while nothing is written to it, so that a directory removed, read-only or failing shows on /healthz and in nprdma_target_metadata_healthy (0: only before each metadata write)"},
		}, slices.Concat(providers.Flags(), limitCLIFlags(), manageCLIFlags())...),
		HideHelpCommand: true,
		Action:          serve,
		Commands:        []*cli.Command{ctlCommand(), genDHCHAPKeyCommand()},
	}
}
