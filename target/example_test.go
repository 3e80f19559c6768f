package target_test

import (
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

// A target serving one subsystem with a 16 MiB namespace over a sparse file,
// in-process (the loop provider; nprdma-target uses nprdma/tcp on
// 127.0.0.1:4420). The subsystem admits one host NQN; that host's discovery
// lists it. The initiator package's example reads and writes the namespace.
func Example() {
	dir, err := os.MkdirTemp("", "target-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	const (
		subNQN  = "nqn.2026-11.io.nprdma:example"
		hostNQN = "nqn.2026-11.io.nprdma:example-host"
	)
	fabric := loop.NewFabric()

	tg, err := target.New(
		target.WithProvider(loop.New(loop.WithFabric(fabric))),
		target.WithListen("example-target"),
		target.WithLogger(slog.New(slog.DiscardHandler)),
	)
	if err != nil {
		panic(err)
	}
	defer tg.Close()
	sub, err := tg.AddSubsystem(target.SubsystemConfig{NQN: subNQN, AllowHosts: []string{hostNQN}})
	if err != nil {
		panic(err)
	}
	path := filepath.Join(dir, "ns1.img")
	if err := blockdev.Create(path, 16<<20); err != nil {
		panic(err)
	}
	backing, err := blockdev.Open(path)
	if err != nil {
		panic(err)
	}
	// The namespace owns its backing from here on; a DRAM budget of 4 MiB.
	ns, err := sub.AddNamespace(target.NamespaceConfig{NSID: 1, Backing: backing, Budget: 4 << 20})
	if err != nil {
		panic(err)
	}
	if err := tg.Start(); err != nil {
		panic(err)
	}
	fmt.Printf("namespace %d: %d blocks of %d bytes, one-sided reads %v\n", ns.NSID(), ns.Blocks(), target.BlockSize, ns.OneSided())

	// A host on the same fabric asks what it may use.
	host := nprdma.NewDevice(loop.New(loop.WithFabric(fabric)), nprdma.WithPinning(false))
	defer host.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	log, err := initiator.Discover(ctx, host, tg.Addr(),
		initiator.WithHostNQN(hostNQN), initiator.WithHostID(nvme.UUID{1}),
		initiator.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		panic(err)
	}
	for _, e := range log.Entries {
		fmt.Println("discovered:", e.SubNQN)
	}
	// Output:
	// namespace 1: 4096 blocks of 4096 bytes, one-sided reads true
	// discovered: nqn.2026-11.io.nprdma:example
}
