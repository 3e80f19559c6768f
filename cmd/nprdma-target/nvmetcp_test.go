package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/internal/banner"
	"github.com/nprdma/nprdma/internal/nvmetcptest"
	"github.com/nprdma/nprdma/nvme"
)

// TestListenNVMeTCPServesTheSameNamespace: with --listen-nvme-tcp and
// --listen-nvme-tcp-discovery the banner names both ports; an NVMe/TCP
// host's write is read back by the nprdma initiator over the fabric.
func TestListenNVMeTCPServesTheSameNamespace(t *testing.T) {
	dir := t.TempDir()
	makeBacking(t, dir, 16<<20)
	p := startTargetProc(t, append(targetArgs(dir), "--listen-nvme-tcp", "127.0.0.1:0",
		"--listen-nvme-tcp-discovery", "127.0.0.1:0")...)
	var addr string
	deadline := time.Now().Add(10 * time.Second)
	for addr == "" && time.Now().Before(deadline) {
		for _, l := range strings.Split(p.output(), "\n") {
			if a, ok := banner.NVMeTCPAddr(l); ok && strings.Contains(l, "(discovery on 127.0.0.1:") {
				addr = a
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if addr == "" {
		t.Fatalf("no NVMe/TCP line:\n%s", p.output())
	}
	h := nvmetcptest.Dial(t, addr, 0)
	c := h.Connect(t, 0, 31, testNQN, "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000aa", 0)
	if !c.Status.OK() {
		t.Fatalf("admin connect: %v", c.Status)
	}
	cntlid := nvme.DecodeConnectResponse(c.DW0).CNTLID
	cc := nvme.CC{EN: true, IOSQES: 6, IOCQES: 4}
	set, _ := nvme.PropertySetCommand(nvme.PropCC, 4, uint64(cc.Encode()))
	if c, err := h.Exec(set, nil, nil); err != nil || !c.Status.OK() {
		t.Fatalf("enable: %v %v", err, c.Status)
	}
	if c, err := h.Exec(nvme.SetFeaturesCommand(nvme.FeatureNumberOfQueues, 0, false), nil, nil); err != nil || !c.Status.OK() {
		t.Fatalf("number of queues: %v %v", err, c.Status)
	}
	io := nvmetcptest.Dial(t, addr, 0)
	if c := io.Connect(t, 1, 31, testNQN, "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000aa", cntlid); !c.Status.OK() {
		t.Fatalf("I/O connect: %v", c.Status)
	}
	data := make([]byte, 64<<10)
	fill(data, 1<<20, 7)
	w, _ := nvme.WriteCommand(1, (1<<20)/4096, 16, 0, nvme.SGLDescriptor{})
	if c, err := io.Exec(w, data, nil); err != nil || !c.Status.OK() {
		t.Fatalf("write over NVMe/TCP: %v %v", err, c.Status)
	}
	_, n, done := connectNS(t, p.addr)
	defer done()
	got := make([]byte, len(data))
	if _, err := n.ReadAt(got, 1<<20); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the fabric host reads the NVMe/TCP host's write: %v, equal %v", err, bytes.Equal(got, data))
	}
}
