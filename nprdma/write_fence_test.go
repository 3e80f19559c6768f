package nprdma

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma/link"
)

// gatedPayload is a WRITE's payload that stops before its bytes land until
// the test opens the gate, so that a WRITE is caught in the middle of its
// copy into the region.
type gatedPayload struct {
	entered, gate chan struct{}
	data          []byte
}

func (p *gatedPayload) Read(dst []byte) error {
	close(p.entered)
	<-p.gate
	copy(dst, p.data)
	return nil
}

func (p *gatedPayload) Discard(int) error { return nil }

// downLink is a sinkLink that goes down when closed, so that its queue
// pair can close.
type downLink struct {
	sinkLink
	r    link.Receiver
	once sync.Once
}

func (l *downLink) Close() { l.once.Do(func() { l.r.LinkDown(nil) }) }
func (l *downLink) Abort() { l.Close() }

// TestDeregisterWaitsForWriteInProgress: Deregister returns only after a
// peer's WRITE that is copying into the region has landed, so the owner
// may free the memory right after it; the next WRITE with the key is
// refused.
func TestDeregisterWaitsForWriteInProgress(t *testing.T) {
	dev := NewDevice(nullProvider{}, WithPinning(false))
	defer dev.Close()
	pd := dev.AllocPD()
	mem, err := AllocBuffer(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer FreeBuffer(mem)
	mr, err := pd.Register(mem, AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	q, err := pd.NewQP(QPConfig{SendCQ: dev.NewCQ(4)})
	if err != nil {
		t.Fatal(err)
	}
	qp := q.drv.(*softQP)
	qp.link = &downLink{r: qp}
	p := &gatedPayload{entered: make(chan struct{}), gate: make(chan struct{}), data: bytes.Repeat([]byte{0xa5}, len(mem))}
	written := make(chan error, 1)
	go func() {
		written <- qp.onWrite(&link.Header{Kind: link.PacketWrite, Seq: 0, Len: uint32(len(mem)), RKey: mr.RKey(), Addr: mr.Addr()}, p)
	}()
	<-p.entered
	deregistered := make(chan struct{})
	go func() {
		mr.Deregister()
		close(deregistered)
	}()
	select {
	case <-deregistered:
		close(p.gate)
		t.Fatal("Deregister returned while a WRITE was copying into the region")
	case <-time.After(50 * time.Millisecond):
	}
	close(p.gate)
	select {
	case <-deregistered:
	case <-time.After(10 * time.Second):
		t.Fatal("Deregister did not return after the WRITE landed")
	}
	if err := <-written; err != nil {
		t.Fatalf("WRITE begun before Deregister: %v", err)
	}
	if !bytes.Equal(mem, p.data) {
		t.Fatal("WRITE begun before Deregister did not land whole")
	}
	refused := dev.Stats().RemoteAccessErrors
	qp.onWrite(&link.Header{Kind: link.PacketWrite, Seq: 1, Len: 8, RKey: mr.RKey(), Addr: mr.Addr()}, &gatedPayload{})
	if dev.Stats().RemoteAccessErrors != refused+1 {
		t.Fatal("a WRITE after Deregister was not refused")
	}
}
