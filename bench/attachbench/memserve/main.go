// Command memserve serves an in-memory namespace through one attach mode —
// the frontends of initiator/attach, as nprdma-initiator attach uses them —
// until SIGTERM. The attach-modes experiment runs it in the guest lab, so
// that what it compares is the attach paths alone: through the target, the
// initiator's and the target's own work per request is the same in every
// mode and, under TCG, large enough to hide the differences.
//
//	memserve -mode ublk -size 64MiB -ready FILE
//
// It writes what to use (the block device or the NBD URI) to FILE once it
// serves, and tears down (forced) at SIGTERM or SIGINT.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/nprdma/nprdma/initiator/attach"
	"github.com/nprdma/nprdma/initiator/blockio"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "memserve:", err)
		os.Exit(1)
	}
}

func run() error {
	mode := flag.String("mode", "ublk", "attach mode: ublk, nbd-kernel, fuse or nbd")
	size := flag.Int64("size", 64<<20, "size of the in-memory namespace in bytes (a multiple of 4096)")
	ready := flag.String("ready", "", "file to write the device or URI to once serving")
	runDir := flag.String("run-dir", "", "run directory (sockets, FUSE mount point); default: a temporary one")
	flag.Parse()
	f, err := attach.FrontendOf(attach.Mode(*mode))
	if err != nil {
		return err
	}
	root := *runDir
	if root == "" {
		if root, err = os.MkdirTemp("", "memserve-"); err != nil {
			return err
		}
		defer os.RemoveAll(root)
	}
	dir, err := attach.OpenDir(root)
	if err != nil {
		return err
	}
	name := "mem-" + *mode
	exp, err := f.Start(context.Background(), blockio.NewMemory(*size, 4096), attach.Config{Name: name, Dir: dir, Description: "memserve"})
	if err != nil {
		return err
	}
	var rec attach.Record
	exp.Fill(&rec)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	if *ready != "" {
		if err := os.WriteFile(*ready, []byte(rec.Use()+"\n"), 0o644); err != nil {
			exp.Detach(true)
			return err
		}
	}
	select {
	case <-sigs:
	case err := <-exp.Failed():
		exp.Detach(true)
		return err
	}
	return exp.Detach(true)
}
