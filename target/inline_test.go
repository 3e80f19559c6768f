package target_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/internal/nvmetcptest"
	"github.com/nprdma/nprdma/internal/promtest"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/target"
)

// Commands on the receive loop (target/inline.go).

// dispatched reads how many commands named op ran on a receive loop and
// how many were handed to a worker.
func dispatched(t *testing.T, r *adminRig, op string) (inline, handedOff float64) {
	t.Helper()
	return promtest.Sum(t, r.reg, "nprdma_target_commands_inline_total", "opcode", op),
		promtest.Sum(t, r.reg, "nprdma_target_commands_handed_off_total", "opcode", op)
}

// wantDispatched fails unless the counts of op moved by exactly inline and
// handedOff since before.
func wantDispatched(t *testing.T, r *adminRig, op string, before [2]float64, inline, handedOff float64) {
	t.Helper()
	i, h := dispatched(t, r, op)
	if i-before[0] != inline || h-before[1] != handedOff {
		t.Fatalf("%s: %v inline and %v handed off, want %v and %v", op, i-before[0], h-before[1], inline, handedOff)
	}
}

func counts(t *testing.T, r *adminRig, op string) [2]float64 {
	i, h := dispatched(t, r, op)
	return [2]float64{i, h}
}

// TestResidentCommandsRunOnTheReceiveLoop: over NVMe/TCP, a Read of a
// resident block, a Write of in-capsule data into a resident block and a
// Keep Alive execute on the receive loop, and read back what was written;
// a first Write of a block (its page absent), a Read of a block never
// touched (a fault), a FUA Write, a Write whose data comes by R2T and a
// Flush are handed to a worker.
func TestResidentCommandsRunOnTheReceiveLoop(t *testing.T) {
	r := newTCPRig(t)
	addr := r.tg.NVMeTCPAddr()
	admin, cntlid := bringUp(t, addr, 0, subNQN)
	wantOK(t, exec(t, admin, nvme.SetFeaturesCommand(nvme.FeatureNumberOfQueues, 0, false), nil, nil), "number of queues")
	io := nvmetcptest.Dial(t, addr, 0)
	wantOK(t, io.Connect(t, 1, 31, subNQN, hostNQN, cntlid), "I/O connect")
	reads, writes := counts(t, r, "read"), counts(t, r, "write")

	first := bytes.Repeat([]byte("1st!"), target.BlockSize/4)
	wantOK(t, exec(t, io, mc(t)(nvme.WriteCommand(tcpNSID, 5, 1, 0, nvme.SGLDescriptor{})), first, nil), "first write")
	wantDispatched(t, r, "write", writes, 0, 1) // the page was absent
	got := make([]byte, target.BlockSize)
	wantOK(t, exec(t, io, mc(t)(nvme.ReadCommand(tcpNSID, 5, 1, 0, nvme.SGLDescriptor{})), nil, got), "read")
	if !bytes.Equal(got, first) {
		t.Fatal("read back the wrong data")
	}
	wantDispatched(t, r, "read", reads, 1, 0)
	second := bytes.Repeat([]byte("2nd!"), target.BlockSize/4)
	wantOK(t, exec(t, io, mc(t)(nvme.WriteCommand(tcpNSID, 5, 1, 0, nvme.SGLDescriptor{})), second, nil), "second write")
	wantDispatched(t, r, "write", writes, 1, 1)
	wantOK(t, exec(t, io, mc(t)(nvme.ReadCommand(tcpNSID, 5, 1, 0, nvme.SGLDescriptor{})), nil, got), "read")
	if !bytes.Equal(got, second) {
		t.Fatal("read back the wrong data after a write on the receive loop")
	}
	wantDispatched(t, r, "read", reads, 2, 0)

	wantOK(t, exec(t, io, mc(t)(nvme.ReadCommand(tcpNSID, 1000, 1, 0, nvme.SGLDescriptor{})), nil, got), "read of an untouched block")
	wantDispatched(t, r, "read", reads, 2, 1)
	wantOK(t, exec(t, io, mc(t)(nvme.WriteCommand(tcpNSID, 5, 1, nvme.FUA, nvme.SGLDescriptor{})), first, nil), "FUA write")
	wantDispatched(t, r, "write", writes, 1, 2)
	io.ICD = 0 // by R2T
	wantOK(t, exec(t, io, mc(t)(nvme.WriteCommand(tcpNSID, 5, 1, 0, nvme.SGLDescriptor{})), second, nil), "write by R2T")
	wantDispatched(t, r, "write", writes, 1, 3)
	flushes := counts(t, r, "flush")
	wantOK(t, exec(t, io, nvme.FlushCommand(tcpNSID), nil, nil), "flush")
	wantDispatched(t, r, "flush", flushes, 0, 1)

	kas := counts(t, r, "keep-alive")
	wantOK(t, exec(t, admin, nvme.KeepAliveCommand(), nil, nil), "keep alive")
	wantDispatched(t, r, "keep-alive", kas, 1, 0)
}

