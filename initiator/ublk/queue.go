package ublk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/nprdma/nprdma/initiator/blockio"
	"github.com/nprdma/nprdma/internal/uring"
	"golang.org/x/sys/unix"
)

// ioRing is what a queue needs of its io_uring: *uring.Ring, or a fake
// driver in tests.
type ioRing interface {
	Prepare() *uring.SQE
	Cmd(*uring.SQE) []byte
	Submit(wait uint32) (int, error)
	Completions(func(uring.CQE)) int
	Close() error
}

// dataFile is /dev/ublkcN as UBLK_F_USER_COPY moves requests' data through
// it: pread of a write's data, pwrite of a read's.
type dataFile interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
}

// inlineAfter is how many requests in a row must arrive alone before the
// loop serves them on its own thread.
const inlineAfter = 8

// eventsTag is the user data of the read of the queue's eventfd; request
// tags are below maxQueueDepth.
const eventsTag = 1 << 32

// queue serves one hardware queue of a device. Its loop (run) runs on one
// OS thread, as the driver requires: the thread that fetched a tag is the
// only one that may commit it, and the driver completes commands in that
// thread's task work. The loop fetches every tag, then waits on its ring:
// a completed fetch is a request, which it serves itself while the backend
// answers faster than a worker can be handed a request (a fast backend
// then costs no wake-up at all), or while requests come one at a time (no
// wake-up of another thread at queue depth 1), and otherwise hands to a
// worker goroutine; workers queue their results and wake the loop through
// an eventfd, whose read is one more entry in the ring; the loop commits
// each result with COMMIT_AND_FETCH_REQ, which also fetches the tag's next
// request. When the device stops, the driver aborts every fetch (-ENODEV),
// and the loop ends once all tags are aborted.
type queue struct {
	id, depth int
	maxIO     int
	charFD    int32
	ring      ioRing
	descs     []byte // the driver's descriptors, one per tag (read-only)
	bufs      []byte // each tag's buffer, maxIO bytes (mapped outside the Go heap)
	userCopy  bool
	data      dataFile // userCopy: where the data moves
	backend   blockio.Backend
	log       *slog.Logger
	efd       int
	evbuf     []byte // the eventfd read's 8 bytes (outside the Go heap)

	busy    int // requests handed to workers, not yet committed (loop only)
	alone   int // requests in a row that arrived with nothing else in flight (loop only)
	aborted int // tags whose fetch the driver aborted (loop only)

	mu       sync.Mutex
	done     []completion // results of workers, to commit
	notified bool         // the eventfd was written since the loop last looked

	work chan handoff // requests for idle workers
	idle atomic.Int32 // idle workers not yet handed a request

	// Moving averages of the time the backend takes to serve a request
	// and of the time a worker takes to start on one handed to it.
	serveNanos, handoffNanos atomic.Int64

	served, inline atomic.Uint64 // requests, those served on the loop's thread (tests)
}

type completion struct {
	tag uint16
	res int32
}

// run is the queue's loop; the caller has locked its goroutine to its
// thread. fetched gets nil once every tag's fetch is submitted (the device
// can then be started), or the error that ended the loop first.
func (q *queue) run(fetched chan<- error) error {
	for tag := range q.depth {
		q.prepare(ioFetchReq, uint16(tag), 0)
	}
	q.armEvents()
	if _, err := q.ring.Submit(0); err != nil {
		err = fmt.Errorf("ublk: queue %d: submitting its fetches: %w", q.id, err)
		fetched <- err
		return err
	}
	fetched <- nil
	var batch []uint16
	for q.aborted < q.depth {
		if _, err := q.ring.Submit(1); err != nil && !errors.Is(err, unix.EINTR) && !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("ublk: queue %d: io_uring_enter: %w", q.id, err)
		}
		q.ring.Completions(func(c uring.CQE) {
			if c.UserData == eventsTag {
				if c.Res < 0 {
					q.log.Warn("ublk: reading the queue's eventfd failed", "queue", q.id, "err", unix.Errno(-c.Res))
				}
				q.collect()
				q.armEvents()
				return
			}
			tag := uint16(c.UserData)
			switch c.Res {
			case ioResOK:
				batch = append(batch, tag)
			case ioResAbort:
				q.aborted++
			default:
				// The driver refused our command for this tag: it is
				// no longer ours to serve.
				q.log.Error("ublk: fetch or commit failed", "queue", q.id, "tag", tag, "err", unix.Errno(-c.Res))
				q.aborted++
			}
		})
		// Serve on this thread when the backend answers faster than a
		// worker can be handed a request, or while requests come one at
		// a time. Otherwise a request served here holds up every request
		// that arrives meanwhile, which costs more than the hand-off.
		if len(batch) == 1 && q.busy == 0 {
			q.alone++
		} else if len(batch) > 0 {
			q.alone = 0
		}
		fast := q.serveNanos.Load() < q.handoffNanos.Load()
		if fast || (len(batch) == 1 && q.busy == 0 && q.alone > inlineAfter) {
			for _, tag := range batch {
				q.inline.Add(1)
				q.prepare(ioCommitAndFetchReq, tag, q.timedServe(tag))
			}
		} else {
			for _, tag := range batch {
				q.busy++
				q.dispatch(tag)
			}
		}
		batch = batch[:0]
	}
	return nil
}

