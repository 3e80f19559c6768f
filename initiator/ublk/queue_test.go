package ublk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"log/slog"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/nprdma/nprdma/initiator/blockio"
	"github.com/nprdma/nprdma/internal/uring"
	"golang.org/x/sys/unix"
)

// fakeDriver plays the ublk driver and io_uring for one queue: it takes
// the queue's commands (fetches, commits, the eventfd read) at Submit,
// and completes what the test delivers (requests, aborts) and the eventfd
// read once a worker has written the eventfd.
type fakeDriver struct {
	t       *testing.T
	efd     int
	entries []uring.SQE
	cmds    [][16]byte
	next    int // entries prepared since the last Submit

	deliver chan []uring.CQE // requests and aborts, from the test
	events  chan struct{}    // the eventfd was written
	ready   []uring.CQE      // completions for Completions

	armed, eventPending bool
	commands            chan command // what the queue submitted, to the test
	closed              chan struct{}
}

type command struct {
	op  uint32 // ioFetchReq, ioCommitAndFetchReq
	cmd ioCmd
}

func newFakeDriver(t *testing.T, efd int) *fakeDriver {
	f := &fakeDriver{t: t, efd: efd, entries: make([]uring.SQE, 64), cmds: make([][16]byte, 64),
		deliver: make(chan []uring.CQE), events: make(chan struct{}, 1), commands: make(chan command, 256), closed: make(chan struct{})}
	go func() {
		var b [8]byte
		for {
			if _, err := unix.Read(efd, b[:]); err != nil {
				return
			}
			select {
			case f.events <- struct{}{}:
			default:
			}
		}
	}()
	return f
}

func (f *fakeDriver) Prepare() *uring.SQE {
	e := &f.entries[f.next]
	*e = uring.SQE{}
	f.cmds[f.next] = [16]byte{}
	f.next++
	return e
}

func (f *fakeDriver) Cmd(e *uring.SQE) []byte {
	i := (uintptr(unsafe.Pointer(e)) - uintptr(unsafe.Pointer(&f.entries[0]))) / unsafe.Sizeof(*e)
	return f.cmds[i][:]
}

func (f *fakeDriver) Submit(wait uint32) (int, error) {
	n := f.next
	for i := range n {
		e := f.entries[i]
		switch e.Opcode {
		case uring.OpRead:
			if int(e.FD) != f.efd || e.UserData != eventsTag || e.Len != 8 {
				f.t.Errorf("unexpected read %+v", e)
			}
			f.armed = true
		case uring.OpURingCmd:
			b := f.cmds[i]
			le := binary.LittleEndian
			c := ioCmd{queue: le.Uint16(b[0:]), tag: le.Uint16(b[2:]), result: int32(le.Uint32(b[4:])), addr: le.Uint64(b[8:])}
			op := uint32(e.Off) & 0xff
			if uint32(e.Off) != ioOp(op) || e.UserData != uint64(c.tag) {
				f.t.Errorf("command %#x for tag %d with user data %d", e.Off, c.tag, e.UserData)
			}
			f.commands <- command{op, c}
		default:
			f.t.Errorf("unexpected opcode %d", e.Opcode)
		}
	}
	f.next = 0
	if wait == 0 {
		return n, nil
	}
	for len(f.ready) == 0 {
		if f.eventPending && f.armed {
			f.ready = append(f.ready, uring.CQE{UserData: eventsTag, Res: 8})
			f.eventPending, f.armed = false, false
			continue
		}
		select {
		case cqes := <-f.deliver:
			f.ready = append(f.ready, cqes...)
		case <-f.events:
			f.eventPending = true
		case <-time.After(10 * time.Second):
			f.t.Error("the queue waited 10 s for the driver")
			return n, unix.EIO
		}
	}
	return n, nil
}

func (f *fakeDriver) Completions(fn func(uring.CQE)) int {
	cqes := f.ready
	f.ready = nil
	for _, c := range cqes {
		fn(c)
	}
	return len(cqes)
}

