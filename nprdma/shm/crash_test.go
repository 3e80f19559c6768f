package shm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/link"
	"github.com/nprdma/nprdma/nprdma/nprdmatest"
)

// The crash tests run one side of a connection in a child process (this
// test binary, re-executed) and kill it with SIGKILL: the other side must be
// left with no ring, doorbell, shared region or link of it.

const envChild = "NPRDMA_SHM_TEST_CHILD" // "target" or "initiator"

func TestMain(m *testing.M) {
	switch os.Getenv(envChild) {
	case "target":
		childTarget()
	case "initiator":
		childInitiator()
	default:
		os.Exit(m.Run())
	}
}

// childTarget serves a shared region on the socket in NPRDMA_SHM_TEST_SOCKET
// and prints its key, address and magic; it runs until killed.
func childTarget() {
	pg, err := nprdmatest.NewSharedPager(64, 4096)
	must(err)
	for i := range pg.Bytes() {
		pg.Bytes()[i] = byte(i)
	}
	p := New()
	dev := nprdma.NewDevice(p)
	pd := dev.AllocPD()
	mr, err := pd.RegisterUnpinned(pg, nprdma.AccessRemoteRead)
	must(err)
	ln, err := dev.Listen(os.Getenv("NPRDMA_SHM_TEST_SOCKET"))
	must(err)
	go func() {
		for {
			req, err := ln.Accept(context.Background())
			must(err)
			qp, err := pd.NewQP(nprdma.QPConfig{SendCQ: dev.NewCQ(64)})
			must(err)
			must(req.Accept(qp, nil))
		}
	}()
	fmt.Printf("ready %d %d %d\n", mr.RKey(), mr.Addr(), mr.Magic())
	select {}
}

// childInitiator connects to the socket in NPRDMA_SHM_TEST_SOCKET, reads the
// region NPRDMA_SHM_TEST_REGION ("rkey addr") until a READ ran in place,
// says so and runs until killed.
func childInitiator() {
	var rkey uint32
	var addr uint64
	_, err := fmt.Sscan(os.Getenv("NPRDMA_SHM_TEST_REGION"), &rkey, &addr)
	must(err)
	dev := nprdma.NewDevice(New(), nprdma.WithPinning(false))
	pd := dev.AllocPD()
	cq := dev.NewCQ(64)
	qp, err := pd.NewQP(nprdma.QPConfig{SendCQ: cq})
	must(err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = qp.Connect(ctx, os.Getenv("NPRDMA_SHM_TEST_SOCKET"), nil)
	must(err)
	buf, err := nprdma.AllocBuffer(4096)
	must(err)
	dst, err := pd.Register(buf, nprdma.AccessLocalWrite)
	must(err)
	for i := 1; dev.Stats().LocalReads == 0; i++ {
		must(qp.PostSend(nprdma.SendWR{ID: uint64(i), Op: nprdma.OpRead, SG: []nprdma.SGE{dst.SGE(0, 4096)}, RemoteAddr: addr, RKey: rkey, Signaled: true}))
		var wc [1]nprdma.WC
		_, err := cq.Wait(ctx, wc[:])
		must(err)
		if wc[0].Status != nprdma.StatusSuccess {
			must(fmt.Errorf("READ %s", wc[0].Status))
		}
		if i > 10000 {
			must(errors.New("no READ ran in place"))
		}
	}
	fmt.Println("ready")
	select {}
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
}

// child starts this binary as role with env and waits for its "ready" line.
func child(t *testing.T, role string, env ...string) (*exec.Cmd, []string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), envChild+"="+role), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
	}()
	select {
	case l, ok := <-line:
		f := strings.Fields(l)
		if !ok || len(f) == 0 || f[0] != "ready" {
			t.Fatalf("child %s said %q", role, l)
		}
		return cmd, f[1:]
	case <-time.After(30 * time.Second):
		t.Fatalf("child %s not ready", role)
	}
	return nil, nil
}

// kill SIGKILLs the child and reaps it.
func kill(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
}

// held counts this process's descriptors and mappings of shm's and the
// test pager's memory files, and its eventfds.
type held struct{ ringFDs, ringMaps, regionFDs, regionMaps, eventfds int }

