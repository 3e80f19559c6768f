package target_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nprdma/nprdma/internal/nvmetcptest"
	"github.com/nprdma/nprdma/internal/promtest"
	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nprdma/loop"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/dhchap"
	"github.com/nprdma/nprdma/nvme/fabric"
	"github.com/nprdma/nprdma/target"
)

// testKeyring is a Keyring whose secrets a test replaces.
type testKeyring struct {
	mu    sync.Mutex
	creds map[string]dhchap.Credentials // by host NQN
}

func (k *testKeyring) DHCHAP(sub, host string) (dhchap.Credentials, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	c, ok := k.creds[host]
	return c, ok
}

func (k *testKeyring) set(host string, c dhchap.Credentials) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.creds[host] = c
}

// queueExchanger carries DH-HMAC-CHAP messages over a host queue.
type queueExchanger struct{ q *fabric.HostQueue }

func (x queueExchanger) Send(ctx context.Context, msg []byte) error {
	_, err := x.q.Submit(ctx, nvme.AuthSendCommand(uint32(len(msg)), nvme.NullSGL()), msg)
	return err
}

func (x queueExchanger) Receive(ctx context.Context, al int) ([]byte, error) {
	b := make([]byte, al)
	_, err := x.q.Submit(ctx, nvme.AuthReceiveCommand(uint32(al), nvme.NullSGL()), b)
	return b, err
}