func (f *fakeDriver) Close() error { close(f.closed); return nil }

// memFile is /dev/ublkcN as user copy sees it: requests' data at offsets.
type memFile struct {
	mu   sync.Mutex
	data map[int64][]byte
}

func (m *memFile) ReadAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return copy(p, m.data[off]), nil
}

func (m *memFile) WriteAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.data[off] = bytes.Clone(p)
	return len(p), nil
}

type queueRig struct {
	t       *testing.T
	q       *queue
	drv     *fakeDriver
	mem     *blockio.Memory
	file    *memFile
	runErr  chan error
	pending map[uint16]bool
}

const rigDepth, rigMaxIO = 4, 64 << 10

func startQueue(t *testing.T, userCopy bool) *queueRig {
	t.Helper()
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(efd) })
	mem := blockio.NewMemory(1<<20, 4096)
	drv := newFakeDriver(t, efd)
	file := &memFile{data: map[int64][]byte{}}
	q := &queue{id: 1, depth: rigDepth, maxIO: rigMaxIO, charFD: 99, ring: drv, descs: make([]byte, rigDepth*descSize),
		bufs: make([]byte, rigDepth*rigMaxIO), evbuf: make([]byte, 8), userCopy: userCopy, data: file, backend: mem,
		log: slog.New(slog.DiscardHandler), efd: efd, work: make(chan handoff, rigDepth)}
	q.serveNanos.Store(int64(time.Hour)) // workers, unless a test says otherwise
	r := &queueRig{t: t, q: q, drv: drv, mem: mem, file: file, runErr: make(chan error, 1)}
	fetched := make(chan error, 1)
	go func() {
		err := q.run(fetched)
		close(q.work)
		r.runErr <- err
	}()
	if err := <-fetched; err != nil {
		t.Fatal(err)
	}
	for tag := range rigDepth {
		c := r.command(t)
		want := uint64(0)
		if !userCopy {
			want = uint64(uintptr(unsafe.Pointer(&q.bufs[tag*rigMaxIO])))
		}
		if c.op != ioFetchReq || c.cmd != (ioCmd{queue: 1, tag: uint16(tag), addr: want}) {
			t.Fatalf("command %d: %+v, want FETCH_REQ of tag %d with buffer %#x", tag, c, tag, want)
		}
	}
	return r
}

func (r *queueRig) command(t *testing.T) command {
	t.Helper()
	select {
	case c := <-r.drv.commands:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no command from the queue in 10 s")
	}
	return command{}
}

// request writes tag's descriptor, as the driver does before completing the
// tag's fetch.
func (r *queueRig) request(tag uint16, op uint8, flags uint32, off, length int64) uring.CQE {
	b := r.q.descs[int(tag)*descSize:]
	binary.LittleEndian.PutUint32(b[0:], uint32(op)|flags)
	binary.LittleEndian.PutUint32(b[4:], uint32(length/512))
	binary.LittleEndian.PutUint64(b[8:], uint64(off/512))
	return uring.CQE{UserData: uint64(tag), Res: ioResOK}
}

// commits collects n commits, by tag.
func (r *queueRig) commits(t *testing.T, n int) map[uint16]int32 {
	t.Helper()
	got := map[uint16]int32{}
	for range n {
		c := r.command(t)
		if c.op != ioCommitAndFetchReq || c.cmd.queue != 1 {
			t.Fatalf("command %+v, want COMMIT_AND_FETCH_REQ", c)
		}
		if _, dup := got[c.cmd.tag]; dup {
			t.Fatalf("tag %d committed twice", c.cmd.tag)
		}
		got[c.cmd.tag] = c.cmd.result
	}
	return got
}