func holding(t *testing.T) held {
	t.Helper()
	var h held
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil {
			continue
		}
		switch {
		case strings.Contains(target, "memfd:nprdma-shm-ring"):
			h.ringFDs++
		case strings.Contains(target, "memfd:nprdmatest-"):
			h.regionFDs++
		case target == "anon_inode:[eventfd]":
			h.eventfds++
		}
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(maps), "\n") {
		switch {
		case strings.Contains(l, "memfd:nprdma-shm-ring"):
			h.ringMaps++
		case strings.Contains(l, "memfd:nprdmatest-"):
			h.regionMaps++
		}
	}
	return h
}

// waitHolding waits until this process holds what it held before (the
// link's clean-up runs when its socket reports the peer gone).
func waitHolding(t *testing.T, want held, links func() int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := holding(t)
		if got == want && links() == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the peer was killed: holding %+v and %d links, want %+v and none", got, links(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestKilledInitiatorLeavesNothing: an initiator process that mapped a
// shared region and read it in place is killed; the target's side of the
// link goes, with its ring file mapping and doorbells.
func TestKilledInitiatorLeavesNothing(t *testing.T) {
	pg, err := nprdmatest.NewSharedPager(64, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	before := holding(t)
	prov := New()
	pr := newPair(t, prov, pg)
	c, _ := child(t, "initiator", "NPRDMA_SHM_TEST_SOCKET="+pr.ln.Addr(),
		"NPRDMA_SHM_TEST_REGION="+strconv.FormatUint(uint64(pr.mr.RKey()), 10)+" "+strconv.FormatUint(pr.mr.Addr(), 10))
	if during := holding(t); during.ringMaps == 0 || prov.Stats().Links != 1 {
		t.Fatalf("while the initiator is connected: holding %+v, %d links", during, prov.Stats().Links)
	}
	kill(t, c)
	waitHolding(t, before, func() int { return prov.Stats().Links })
}

// TestKilledTargetLeavesNothing: the initiator reads a killed target's
// region in place until the kill; then its link fails as a lost peer and
// the ring, the doorbells and the mapping of the region all go.
func TestKilledTargetLeavesNothing(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "t.sock")
	before := holding(t)
	c, f := child(t, "target", "NPRDMA_SHM_TEST_SOCKET=unix:"+sock)
	rkey, _ := strconv.ParseUint(f[0], 10, 32)
	addr, _ := strconv.ParseUint(f[1], 10, 64)
	prov := New()
	dev := nprdma.NewDevice(prov, nprdma.WithPinning(false))
	defer dev.Close()
	pd := dev.AllocPD()
	cq := dev.NewCQ(64)
	qp, err := pd.NewQP(nprdma.QPConfig{SendCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := qp.Connect(ctx, "unix:"+sock, nil); err != nil {
		t.Fatal(err)
	}
	buf, err := nprdma.AllocBuffer(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer nprdma.FreeBuffer(buf)
	dst, err := pd.Register(buf, nprdma.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; dev.Stats().LocalReads == 0; i++ {
		if err := qp.PostSend(nprdma.SendWR{ID: uint64(i), Op: nprdma.OpRead, SG: []nprdma.SGE{dst.SGE(0, 4096)}, RemoteAddr: addr, RKey: uint32(rkey), Signaled: true}); err != nil {
			t.Fatal(err)
		}
		var wc [1]nprdma.WC
		if _, err := cq.Wait(ctx, wc[:]); err != nil || wc[0].Status != nprdma.StatusSuccess {
			t.Fatalf("READ: %v %s", err, wc[0].Status)
		}
		if i > 10000 {
			t.Fatal("no READ ran in place")
		}
	}
	if during := holding(t); during.ringMaps == 0 || during.regionMaps == 0 || prov.Stats().Mappings != 1 {
		t.Fatalf("while reading in place: holding %+v, %d mappings", during, prov.Stats().Mappings)
	}
	kill(t, c)
	select {
	case <-qp.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the queue pair did not fail when the target was killed")
	}
	if err := qp.Err(); !errors.Is(err, link.ErrPeerLost) {
		t.Fatalf("queue pair error %v, want a lost peer", err)
	}
	waitHolding(t, before, func() int { return prov.Stats().Links })
	if m := prov.Stats().Mappings; m != 0 {
		t.Fatalf("%d regions still mapped", m)
	}
}
