package target_test

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nprdma/nprdma/internal/nvmetcptest"
	"github.com/nprdma/nprdma/internal/promtest"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/tcp"
	"github.com/nprdma/nprdma/target"
)

// The target served to NVMe/TCP hosts, driven by the test host of
// internal/nvmetcptest with what a Linux host sends (nvmeof.md §3.1).

// tcpNSID is the namespace of newRig.
const tcpNSID = 3

// newTCPRig is newRig with an NVMe/TCP port and a discovery port on
// loopback beside the nprdma fabric over loop.
func newTCPRig(t testing.TB, opts ...target.Option) *adminRig {
	t.Helper()
	f := loop.NewFabric()
	return newRig(t, loop.New(loop.WithFabric(f)), loop.New(loop.WithFabric(f)), "tcp-test", nil,
		append([]target.Option{target.WithListenNVMeTCP("127.0.0.1:0"), target.WithListenNVMeTCPDiscovery("127.0.0.1:0")}, opts...)...)
}

// exec runs cmd on h and fails the test on a transport error.
func exec(t testing.TB, h *nvmetcptest.Host, cmd nvme.Command, out, in []byte) nvme.Completion {
	t.Helper()
	c, err := h.Exec(cmd, out, in)
	if err != nil {
		t.Fatalf("%s: %v", cmd.Name(false), err)
	}
	return c
}

func wantOK(t testing.TB, c nvme.Completion, what string) {
	t.Helper()
	if !c.Status.OK() {
		t.Fatalf("%s: %v", what, c.Status)
	}
}

func wantCQE(t testing.TB, c nvme.Completion, want nvme.Status, what string) {
	t.Helper()
	if !errors.Is(c.Err(), want) {
		t.Fatalf("%s: %v, want %v", what, c.Status, want)
	}
}

// bringUp connects an admin queue as Linux does (SQSIZE 31, KATO 5 s),
// reads CAP, enables the controller, waits for CSTS.RDY and reads VS.
func bringUp(t testing.TB, addr string, dg tcp.Digests, sub string) (*nvmetcptest.Host, uint16) {
	t.Helper()
	h := nvmetcptest.Dial(t, addr, dg)
	c := h.Connect(t, 0, 31, sub, hostNQN, 0)
	wantOK(t, c, "admin connect")
	cntlid := nvme.DecodeConnectResponse(c.DW0).CNTLID
	c = exec(t, h, mc(t)(nvme.PropertyGetCommand(nvme.PropCAP, 8)), nil, nil)
	if capv := nvme.DecodeCAP(c.Result64()); !capv.CQR || capv.CSS&nvme.CSSNVM == 0 || capv.TO == 0 {
		t.Fatalf("CAP %+v", capv)
	}
	cc := nvme.CC{EN: true, IOSQES: 6, IOCQES: 4}
	wantOK(t, exec(t, h, mc(t)(nvme.PropertySetCommand(nvme.PropCC, 4, uint64(cc.Encode()))), nil, nil), "CC.EN")
	if c := exec(t, h, mc(t)(nvme.PropertyGetCommand(nvme.PropCSTS, 4)), nil, nil); !nvme.DecodeCSTS(c.DW0).RDY {
		t.Fatalf("CSTS %#x after enable", c.DW0)
	}
	if c := exec(t, h, mc(t)(nvme.PropertyGetCommand(nvme.PropVS, 4)), nil, nil); c.DW0 != uint32(nvme.Version1_3) {
		t.Fatalf("VS %#x", c.DW0)
	}
	return h, cntlid
}

func identify(t testing.TB, h *nvmetcptest.Host, cns nvme.CNS, nsid uint32) ([]byte, nvme.Completion) {
	t.Helper()
	buf := make([]byte, nvme.IdentifySize)
	c := exec(t, h, nvme.IdentifyCommand(cns, nsid, nvme.SGLDescriptor{}), nil, buf)
	return buf, c
}