func (r *queueRig) abortAll(t *testing.T) {
	t.Helper()
	var cqes []uring.CQE
	for tag := range rigDepth {
		cqes = append(cqes, uring.CQE{UserData: uint64(tag), Res: ioResAbort})
	}
	r.drv.deliver <- cqes
	select {
	case err := <-r.runErr:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the queue's loop did not end when every tag was aborted")
	}
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// One request at a time: a FUA write, read back, with the driver copying
// to and from the tags' buffers (or the server, with user copy).
func TestQueueServesOneRequestAtATime(t *testing.T) {
	for _, userCopy := range []bool{false, true} {
		r := startQueue(t, userCopy)
		data := pattern(8192, 3)
		if userCopy {
			r.file.WriteAt(data, userCopyOffset(1, 2))
		} else {
			copy(r.q.bufs[2*rigMaxIO:], data)
		}
		r.drv.deliver <- []uring.CQE{r.request(2, opWrite, ioFlagFUA, 65536, 8192)}
		if got := r.commits(t, 1); got[2] != 8192 {
			t.Fatalf("user copy %v: write committed %v, want 8192 bytes for tag 2", userCopy, got)
		}
		if s := r.mem.Stats(); s.FUAWrites != 1 || s.Writes != 0 || !bytes.Equal(r.mem.Snapshot()[65536:65536+8192], data) {
			t.Fatalf("user copy %v: backend after a FUA write: %+v", userCopy, s)
		}
		r.drv.deliver <- []uring.CQE{r.request(3, opRead, 0, 65536+4096, 4096)}
		if got := r.commits(t, 1); got[3] != 4096 {
			t.Fatalf("user copy %v: read committed %v", userCopy, got)
		}
		read := r.q.bufs[3*rigMaxIO:][:4096]
		if userCopy {
			read = r.file.data[userCopyOffset(1, 3)]
		}
		if !bytes.Equal(read, data[4096:]) {
			t.Fatalf("user copy %v: the read's data differs", userCopy)
		}
		r.abortAll(t)
	}
}

// Requests arriving together go to workers; each operation reaches the
// backend as it should and its result reaches the driver, errors as
// -errno.
func TestQueueServesConcurrentRequests(t *testing.T) {
	r := startQueue(t, false)
	copy(r.q.bufs[0:], pattern(4096, 9))
	r.drv.deliver <- []uring.CQE{
		r.request(0, opWrite, 0, 0, 4096),
		r.request(1, opFlush, 0, 0, 0),
		r.request(2, opDiscard, 0, 8192, 8192),
		r.request(3, opWriteZeroes, ioFlagFUA, 32768, 4096),
	}
	got := r.commits(t, 4)
	if got[0] != 4096 || got[1] != 0 || got[2] != 0 || got[3] != 0 {
		t.Fatalf("results %v", got)
	}
	// The flush may run before or after the write; the FUA write-zeroes
	// flushes after itself.
	if s := r.mem.Stats(); s.Writes != 1 || s.Trims != 1 || s.WriteZeroes != 1 || s.Flushes != 2 {
		t.Fatalf("backend calls %+v", s)
	}

	// A tag is served again after its commit; an unknown operation, a
	// request larger than the buffer and a backend error fail with their
	// errno, and the queue goes on.
	r.drv.deliver <- []uring.CQE{r.request(0, 9, 0, 0, 4096), r.request(1, opRead, 0, 0, 2*rigMaxIO)}
	got = r.commits(t, 2)
	if got[0] != -int32(syscall.EOPNOTSUPP) || got[1] != -int32(syscall.EINVAL) {
		t.Fatalf("unknown op and oversized read: %v", got)
	}
	r.mem.FailWith(errors.Join(errors.New("disk on fire"), syscall.EIO))
	r.drv.deliver <- []uring.CQE{r.request(2, opRead, 0, 0, 4096)}
	if got := r.commits(t, 1); got[2] != -int32(syscall.EIO) {
		t.Fatalf("backend error: %v", got)
	}
	r.mem.FailWith(nil)
	r.abortAll(t)
	if n := r.q.served.Load(); n != 7 {
		t.Fatalf("%d requests served, want 7", n)
	}
}

// Many rounds of requests on every tag at once: every result is
// committed once, and nothing is lost between the workers and the loop.
func TestQueueManyRounds(t *testing.T) {
	r := startQueue(t, false)
	for round := range 200 {
		var cqes []uring.CQE
		for tag := range uint16(rigDepth) {
			off := int64(tag)*rigMaxIO + int64(round%8)*4096
			if round%2 == 0 {
				copy(r.q.bufs[int(tag)*rigMaxIO:], pattern(4096, byte(round)+byte(tag)))
				cqes = append(cqes, r.request(tag, opWrite, 0, off, 4096))
			} else {
				cqes = append(cqes, r.request(tag, opRead, 0, off-4096, 4096))
			}
		}
		r.drv.deliver <- cqes
		got := r.commits(t, rigDepth)
		for tag := range uint16(rigDepth) {
			if got[tag] != 4096 {
				t.Fatalf("round %d: results %v", round, got)
			}
			if round%2 == 1 && !bytes.Equal(r.q.bufs[int(tag)*rigMaxIO:][:4096], pattern(4096, byte(round-1)+byte(tag))) {
				t.Fatalf("round %d tag %d: read back other data", round, tag)
			}
		}
	}
	r.abortAll(t)
}

// Requests that come one at a time are served on the loop's own thread
// once enough of them came so in a row; requests arriving together go to
// workers, and the next lone one starts the count again.
func TestQueueServesLoneRequestsOnItsThread(t *testing.T) {
	r := startQueue(t, false)
	lone := func(n int) {
		for i := range n {
			tag := uint16(i % rigDepth)
			r.drv.deliver <- []uring.CQE{r.request(tag, opRead, 0, 0, 4096)}
			if got := r.commits(t, 1); got[tag] != 4096 {
				t.Fatalf("read committed %v", got)
			}
		}
	}
	lone(inlineAfter)
	if n := r.q.inline.Load(); n != 0 {
		t.Fatalf("%d of the first %d lone requests served on the loop's thread, want none", n, inlineAfter)
	}
	lone(4)
	if n := r.q.inline.Load(); n != 4 {
		t.Fatalf("%d of the next 4 lone requests served on the loop's thread, want 4", n)
	}
	var cqes []uring.CQE
	for tag := range uint16(rigDepth) {
		cqes = append(cqes, r.request(tag, opRead, 0, 0, 4096))
	}
	r.drv.deliver <- cqes
	r.commits(t, rigDepth)
	lone(1)
	if n := r.q.inline.Load(); n != 4 {
		t.Fatalf("requests served on the loop's thread: %d after a batch and a lone one, want still 4", n)
	}
	r.abortAll(t)
}

// A backend that answers faster than a worker starts on a request is
// served on the loop's thread, requests arriving together included; one
// that slows down goes back to workers.
func TestQueueServesAFastBackendOnItsThread(t *testing.T) {
	r := startQueue(t, false)
	r.q.serveNanos.Store(int64(time.Microsecond))
	r.q.handoffNanos.Store(int64(time.Hour))
	batch := func() {
		var cqes []uring.CQE
		for tag := range uint16(rigDepth) {
			cqes = append(cqes, r.request(tag, opRead, 0, int64(tag)*4096, 4096))
		}
		r.drv.deliver <- cqes
		for tag, res := range r.commits(t, rigDepth) {
			if res != 4096 {
				t.Fatalf("tag %d: %d", tag, res)
			}
		}
	}
	batch()
	if n := r.q.inline.Load(); n != rigDepth {
		t.Fatalf("%d of %d requests of a fast backend served on the loop's thread", n, rigDepth)
	}
	r.q.serveNanos.Store(int64(time.Hour))
	r.q.handoffNanos.Store(int64(time.Microsecond))
	batch()
	if n := r.q.inline.Load(); n != rigDepth {
		t.Fatalf("%d requests served on the loop's thread after the backend slowed down, want still %d", n, rigDepth)
	}
	r.abortAll(t)
}