// prepare puts an I/O command for tag in the ring. The ring has room for a
// command per tag and the eventfd read, more than can ever be pending.
func (q *queue) prepare(op uint32, tag uint16, res int32) {
	e := q.ring.Prepare()
	e.Opcode, e.FD, e.UserData = uring.OpURingCmd, q.charFD, uint64(tag)
	e.SetCmdOp(ioOp(op))
	cmd := ioCmd{queue: uint16(q.id), tag: tag, result: res}
	if !q.userCopy {
		cmd.addr = uint64(uintptr(unsafe.Pointer(&q.bufs[int(tag)*q.maxIO])))
	}
	cmd.put(q.ring.Cmd(e))
}

// armEvents reads the eventfd through the ring: the read completes when a
// worker has results to commit.
func (q *queue) armEvents() {
	e := q.ring.Prepare()
	e.Opcode, e.FD, e.UserData = uring.OpRead, int32(q.efd), eventsTag
	e.Addr, e.Len = uint64(uintptr(unsafe.Pointer(&q.evbuf[0]))), 8
}

// collect commits the workers' results.
func (q *queue) collect() {
	q.mu.Lock()
	done := q.done
	q.done, q.notified = nil, false
	q.mu.Unlock()
	for _, c := range done {
		q.busy--
		q.prepare(ioCommitAndFetchReq, c.tag, c.res)
	}
}

// handoff is a request on its way to a worker.
type handoff struct {
	tag  uint16
	sent int64 // nanotime
}

// dispatch hands tag to an idle worker, or to a new one.
func (q *queue) dispatch(tag uint16) {
	h := handoff{tag, nanotime()}
	for {
		n := q.idle.Load()
		if n <= 0 {
			go q.worker(h)
			return
		}
		if q.idle.CompareAndSwap(n, n-1) {
			q.work <- h
			return
		}
	}
}

func (q *queue) worker(h handoff) {
	for {
		ewma(&q.handoffNanos, nanotime()-h.sent)
		q.complete(h.tag, q.timedServe(h.tag))
		q.idle.Add(1)
		var ok bool
		if h, ok = <-q.work; !ok {
			return
		}
	}
}

// timedServe serves tag and keeps the moving average of serving times.
func (q *queue) timedServe(tag uint16) int32 {
	start := nanotime()
	res := q.serve(tag)
	ewma(&q.serveNanos, nanotime()-start)
	return res
}

// ewma moves a moving average over about 8 samples towards sample;
// concurrent updates may lose one another, which only slows adaptation.
func ewma(avg *atomic.Int64, sample int64) {
	old := avg.Load()
	avg.Store(old + (sample-old)/8)
}

var epoch = time.Now()

func nanotime() int64 { return int64(time.Since(epoch)) }

// complete queues a worker's result and wakes the loop, unless it was woken
// since it last collected.
func (q *queue) complete(tag uint16, res int32) {
	q.mu.Lock()
	q.done = append(q.done, completion{tag, res})
	wake := !q.notified
	q.notified = true
	q.mu.Unlock()
	if wake {
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		if _, err := unix.Write(q.efd, one[:]); err != nil {
			q.log.Error("ublk: waking the queue's loop", "queue", q.id, "err", err)
		}
	}
}

// serve does request tag and returns its result for the driver: the bytes
// read or written, 0, or -errno.
func (q *queue) serve(tag uint16) int32 {
	q.served.Add(1)
	d := parseDesc(q.descs[int(tag)*descSize:])
	off, n := int64(d.startSector)*512, int64(d.sectors)*512
	fail := func(err error) int32 {
		q.log.Warn("ublk: request failed", "queue", q.id, "op", d.op, "off", off, "len", n, "err", err)
		return -int32(blockio.Errno(err))
	}
	var buf []byte
	if d.op == opRead || d.op == opWrite {
		if n > int64(q.maxIO) {
			return fail(fmt.Errorf("request of %d bytes beyond the buffer's %d: %w", n, q.maxIO, unix.EINVAL))
		}
		buf = q.bufs[int(tag)*q.maxIO:][:n]
	}
	fua := d.flags&ioFlagFUA != 0
	var err error
	switch d.op {
	case opRead:
		if _, err = q.backend.ReadAt(buf, off); err == nil && q.userCopy {
			_, err = q.data.WriteAt(buf, userCopyOffset(q.id, int(tag)))
		}
		if err != nil {
			return fail(err)
		}
		return int32(n)
	case opWrite:
		if q.userCopy {
			if _, err = q.data.ReadAt(buf, userCopyOffset(q.id, int(tag))); err != nil {
				return fail(err)
			}
		}
		if fua {
			_, err = q.backend.WriteAtFUA(buf, off)
		} else {
			_, err = q.backend.WriteAt(buf, off)
		}
		if err != nil {
			return fail(err)
		}
		return int32(n)
	case opFlush:
		err = q.backend.Flush()
	case opDiscard:
		err = q.backend.Trim(off, n)
	case opWriteZeroes:
		err = q.backend.WriteZeroes(off, n)
	default:
		return fail(fmt.Errorf("operation %d: %w", d.op, unix.EOPNOTSUPP))
	}
	if err == nil && fua && d.op != opFlush {
		// The backend has no FUA variant of trim and write-zeroes.
		err = q.backend.Flush()
	}
	if err != nil {
		return fail(err)
	}
	return 0
}