// TestNVMeTCPLinuxBringUp answers everything a Linux host sends to bring a
// namespace up, with and without digests, then moves data through an I/O
// queue and shuts the controller down.
func TestNVMeTCPLinuxBringUp(t *testing.T) {
	r := newTCPRig(t)
	for _, dg := range []tcp.Digests{0, tcp.HeaderDigest | tcp.DataDigest} {
		t.Run(dg.String(), func(t *testing.T) {
			testLinuxBringUp(t, r, dg)
		})
	}
}

func testLinuxBringUp(t *testing.T, r *adminRig, dg tcp.Digests) {
	addr := r.tg.NVMeTCPAddr()
	h, cntlid := bringUp(t, addr, dg, subNQN)
	// Identify Controller: the fields the Linux host checks.
	b, c := identify(t, h, nvme.CNSController, 0)
	wantOK(t, c, "identify controller")
	var id nvme.IdentifyController
	if err := id.Unmarshal(b); err != nil {
		t.Fatal(err)
	}
	switch {
	case id.CNTLID != cntlid, id.KAS == 0, id.IOCCSZ != nvme.IOCCSZFor(target.DefaultInCapsuleData), id.IORCSZ != 1,
		id.MAXCMD == 0, id.CNTRLTYPE != nvme.ControllerTypeIO, id.SUBNQN != subNQN, id.MSDBD != 1,
		id.SGLS&nvme.SGLSSupported == 0, id.SGLS&nvme.SGLSOffset == 0, id.SGLS&nvme.SGLSKeyedDataBlock != 0,
		id.NN < tcpNSID, id.VWC&nvme.VWCPresent == 0:
		t.Fatalf("identify controller over NVMe/TCP: %+v", id)
	}
	// Optional structures newer kernels probe: an NVMe error, not a drop.
	_, c = identify(t, h, nvme.CNS(0x06), 0)
	wantCQE(t, c, nvme.StatusInvalidField, "identify CNS 0x06")
	_, c = identify(t, h, nvme.CNS(0x08), tcpNSID)
	wantCQE(t, c, nvme.StatusInvalidField, "identify CNS 0x08")
	// The commands supported: no NP Get Region Descriptor over NVMe/TCP.
	fx := make([]byte, 4096)
	wantOK(t, exec(t, h, mc(t)(nvme.GetLogPageCommand(nvme.LogCommandEffects, 0, 0, 4096, nvme.SGLDescriptor{})), nil, fx), "effects log")
	var effects nvme.CommandEffectsLog
	if err := effects.Unmarshal(fx); err != nil {
		t.Fatal(err)
	}
	if effects.Admin[nvme.AdminNPGetRegionDescriptor] != 0 || effects.Admin[nvme.AdminIdentify] == 0 || effects.IO[nvme.IOWrite] == 0 {
		t.Fatalf("effects: admin %v io %v", effects.Admin[:32], effects.IO[:16])
	}
	smart := make([]byte, 512)
	wantOK(t, exec(t, h, mc(t)(nvme.GetLogPageCommand(nvme.LogSMARTHealth, nvme.BroadcastNSID, 0, 512, nvme.SGLDescriptor{})), nil, smart), "SMART log")
	c = exec(t, h, mc(t)(nvme.GetLogPageCommand(nvme.LogPageID(0x0c), 0, 0, 4096, nvme.SGLDescriptor{})), nil, make([]byte, 4096))
	wantCQE(t, c, nvme.StatusInvalidField, "ANA log")
	// Number of Queues: a grant of at least one.
	c = exec(t, h, nvme.SetFeaturesCommand(nvme.FeatureNumberOfQueues, 0x00070007, false), nil, nil)
	wantOK(t, c, "number of queues")
	if n, _ := nvme.DecodeNumberOfQueues(c.DW0); n.IOQueues() != 4 {
		t.Fatalf("granted %+v, want 4 (WithMaxIOQueues)", n)
	}
	// Async Event Configuration: Linux asks for what OAES offers, the
	// Namespace Attribute Notices (bit 8); a notice this target never
	// raises (Firmware Activation, bit 9) is refused.
	wantOK(t, exec(t, h, nvme.SetFeaturesCommand(nvme.FeatureAsyncEventConfig, uint32(nvme.AECNamespaceAttribute), false), nil, nil), "async event config")
	c = exec(t, h, nvme.SetFeaturesCommand(nvme.FeatureAsyncEventConfig, uint32(nvme.AECFirmwareActivation), false), nil, nil)
	wantCQE(t, c, nvme.StatusInvalidField, "async event config of firmware activation notices")
	wantOK(t, exec(t, h, nvme.KeepAliveCommand(), nil, nil), "keep alive")
	// The namespace scan: active list, descriptors, identify namespace.
	b, c = identify(t, h, nvme.CNSActiveNamespaces, 0)
	wantOK(t, c, "active namespaces")
	if ids, err := nvme.ParseNamespaceList(b); err != nil || len(ids) != 1 || ids[0] != tcpNSID {
		t.Fatalf("active namespaces %v %v", ids, err)
	}
	b, c = identify(t, h, nvme.CNSNamespaceDescriptors, tcpNSID)
	wantOK(t, c, "namespace descriptors")
	var descs nvme.NamespaceIDs
	if err := descs.Unmarshal(b); err != nil || descs.NGUID == ([16]byte{}) || descs.UUID == (nvme.UUID{}) {
		t.Fatalf("descriptors %+v %v", descs, err)
	}
	b, c = identify(t, h, nvme.CNSNamespace, tcpNSID)
	wantOK(t, c, "identify namespace")
	var ns nvme.IdentifyNamespace
	if err := ns.Unmarshal(b); err != nil || ns.NSZE != (8<<20)/target.BlockSize || ns.LBAF[0].LBADS != 12 || ns.NGUID != descs.NGUID {
		t.Fatalf("identify namespace %+v %v", ns, err)
	}
	c = exec(t, h, nvme.NPGetRegionDescriptorCommand(tcpNSID, nvme.SGLDescriptor{}), nil, make([]byte, nvme.RegionDescriptorSize))
	wantCQE(t, c, nvme.StatusInvalidOpcode, "NP Get Region Descriptor over NVMe/TCP")

	// An I/O queue and data.
	io := nvmetcptest.Dial(t, addr, dg)
	wantOK(t, io.Connect(t, 1, 127, subNQN, hostNQN, cntlid), "I/O connect")
	tcpWriteRead(t, io, 0, 1, 1)    // in the capsule
	tcpWriteRead(t, io, 10, 32, 2)  // 128 KiB by R2T
	tcpWriteRead(t, io, 100, 64, 3) // 256 KiB: two H2CData PDUs
	wantOK(t, exec(t, io, nvme.FlushCommand(tcpNSID), nil, nil), "flush")
	wz := mc(t)(nvme.WriteZeroesCommand(tcpNSID, 10, 2, 0))
	wantOK(t, exec(t, io, wz, nil, nil), "write zeroes")
	got := make([]byte, 2*target.BlockSize)
	wantOK(t, exec(t, io, mc(t)(nvme.ReadCommand(tcpNSID, 10, 2, 0, nvme.SGLDescriptor{})), nil, got), "read zeroes")
	if !allZero(got) {
		t.Fatal("blocks read back after Write Zeroes are not zero")
	}
	ranges := mc(t)(nvme.DeallocateCommand(tcpNSID, 1, nvme.SGLDescriptor{}))
	rb, _ := nvme.MarshalDSMRanges([]nvme.DSMRange{{SLBA: 100, Blocks: 64}})
	// As Linux sends it: one range in a 4 KiB buffer.
	wantOK(t, exec(t, io, ranges, append(rb, make([]byte, 4096-len(rb))...), nil), "deallocate")
	wantOK(t, exec(t, io, mc(t)(nvme.ReadCommand(tcpNSID, 100, 1, 0, nvme.SGLDescriptor{})), nil, got[:target.BlockSize]), "read deallocated")
	if !allZero(got[:target.BlockSize]) {
		t.Fatal("a deallocated block does not read back as zeroes")
	}
	c = exec(t, io, mc(t)(nvme.DeallocateCommand(tcpNSID, 2, nvme.SGLDescriptor{})), rb, nil)
	wantCQE(t, c, nvme.StatusDataSGLLengthInvalid, "deallocate with less data than its ranges")
	// Bad commands get statuses, the queue goes on.
	c = exec(t, io, mc(t)(nvme.ReadCommand(tcpNSID, 2047, 2, 0, nvme.SGLDescriptor{})), nil, make([]byte, 2*target.BlockSize))
	wantCQE(t, c, nvme.StatusLBAOutOfRange, "read beyond the namespace")
	c = exec(t, io, mc(t)(nvme.ReadCommand(9, 0, 1, 0, nvme.SGLDescriptor{})), nil, make([]byte, target.BlockSize))
	wantCQE(t, c, nvme.StatusInvalidNamespaceOrFormat, "read of an inactive namespace")
	c = exec(t, io, nvme.Command{Opcode: 0x7e, NSID: tcpNSID}, nil, nil)
	wantCQE(t, c, nvme.StatusInvalidOpcode, "unknown opcode")
	tcpWriteRead(t, io, 5, 1, 4)

	// nvme disconnect: shutdown, wait for SHST complete, close.
	cc := nvme.CC{EN: true, IOSQES: 6, IOCQES: 4, SHN: nvme.ShutdownNormal}
	wantOK(t, exec(t, h, mc(t)(nvme.PropertySetCommand(nvme.PropCC, 4, uint64(cc.Encode()))), nil, nil), "shutdown")
	if c := exec(t, h, mc(t)(nvme.PropertyGetCommand(nvme.PropCSTS, 4)), nil, nil); nvme.DecodeCSTS(c.DW0).SHST != nvme.ShutdownStatusComplete {
		t.Fatalf("CSTS %#x after shutdown", c.DW0)
	}
	io.Conn.Close()
	h.Conn.Close()
	waitFor(t, "the controller to go", func() bool { return r.tg.Controllers() == 0 })
}