// TestResidentCommandsRunOnTheReceiveLoopOverTheFabric: the same over the
// nprdma fabric, on both providers: a Read of resident blocks and a Write of
// in-capsule data into them run on the receive loop, a Write whose data the
// target fetches with an RDMA READ on a worker.
func TestResidentCommandsRunOnTheReceiveLoopOverTheFabric(t *testing.T) {
	for _, p := range rigProviders {
		t.Run(p.name, func(t *testing.T) {
			r := p.new(t)
			o := newIOOps(t, r) // writes every block with a keyed SGL, reads it back
			if i, h := dispatched(t, r, "write"); i != 0 || h != ioBlocks {
				t.Fatalf("keyed writes: %v inline, %v handed off; want 0 and %d", i, h, ioBlocks)
			}
			if i, h := dispatched(t, r, "read"); i != ioBlocks || h != 0 {
				t.Fatalf("resident reads: %v inline, %v handed off; want %d and 0", i, h, ioBlocks)
			}
			writes := counts(t, r, "write")
			for range ioBlocks {
				o.write()
			}
			wantDispatched(t, r, "write", writes, ioBlocks, 0)
			for range ioBlocks {
				o.read()
				if !bytes.Equal(o.buf.Bytes(), o.src) {
					t.Fatalf("block %d read back wrong", o.lba)
				}
			}
		})
	}
}

// TestFaultHoldsUpNoResidentRead: a Read whose page must be read from the
// backing device goes to a worker; while the device holds it, a Read of a
// resident block sent after it on the same queue completes first, on the
// receive loop; then the first completes with the device's data.
func TestFaultHoldsUpNoResidentRead(t *testing.T) {
	const cold = 1000 // a block with data on the device only
	onDevice := bytes.Repeat([]byte("disk"), target.BlockSize/4)
	var faulty *blockdev.Faulty
	f := loop.NewFabric()
	r := newRig(t, loop.New(loop.WithFabric(f)), loop.New(loop.WithFabric(f)), "inline-test", func(d blockdev.Device) blockdev.Device {
		b := blockdev.AlignedBuffer(target.BlockSize)
		copy(b, onDevice)
		if _, err := d.WriteAt(b, cold*target.BlockSize); err != nil {
			t.Fatal(err)
		}
		faulty = blockdev.NewFaulty(d)
		return faulty
	}, target.WithListenNVMeTCP("127.0.0.1:0"))
	addr := r.tg.NVMeTCPAddr()
	admin, cntlid := bringUp(t, addr, 0, subNQN)
	wantOK(t, exec(t, admin, nvme.SetFeaturesCommand(nvme.FeatureNumberOfQueues, 0, false), nil, nil), "number of queues")
	io := nvmetcptest.Dial(t, addr, 0)
	wantOK(t, io.Connect(t, 1, 31, subNQN, hostNQN, cntlid), "I/O connect")
	hot := bytes.Repeat([]byte("hot!"), target.BlockSize/4)
	wantOK(t, exec(t, io, mc(t)(nvme.WriteCommand(tcpNSID, 5, 1, 0, nvme.SGLDescriptor{})), hot, nil), "write")

	entered, release := holdOps(t, faulty, blockdev.OpRead, 1, func(off int64) bool { return off == cold*target.BlockSize })
	reads := counts(t, r, "read")
	slow, err := io.Send(mc(t)(nvme.ReadCommand(tcpNSID, cold, 1, 0, nvme.SGLDescriptor{})), nil, target.BlockSize)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the read of the cold block never reached the device")
	}
	// Exec fails if any PDU of the first read arrives before its
	// completion.
	got := make([]byte, target.BlockSize)
	wantOK(t, exec(t, io, mc(t)(nvme.ReadCommand(tcpNSID, 5, 1, 0, nvme.SGLDescriptor{})), nil, got), "resident read behind a fault")
	if !bytes.Equal(got, hot) {
		t.Fatal("the resident read returned the wrong data")
	}
	wantDispatched(t, r, "read", reads, 1, 1)
	release()
	io.Conn.SetDeadline(time.Now().Add(nvmetcptest.Timeout))
	c, err := io.Await(slow, nil, got)
	if err != nil {
		t.Fatal(err)
	}
	wantOK(t, c, "read of the cold block")
	if !bytes.Equal(got, onDevice) {
		t.Fatal("the faulted read returned the wrong data")
	}
}

