package initiator_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/initiator"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/target"
)

// serveExample starts an in-process target (the loop provider on fabric)
// with namespace 1 of subNQN, 8 MiB over a sparse file in dir, open to any
// host.
func serveExample(fabric *loop.Fabric, dir, subNQN string) (*target.Target, error) {
	path := filepath.Join(dir, "ns1.img")
	if err := blockdev.Create(path, 8<<20); err != nil {
		return nil, err
	}
	backing, err := blockdev.Open(path)
	if err != nil {
		return nil, err
	}
	tg, err := target.New(target.WithProvider(loop.New(loop.WithFabric(fabric))),
		target.WithListen("initiator-example"), target.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		backing.Close()
		return nil, err
	}
	sub, err := tg.AddSubsystem(target.SubsystemConfig{NQN: subNQN, AllowAnyHost: true})
	if err != nil {
		backing.Close()
	} else if _, err = sub.AddNamespace(target.NamespaceConfig{NSID: 1, Backing: backing}); err == nil {
		err = tg.Start()
	}
	if err != nil {
		tg.Close()
		return nil, err
	}
	return tg, nil
}

// A host connects a controller to a target's subsystem, writes a block and
// reads it back. Over the nprdma fabric the read is one-sided: an RDMA READ
// out of the target's region, then an NVMe Read only for pages that were not
// resident there. Without an nprdma device, ConnectOver(ctx,
// initiator.TCP(), ...) reaches any NVMe/TCP target the same way.
func Example() {
	dir, err := os.MkdirTemp("", "initiator-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	const subNQN = "nqn.2026-11.io.nprdma:example"
	fabric := loop.NewFabric()
	tg, err := serveExample(fabric, dir, subNQN)
	if err != nil {
		panic(err)
	}
	defer tg.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dev := nprdma.NewDevice(loop.New(loop.WithFabric(fabric)), nprdma.WithPinning(false))
	defer dev.Close()
	ctrl, err := initiator.Connect(ctx, dev, tg.Addr(), subNQN,
		initiator.WithHostNQN("nqn.2026-11.io.nprdma:example-host"), initiator.WithHostID(nvme.UUID{2}),
		initiator.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		panic(err)
	}
	defer ctrl.Close()
	ns, err := ctrl.Namespace(ctx, 1)
	if err != nil {
		panic(err)
	}
	fmt.Printf("namespace %d: %d MiB, blocks of %d bytes\n", ns.NSID(), ns.Size()>>20, ns.BlockSize())

	block := bytes.Repeat([]byte("nprdma! "), ns.BlockSize()/8)
	if _, err := ns.WriteAt(block, 3*int64(ns.BlockSize())); err != nil {
		panic(err)
	}
	if err := ns.Flush(); err != nil { // durable on the target's backing file
		panic(err)
	}
	got := make([]byte, 2*ns.BlockSize())
	if _, err := ns.ReadAt(got, 2*int64(ns.BlockSize())); err != nil {
		panic(err)
	}
	fmt.Println("block 2 reads zeros:", bytes.Count(got[:ns.BlockSize()], []byte{0}) == ns.BlockSize())
	fmt.Println("block 3 reads back:", bytes.Equal(got[ns.BlockSize():], block))
	// Output:
	// namespace 1: 8 MiB, blocks of 4096 bytes
	// block 2 reads zeros: true
	// block 3 reads back: true
}