func tcpWriteRead(t testing.TB, h *nvmetcptest.Host, slba uint64, blocks uint32, seed byte) {
	t.Helper()
	data := make([]byte, int(blocks)*target.BlockSize)
	for i := range data {
		data[i] = seed ^ byte(i*31+i>>12)
	}
	wantOK(t, exec(t, h, mc(t)(nvme.WriteCommand(tcpNSID, slba, blocks, 0, nvme.SGLDescriptor{})), data, nil), "write")
	got := make([]byte, len(data))
	wantOK(t, exec(t, h, mc(t)(nvme.ReadCommand(tcpNSID, slba, blocks, 0, nvme.SGLDescriptor{})), nil, got), "read")
	if !bytes.Equal(got, data) {
		t.Fatalf("%d blocks at %d read back differ", blocks, slba)
	}
}

func waitFor(t testing.TB, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestNVMeTCPDiscovery: `nvme discover` against the discovery port and the
// I/O port: a discovery controller whose log points at the NVMe/TCP I/O
// port, read as libnvme reads it (header, entries from offset 1024).
func TestNVMeTCPDiscovery(t *testing.T) {
	r := newTCPRig(t)
	_, ioPort := splitAddr(t, r.tg.NVMeTCPAddr())
	for _, addr := range []string{r.tg.NVMeTCPDiscoveryAddr(), r.tg.NVMeTCPAddr()} {
		h, _ := bringUp(t, addr, 0, nvme.DiscoveryNQN)
		b, c := identify(t, h, nvme.CNSController, 0)
		wantOK(t, c, "identify")
		var id nvme.IdentifyController
		if err := id.Unmarshal(b); err != nil || id.CNTRLTYPE != nvme.ControllerTypeDiscovery || id.SUBNQN != nvme.DiscoveryNQN {
			t.Fatalf("discovery identify %+v %v", id, err)
		}
		hdr := make([]byte, 20)
		wantOK(t, exec(t, h, mc(t)(nvme.GetLogPageCommand(nvme.LogDiscovery, 0, 0, 20, nvme.SGLDescriptor{})), nil, hdr), "log header")
		numrec := int(hdr[8]) | int(hdr[9])<<8
		if numrec != 1 {
			t.Fatalf("%d discovery records, want 1", numrec)
		}
		full := make([]byte, 1024+numrec*1024)
		copy(full, hdr)
		wantOK(t, exec(t, h, mc(t)(nvme.GetLogPageCommand(nvme.LogDiscovery, 0, 1024, 1024, nvme.SGLDescriptor{})), nil, full[1024:]), "log entries")
		log, err := nvme.ParseDiscoveryLog(full)
		if err != nil {
			t.Fatal(err)
		}
		e := log.Entries[0]
		if e.TRTYPE != nvme.TransportTCP || e.ADRFAM != nvme.AddressIPv4 || e.SubNQN != subNQN || e.TRADDR != "127.0.0.1" ||
			e.TRSVCID != ioPort || e.TREQ&3 != nvme.TREQSecureChannelNotRequired || e.CNTLID != nvme.DynamicControllerID || e.ASQSZ < 32 {
			t.Fatalf("discovery entry %+v", e)
		}
		wantOK(t, exec(t, h, nvme.KeepAliveCommand(), nil, nil), "discovery keep alive")
		// A discovery controller serves no I/O subsystem structures.
		_, c = identify(t, h, nvme.CNSNamespace, 1)
		wantCQE(t, c, nvme.StatusInvalidField, "identify namespace on discovery")
		h.Conn.Close()
	}
	// The discovery port serves the discovery NQN only.
	h := nvmetcptest.Dial(t, r.tg.NVMeTCPDiscoveryAddr(), 0)
	c := h.Connect(t, 0, 31, subNQN, hostNQN, 0)
	wantCQE(t, c, nvme.StatusConnectInvalidParameters, "I/O subsystem on the discovery port")
	if p := nvme.DecodeInvalidParameter(c.DW0); !p.InData || p.Offset != nvme.ConnectDataOffsetSubNQN {
		t.Fatalf("blames %+v, want the SUBNQN", p)
	}
	// A host that may access nothing discovers nothing.
	other := nvmetcptest.Dial(t, r.tg.NVMeTCPDiscoveryAddr(), 0)
	d := nvme.ConnectData{CNTLID: nvme.DynamicControllerID, SubNQN: nvme.DiscoveryNQN, HostNQN: "nqn.2026-11.io.nprdma:stranger"}
	raw, _ := d.Marshal()
	wantOK(t, exec(t, other, nvme.ConnectCommand(nvme.ConnectParams{SQSIZE: 31}, nvme.SGLDescriptor{}), raw, nil), "stranger's discovery connect")
	cc := nvme.CC{EN: true, IOSQES: 6, IOCQES: 4}
	exec(t, other, mc(t)(nvme.PropertySetCommand(nvme.PropCC, 4, uint64(cc.Encode()))), nil, nil)
	hdr := make([]byte, 20)
	wantOK(t, exec(t, other, mc(t)(nvme.GetLogPageCommand(nvme.LogDiscovery, 0, 0, 20, nvme.SGLDescriptor{})), nil, hdr), "stranger's log")
	if hdr[8] != 0 {
		t.Fatalf("%d records for a host allowed nothing", hdr[8])
	}
}

func splitAddr(t testing.TB, addr string) (string, string) {
	t.Helper()
	i := len(addr) - 1
	for i >= 0 && addr[i] != ':' {
		i--
	}
	if _, err := strconv.Atoi(addr[i+1:]); err != nil || i < 0 {
		t.Fatalf("address %q", addr)
	}
	return addr[:i], addr[i+1:]
}

// TestNVMeTCPAccessAndLimits: the host NQN allow-list and the limits apply
// over NVMe/TCP exactly as over the nprdma fabric.
func TestNVMeTCPAccessAndLimits(t *testing.T) {
	r := newTCPRig(t, target.WithMaxControllers(2))
	addr := r.tg.NVMeTCPAddr()
	h := nvmetcptest.Dial(t, addr, 0)
	d := nvme.ConnectData{CNTLID: nvme.DynamicControllerID, SubNQN: subNQN, HostNQN: "nqn.2026-11.io.nprdma:stranger"}
	raw, _ := d.Marshal()
	c := exec(t, h, nvme.ConnectCommand(nvme.ConnectParams{SQSIZE: 31, KATO: 5000}, nvme.SGLDescriptor{}), raw, nil)
	if c.Status.SCT() != nvme.SCTCommandSpecific || c.Status.SC() != 0x84 || !c.Status.DNR() {
		t.Fatalf("host not allowed: %v, want Connect Invalid Host (SCT 1 SC 0x84) with DNR", c.Status)
	}
	if n := promtest.Sum(t, r.reg, "nprdma_target_hosts_refused_total"); n != 1 {
		t.Fatalf("hosts refused counted %v", n)
	}
	if n := r.tg.Controllers(); n != 0 {
		t.Fatalf("%d controllers after a refused host", n)
	}
	// SQSIZE above CAP.MQES.
	io := nvmetcptest.Dial(t, addr, 0)
	_, cntlid := bringUp(t, addr, 0, subNQN)
	c = io.Connect(t, 1, uint16(target.DefaultQueueDepth), subNQN, hostNQN, cntlid)
	wantCQE(t, c, nvme.StatusConnectInvalidParameters, "SQSIZE above MQES")
	if p := nvme.DecodeInvalidParameter(c.DW0); p.InData || p.Offset != nvme.ConnectOffsetSQSIZE {
		t.Fatalf("blames %+v, want SQSIZE", p)
	}
	// A queue beyond the grant (none asked for: Number of Queues not set).
	io2 := nvmetcptest.Dial(t, addr, 0)
	c = io2.Connect(t, 5, 31, subNQN, hostNQN, cntlid)
	wantCQE(t, c, nvme.StatusConnectInvalidParameters, "QID beyond the grant")
	// Controllers beyond the limit: Controller Busy.
	bringUp(t, addr, 0, subNQN)
	third := nvmetcptest.Dial(t, addr, 0)
	c = third.Connect(t, 0, 31, subNQN, hostNQN, 0)
	wantCQE(t, c, nvme.StatusControllerBusy, "a third controller")
}

// TestNVMeTCPBesideTheFabric: a host over NVMe/TCP and a host over the
// nprdma fabric share the namespace; an I/O queue cannot join a controller
// of the other transport; the commands of both are counted.
func TestNVMeTCPBesideTheFabric(t *testing.T) {
	r := newTCPRig(t)
	addr := r.tg.NVMeTCPAddr()
	h, cntlid := bringUp(t, addr, 0, subNQN)
	wantOK(t, exec(t, h, nvme.SetFeaturesCommand(nvme.FeatureNumberOfQueues, 0, false), nil, nil), "number of queues")
	io := nvmetcptest.Dial(t, addr, 0)
	wantOK(t, io.Connect(t, 1, 31, subNQN, hostNQN, cntlid), "I/O connect")
	data := bytes.Repeat([]byte("tcp!"), target.BlockSize/4)
	wantOK(t, exec(t, io, mc(t)(nvme.WriteCommand(tcpNSID, 7, 1, 0, nvme.SGLDescriptor{})), data, nil), "write over NVMe/TCP")

	fq, fcntl := r.adminController(t)
	if _, err := fq.Submit(context.Background(), nvme.SetFeaturesCommand(nvme.FeatureNumberOfQueues, 0, false), nil); err != nil {
		t.Fatal(err)
	}
	fio := r.dial(t, 1, 8192)
	if _, err := connectCmd(t, fio, subNQN, fcntl); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, target.BlockSize)
	if _, err := fio.Submit(context.Background(), mc(t)(nvme.ReadCommand(tcpNSID, 7, 1, 0, nvme.NullSGL())), got); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the fabric host reads what the NVMe/TCP host wrote: %v, equal %v", err, bytes.Equal(got, data))
	}
	// The TCP controller's I/O queue over the fabric, and the fabric
	// controller's over NVMe/TCP: refused.
	cross := r.dial(t, 2, 8192)
	_, err := connectCmd(t, cross, subNQN, cntlid)
	wantStatus(t, err, nvme.StatusConnectInvalidParameters)
	tio := nvmetcptest.Dial(t, addr, 0)
	wantCQE(t, tio.Connect(t, 2, 31, subNQN, hostNQN, fcntl), nvme.StatusConnectInvalidParameters, "a fabric controller's queue over NVMe/TCP")
	if n := promtest.Sum(t, r.reg, "nprdma_target_commands_total", "opcode", "write"); n < 1 {
		t.Fatalf("writes counted %v", n)
	}
}

