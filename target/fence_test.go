package target_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/internal/promtest"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nprdma/tcp"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/fabric"
	"github.com/nprdma/nprdma/target"
	"github.com/prometheus/client_golang/prometheus"
)

// TestFencingUnderChurn: a host's controllers write, write zeroes and
// deallocate (overlapping DSM ranges) the same few blocks of a two-sided
// namespace whose device delays every change, at queue depths beyond the
// 16 idle workers a queue keeps, while their queues fail under them: an I/O
// queue closed by the host, a controller reset (CC.EN=0), the admin queue
// lost. Another controller of the host keeps writing those blocks all along,
// so its writes are held behind the failed queues' changes and some time
// out. Every command ends with success or an expected status, nothing hangs,
// and once every controller is gone the subsystem keeps no fencing state,
// no command is held, and no worker outlives the target.
func TestFencingUnderChurn(t *testing.T) {
	for _, pk := range []struct {
		name   string
		new    func() (nprdma.Provider, nprdma.Provider)
		listen string
	}{
		{"loop", func() (nprdma.Provider, nprdma.Provider) {
			f := loop.NewFabric()
			return loop.New(loop.WithFabric(f)), loop.New(loop.WithFabric(f))
		}, "fence-test"},
		{"tcp", func() (nprdma.Provider, nprdma.Provider) { return tcp.New(), tcp.New() }, "127.0.0.1:0"},
	} {
		t.Run(pk.name, func(t *testing.T) {
			tp, hp := pk.new()
			testFencingUnderChurn(t, tp, hp, pk.listen)
		})
	}
}

