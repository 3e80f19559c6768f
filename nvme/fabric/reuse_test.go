package fabric

import (
	"context"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nvme"
)

// TestReusedRequestsAfterHostDataTimeouts: a queue hands a released
// Request (its slot, READ-done channel and timer) to its next command. Here
// half the writes give HostData a timeout too short for their RDMA READ,
// whose completion then arrives for a command that stopped waiting; the
// commands after them on the same Requests must each get their own data,
// never return early on a stale READ completion or a stale timer. The
// controller answers every write with the CRC of the data it got.
func TestReusedRequestsAfterHostDataTimeouts(t *testing.T) {
	forEachProvider(t, func(t *testing.T, pk providerKind) {
		rig := newRig(t, pk)
		var nTimedOut, nOK int64
		var mu sync.Mutex
		rig.ctrl.hook = func(r *Request) bool {
			if r.Cmd.Opcode != nvme.IOWrite {
				return false
			}
			go func() {
				timeout := 10 * time.Second
				if r.Cmd.CDW15 == 1 {
					timeout = time.Nanosecond
				}
				p, err := r.HostData(timeout)
				if err != nil {
					mu.Lock()
					nTimedOut++
					mu.Unlock()
					if !errors.Is(err, context.DeadlineExceeded) {
						r.Fail(nvme.Errorf(nvme.StatusDataTransferError, "unexpected: %v", err))
						return
					}
					r.Fail(nvme.Errorf(nvme.StatusInternalError, "timed out"))
					return
				}
				mu.Lock()
				nOK++
				mu.Unlock()
				r.Complete(nvme.Completion{DW0: crc32.ChecksumIEEE(p)})
			}()
			return true
		}
		q := rig.dial(t, QueueConfig{QID: 1, Entries: 8})
		const submitters, rounds = 4, 300
		var wg sync.WaitGroup
		errs := make(chan error, submitters)
		for s := range submitters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(s), 7))
				buf, err := q.Pool().Get(8192)
				if err != nil {
					errs <- err
					return
				}
				defer buf.Release()
				for range rounds {
					n := testBlock * (1 + rng.IntN(16))
					for j := range buf.Bytes()[:n] {
						buf.Bytes()[j] = byte(rng.Uint32())
					}
					want := crc32.ChecksumIEEE(buf.Bytes()[:n])
					cmd, err := nvme.WriteCommand(1, uint64(s*32), uint32(n/testBlock), 0, nvme.NullSGL())
					if err != nil {
						errs <- err
						return
					}
					short := rng.IntN(2) == 0
					if short {
						cmd.CDW15 = 1
					}
					cqe, err := q.SubmitBuffer(context.Background(), cmd, buf, 0, n)
					switch {
					case err != nil && errors.Is(err, nvme.StatusInternalError) && short:
						// The READ outlived its timeout: as intended.
					case err != nil:
						errs <- err
						return
					case cqe.DW0 != want:
						errs <- errors.New("the controller got other data than this write's: a reused Request returned before its own READ landed")
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		t.Logf("%d HostData timeouts, %d writes with their data", nTimedOut, nOK)
		if st := rig.queue(t, 0).Stats(); st.HostReads < submitters*rounds {
			t.Fatalf("%d RDMA READs for %d writes", st.HostReads, submitters*rounds)
		}
	})
}
