package target_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/tcp"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/fabric"
)

// The two-sided 4 KiB command path through the real target at queue depth
// 1: ns/op and allocs/op (not timing assertions: the figures are read in
// docs/target.md §3). Allocations are counted over every goroutine, the
// host queue's included.

// rigProviders are the providers the command path is measured on.
var rigProviders = []struct {
	name string
	new  func(testing.TB) *adminRig
}{
	{"loop", newAdminRig},
	{"tcp", func(tb testing.TB) *adminRig { return newRig(tb, tcp.New(), tcp.New(), "127.0.0.1:0", nil) }},
}

// ioBlocks is how many blocks the commands cycle over (all resident).
const ioBlocks = 64

// ioOps drives 4 KiB commands on I/O queue 1 of a connected, enabled
// controller, cycling over the first ioBlocks blocks of namespace 3.
type ioOps struct {
	tb  testing.TB
	q   *fabric.HostQueue
	buf *nprdma.Buffer // registered host buffer: keyed reads and writes
	src []byte         // in-capsule write data
	lba uint64
}

func newIOOps(tb testing.TB, r *adminRig) *ioOps {
	tb.Helper()
	admin, cntlid := r.adminController(tb)
	nq, _ := nvme.NumberOfQueues{Submission: 1, Completion: 1}.Encode()
	if _, err := admin.Submit(context.Background(), nvme.SetFeaturesCommand(nvme.FeatureNumberOfQueues, nq, false), nil); err != nil {
		tb.Fatal(err)
	}
	q := r.dial(tb, 1, 8192)
	if _, err := connectCmd(tb, q, subNQN, cntlid); err != nil {
		tb.Fatal(err)
	}
	buf, err := q.Pool().Get(4096)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(buf.Release)
	o := &ioOps{tb: tb, q: q, buf: buf, src: bytes.Repeat([]byte{0x5a}, 4096)}
	// Every block written once (resident from then on) and read back.
	copy(buf.Bytes(), o.src)
	for range ioBlocks {
		o.writeKeyed()
	}
	for range ioBlocks {
		o.read()
		if !bytes.Equal(buf.Bytes(), o.src) {
			tb.Fatalf("block %d read back wrong", o.lba)
		}
	}
	return o
}

func (o *ioOps) next() uint64 {
	lba := o.lba
	o.lba = (o.lba + 1) % ioBlocks
	return lba
}

// read: NVMe Read, the target RDMA-WRITEs the block into buf.
func (o *ioOps) read() {
	cmd, _ := nvme.ReadCommand(3, o.next(), 1, 0, nvme.NullSGL())
	if _, err := o.q.SubmitBuffer(context.Background(), cmd, o.buf, 0, 4096); err != nil {
		o.tb.Fatal(err)
	}
}

// write: NVMe Write with the data in the capsule (the initiator's 4 KiB
// write).
func (o *ioOps) write() {
	cmd, _ := nvme.WriteCommand(3, o.next(), 1, 0, nvme.NullSGL())
	if _, err := o.q.Submit(context.Background(), cmd, o.src); err != nil {
		o.tb.Fatal(err)
	}
}

// writeKeyed: NVMe Write with a keyed SGL, the target RDMA-READs the data
// from buf.
func (o *ioOps) writeKeyed() {
	cmd, _ := nvme.WriteCommand(3, o.next(), 1, 0, nvme.NullSGL())
	if _, err := o.q.SubmitBuffer(context.Background(), cmd, o.buf, 0, 4096); err != nil {
		o.tb.Fatal(err)
	}
}

func BenchmarkIO4K(b *testing.B) {
	for _, p := range rigProviders {
		b.Run(p.name, func(b *testing.B) {
			o := newIOOps(b, p.new(b))
			for _, c := range []struct {
				name string
				op   func()
			}{{"read", o.read}, {"write", o.write}, {"write-keyed", o.writeKeyed}} {
				b.Run(c.name, func(b *testing.B) {
					b.ReportAllocs()
					for b.Loop() {
						c.op()
					}
				})
			}
		})
	}
}
