package main

import (
	"context"
	"fmt"
	"os/signal"
	"syscall"
	"time"

	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/initiator/nbd"
	"github.com/urfave/cli/v2"
)

func attachCommand() *cli.Command {
	return &cli.Command{
		Name:  "attach",
		Usage: "attach a remote namespace locally (mode nbd: an NBD server on a unix socket) until interrupted",
		Description: "Connects to the subsystem, and serves the namespace over NBD on --socket until SIGINT or\n" +
			"SIGTERM (then it flushes and disconnects). Use it with fio's nbd engine, nbdinfo, nbdcopy or\n" +
			"nbdfuse: fio --ioengine=nbd --uri=nbd+unix:///?socket=SOCKET ...",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "target", Aliases: []string{"t"}, Required: true, Usage: "target address (tcp: host:port)"},
			&cli.StringFlag{Name: "nqn", Aliases: []string{"n"}, Required: true, Usage: "subsystem NQN (see discover)"},
			&cli.UintFlag{Name: "nsid", Value: 1, Usage: "namespace ID"},
			&cli.StringFlag{Name: "mode", Value: "nbd", Usage: "attach backend: nbd (the only one in this command so far)"},
			&cli.StringFlag{Name: "socket", Value: "/tmp/nprdma.sock", Usage: "unix socket the NBD server listens on"},
			&cli.IntFlag{Name: "io-queues", Usage: "I/O queues (0: one per CPU)"},
			&cli.IntFlag{Name: "queue-depth", Value: initiator.DefaultQueueDepth, Usage: "entries per I/O queue"},
			&cli.DurationFlag{Name: "ctrl-loss-timeout", Value: initiator.DefaultLossTimeout, Usage: "how long I/O waits for a reconnect before failing"},
			&cli.DurationFlag{Name: "keep-alive", Value: initiator.DefaultKeepAlive, Usage: "keep-alive timeout asked of the target (keep-alives every half of it)"},
			&cli.BoolFlag{Name: "two-sided", Usage: "read with NVMe Read commands only (no one-sided reads; a baseline)"},
		},
		Action: attach,
	}
}

func attach(cc *cli.Context) error {
	if m := cc.String("mode"); m != "nbd" {
		return fmt.Errorf("--mode %q: only nbd is available here", m)
	}
	opts, err := hostOptions(cc)
	if err != nil {
		return err
	}
	opts = append(opts, initiator.WithQueueDepth(cc.Int("queue-depth")), initiator.WithControllerLossTimeout(cc.Duration("ctrl-loss-timeout")),
		initiator.WithKeepAlive(cc.Duration("keep-alive")), initiator.WithOneSidedReads(!cc.Bool("two-sided")))
	if n := cc.Int("io-queues"); n > 0 {
		opts = append(opts, initiator.WithIOQueues(n))
	}
	dev, err := newDevice(cc)
	if err != nil {
		return err
	}
	defer dev.Close()
	ctx, stop := signal.NotifyContext(cc.Context, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	c, err := initiator.Connect(cctx, dev, cc.String("target"), cc.String("nqn"), opts...)
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	ns, err := c.Namespace(ctx, uint32(cc.Uint("nsid")))
	if err != nil {
		return err
	}
	srv, err := nbd.NewServer(ns, nbd.WithMultiConn(true))
	if err != nil {
		return err
	}
	ln, err := nbd.ListenUnix(cc.String("socket"))
	if err != nil {
		return err
	}
	fmt.Fprintf(cc.App.ErrWriter, "nprdma-initiator: namespace %d of %s (%d bytes) attached at nbd+unix:///?socket=%s\n",
		ns.NSID(), c.SubsystemNQN(), ns.Size(), cc.String("socket"))
	err = srv.Serve(ctx, ln)
	if ferr := ns.Flush(); err == nil {
		err = ferr
	}
	return err
}
