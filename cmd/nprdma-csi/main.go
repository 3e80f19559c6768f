// Command nprdma-csi is the Kubernetes CSI driver of nprdma: the controller
// service places volumes on nprdma targets through their management APIs,
// the node service attaches them with nprdma-initiator and mounts them. See
// docs/kubernetes.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/nprdma/nprdma/csi"
	"github.com/nprdma/nprdma/internal/command"
)

func main() {
	command.Main(newApp(), os.Args)
}

func newApp() *cli.App {
	return &cli.App{
		Name:  "nprdma-csi",
		Usage: "the CSI driver of nprdma: volumes as namespaces of nprdma targets, attached as loop devices on the nodes",
		Description: "The controller service (--mode controller) creates each volume as namespace 1 of a subsystem of its own\n" +
			"on the target with the most free capacity among --target/--config, lets a node in by adding its host NQN\n" +
			"(its node ID) to the subsystem (required to authenticate where the StorageClass names DH-HMAC-CHAP key\n" +
			"files), and grows volumes. The node service (--mode node) attaches a volume with nprdma-initiator (fuse\n" +
			"mode: a loop device; root), authenticating with the node-stage secrets dhchapSecret and dhchapCtrlSecret\n" +
			"where the target requires DH-HMAC-CHAP, makes a file system where there is none, mounts it at the staging\n" +
			"path and bind-mounts it where pods use it. See docs/kubernetes.md.",
		DisableSliceFlagSeparator: true,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "endpoint", Value: "unix:///csi/csi.sock", Usage: "the CSI socket the sidecars and the kubelet talk to"},
			&cli.StringFlag{Name: "mode", Value: "all", Usage: "controller, node, or all (both: for tests)"},
			&cli.StringSliceFlag{Name: "target", Usage: "a target volumes may go to: name=N,manage=unix:PATH|HOST:PORT,address=HOST:PORT[,token-file=F] (repeatable; controller)"},
			&cli.StringFlag{Name: "config", Usage: "JSON file listing the targets: {\"targets\":[{\"name\":..,\"manage\":..,\"token_file\":..,\"address\":..}]} (controller)"},
			&cli.StringFlag{Name: "initiator", Usage: "the nprdma-initiator binary (node; default: beside this one, else on PATH)"},
			&cli.StringFlag{Name: "run-dir", Value: "/run/nprdma", Usage: "nprdma-initiator's run directory: attachment records, FUSE mount points, logs (node)"},
			&cli.StringFlag{Name: "host-nqn", Usage: "this node's host NQN, its node ID (node; default: what nprdma-initiator hostnqn says, from --hostid-file)"},
			&cli.StringFlag{Name: "hostid-file", Usage: "nprdma-initiator's --hostid-file: keep it on the node's disk (a hostPath), so the node keeps its NQN (node)"},
			&cli.StringFlag{Name: "provider", Value: "tcp", Usage: "nprdma provider of the attachments (node), nprdma-initiator's --provider: tcp, auto (shm where the target is on this node and its socket is visible here) or shm"},
			&cli.StringFlag{Name: "name", Value: csi.DefaultName, Usage: "the driver's name (the StorageClass's provisioner)"},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn, error"},
		},
		HideHelpCommand: true,
		Action:          serve,
	}
}

func serve(cc *cli.Context) error {
	log, err := command.Logger(cc)
	if err != nil {
		return err
	}
	opts := []csi.Option{csi.WithName(cc.String("name")), csi.WithLogger(log)}
	mode := cc.String("mode")
	if mode != "controller" && mode != "node" && mode != "all" {
		return fmt.Errorf("--mode %q: want controller, node or all", mode)
	}
	if mode != "node" {
		var targets []csi.Target
		if path := cc.String("config"); path != "" {
			c, err := csi.LoadConfig(path)
			if err != nil {
				return err
			}
			targets = c.Targets
		}
		for _, v := range cc.StringSlice("target") {
			t, err := csi.ParseTarget(v)
			if err != nil {
				return err
			}
			targets = append(targets, t)
		}
		opts = append(opts, csi.WithController(targets))
	}
	if mode != "controller" {
		initiator, err := initiatorBinary(cc.String("initiator"))
		if err != nil {
			return err
		}
		args := []string{"--provider", cc.String("provider")}
		if f := cc.String("hostid-file"); f != "" {
			args = append(args, "--hostid-file", f)
		}
		nqn := cc.String("host-nqn")
		if nqn == "" {
			out, err := exec.Command(initiator, append(args, "hostnqn")...).Output()
			if err != nil {
				return fmt.Errorf("%s hostnqn: %w", initiator, err)
			}
			nqn = strings.TrimSpace(string(out))
		}
		opts = append(opts, csi.WithNode(nqn, initiator, cc.String("run-dir"), args...))
	}
	d, err := csi.New(opts...)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return d.Serve(ctx, cc.String("endpoint"))
}

// initiatorBinary finds nprdma-initiator: the flag, beside this program,
// or on PATH.
func initiatorBinary(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "nprdma-initiator")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("nprdma-initiator")
	if err != nil {
		return "", fmt.Errorf("no nprdma-initiator beside nprdma-csi nor on PATH: give --initiator")
	}
	return p, nil
}
