package target_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/blockdev"
	"github.com/nprdma/nprdma/internal/promtest"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/fabric"
	"github.com/nprdma/nprdma/target"
	"github.com/prometheus/client_golang/prometheus"
)

const (
	subNQN  = "nqn.2026-11.io.nprdma:admin-test"
	hostNQN = "nqn.2026-11.io.nprdma:host"
)

type adminRig struct {
	tg  *target.Target
	pd  *nprdma.PD
	reg *prometheus.Registry
}

func newAdminRig(t testing.TB) *adminRig {
	t.Helper()
	f := loop.NewFabric()
	return newRig(t, loop.New(loop.WithFabric(f)), loop.New(loop.WithFabric(f)), "admin-test", nil)
}

// newRig starts a target on provider tp listening at listen, with one
// subsystem holding an 8 MiB namespace 3 (its backing wrapped by wrap, if
// not nil), and a host device on hp; opts come after the rig's own.
func newRig(t testing.TB, tp, hp nprdma.Provider, listen string, wrap func(blockdev.Device) blockdev.Device, opts ...target.Option) *adminRig {
	t.Helper()
	reg := prometheus.NewRegistry()
	tg, err := target.New(append([]target.Option{target.WithProvider(tp), target.WithListen(listen),
		target.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), target.WithMetrics(reg),
		target.WithMaxIOQueues(4), target.WithDataDir(filepath.Join(t.TempDir(), "meta"))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := tg.AddSubsystem(target.SubsystemConfig{NQN: subNQN, AllowHosts: []string{hostNQN}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ns.img")
	if err := blockdev.Create(path, 8<<20); err != nil {
		t.Fatal(err)
	}
	var dev blockdev.Device
	if dev, err = blockdev.Open(path); err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		dev = wrap(dev)
	}
	if _, err := sub.AddNamespace(target.NamespaceConfig{NSID: 3, Backing: dev}); err != nil {
		t.Fatal(err)
	}
	if err := tg.Start(); err != nil {
		t.Fatal(err)
	}
	cdev := nprdma.NewDevice(hp, nprdma.WithPinning(false))
	t.Cleanup(func() {
		tg.Close()
		cdev.Close()
	})
	return &adminRig{tg: tg, pd: cdev.AllocPD(), reg: reg}
}

func (r *adminRig) dial(t testing.TB, qid uint16, icd int) *fabric.HostQueue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q, err := fabric.Dial(ctx, r.pd, r.tg.Addr(), fabric.QueueConfig{QID: qid, Entries: 32, InCapsuleData: icd})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

func connectCmd(t testing.TB, q *fabric.HostQueue, sub string, cntlid uint16) (nvme.Completion, error) {
	t.Helper()
	return connectWith(t, q, nvme.ConnectData{CNTLID: cntlid, SubNQN: sub, HostNQN: hostNQN})
}

func connectWith(t testing.TB, q *fabric.HostQueue, d nvme.ConnectData) (nvme.Completion, error) {
	t.Helper()
	raw, err := d.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	cmd := nvme.ConnectCommand(nvme.ConnectParams{QID: q.QID(), SQSIZE: uint16(q.Entries() - 1), KATO: 60000}, nvme.NullSGL())
	return q.Submit(context.Background(), cmd, raw)
}

// mc unwraps a command builder's result.
func mc(t testing.TB) func(nvme.Command, error) nvme.Command {
	return func(c nvme.Command, err error) nvme.Command {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
}

func wantStatus(t *testing.T, err error, want nvme.Status) *nvme.StatusError {
	t.Helper()
	var se *nvme.StatusError
	if !errors.Is(err, want) || !errors.As(err, &se) {
		t.Fatalf("got %v, want %s", err, want)
	}
	return se
}

// adminController connects and enables a controller on a fresh admin queue.
func (r *adminRig) adminController(t testing.TB) (*fabric.HostQueue, uint16) {
	t.Helper()
	q := r.dial(t, 0, 0)
	cqe, err := connectCmd(t, q, subNQN, nvme.DynamicControllerID)
	if err != nil {
		t.Fatal(err)
	}
	cntlid := nvme.DecodeConnectResponse(cqe.DW0).CNTLID
	cc := nvme.CC{EN: true, IOSQES: 6, IOCQES: 4}
	if _, err := q.Submit(context.Background(), mc(t)(nvme.PropertySetCommand(nvme.PropCC, 4, uint64(cc.Encode()))), nil); err != nil {
		t.Fatal(err)
	}
	return q, cntlid
}

func TestConnectErrors(t *testing.T) {
	r := newAdminRig(t)
	q := r.dial(t, 0, 0)
	// Nothing but Connect before Connect.
	_, err := q.Submit(context.Background(), nvme.KeepAliveCommand(), nil)
	wantStatus(t, err, nvme.StatusInvalidOpcode)

	_, err = connectCmd(t, q, "nqn.2026-11.io.nprdma:nope", nvme.DynamicControllerID)
	se := wantStatus(t, err, nvme.StatusConnectInvalidParameters)
	if p := nvme.DecodeInvalidParameter(se.Result); !p.InData || p.Offset != nvme.ConnectDataOffsetSubNQN {
		t.Fatalf("unknown subsystem blames %+v, want the SUBNQN in the data", p)
	}
	_, err = connectCmd(t, q, subNQN, 5)
	se = wantStatus(t, err, nvme.StatusConnectInvalidParameters)
	if p := nvme.DecodeInvalidParameter(se.Result); !p.InData || p.Offset != nvme.ConnectDataOffsetCNTLID {
		t.Fatalf("static CNTLID blames %+v", p)
	}
	if n := r.tg.Controllers(); n != 0 {
		t.Fatalf("%d controllers after failed connects", n)
	}
	// An I/O queue for a controller that does not exist.
	io := r.dial(t, 1, 8192)
	_, err = connectCmd(t, io, subNQN, 77)
	se = wantStatus(t, err, nvme.StatusConnectInvalidParameters)
	if p := nvme.DecodeInvalidParameter(se.Result); p.Offset != nvme.ConnectDataOffsetCNTLID {
		t.Fatalf("unknown controller blames %+v", p)
	}
}

func TestAdminCommands(t *testing.T) {
	r := newAdminRig(t)
	q := r.dial(t, 0, 0)
	cqe, err := connectCmd(t, q, subNQN, nvme.DynamicControllerID)
	if err != nil {
		t.Fatal(err)
	}
	cntlid := nvme.DecodeConnectResponse(cqe.DW0).CNTLID
	// Before CC.EN: only properties.
	_, err = q.Submit(context.Background(), nvme.IdentifyCommand(nvme.CNSController, 0, nvme.NullSGL()), make([]byte, 4096))
	wantStatus(t, err, nvme.StatusCommandSequenceError)
	cqe, err = q.Submit(context.Background(), mc(t)(nvme.PropertyGetCommand(nvme.PropCAP, 8)), nil)
	if err != nil {
		t.Fatal(err)
	}
	capv := nvme.DecodeCAP(cqe.Result64())
	if !capv.CQR || capv.CSS&nvme.CSSNVM == 0 || capv.MaxQueueEntries() != target.DefaultQueueDepth {
		t.Fatalf("CAP %+v", capv)
	}
	_, err = q.Submit(context.Background(), mc(t)(nvme.PropertyGetCommand(0x40, 4)), nil)
	wantStatus(t, err, nvme.StatusInvalidField)
	cc := nvme.CC{EN: true, IOSQES: 6, IOCQES: 4}
	if _, err := q.Submit(context.Background(), mc(t)(nvme.PropertySetCommand(nvme.PropCC, 4, uint64(cc.Encode()))), nil); err != nil {
		t.Fatal(err)
	}
	cqe, err = q.Submit(context.Background(), mc(t)(nvme.PropertyGetCommand(nvme.PropCSTS, 4)), nil)
	if err != nil || !nvme.DecodeCSTS(cqe.DW0).RDY {
		t.Fatalf("CSTS after enable: %#x %v", cqe.DW0, err)
	}

	buf := make([]byte, 4096)
	if _, err := q.Submit(context.Background(), nvme.IdentifyCommand(nvme.CNSController, 0, nvme.NullSGL()), buf); err != nil {
		t.Fatal(err)
	}
	var id nvme.IdentifyController
	if err := id.Unmarshal(buf); err != nil {
		t.Fatal(err)
	}
	if id.CNTLID != cntlid || id.SUBNQN != subNQN || id.NN != 3 || id.SGLS&nvme.SGLSKeyedDataBlock == 0 ||
		nvme.ICDLimit(id.IOCCSZ) != target.DefaultInCapsuleData || id.KAS == 0 || id.VWC&nvme.VWCPresent == 0 ||
		id.MaxTransfer(4096) != target.DefaultMaxTransferBytes || len(id.SN) != 20 {
		t.Fatalf("identify controller: %+v", id)
	}
	if _, err := q.Submit(context.Background(), nvme.IdentifyCommand(nvme.CNSNamespace, 3, nvme.NullSGL()), buf); err != nil {
		t.Fatal(err)
	}
	var ns nvme.IdentifyNamespace
	ns.Unmarshal(buf)
	if bs, _ := ns.BlockSize(); ns.NSZE != 2048 || bs != 4096 || ns.NGUID == ([16]byte{}) {
		t.Fatalf("identify namespace: %+v", ns)
	}
	if _, err := q.Submit(context.Background(), nvme.IdentifyCommand(nvme.CNSNamespace, 4, nvme.NullSGL()), buf); err != nil || !allZero(buf) {
		t.Fatalf("inactive namespace: not all zero (%v)", err)
	}
	if _, err := q.Submit(context.Background(), nvme.IdentifyCommand(nvme.CNSActiveNamespaces, 0, nvme.NullSGL()), buf); err != nil {
		t.Fatal(err)
	}
	if l, _ := nvme.ParseNamespaceList(buf); len(l) != 1 || l[0] != 3 {
		t.Fatalf("active list %v", l)
	}
	if _, err := q.Submit(context.Background(), nvme.IdentifyCommand(nvme.CNSNamespaceDescriptors, 3, nvme.NullSGL()), buf); err != nil {
		t.Fatal(err)
	}
	var ids nvme.NamespaceIDs
	if err := ids.Unmarshal(buf); err != nil || ids.NGUID != ns.NGUID || ids.UUID == (nvme.UUID{}) {
		t.Fatalf("descriptors %+v %v", ids, err)
	}
	_, err = q.Submit(context.Background(), nvme.IdentifyCommand(0x7, 0, nvme.NullSGL()), buf)
	wantStatus(t, err, nvme.StatusInvalidField)

	// Log pages, with an offset.
	smart := make([]byte, 512)
	if _, err := q.Submit(context.Background(), mc(t)(nvme.GetLogPageCommand(nvme.LogSMARTHealth, nvme.BroadcastNSID, 0, 512, nvme.NullSGL())), smart); err != nil {
		t.Fatal(err)
	}
	var h nvme.HealthLog
	if err := h.Unmarshal(smart); err != nil || h.CompositeTemperature != nvme.DefaultCompositeTemperature {
		t.Fatalf("health log %+v %v", h, err)
	}
	part := make([]byte, 8)
	if _, err := q.Submit(context.Background(), mc(t)(nvme.GetLogPageCommand(nvme.LogCommandEffects, 0, 4*uint64(nvme.AdminIdentify), 8, nvme.NullSGL())), part); err != nil || part[0]&1 == 0 {
		t.Fatalf("command effects at an offset: %x %v", part, err)
	}
	_, err = q.Submit(context.Background(), mc(t)(nvme.GetLogPageCommand(0x42, 0, 0, 512, nvme.NullSGL())), smart)
	wantStatus(t, err, nvme.StatusInvalidField)

	// Features.
	nq, _ := nvme.NumberOfQueues{Submission: 16, Completion: 16}.Encode()
	cqe, err = q.Submit(context.Background(), nvme.SetFeaturesCommand(nvme.FeatureNumberOfQueues, nq, false), nil)
	if g, _ := nvme.DecodeNumberOfQueues(cqe.DW0); err != nil || g.IOQueues() != 4 {
		t.Fatalf("number of queues granted %+v %v (want the limit, 4)", g, err)
	}
	nq, _ = nvme.NumberOfQueues{Submission: 2, Completion: 2}.Encode()
	cqe, err = q.Submit(context.Background(), nvme.SetFeaturesCommand(nvme.FeatureNumberOfQueues, nq, false), nil)
	if g, _ := nvme.DecodeNumberOfQueues(cqe.DW0); err != nil || g.IOQueues() != 2 {
		t.Fatalf("number of queues granted %+v %v (want 2)", g, err)
	}
	cqe, err = q.Submit(context.Background(), nvme.GetFeaturesCommand(nvme.FeatureKeepAliveTimer, nvme.SelectCurrent, 0), nil)
	if err != nil || cqe.DW0 != 60000 {
		t.Fatalf("KATO %d %v", cqe.DW0, err)
	}
	cqe, err = q.Submit(context.Background(), nvme.GetFeaturesCommand(nvme.FeatureVolatileWriteCache, nvme.SelectCurrent, 0), nil)
	if err != nil || !nvme.VolatileWriteCacheEnabled(cqe.DW0) {
		t.Fatalf("VWC %d %v", cqe.DW0, err)
	}
	if _, err = q.Submit(context.Background(), nvme.SetFeaturesCommand(nvme.FeatureAsyncEventConfig, uint32(nvme.AECNamespaceAttribute), false), nil); err != nil {
		t.Fatalf("enabling namespace attribute notices: %v", err)
	}
	cqe, err = q.Submit(context.Background(), nvme.GetFeaturesCommand(nvme.FeatureAsyncEventConfig, nvme.SelectCurrent, 0), nil)
	if err != nil || cqe.DW0 != uint32(nvme.AECNamespaceAttribute) {
		t.Fatalf("async event configuration %#x %v", cqe.DW0, err)
	}
	_, err = q.Submit(context.Background(), nvme.SetFeaturesCommand(nvme.FeatureAsyncEventConfig, uint32(nvme.AECFirmwareActivation), false), nil)
	wantStatus(t, err, nvme.StatusInvalidField)
	_, err = q.Submit(context.Background(), nvme.SetFeaturesCommand(nvme.FeatureArbitration, 0, false), nil)
	wantStatus(t, err, nvme.StatusInvalidField)
	_, err = q.Submit(context.Background(), nvme.SetFeaturesCommand(nvme.FeatureKeepAliveTimer, 0, false), nil)
	wantStatus(t, err, nvme.StatusKeepAliveTimeoutInvalid)

	// Abort: not aborted.
	cqe, err = q.Submit(context.Background(), nvme.Command{Opcode: nvme.AdminAbort, Flags: nvme.FlagsSGL, DPTR: nvme.NullSGL()}, nil)
	if err != nil || cqe.DW0&1 != 1 {
		t.Fatalf("abort %+v %v", cqe, err)
	}
	// Unknown admin opcode.
	_, err = q.Submit(context.Background(), nvme.Command{Opcode: 0xc7, Flags: nvme.FlagsSGL, DPTR: nvme.NullSGL()}, nil)
	wantStatus(t, err, nvme.StatusInvalidOpcode)

	// NP Get Region Descriptor.
	desc := make([]byte, nvme.RegionDescriptorSize)
	if _, err := q.Submit(context.Background(), nvme.NPGetRegionDescriptorCommand(3, nvme.NullSGL()), desc); err != nil {
		t.Fatal(err)
	}
	d, err := nvme.ParseRegionDescriptor(desc)
	if err != nil || d.Length != 8<<20 || d.Flags&nvme.RegionUnpinned == 0 || d.RKey == 0 {
		t.Fatalf("region descriptor %+v %v", d, err)
	}
	_, err = q.Submit(context.Background(), nvme.NPGetRegionDescriptorCommand(9, nvme.NullSGL()), desc)
	wantStatus(t, err, nvme.StatusInvalidNamespaceOrFormat)
	bad := nvme.NPGetRegionDescriptorCommand(3, nvme.NullSGL())
	bad.CDW10 = 3 // a format nobody knows
	_, err = q.Submit(context.Background(), bad, desc)
	wantStatus(t, err, nvme.StatusInvalidField)

	// An I/O queue beyond the grant is refused, one inside it connects.
	io3 := r.dial(t, 3, 8192)
	_, err = connectCmd(t, io3, subNQN, cntlid)
	se := wantStatus(t, err, nvme.StatusConnectInvalidParameters)
	if p := nvme.DecodeInvalidParameter(se.Result); p.InData || p.Offset != nvme.ConnectOffsetQID {
		t.Fatalf("QID beyond grant blames %+v", p)
	}
	io1 := r.dial(t, 1, 8192)
	if _, err := connectCmd(t, io1, subNQN, cntlid); err != nil {
		t.Fatal(err)
	}
	io1b := r.dial(t, 1, 8192)
	_, err = connectCmd(t, io1b, subNQN, cntlid)
	wantStatus(t, err, nvme.StatusCommandSequenceError)

	// Async events: AERL+1 = 4 are parked, a fifth is refused.
	aerErrs := make(chan error, 5)
	for i := 0; i < 5; i++ {
		go func() {
			_, err := q.Submit(context.Background(), nvme.AsyncEventRequestCommand(), nil)
			aerErrs <- err
		}()
	}
	select {
	case err := <-aerErrs:
		wantStatus(t, err, nvme.StatusAsyncEventLimitExceeded)
	case <-time.After(10 * time.Second):
		t.Fatal("no async event request was refused beyond the limit")
	}
	select {
	case err := <-aerErrs:
		t.Fatalf("a parked async event request completed: %v", err)
	case <-time.After(50 * time.Millisecond):
	}

	// Shutdown handshake.
	cc.SHN = nvme.ShutdownNormal
	if _, err := q.Submit(context.Background(), mc(t)(nvme.PropertySetCommand(nvme.PropCC, 4, uint64(cc.Encode()))), nil); err != nil {
		t.Fatal(err)
	}
	cqe, _ = q.Submit(context.Background(), mc(t)(nvme.PropertyGetCommand(nvme.PropCSTS, 4)), nil)
	if nvme.DecodeCSTS(cqe.DW0).SHST != nvme.ShutdownStatusComplete {
		t.Fatalf("CSTS after shutdown %#x", cqe.DW0)
	}

	// The command metrics moved.
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var identifyOK, invalidOpcode float64
	for _, mf := range mfs {
		if mf.GetName() != "nprdma_target_commands_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["opcode"] == "identify" && labels["status"] == "success" {
				identifyOK = m.GetCounter().GetValue()
			}
			if strings.HasPrefix(labels["opcode"], "admin-0xc7") && labels["status"] == "invalid command opcode" {
				invalidOpcode = m.GetCounter().GetValue()
			}
		}
	}
	if identifyOK < 5 || invalidOpcode != 1 {
		t.Fatalf("commands_total: identify/success %v, admin-0xc7/invalid opcode %v", identifyOK, invalidOpcode)
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// A host that gives up on a controller names it in the Connect of its
// replacement (nvme.NPControllerRef) and the target tears it down at once.
// Only the host's own controller, named with its token, goes: a wrong
// token (a CNTLID reused since) or another host ID leaves it serving.
func TestConnectReplacesTheHostsOwnController(t *testing.T) {
	r := newAdminRig(t)
	ctx := context.Background()
	identify := func(q *fabric.HostQueue) nvme.IdentifyController {
		t.Helper()
		buf := make([]byte, nvme.IdentifySize)
		if _, err := q.Submit(ctx, nvme.IdentifyCommand(nvme.CNSController, 0, nvme.NullSGL()), buf); err != nil {
			t.Fatal(err)
		}
		var id nvme.IdentifyController
		if err := id.Unmarshal(buf); err != nil {
			t.Fatal(err)
		}
		return id
	}
	q1, id1 := r.adminController(t)
	token := identify(q1).NPToken
	if token == 0 {
		t.Fatal("Identify Controller reports no controller token")
	}
	alive := func(what string) {
		t.Helper()
		if _, err := q1.Submit(ctx, nvme.KeepAliveCommand(), nil); err != nil {
			t.Fatalf("%s: the named controller stopped serving: %v", what, err)
		}
		if got := promtest.Sum(t, r.reg, "nprdma_target_controllers_replaced_total"); got != 0 {
			t.Fatalf("%s: %v controllers replaced, want 0", what, got)
		}
	}
	for _, tc := range []struct {
		what string
		d    nvme.ConnectData
	}{
		{"wrong token", nvme.ConnectData{Replaces: nvme.NPControllerRef{Token: token ^ 2, CNTLID: id1}}},
		{"other host ID", nvme.ConnectData{HostID: nvme.UUID{1}, Replaces: nvme.NPControllerRef{Token: token, CNTLID: id1}}},
		{"other CNTLID", nvme.ConnectData{Replaces: nvme.NPControllerRef{Token: token, CNTLID: id1 + 100}}},
	} {
		tc.d.CNTLID, tc.d.SubNQN, tc.d.HostNQN = nvme.DynamicControllerID, subNQN, hostNQN
		if _, err := connectWith(t, r.dial(t, 0, 0), tc.d); err != nil {
			t.Fatalf("%s: connect: %v", tc.what, err)
		}
		alive(tc.what)
	}
	q2 := r.dial(t, 0, 0)
	cqe, err := connectWith(t, q2, nvme.ConnectData{CNTLID: nvme.DynamicControllerID, SubNQN: subNQN, HostNQN: hostNQN,
		Replaces: nvme.NPControllerRef{Token: token, CNTLID: id1}})
	if err != nil {
		t.Fatal(err)
	}
	if id2 := nvme.DecodeConnectResponse(cqe.DW0).CNTLID; id2 == id1 {
		t.Fatalf("the replacement got the replaced controller's ID %d", id1)
	}
	if got := promtest.Sum(t, r.reg, "nprdma_target_controllers_replaced_total"); got != 1 {
		t.Fatalf("%v controllers replaced, want 1", got)
	}
	// Stopped and fenced before the replacement's Connect completed; its
	// queues close right after.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, err := q1.Submit(ctx, nvme.KeepAliveCommand(), nil); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the replaced controller still serves after 10 s")
		}
	}
	cc := nvme.CC{EN: true, IOSQES: 6, IOCQES: 4}
	if _, err := q2.Submit(ctx, mc(t)(nvme.PropertySetCommand(nvme.PropCC, 4, uint64(cc.Encode()))), nil); err != nil {
		t.Fatal(err)
	}
	if tok2 := identify(q2).NPToken; tok2 == 0 || tok2 == token {
		t.Fatalf("the replacement's token %#x (the replaced one's %#x)", tok2, token)
	}
}