func secret(t testing.TB) *dhchap.Secret {
	t.Helper()
	s, err := dhchap.GenerateSecret(dhchap.HashSHA256, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

type authRig struct {
	*adminRig
	keys *testKeyring
	log  *syncBuffer
}

func newAuthRig(t *testing.T, opts ...target.Option) *authRig {
	f := loop.NewFabric()
	keys := &testKeyring{creds: map[string]dhchap.Credentials{}}
	log := &syncBuffer{}
	opts = append([]target.Option{target.WithKeyring(keys), target.WithLogger(slog.New(slog.NewTextHandler(log, nil)))}, opts...)
	r := newRig(t, loop.New(loop.WithFabric(f)), loop.New(loop.WithFabric(f)), "auth-test", nil, opts...)
	return &authRig{adminRig: r, keys: keys, log: log}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// tcpExchanger carries DH-HMAC-CHAP messages over a raw NVMe/TCP host
// queue (the messages in the capsule, as Linux sends them).
type tcpExchanger struct{ h *nvmetcptest.Host }

func (x tcpExchanger) Send(ctx context.Context, msg []byte) error {
	c, err := x.h.Exec(nvme.AuthSendCommand(uint32(len(msg)), nvme.SGLDescriptor{}), msg, nil)
	if err != nil {
		return err
	}
	return c.Err()
}

func (x tcpExchanger) Receive(ctx context.Context, al int) ([]byte, error) {
	b := make([]byte, al)
	c, err := x.h.Exec(nvme.AuthReceiveCommand(uint32(al), nvme.SGLDescriptor{}), nil, b)
	if err != nil {
		return nil, err
	}
	return b, c.Err()
}

func authenticate(t *testing.T, q *fabric.HostQueue, host, ctrl *dhchap.Secret) error {
	t.Helper()
	return authenticateOver(t, queueExchanger{q}, host, ctrl)
}

func authenticateOver(t *testing.T, x dhchap.Exchanger, host, ctrl *dhchap.Secret) error {
	t.Helper()
	h, err := dhchap.NewHost(hostNQN, subNQN, host, ctrl)
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.Authenticate(context.Background(), x, 1)
	return err
}

func enable(t *testing.T, q *fabric.HostQueue) {
	t.Helper()
	cc := nvme.CC{EN: true, IOSQES: 6, IOCQES: 4}
	if _, err := q.Submit(context.Background(), mc(t)(nvme.PropertySetCommand(nvme.PropCC, 4, uint64(cc.Encode()))), nil); err != nil {
		t.Fatal(err)
	}
}

// TestAuthenticationRequiredBeforeAnything connects a host that has a
// secret: Connect answers ATR, every command but Authentication Send and
// Receive gets Authentication Required (DNR) on the admin and the I/O
// queue until the queue authenticated, bidirectionally, and everything
// works after.
func TestAuthenticationRequiredBeforeAnything(t *testing.T) {
	r := newAuthRig(t)
	host, ctrl := secret(t), secret(t)
	r.keys.set(hostNQN, dhchap.Credentials{Host: host, Controller: ctrl})
	q := r.dial(t, 0, 0)
	cqe, err := connectCmd(t, q, subNQN, nvme.DynamicControllerID)
	if err != nil {
		t.Fatal(err)
	}
	resp := nvme.DecodeConnectResponse(cqe.DW0)
	if !resp.AuthRequired {
		t.Fatalf("connect response %+v: no ATR for a host with a secret", resp)
	}
	ctx := context.Background()
	for name, cmd := range map[string]nvme.Command{
		"property get":      mc(t)(nvme.PropertyGetCommand(nvme.PropCAP, 8)),
		"property set":      mc(t)(nvme.PropertySetCommand(nvme.PropCC, 4, 1)),
		"keep alive":        nvme.KeepAliveCommand(),
		"identify":          nvme.IdentifyCommand(nvme.CNSController, 0, nvme.NullSGL()),
		"region descriptor": nvme.NPGetRegionDescriptorCommand(3, nvme.NullSGL()),
	} {
		var data []byte
		if cmd.Direction() == nvme.ControllerToHost {
			data = make([]byte, 4096)
			if cmd.Opcode == nvme.AdminNPGetRegionDescriptor {
				data = make([]byte, nvme.RegionDescriptorSize)
			}
		}
		_, err := q.Submit(ctx, cmd, data)
		if se := wantStatus(t, err, nvme.StatusAuthenticationRequired); !se.Status.DNR() {
			t.Fatalf("%s: %v without DNR", name, err)
		}
		if !bytes.Equal(data, make([]byte, len(data))) {
			t.Fatalf("%s: data came back before authentication", name)
		}
	}
	if err := authenticate(t, q, host, ctrl); err != nil {
		t.Fatal(err)
	}
	enable(t, q)
	if _, err := q.Submit(ctx, nvme.NPGetRegionDescriptorCommand(3, nvme.NullSGL()), make([]byte, nvme.RegionDescriptorSize)); err != nil {
		t.Fatalf("region descriptor after authentication: %v", err)
	}
	if _, err := q.Submit(ctx, nvme.SetFeaturesCommand(nvme.FeatureNumberOfQueues, 0, false), nil); err != nil {
		t.Fatal(err)
	}
	io := r.dial(t, 1, 8192)
	cqe, err = connectCmd(t, io, subNQN, resp.CNTLID)
	if err != nil || !nvme.DecodeConnectResponse(cqe.DW0).AuthRequired {
		t.Fatalf("I/O connect: %#x %v, want ATR", cqe.DW0, err)
	}
	buf := make([]byte, 4096)
	_, err = io.Submit(ctx, mc(t)(nvme.ReadCommand(3, 0, 1, 0, nvme.NullSGL())), buf)
	wantStatus(t, err, nvme.StatusAuthenticationRequired)
	if err := authenticate(t, io, host, ctrl); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Submit(ctx, mc(t)(nvme.ReadCommand(3, 0, 1, 0, nvme.NullSGL())), buf); err != nil {
		t.Fatalf("read after authentication: %v", err)
	}
	if got := promtest.Sum(t, r.reg, "nprdma_target_authentications_total"); got != 2 {
		t.Fatalf("authentications_total %v, want 2", got)
	}
	if strings.Contains(r.log.String(), host.Encode()[10:30]) || strings.Contains(r.log.String(), ctrl.Encode()[10:30]) {
		t.Fatal("a secret is in the log")
	}
}

// TestFailedAuthenticationTearsControllerDown: a wrong secret gets
// AUTH_Failure1, the controller goes, nothing was served, and the log names
// the host without any secret.
func TestFailedAuthenticationTearsControllerDown(t *testing.T) {
	r := newAuthRig(t)
	right := secret(t)
	r.keys.set(hostNQN, dhchap.Credentials{Host: right})
	q := r.dial(t, 0, 0)
	if _, err := connectCmd(t, q, subNQN, nvme.DynamicControllerID); err != nil {
		t.Fatal(err)
	}
	wrong := secret(t)
	if err := authenticate(t, q, wrong, nil); !errors.Is(err, dhchap.ErrRejected) {
		t.Fatalf("wrong secret: %v, want dhchap.ErrRejected", err)
	}
	waitFor(t, "the controller torn down", func() bool { return r.tg.Controllers() == 0 })
	<-q.Done()
	if got := promtest.Sum(t, r.reg, "nprdma_target_authentications_total"); got != 1 {
		t.Fatalf("authentications_total %v, want 1 (a failure)", got)
	}
	log := r.log.String()
	if !strings.Contains(log, "host failed to authenticate") || !strings.Contains(log, hostNQN) {
		t.Fatalf("no warning naming the host in %q", log)
	}
	for _, s := range []*dhchap.Secret{right, wrong} {
		if strings.Contains(log, s.Encode()[10:30]) {
			t.Fatal("a secret is in the log")
		}
	}
}

// TestUnauthenticatedQueueTimesOut: a host that connects and never
// authenticates loses its controller after the authentication timeout.
func TestUnauthenticatedQueueTimesOut(t *testing.T) {
	r := newAuthRig(t, target.WithAuthTimeout(200*time.Millisecond))
	r.keys.set(hostNQN, dhchap.Credentials{Host: secret(t)})
	q := r.dial(t, 0, 0)
	if _, err := connectCmd(t, q, subNQN, nvme.DynamicControllerID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the controller torn down", func() bool { return r.tg.Controllers() == 0 })
	<-q.Done()
	if !strings.Contains(r.log.String(), "did not authenticate in time") {
		t.Fatal("no warning")
	}
}

// TestReauthenticationUsesReplacedSecret: an authenticated queue keeps
// working after its host's secret is replaced; a re-authentication with the
// new secret succeeds, one with the old secret fails and ends the
// controller.
func TestReauthenticationUsesReplacedSecret(t *testing.T) {
	r := newAuthRig(t)
	old := secret(t)
	r.keys.set(hostNQN, dhchap.Credentials{Host: old})
	q := r.dial(t, 0, 0)
	if _, err := connectCmd(t, q, subNQN, nvme.DynamicControllerID); err != nil {
		t.Fatal(err)
	}
	if err := authenticate(t, q, old, nil); err != nil {
		t.Fatal(err)
	}
	enable(t, q)
	replaced := secret(t)
	r.keys.set(hostNQN, dhchap.Credentials{Host: replaced})
	if _, err := q.Submit(context.Background(), nvme.KeepAliveCommand(), nil); err != nil {
		t.Fatalf("an authenticated queue after the replacement: %v", err)
	}
	if err := authenticate(t, q, replaced, nil); err != nil {
		t.Fatalf("re-authentication with the new secret: %v", err)
	}
	if err := authenticate(t, q, old, nil); !errors.Is(err, dhchap.ErrRejected) {
		t.Fatalf("re-authentication with the old secret: %v", err)
	}
	_, err := q.Submit(context.Background(), nvme.KeepAliveCommand(), nil)
	if !errors.Is(err, nvme.StatusAuthenticationRequired) && !errors.Is(err, fabric.ErrQueueFailed) {
		t.Fatalf("after a failed re-authentication: %v", err)
	}
	waitFor(t, "the controller torn down", func() bool { return r.tg.Controllers() == 0 })
	if got := promtest.Sum(t, r.reg, "nprdma_target_authentications_total"); got != 3 {
		t.Fatalf("authentications_total %v, want 3", got)
	}
}

// TestHostWithoutSecretConnectsWithoutATR: hosts the keyring has no secret
// for are admitted as before.
func TestHostWithoutSecretConnectsWithoutATR(t *testing.T) {
	r := newAuthRig(t)
	q, _ := r.adminController(t)
	cqe, err := q.Submit(context.Background(), nvme.IdentifyCommand(nvme.CNSController, 0, nvme.NullSGL()), make([]byte, 4096))
	if err != nil {
		t.Fatalf("identify: %#x %v", cqe.DW0, err)
	}
}

// TestImpostorIOQueueGetsNothing: a peer that claims an authenticated
// host's NQN joins an I/O queue to that host's controller (a queue ID the
// host left free) without the secret: its Read gets Authentication
// Required, and a one-sided READ with the host's own rkey on its queue
// pair is a remote access error; nothing lands in its buffers. The same
// key works on the host's authenticated queue.
func TestImpostorIOQueueGetsNothing(t *testing.T) {
	r := newAuthRig(t)
	host := secret(t)
	r.keys.set(hostNQN, dhchap.Credentials{Host: host})
	ctx := context.Background()
	admin := r.dial(t, 0, 0)
	cqe, err := connectCmd(t, admin, subNQN, nvme.DynamicControllerID)
	if err != nil {
		t.Fatal(err)
	}
	cntlid := nvme.DecodeConnectResponse(cqe.DW0).CNTLID
	if err := authenticate(t, admin, host, nil); err != nil {
		t.Fatal(err)
	}
	enable(t, admin)
	nq, _ := nvme.NumberOfQueues{Submission: 2, Completion: 2}.Encode()
	if _, err := admin.Submit(ctx, nvme.SetFeaturesCommand(nvme.FeatureNumberOfQueues, nq, false), nil); err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, nvme.RegionDescriptorSize)
	if _, err := admin.Submit(ctx, nvme.NPGetRegionDescriptorCommand(3, nvme.NullSGL()), raw); err != nil {
		t.Fatal(err)
	}
	desc, err := nvme.ParseRegionDescriptor(raw)
	if err != nil {
		t.Fatal(err)
	}
	io1 := r.dial(t, 1, 8192)
	if _, err := connectCmd(t, io1, subNQN, cntlid); err != nil {
		t.Fatal(err)
	}
	if err := authenticate(t, io1, host, nil); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("secret data!"), 4096/12+1)[:4096]
	if _, err := io1.Submit(ctx, mc(t)(nvme.WriteCommand(3, 0, 1, 0, nvme.NullSGL())), data); err != nil {
		t.Fatal(err)
	}

	// The impostor: same NQN, no secret, the free queue ID.
	imp := r.dial(t, 2, 8192)
	cqe, err = connectCmd(t, imp, subNQN, cntlid)
	if err != nil || !nvme.DecodeConnectResponse(cqe.DW0).AuthRequired {
		t.Fatalf("impostor I/O connect: %#x %v, want ATR", cqe.DW0, err)
	}
	canary := bytes.Repeat([]byte{0xee}, 4096)
	got := bytes.Clone(canary)
	_, err = imp.Submit(ctx, mc(t)(nvme.ReadCommand(3, 0, 1, 0, nvme.NullSGL())), got)
	wantStatus(t, err, nvme.StatusAuthenticationRequired)
	if !bytes.Equal(got, canary) {
		t.Fatal("the impostor's read returned data")
	}
	read := func(q *fabric.HostQueue) ([]byte, error) {
		buf, err := q.Pool().Get(4096)
		if err != nil {
			t.Fatal(err)
		}
		defer buf.Release()
		copy(buf.Bytes(), canary)
		err = q.ReadRemote(ctx, buf, 0, 4096, desc.Address, desc.RKey)
		return bytes.Clone(buf.Bytes()[:4096]), err
	}
	b, err := read(imp)
	if !errors.Is(err, nprdma.ErrRemoteAccess) || !bytes.Equal(b, canary) {
		t.Fatalf("impostor's one-sided READ: %v, data changed %v", err, !bytes.Equal(b, canary))
	}
	if b, err = read(io1); err != nil || !bytes.Equal(b, data) {
		t.Fatalf("the host's one-sided READ with the same key: %v, data equal %v", err, bytes.Equal(b, data))
	}
}

// TestAuthenticationOverNVMeTCP: the same rules over NVMe/TCP, where there
// is no region to grant: a host with a secret gets ATR at Connect, every
// command but Authentication Send and Receive gets Authentication Required
// (DNR) on the admin and the I/O queue until that queue authenticated
// (bidirectionally, the messages in the capsule), and everything works
// after; a wrong secret is refused with AUTH_Failure1 and ends the
// controller.
func TestAuthenticationOverNVMeTCP(t *testing.T) {
	keys := &testKeyring{creds: map[string]dhchap.Credentials{}}
	r := newTCPRig(t, target.WithKeyring(keys))
	host, ctrl := secret(t), secret(t)
	keys.set(hostNQN, dhchap.Credentials{Host: host, Controller: ctrl})
	addr := r.tg.NVMeTCPAddr()

	h := nvmetcptest.Dial(t, addr, 0)
	c := h.Connect(t, 0, 31, subNQN, hostNQN, 0)
	wantOK(t, c, "admin connect")
	resp := nvme.DecodeConnectResponse(c.DW0)
	if !resp.AuthRequired {
		t.Fatalf("connect response %+v: no ATR for a host with a secret", resp)
	}
	c = exec(t, h, mc(t)(nvme.PropertyGetCommand(nvme.PropCAP, 8)), nil, nil)
	wantCQE(t, c, nvme.StatusAuthenticationRequired, "property get before authentication")
	if !c.Status.DNR() {
		t.Fatalf("property get: %v without DNR", c.Status)
	}
	buf, c := identify(t, h, nvme.CNSController, 0)
	wantCQE(t, c, nvme.StatusAuthenticationRequired, "identify before authentication")
	if !bytes.Equal(buf, make([]byte, len(buf))) {
		t.Fatal("identify data came back before authentication")
	}
	if err := authenticateOver(t, tcpExchanger{h}, host, ctrl); err != nil {
		t.Fatal(err)
	}
	cc := nvme.CC{EN: true, IOSQES: 6, IOCQES: 4}
	wantOK(t, exec(t, h, mc(t)(nvme.PropertySetCommand(nvme.PropCC, 4, uint64(cc.Encode()))), nil, nil), "CC.EN after authentication")
	_, c = identify(t, h, nvme.CNSController, 0)
	wantOK(t, c, "identify after authentication")
	wantOK(t, exec(t, h, nvme.SetFeaturesCommand(nvme.FeatureNumberOfQueues, 0, false), nil, nil), "number of queues")

	io := nvmetcptest.Dial(t, addr, 0)
	c = io.Connect(t, 1, 31, subNQN, hostNQN, resp.CNTLID)
	wantOK(t, c, "I/O connect")
	if !nvme.DecodeConnectResponse(c.DW0).AuthRequired {
		t.Fatalf("I/O connect %#x: no ATR", c.DW0)
	}
	data := bytes.Repeat([]byte("auth"), target.BlockSize/4)
	c = exec(t, io, mc(t)(nvme.WriteCommand(tcpNSID, 5, 1, 0, nvme.SGLDescriptor{})), data, nil)
	wantCQE(t, c, nvme.StatusAuthenticationRequired, "write before authentication")
	if err := authenticateOver(t, tcpExchanger{io}, host, ctrl); err != nil {
		t.Fatal(err)
	}
	wantOK(t, exec(t, io, mc(t)(nvme.WriteCommand(tcpNSID, 5, 1, 0, nvme.SGLDescriptor{})), data, nil), "write after authentication")
	got := make([]byte, target.BlockSize)
	wantOK(t, exec(t, io, mc(t)(nvme.ReadCommand(tcpNSID, 5, 1, 0, nvme.SGLDescriptor{})), nil, got), "read after authentication")
	if !bytes.Equal(got, data) {
		t.Fatal("read back other data")
	}
	if n := promtest.Sum(t, r.reg, "nprdma_target_authentications_total", "result", "success"); n != 2 {
		t.Fatalf("successful authentications %v, want 2", n)
	}
	// Authentication Send fetches its data and both compute: never on the
	// receive loop (target/inline.go).
	for _, op := range []string{"fabrics-auth-send", "fabrics-auth-receive"} {
		inline := promtest.Sum(t, r.reg, "nprdma_target_commands_inline_total", "opcode", op)
		handedOff := promtest.Sum(t, r.reg, "nprdma_target_commands_handed_off_total", "opcode", op)
		if inline != 0 || handedOff == 0 {
			t.Fatalf("%s: %v on the receive loop, %v handed off; want none and some", op, inline, handedOff)
		}
	}

	// A wrong secret: refused, and the controller goes.
	before := r.tg.Controllers()
	bad := nvmetcptest.Dial(t, addr, 0)
	wantOK(t, bad.Connect(t, 0, 31, subNQN, hostNQN, 0), "admin connect with a wrong secret")
	if err := authenticateOver(t, tcpExchanger{bad}, secret(t), nil); !errors.Is(err, dhchap.ErrRejected) {
		t.Fatalf("a wrong secret: %v, want a rejection", err)
	}
	waitFor(t, "the refused controller to go", func() bool { return r.tg.Controllers() == before })
	bad.ExpectClosed(t)
}

// TestAddHostWithKeyFile: a host added through the management API with a
// key file must authenticate with the secret in it, and keeps having to
// after a restart (the path is recorded, never the secret). A key file open
// to others or a relative path is refused, changing nothing; one that
// cannot be read at start leaves the host unable to authenticate (never
// admitted without), until it is fixed and ReloadHostKeys reads it.
// Removing the host removes its key.
func TestAddHostWithKeyFile(t *testing.T) {
	const keyed = "nqn.2026-11.io.nprdma:keyed"
	r := newManageRig(t)
	s := secret(t)
	path := filepath.Join(t.TempDir(), "keyed.key")
	writeKey(t, path, s, 0o644)
	for _, c := range []struct{ path, says string }{{path, "open to group or others"}, {"keyed.key", "absolute"}} {
		err := r.tg.AddHost(subNQN, target.HostConfig{NQN: keyed, DHCHAPKeyFile: c.path})
		if !errors.Is(err, target.ErrInvalid) || !strings.Contains(err.Error(), c.says) {
			t.Fatalf("key file %s: %v, want ErrInvalid saying %q", c.path, err, c.says)
		}
	}
	if r.tg.Subsystem(subNQN).Allows(keyed) {
		t.Fatal("a refused add-host allowed the host")
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.tg.AddHost(subNQN, target.HostConfig{NQN: keyed, DHCHAPKeyFile: path}); err != nil {
		t.Fatal(err)
	}

	check := func(when string, secret *dhchap.Secret, wantATR, wantWorks bool) {
		t.Helper()
		if atr, works, _ := keyedAdmin(t, r.adminRig, keyed, secret, nil); atr != wantATR || works != wantWorks {
			t.Fatalf("%s: ATR %v, property get works %v; want %v, %v", when, atr, works, wantATR, wantWorks)
		}
	}
	check("without a secret", nil, true, false)
	check("with the key file's secret", s, true, true)
	check("with another secret", secret(t), true, false)

	r.restart(t)
	check("after a restart, without a secret", nil, true, false)
	check("after a restart, with the secret", s, true, true)

	// A key file that cannot be read at start: the host must still
	// authenticate, and cannot, until the file is fixed and read again.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	r.restart(t)
	check("with its key file unreadable", s, true, false)
	if _, err := r.tg.ReloadHostKeys(); err == nil {
		t.Fatal("ReloadHostKeys read a key file open to others")
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if n, err := r.tg.ReloadHostKeys(); err != nil || n != 1 {
		t.Fatalf("ReloadHostKeys: %d, %v", n, err)
	}
	check("with its key file fixed and reloaded", s, true, true)

	// Removed and allowed again without a key file: no authentication.
	if err := r.tg.RemoveHost(subNQN, keyed); err != nil {
		t.Fatal(err)
	}
	if err := r.tg.AddHost(subNQN, target.HostConfig{NQN: keyed}); err != nil {
		t.Fatal(err)
	}
	check("allowed again without a key file", nil, false, true)
	r.restart(t)
	check("after a restart, without a key file", nil, false, true)
}

// writeKey writes s to path as a key file of the given mode.
func writeKey(t *testing.T, path string, s *dhchap.Secret, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s.Encode()+"\n"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// keyedAdmin connects host's admin queue on r and authenticates it with
// secret (nil: not at all) and ctrl (nil: unidirectionally): whether
// Connect asked it to authenticate, whether a property get then works,
// and what authenticating returned.
func keyedAdmin(t *testing.T, r *adminRig, host string, secret, ctrl *dhchap.Secret) (atr, works bool, authErr error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	q := r.dial(t, 0, 0)
	cqe, err := connectWith(t, q, nvme.ConnectData{CNTLID: nvme.DynamicControllerID, SubNQN: subNQN, HostNQN: host})
	if err != nil {
		t.Fatal(err)
	}
	atr = nvme.DecodeConnectResponse(cqe.DW0).AuthRequired
	if secret != nil {
		h, err := dhchap.NewHost(host, subNQN, secret, ctrl)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.Authenticate(ctx, queueExchanger{q}, 1); err != nil {
			return atr, false, err
		}
	}
	_, err = q.Submit(ctx, mc(t)(nvme.PropertyGetCommand(nvme.PropCAP, 8)), nil)
	return atr, err == nil, nil
}

// TestAddHostWithCtrlKeyFile: a host added through the management API with
// a key file and a controller key file authenticates bidirectionally: the
// target proves itself with the controller's secret, so a host holding
// another controller secret finds that it did not, and a host that does
// not ask still authenticates. The controller key file needs the host's
// and follows its rules; its path is recorded apart from the host's (no
// secret in the record) and survives a restart; ReloadHostKeys reads a
// replaced file; one that cannot be read leaves the host unable to
// authenticate at all. Allowing the host again with other files replaces
// them (the same files are read again); removing it drops both.
func TestAddHostWithCtrlKeyFile(t *testing.T) {
	const keyed = "nqn.2026-11.io.nprdma:keyed"
	r := newManageRig(t)
	dir := t.TempDir()
	hostPath, ctrlPath := filepath.Join(dir, "host.key"), filepath.Join(dir, "ctrl.key")
	host, ctrl := secret(t), secret(t)
	writeKey(t, hostPath, host, 0o600)
	writeKey(t, ctrlPath, ctrl, 0o644)
	for _, c := range []struct {
		h    target.HostConfig
		says string
	}{
		{target.HostConfig{NQN: keyed, DHCHAPCtrlKeyFile: ctrlPath}, "needs the host's key file"},
		{target.HostConfig{NQN: keyed, DHCHAPKeyFile: hostPath, DHCHAPCtrlKeyFile: ctrlPath}, "controller secret: key file " + ctrlPath + " is open to group or others"},
		{target.HostConfig{NQN: keyed, DHCHAPKeyFile: hostPath, DHCHAPCtrlKeyFile: "ctrl.key"}, "absolute"},
	} {
		if err := r.tg.AddHost(subNQN, c.h); !errors.Is(err, target.ErrInvalid) || !strings.Contains(err.Error(), c.says) {
			t.Fatalf("%+v: %v, want ErrInvalid saying %q", c.h, err, c.says)
		}
	}
	if r.tg.Subsystem(subNQN).Allows(keyed) {
		t.Fatal("a refused add-host allowed the host")
	}
	if err := os.Chmod(ctrlPath, 0o600); err != nil {
		t.Fatal(err)
	}
	both := target.HostConfig{NQN: keyed, DHCHAPKeyFile: hostPath, DHCHAPCtrlKeyFile: ctrlPath}
	if err := r.tg.AddHost(subNQN, both); err != nil {
		t.Fatal(err)
	}

	// check authenticates keyed with its host secret and ctrl (nil:
	// unidirectionally), wanting the error want.
	check := func(when string, ctrl *dhchap.Secret, want error) {
		t.Helper()
		atr, works, err := keyedAdmin(t, r.adminRig, keyed, host, ctrl)
		if !atr || !errors.Is(err, want) || works != (want == nil) {
			t.Fatalf("%s: ATR %v, authentication %v, property get works %v; want ATR, %v", when, atr, err, works, want)
		}
	}
	// recorded checks the key files the subsystem's record names for keyed
	// ("": none), and that it holds no secret.
	recorded := func(when, wantHost, wantCtrl string, secrets ...*dhchap.Secret) {
		t.Helper()
		raw, err := target.SubsystemRecord(r.tg.Subsystem(subNQN))
		if err != nil {
			t.Fatal(err)
		}
		var rec struct {
			HostKeys     map[string]string `json:"host_keys"`
			HostCtrlKeys map[string]string `json:"host_ctrl_keys"`
		}
		if err := json.Unmarshal(raw, &rec); err != nil {
			t.Fatal(err)
		}
		if rec.HostKeys[keyed] != wantHost || rec.HostCtrlKeys[keyed] != wantCtrl {
			t.Fatalf("%s: the record names %q and %q, want %q and %q: %s", when, rec.HostKeys[keyed], rec.HostCtrlKeys[keyed], wantHost, wantCtrl, raw)
		}
		for _, s := range secrets {
			if bytes.Contains(raw, []byte(s.Encode()[10:30])) {
				t.Fatalf("%s: a secret is in the record: %s", when, raw)
			}
		}
	}
	check("bidirectionally", ctrl, nil)
	check("unidirectionally", nil, nil)
	check("with another controller secret", secret(t), dhchap.ErrControllerNotAuthenticated)
	recorded("added", hostPath, ctrlPath, host, ctrl)

	r.restart(t)
	check("after a restart, bidirectionally", ctrl, nil)
	check("after a restart, with another controller secret", secret(t), dhchap.ErrControllerNotAuthenticated)

	// A replaced controller key file is read by ReloadHostKeys, not before.
	replaced := secret(t)
	writeKey(t, ctrlPath, replaced, 0o600)
	check("with the replaced controller secret before the reload", replaced, dhchap.ErrControllerNotAuthenticated)
	if n, err := r.tg.ReloadHostKeys(); err != nil || n != 1 {
		t.Fatalf("ReloadHostKeys: %d, %v", n, err)
	}
	check("with the replaced controller secret", replaced, nil)
	check("with the controller secret before the reload", ctrl, dhchap.ErrControllerNotAuthenticated)

	// A controller key file that cannot be read at start: the host cannot
	// authenticate, either way, until it is fixed and read again.
	if err := os.Chmod(ctrlPath, 0o644); err != nil {
		t.Fatal(err)
	}
	r.restart(t)
	check("with its controller key file unreadable, bidirectionally", replaced, dhchap.ErrRejected)
	check("with its controller key file unreadable, unidirectionally", nil, dhchap.ErrRejected)
	if _, err := r.tg.ReloadHostKeys(); err == nil || !strings.Contains(err.Error(), "controller secret") {
		t.Fatalf("ReloadHostKeys with a controller key file open to others: %v", err)
	}
	if err := os.Chmod(ctrlPath, 0o600); err != nil {
		t.Fatal(err)
	}
	if n, err := r.tg.ReloadHostKeys(); err != nil || n != 1 {
		t.Fatalf("ReloadHostKeys: %d, %v", n, err)
	}
	check("with its controller key file fixed and reloaded", replaced, nil)

	// Allowed again with its key file alone: the controller's goes, and a
	// host that asks the controller to prove itself is refused.
	if err := r.tg.AddHost(subNQN, target.HostConfig{NQN: keyed, DHCHAPKeyFile: hostPath}); err != nil {
		t.Fatal(err)
	}
	check("without a controller key file, bidirectionally", replaced, dhchap.ErrRejected)
	check("without a controller key file, unidirectionally", nil, nil)
	recorded("without a controller key file", hostPath, "")
	r.restart(t)
	check("after a restart without a controller key file, bidirectionally", replaced, dhchap.ErrRejected)

	// Allowed again with both: the controller's is back; allowed again with
	// the same files, they are read again.
	if err := r.tg.AddHost(subNQN, both); err != nil {
		t.Fatal(err)
	}
	check("with both key files again", replaced, nil)
	again := secret(t)
	writeKey(t, ctrlPath, again, 0o600)
	if err := r.tg.AddHost(subNQN, both); err != nil {
		t.Fatal(err)
	}
	check("allowed again with the same files", again, nil)
	recorded("allowed again", hostPath, ctrlPath, host, ctrl, replaced, again)

	if err := r.tg.RemoveHost(subNQN, keyed); err != nil {
		t.Fatal(err)
	}
	recorded("removed", "", "")
}