func testFencingUnderChurn(t *testing.T, tp, hp nprdma.Provider, listen string) {
	reg := prometheus.NewRegistry()
	tg, err := target.New(target.WithProvider(tp), target.WithListen(listen),
		target.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), target.WithMetrics(reg),
		target.WithMaxIOQueues(4), target.WithQueueDepth(32), target.WithFenceTimeout(50*time.Millisecond),
		// The pinned baseline with too little memory for the namespace:
		// two-sided only, every change goes to the device.
		target.WithPinnedBudget(64<<10))
	if err != nil {
		if strings.Contains(err.Error(), "mlock") {
			t.Skipf("pinning not permitted here: %v", err)
		}
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			tg.Close()
		}
	}()
	sub, err := tg.AddSubsystem(target.SubsystemConfig{NQN: subNQN, AllowHosts: []string{hostNQN}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ns.img")
	if err := blockdev.Create(path, 8<<20); err != nil {
		t.Fatal(err)
	}
	dev, err := blockdev.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	faulty := blockdev.NewFaulty(dev)
	var rngMu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	faulty.Intercept(blockdev.OpWrite|blockdev.OpWriteFUA|blockdev.OpDiscard, func(blockdev.Op, int64, int64) error {
		rngMu.Lock()
		d := time.Duration(rng.IntN(3000)) * time.Microsecond
		if rng.IntN(200) == 0 {
			d = 80 * time.Millisecond // beyond the fence timeout
		}
		rngMu.Unlock()
		time.Sleep(d)
		return nil
	})
	if _, err := sub.AddNamespace(target.NamespaceConfig{NSID: 3, Backing: faulty}); err != nil {
		t.Fatal(err)
	}
	if err := tg.Start(); err != nil {
		t.Fatal(err)
	}
	cdev := nprdma.NewDevice(hp, nprdma.WithPinning(false))
	defer cdev.Close()
	r := &adminRig{tg: tg, pd: cdev.AllocPD(), reg: reg}

	var unexpected sync.Map
	ok := func(err error) bool {
		return err == nil || errors.Is(err, fabric.ErrQueueFailed) || errors.Is(err, nvme.StatusNamespaceNotReady) ||
			errors.Is(err, nvme.StatusAbortedSQDeleted)
	}
	// writer changes blocks [0, 12) of namespace 3 on q until it fails.
	writer := func(q *fabric.HostQueue, seed uint64, stop <-chan struct{}) {
		rng := rand.New(rand.NewPCG(seed, 3))
		data := make([]byte, 4*target.BlockSize)
		for {
			select {
			case <-stop:
				return
			default:
			}
			lo, n := uint64(rng.IntN(9)), uint32(1+rng.IntN(4))
			var cmd nvme.Command
			var p []byte
			var err error
			switch rng.IntN(4) {
			case 0, 1:
				cmd, err = nvme.WriteCommand(3, lo, n, 0, nvme.NullSGL())
				p = data[:int(n)*target.BlockSize]
			case 2:
				cmd, err = nvme.WriteZeroesCommand(3, lo, n, 0)
			case 3:
				p, _ = nvme.MarshalDSMRanges([]nvme.DSMRange{{SLBA: lo, Blocks: n}, {SLBA: lo + 1, Blocks: 2}, {SLBA: 11, Blocks: 1}})
				cmd, err = nvme.DeallocateCommand(3, 3, nvme.NullSGL())
			}
			if err != nil {
				unexpected.Store(err.Error(), true)
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			_, err = q.Submit(ctx, cmd, p)
			cancel()
			if !ok(err) {
				unexpected.Store(err.Error(), true)
			}
			if errors.Is(err, fabric.ErrQueueFailed) {
				return
			}
		}
	}
	ioController := func(nio int) (*fabric.HostQueue, []*fabric.HostQueue) {
		admin, cntlid := r.adminController(t)
		nq, _ := nvme.NumberOfQueues{Submission: nio, Completion: nio}.Encode()
		if _, err := admin.Submit(context.Background(), nvme.SetFeaturesCommand(nvme.FeatureNumberOfQueues, nq, false), nil); err != nil {
			t.Fatal(err)
		}
		var ios []*fabric.HostQueue
		for qid := 1; qid <= nio; qid++ {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			q, err := fabric.Dial(ctx, r.pd, tg.Addr(), fabric.QueueConfig{QID: uint16(qid), Entries: 32, InCapsuleData: 8192})
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := connectCmd(t, q, subNQN, cntlid); err != nil {
				t.Fatal(err)
			}
			ios = append(ios, q)
		}
		return admin, ios
	}

	// The controller that stays, writing the same blocks throughout.
	stayAdmin, stay := ioController(1)
	stop := make(chan struct{})
	var stayWG sync.WaitGroup
	for i := range 4 {
		stayWG.Add(1)
		go func() { defer stayWG.Done(); writer(stay[0], uint64(1000+i), stop) }()
	}

	prng := rand.New(rand.NewPCG(3, 4))
	deadline := time.Now().Add(2 * time.Second)
	round := 0
	for ; time.Now().Before(deadline); round++ {
		admin, ios := ioController(2)
		var wg sync.WaitGroup
		for qi, q := range ios {
			for i := range 20 { // deeper than the 16 idle workers kept
				wg.Add(1)
				go func() { defer wg.Done(); writer(q, uint64(round*100+qi*20+i), nil) }()
			}
		}
		time.Sleep(time.Duration(prng.IntN(15)) * time.Millisecond)
		switch round % 3 {
		case 0: // the host loses one I/O queue, then the rest
			ios[0].Close()
			time.Sleep(time.Duration(prng.IntN(5)) * time.Millisecond)
			ios[1].Close()
			admin.Close()
		case 1: // a controller reset closes the I/O queues
			cc := nvme.CC{IOSQES: 6, IOCQES: 4}
			if _, err := admin.Submit(context.Background(), mc(t)(nvme.PropertySetCommand(nvme.PropCC, 4, uint64(cc.Encode()))), nil); err != nil {
				t.Fatal(err)
			}
			admin.Close()
		case 2: // the admin queue goes: the controller is torn down
			admin.Close()
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: the writers of a failed controller still wait 20 s later", round)
		}
		for _, q := range ios {
			q.Close()
		}
	}
	close(stop)
	stayWG.Wait()
	stay[0].Close()
	stayAdmin.Close()
	unexpected.Range(func(k, _ any) bool {
		t.Errorf("unexpected: %v", k)
		return true
	})
	t.Logf("%d rounds; held writes timed out: %v; fenced commands dropped: %v", round,
		promtest.Sum(t, reg, "nprdma_target_held_timeouts_total"), promtest.Sum(t, reg, "nprdma_target_fenced_commands_dropped_total"))

	deadline = time.Now().Add(10 * time.Second)
	for tg.Controllers() != 0 || target.FenceStates(sub) != 0 || promtest.Sum(t, reg, "nprdma_target_commands_held") != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("10 s after every host left: %d controllers, %d hosts with fencing state, %v commands held",
				tg.Controllers(), target.FenceStates(sub), promtest.Sum(t, reg, "nprdma_target_commands_held"))
		}
		time.Sleep(5 * time.Millisecond)
	}
	closed = true
	tg.Close()
	waitWorkers(t, func(n int) bool { return n == 0 })
}