// TestNVMeTCPBadInputEndsThatQueueOnly: a protocol error on one host's I/O
// queue ends that queue with a C2HTermReq; its controller and other hosts
// go on, and a lost admin connection tears its controller down.
func TestNVMeTCPBadInputEndsThatQueueOnly(t *testing.T) {
	r := newTCPRig(t)
	addr := r.tg.NVMeTCPAddr()
	h, cntlid := bringUp(t, addr, tcp.HeaderDigest, subNQN)
	wantOK(t, exec(t, h, nvme.SetFeaturesCommand(nvme.FeatureNumberOfQueues, 0x00010001, false), nil, nil), "number of queues")
	good := nvmetcptest.Dial(t, addr, tcp.HeaderDigest)
	wantOK(t, good.Connect(t, 1, 31, subNQN, hostNQN, cntlid), "I/O connect")
	bad := nvmetcptest.Dial(t, addr, tcp.HeaderDigest)
	wantOK(t, bad.Connect(t, 2, 31, subNQN, hostNQN, cntlid), "I/O connect")
	tcpWriteRead(t, bad, 0, 1, 1)
	b := bad.Encode(func(w *tcp.Writer) { w.CapsuleCmd(&nvme.Command{Opcode: nvme.IOFlush, NSID: tcpNSID}, nil) })
	b[tcp.CapsuleCmdHeaderSize+1] ^= 0x40 // the header digest
	bad.Raw(b)
	if tr := bad.ExpectTermReq(t); tr.FES != tcp.FESHeaderDigestError {
		t.Fatalf("%v, want a header digest error", &tr)
	}
	tcpWriteRead(t, good, 1, 8, 2)
	wantOK(t, exec(t, h, nvme.KeepAliveCommand(), nil, nil), "keep alive after the bad queue")
	// The host may reconnect the queue it lost, once the controller has let
	// it go.
	waitFor(t, "the bad queue to leave its controller", func() bool {
		l := r.tg.ControllerList()
		return len(l) == 1 && l[0].IOQueues == 1
	})
	again := nvmetcptest.Dial(t, addr, tcp.HeaderDigest)
	wantOK(t, again.Connect(t, 2, 31, subNQN, hostNQN, cntlid), "I/O reconnect")
	got := make([]byte, target.BlockSize)
	wantOK(t, exec(t, again, mc(t)(nvme.ReadCommand(tcpNSID, 0, 1, 0, nvme.SGLDescriptor{})), nil, got), "read after reconnect")
	// Losing the admin connection ends the controller and its queues.
	h.Conn.Close()
	waitFor(t, "the controller to go", func() bool { return r.tg.Controllers() == 0 })
	good.ExpectClosed(t)
}

// TestNVMeTCPKeepAliveTimeout: a controller whose host stops sending Keep
// Alive is torn down, its NVMe/TCP queues closed.
func TestNVMeTCPKeepAliveTimeout(t *testing.T) {
	r := newTCPRig(t)
	h := nvmetcptest.Dial(t, r.tg.NVMeTCPAddr(), 0)
	d := nvme.ConnectData{CNTLID: nvme.DynamicControllerID, SubNQN: subNQN, HostNQN: hostNQN}
	raw, _ := d.Marshal()
	wantOK(t, exec(t, h, nvme.ConnectCommand(nvme.ConnectParams{SQSIZE: 31, KATO: 300}, nvme.SGLDescriptor{}), raw, nil), "connect")
	h.ExpectClosed(t)
	waitFor(t, "the controller to go", func() bool { return r.tg.Controllers() == 0 })
	if n := promtest.Sum(t, r.reg, "nprdma_target_keepalive_expired_total"); n != 1 {
		t.Fatalf("keep-alive expiries counted %v", n)
	}
}
