// Command nprdma-lab boots the project's guest lab by hand: a shell in a
// guest (make lab), a script run in a guest, fetching the pinned kernels
// (make deps), and whether the lab can run here. See docs/lab.md.
package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/nprdma/nprdma/internal/command"
	"github.com/nprdma/nprdma/lab"
	"github.com/urfave/cli/v2"
)

func main() {
	command.Main(newApp(), os.Args)
}

const about = `The guest lab boots a Debian kernel under QEMU (TCG; a few seconds) with this machine's root
file system shared read-only over 9p under a writable overlay: every tool and binary of this
machine runs in the guest at the same path, and what the guest writes stays in the guest, except
in $LAB_OUT, a directory shared with this machine. eth0 is 10.0.2.15/24; the guest reaches
nothing beyond itself, and this machine reaches it only through --forward ports on 127.0.0.1.

In a script or the shell: step NAME (marks a step; the one running when a command fails is the
failed step), nvmet_export NQN FILE [tcp|rdma [ADDR [PORT]]] (the kernel's NVMe target serves FILE),
nvmet_clear, nvme_ns_dev NQN [NSID] (the kernel host's /dev node of a namespace), rxe_up [NETDEV]
(Soft-RoCE rxe0). Scripts run as root under bash 'set -eEo pipefail', in $LAB_OUT.

Environment: NPRDMA_LAB_CACHE (where kernels are cached; default /tmp/nprdma-lab),
NPRDMA_LAB=off (the lab reports itself unavailable; guest tests skip),
NPRDMA_LAB_APPEND (extra kernel command-line words, e.g. loglevel=7 for a noisy boot).`

func newApp() *cli.App {
	return &cli.App{
		Name:            "nprdma-lab",
		Usage:           "run scripts and shells in a QEMU guest with the pinned Debian kernels (the guest lab)",
		Description:     about,
		Commands:        []*cli.Command{shellCommand(), runCommand(), fetchCommand(), statusCommand()},
		HideHelpCommand: true,
		CommandNotFound: command.UnknownCommand,
	}
}

// specFlags are the guest's settings, shared by shell and run.
func specFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "kernel", Aliases: []string{"k"}, Value: lab.KernelNames()[0],
			Usage: "pinned kernel: " + strings.Join(lab.KernelNames(), " or ") + " (7.3 adds Soft-RoCE on-demand paging)"},
		&cli.StringSliceFlag{Name: "modules", Aliases: []string{"m"}, Usage: "modules to load first, comma-separated (e.g. nvme-tcp,nvmet-tcp)"},
		&cli.StringSliceFlag{Name: "env", Aliases: []string{"e"}, Usage: "KEY=VALUE exported in the guest (repeatable)"},
		&cli.StringSliceFlag{Name: "forward", Aliases: []string{"f"}, Usage: "HOSTPORT:GUESTPORT: 127.0.0.1:HOSTPORT here reaches the guest's GUESTPORT (TCP; repeatable)"},
		&cli.IntFlag{Name: "mem", Value: lab.DefaultMemMiB, Usage: "guest RAM in MiB"},
		&cli.IntFlag{Name: "cpus", Value: lab.DefaultCPUs, Usage: "guest vCPUs"},
	}
}

func specFromFlags(cc *cli.Context) (lab.Spec, error) {
	s := lab.Spec{
		Kernel:  cc.String("kernel"),
		Modules: cc.StringSlice("modules"),
		MemMiB:  cc.Int("mem"),
		CPUs:    cc.Int("cpus"),
		Env:     map[string]string{},
	}
	for _, kv := range cc.StringSlice("env") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return s, fmt.Errorf("--env %q: want KEY=VALUE", kv)
		}
		s.Env[k] = v
	}
	for _, f := range cc.StringSlice("forward") {
		h, g, ok := strings.Cut(f, ":")
		hp, err1 := strconv.Atoi(h)
		gp, err2 := strconv.Atoi(g)
		if !ok || err1 != nil || err2 != nil {
			return s, fmt.Errorf("--forward %q: want HOSTPORT:GUESTPORT", f)
		}
		s.Forward = append(s.Forward, lab.Forward{HostPort: hp, GuestPort: gp})
	}
	return s, nil
}
