package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nprdma/nprdma/initiator/attach"
	"github.com/nprdma/nprdma/internal/promtest"
)

// newSharedMemoryEnv is a CLI environment whose target also listens on a
// unix socket for initiators on this host (nprdma/shm).
func newSharedMemoryEnv(t *testing.T) *cliEnv {
	t.Helper()
	dir, err := os.MkdirTemp("", "nprdma-shm-") // short: a socket path is at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return newCLIEnv(t, "unix:"+filepath.Join(dir, "target.sock"))
}

// readsServed is how many one-sided READs the target's NIC engine served:
// over shm, reads of the namespace run in the initiator instead.
func (e *cliEnv) readsServed() float64 {
	e.t.Helper()
	return promtest.Sum(e.t, e.reg, "nprdma_fabric_one_sided_reads_total", "device", "target")
}

// attachedOverSHM checks that an attachment said it chose shm, from the
// daemon's log.
func attachedOverSHM(t *testing.T, rec attach.Record) {
	t.Helper()
	b, err := os.ReadFile(rec.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "provider shm: the target is on this host") {
		t.Fatalf("attach did not say it uses shared memory; its log:\n%s", b)
	}
}

// TestAttachOverSharedMemoryNBD: a target on this host that listens on a
// unix socket too is attached over shm without being asked (and says so);
// fio verifies through the NBD socket, over a namespace four times the
// target's budget, and the target's NIC engine serves almost none of the
// reads (they run in the initiator, in place); detach leaves nothing.
func TestAttachOverSharedMemoryNBD(t *testing.T) {
	needTools(t, "fio")
	e := newSharedMemoryEnv(t)
	rec := e.attachDaemon("t-shm-nbd", "--mode", "nbd")
	attachedOverSHM(t, rec)
	before := e.readsServed()
	fioVerify(t, "--ioengine=nbd", "--uri="+rec.URI)
	if served := e.readsServed() - before; served > verifyReads/100 {
		t.Errorf("the target's NIC engine served %v of fio's %d reads: reads did not run in place", served, verifyReads)
	}
	e.mustRun("detach", rec.Name)
	e.assertGone(rec)
}

// verifyReads is how many 4 KiB reads fioVerify makes at least (it reads
// back the 64 MiB it wrote).
const verifyReads = 64 << 20 / 4096

// TestAttachOverSharedMemoryFUSE: the same through the block device
// (/dev/loopN over the FUSE file).
func TestAttachOverSharedMemoryFUSE(t *testing.T) {
	needLoop(t)
	needTools(t, "fio")
	e := newSharedMemoryEnv(t)
	rec := e.attachDaemon("t-shm-fuse", "--mode", "fuse")
	attachedOverSHM(t, rec)
	before := e.readsServed()
	fioVerify(t, "--filename="+rec.Device, "--ioengine=libaio", "--direct=1")
	if served := e.readsServed() - before; served > verifyReads/100 {
		t.Errorf("the target's NIC engine served %v of fio's %d reads: reads did not run in place", served, verifyReads)
	}
	e.mustRun("detach", rec.Name)
	e.assertGone(rec)
}

// TestAttachProviderTCPOverrides: --provider tcp attaches a target on
// this host that offers shared memory over tcp: its NIC engine serves the
// reads.
func TestAttachProviderTCPOverrides(t *testing.T) {
	needTools(t, "fio")
	e := newSharedMemoryEnv(t)
	out, _ := e.mustRun("--provider", "tcp", "attach", "--target", e.addr, "--nqn", cliSubNQN, "--name", "t-tcp",
		"--daemon", "--json", "--io-queues", "2", "--mode", "nbd")
	var rec attach.Record
	if err := json.Unmarshal([]byte(out), &rec); err != nil {
		t.Fatalf("attach --json printed %q: %v", out, err)
	}
	before := e.readsServed()
	const reads = 1000
	runTool(t, "fio", "--name=r", "--ioengine=nbd", "--uri="+rec.URI, "--rw=randread", "--bs=4k", "--size=64m",
		"--number_ios="+strconv.Itoa(reads))
	if served := e.readsServed() - before; served < reads {
		t.Errorf("the target's NIC engine served %v of %d reads over tcp", served, reads)
	}
	e.mustRun("detach", rec.Name)
	e.assertGone(rec)
}

// TestAttachAutoSaysWhyTCP: a target on this host without a shared-memory
// listener is attached over tcp, and attach says why.
func TestAttachAutoSaysWhyTCP(t *testing.T) {
	e := newCLIEnv(t)
	rec := e.attachDaemon("t-why", "--mode", "nbd")
	b, err := os.ReadFile(rec.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "provider tcp: the target on this host offers no shared memory for "+cliSubNQN) {
		t.Fatalf("attach did not say why it uses tcp; its log:\n%s", b)
	}
	e.mustRun("detach", rec.Name)
	e.assertGone(rec)
}

func TestIsLocalHost(t *testing.T) {
	ctx := context.Background()
	for host, want := range map[string]bool{"127.0.0.1": true, "::1": true, "localhost": true, "192.0.2.1": false} {
		if got := isLocalHost(ctx, host); got != want {
			t.Errorf("isLocalHost(%q) = %v, want %v", host, got, want)
		}
	}
}
