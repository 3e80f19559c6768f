package nprdmabench

import (
	"context"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nprdma/nprdmatest"
	"github.com/nprdma/nprdma/nprdma/tcp"
)

// TestQuick runs every benchmark function at tiny sizes so they keep
// working; it checks that they measure something, not how fast.
func TestQuick(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	checkLat := func(r LatencyResult, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if r.Samples == 0 || r.P50 <= 0 || r.P99 < r.P50 || r.Name == "" {
			t.Fatalf("latency result %+v", r)
		}
	}
	checkTput := func(r ThroughputResult, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if r.OpsPerSec <= 0 || r.MiBPerSec <= 0 || r.Name == "" {
			t.Fatalf("throughput result %+v", r)
		}
	}
	checkLat(RawTCPRoundTrip(ctx, 4096, 20))
	checkTput(RawTCPStream(ctx, 4096, 4, 20*time.Millisecond))
	for _, prov := range []nprdma.Provider{tcp.New(), loop.New()} {
		for _, op := range []nprdma.Opcode{nprdma.OpRead, nprdma.OpWrite, nprdma.OpSend} {
			checkLat(OpLatency(ctx, prov, op, 4096, 20, false))
			checkTput(OpThroughput(ctx, prov, op, 4096, 4, 20*time.Millisecond, true))
		}
		pg, err := nprdmatest.NewPager(8, 4096)
		if err != nil {
			t.Fatal(err)
		}
		checkLat(UnpinnedReadLatency(ctx, prov, pg, 4096, 20))
		pg.Close()
		pooled, perIO, err := PoolVsRegister(ctx, prov, 4096, 20*time.Millisecond)
		checkTput(pooled, err)
		checkTput(perIO, nil)
	}
	if _, err := OpLatency(ctx, tcp.New(), nprdma.OpRecv, 4096, 1, false); err == nil {
		t.Fatal("OpLatency accepted a receive opcode")
	}
	if CPUPlacement() == "" {
		t.Fatal("no CPU placement")
	}
}