// TestReceiveLoopWriteWaitsForAFailedQueuesChange: fencing holds for
// writes that could run on the receive loop. A FUA write of the host's is
// held in the device when its queue fails; a write of the same block on
// another queue of the host, with its data in the capsule and its page
// resident, goes to a worker and is held there until the failed queue's
// write is done, and the block then holds it.
func TestReceiveLoopWriteWaitsForAFailedQueuesChange(t *testing.T) {
	const block = 5
	var faulty *blockdev.Faulty
	f := loop.NewFabric()
	r := newRig(t, loop.New(loop.WithFabric(f)), loop.New(loop.WithFabric(f)), "inline-test", func(d blockdev.Device) blockdev.Device {
		faulty = blockdev.NewFaulty(d)
		return faulty
	}, target.WithListenNVMeTCP("127.0.0.1:0"))
	addr := r.tg.NVMeTCPAddr()
	admin, cntlid := bringUp(t, addr, 0, subNQN)
	wantOK(t, exec(t, admin, nvme.SetFeaturesCommand(nvme.FeatureNumberOfQueues, 0x00010001, false), nil, nil), "number of queues")
	lost, io := nvmetcptest.Dial(t, addr, 0), nvmetcptest.Dial(t, addr, 0)
	wantOK(t, lost.Connect(t, 1, 31, subNQN, hostNQN, cntlid), "I/O connect 1")
	wantOK(t, io.Connect(t, 2, 31, subNQN, hostNQN, cntlid), "I/O connect 2")
	write := func() nvme.Command { return mc(t)(nvme.WriteCommand(tcpNSID, block, 1, 0, nvme.SGLDescriptor{})) }
	wantOK(t, exec(t, io, write(), bytes.Repeat([]byte("zero"), target.BlockSize/4), nil), "write")

	entered, release := holdOps(t, faulty, blockdev.OpWriteFUA, 1, func(off int64) bool { return off == block*target.BlockSize })
	old := bytes.Repeat([]byte("old!"), target.BlockSize/4)
	if _, err := lost.Send(mc(t)(nvme.WriteCommand(tcpNSID, block, 1, nvme.FUA, nvme.SGLDescriptor{})), old, 0); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the FUA write never reached the device")
	}
	conns := promtest.Sum(t, r.reg, "nprdma_target_connections")
	lost.Conn.Close()
	waitFor(t, "the lost queue to be fenced and gone", func() bool {
		return promtest.Sum(t, r.reg, "nprdma_target_connections") == conns-1
	})

	writes := counts(t, r, "write")
	latest := bytes.Repeat([]byte("new!"), target.BlockSize/4)
	cid, err := io.Send(write(), latest, 0)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the write to be held", func() bool {
		return promtest.Sum(t, r.reg, "nprdma_target_commands_held") == 1
	})
	wantDispatched(t, r, "write", writes, 0, 1)
	release()
	io.Conn.SetDeadline(time.Now().Add(nvmetcptest.Timeout))
	c, err := io.Await(cid, latest, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantOK(t, c, "held write")
	got := make([]byte, target.BlockSize)
	wantOK(t, exec(t, io, mc(t)(nvme.ReadCommand(tcpNSID, block, 1, 0, nvme.SGLDescriptor{})), nil, got), "read")
	if !bytes.Equal(got, latest) {
		t.Fatalf("block %d holds %q..., want the held write's data", block, got[:8])
	}
}
