package initiator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nprdma/nprdma/nprdma"
	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/dhchap"
	"github.com/nprdma/nprdma/nvme/fabric"
	"github.com/nprdma/nprdma/target"
)

const authHost = "nqn.2026-11.io.nprdma:auth-host"

// mapKeyring is a target.Keyring over a map by host NQN.
type mapKeyring struct {
	mu    sync.Mutex
	creds map[string]dhchap.Credentials
}

func (k *mapKeyring) DHCHAP(_, host string) (dhchap.Credentials, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	c, ok := k.creds[host]
	return c, ok
}

func newSecret(t *testing.T, h dhchap.HashID) *dhchap.Secret {
	t.Helper()
	s, err := dhchap.GenerateSecret(h, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// authRig is a target that knows authHost's secrets (and admits it only).
func authRig(t *testing.T, k fabricKind, creds dhchap.Credentials) *rig {
	t.Helper()
	keys := &mapKeyring{creds: map[string]dhchap.Credentials{authHost: creds}}
	return newRig(t, k, targetSpec{hosts: []string{authHost}, budget: 32 << 20, targetOpts: []target.Option{target.WithKeyring(keys)}})
}

func (r *rig) tryConnect(t *testing.T, opts ...Option) (*Controller, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	opts = append([]Option{WithStateFile(t.TempDir() + "/hostid"), WithLogger(quiet), WithIOQueues(2), WithHostNQN(authHost),
		WithControllerLossTimeout(time.Second)}, opts...)
	c, err := ConnectOver(ctx, r.transport(), r.addr(), testSubNQN, opts...)
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// TestAuthenticatedHostReadsAndWrites: our initiator and our target with
// unidirectional and bidirectional secrets, over every transport; the data
// written comes back, over the nprdma fabric one-sided reads included (the
// region descriptor and the queues' access came after authentication),
// over NVMe/TCP every read two-sided.
func TestAuthenticatedHostReadsAndWrites(t *testing.T) {
	for _, k := range everyTransport {
		for _, bidi := range []bool{false, true} {
			name := k.name + "/unidirectional"
			if bidi {
				name = k.name + "/bidirectional"
			}
			t.Run(name, func(t *testing.T) {
				host, ctrl := newSecret(t, dhchap.HashSHA256), newSecret(t, dhchap.HashSHA512)
				creds := dhchap.Credentials{Host: host}
				opts := []Option{WithDHCHAPSecret(host)}
				if bidi {
					creds.Controller = ctrl
					opts = append(opts, WithDHCHAPControllerSecret(ctrl))
				}
				r := authRig(t, k, creds)
				c, err := r.tryConnect(t, opts...)
				if err != nil {
					t.Fatal(err)
				}
				n := namespace(t, c)
				writePattern(t, n, 0xa17, 1<<20)
				verifyRange(t, n, 0, n.Size(), 0xa17)
				verifyRange(t, n, 4096, 8192, 0xa17)
				switch s := c.Stats(); {
				case k.nvmeTCP && (s.ReadsOneSided != 0 || s.TwoSidedReads == 0):
					t.Fatalf("over NVMe/TCP: %+v, want two-sided reads only", s)
				case !k.nvmeTCP && s.ReadsOneSided == 0:
					t.Fatalf("no one-sided read after authentication: %+v", s)
				}
			})
		}
	}
}

// TestAuthenticationRefusals: a wrong host secret, no secret, and a
// controller that cannot prove itself each fail Connect with an error that
// says so, over the nprdma fabric and over NVMe/TCP.
func TestAuthenticationRefusals(t *testing.T) {
	for _, k := range []fabricKind{kinds[0], nvmeTCPKind} {
		t.Run(k.name, func(t *testing.T) { authenticationRefusals(t, k) })
	}
}

func authenticationRefusals(t *testing.T, k fabricKind) {
	host, ctrl := newSecret(t, dhchap.HashSHA256), newSecret(t, dhchap.HashSHA384)
	for name, tc := range map[string]struct {
		target dhchap.Credentials
		opts   []Option
		want   error
	}{
		"wrong host secret":       {dhchap.Credentials{Host: host}, []Option{WithDHCHAPSecret(newSecret(t, dhchap.HashSHA256))}, dhchap.ErrRejected},
		"no host secret":          {dhchap.Credentials{Host: host}, nil, ErrAuthenticationRequired},
		"wrong controller secret": {dhchap.Credentials{Host: host, Controller: newSecret(t, dhchap.HashSHA384)}, []Option{WithDHCHAPSecret(host), WithDHCHAPControllerSecret(ctrl)}, dhchap.ErrControllerNotAuthenticated},
		"target without ctrl key": {dhchap.Credentials{Host: host}, []Option{WithDHCHAPSecret(host), WithDHCHAPControllerSecret(ctrl)}, dhchap.ErrRejected},
		"target without any key":  {dhchap.Credentials{}, []Option{WithDHCHAPSecret(host), WithDHCHAPControllerSecret(ctrl)}, dhchap.ErrRejected},
		"controller secret alone": {dhchap.Credentials{Host: host}, []Option{WithDHCHAPControllerSecret(ctrl)}, nil},
	} {
		t.Run(name, func(t *testing.T) {
			creds := tc.target
			var r *rig
			if creds.Host == nil {
				r = newRig(t, k, targetSpec{hosts: []string{authHost}})
			} else {
				r = authRig(t, k, creds)
			}
			_, err := r.tryConnect(t, tc.opts...)
			if tc.want == nil {
				if err == nil || !bytes.Contains([]byte(err.Error()), []byte("needs the host's secret")) {
					t.Fatalf("%v, want a configuration error", err)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("%v, want %v", err, tc.want)
			}
			if r.tg.Controllers() != 0 {
				// The target tears a failed controller down after a grace.
				deadline := time.Now().Add(5 * time.Second)
				for r.tg.Controllers() != 0 && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				if n := r.tg.Controllers(); n != 0 {
					t.Fatalf("%d controllers left after a failed authentication", n)
				}
			}
		})
	}
}

// TestImpostorGetsNothing: a host that claims the NQN of an authenticated
// host, without its secret, gets no region descriptor and no one-sided
// read, even with the real host's rkey, and cannot take the real host's
// queues; the real host goes on.
func TestImpostorGetsNothing(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			host := newSecret(t, dhchap.HashSHA256)
			r := authRig(t, k, dhchap.Credentials{Host: host})
			c, err := r.tryConnect(t, WithDHCHAPSecret(host))
			if err != nil {
				t.Fatal(err)
			}
			n := namespace(t, c)
			writePattern(t, n, 0x1e9, 1<<20)
			if err := n.Flush(); err != nil {
				t.Fatal(err)
			}
			real, err := n.RegionDescriptor(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			cntlid := c.CNTLID()

			ctx := context.Background()
			dev := nprdma.NewDevice(r.cliProv, nprdma.WithPinning(false))
			defer dev.Close()
			pd := dev.AllocPD()
			pool, err := nprdma.NewBufferPool(pd, fabric.HostAccess)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			dial := func(qid uint16, cntlid uint16) *fabric.HostQueue {
				icd := 4096
				if qid == 0 {
					icd = 0
				}
				q, err := fabric.Dial(ctx, pd, r.tg.Addr(), fabric.QueueConfig{QID: qid, Entries: 8, InCapsuleData: icd, CNTLID: cntlid}, fabric.WithPool(pool))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { q.Close() })
				return q
			}
			data := nvme.ConnectData{CNTLID: nvme.DynamicControllerID, SubNQN: testSubNQN, HostNQN: authHost}
			admin := dial(0, nvme.DynamicControllerID)
			var impostorID uint16
			err = connectQueue(ctx, admin, data, 0, &impostorID, hostAuth{})
			if !errors.Is(err, ErrAuthenticationRequired) {
				t.Fatalf("impostor admin connect: %v", err)
			}
			canary := bytes.Repeat([]byte{0xee}, nvme.RegionDescriptorSize)
			desc := bytes.Clone(canary)
			_, err = admin.Submit(ctx, nvme.NPGetRegionDescriptorCommand(1, nvme.NullSGL()), desc)
			if !errors.Is(err, nvme.StatusAuthenticationRequired) || !bytes.Equal(desc, canary) {
				t.Fatalf("region descriptor for the impostor: %v, data changed %v", err, !bytes.Equal(desc, canary))
			}
			// An I/O queue for the real host's controller: its queue IDs are
			// taken (target's TestImpostorIOQueueGetsNothing joins a free one).
			io := dial(1, cntlid)
			data.CNTLID = cntlid
			err = connectQueue(ctx, io, data, 0, nil, hostAuth{})
			if !errors.Is(err, nvme.StatusCommandSequenceError) {
				t.Fatalf("impostor I/O connect: %v", err)
			}
			page := bytes.Repeat([]byte{0xee}, BlockSize)
			before := r.tg.Device().Stats().RemoteAccessErrors
			for _, q := range []*fabric.HostQueue{admin} {
				buf, err := pool.Get(BlockSize)
				if err != nil {
					t.Fatal(err)
				}
				copy(buf.Bytes(), page)
				err = q.ReadRemote(ctx, buf, 0, BlockSize, real.Address, real.RKey)
				if !errors.Is(err, nprdma.ErrRemoteAccess) || !bytes.Equal(buf.Bytes()[:BlockSize], page) {
					t.Fatalf("one-sided READ by the impostor on queue %d: %v, data changed %v", q.QID(), err, !bytes.Equal(buf.Bytes()[:BlockSize], page))
				}
				buf.Release()
			}
			if got := r.tg.Device().Stats().RemoteAccessErrors - before; got != 1 {
				t.Fatalf("target counted %d remote access errors, want 1", got)
			}
			verifyRange(t, n, 0, 1<<20, 0x1e9)
		})
	}
}

// TestDiscoverWithSecretConfigured: discovery does not authenticate (as
// nvmet), so a host with a secret configured still discovers.
func TestDiscoverWithSecretConfigured(t *testing.T) {
	host := newSecret(t, dhchap.HashSHA256)
	r := authRig(t, kinds[0], dhchap.Credentials{Host: host})
	l, err := Discover(context.Background(), r.dev, r.tg.Addr(), WithStateFile(t.TempDir()+"/hostid"), WithLogger(quiet),
		WithHostNQN(authHost), WithDHCHAPSecret(host))
	if err != nil || len(l.Entries) != 1 || l.Entries[0].SubNQN != testSubNQN {
		t.Fatalf("discover: %+v %v", l, err)
	}
}

// nvmetQueue answers Authentication Send and Receive from a dhchap
// controller, and fails as Linux's nvmet does when it refuses a host: the
// queue closes after the reply, the Failure1 lost with it.
type nvmetQueue struct {
	c       *dhchap.Controller
	replied bool
}

func (q *nvmetQueue) QID() uint16 { return 0 }

func (q *nvmetQueue) Submit(_ context.Context, cmd nvme.Command, data []byte) (nvme.Completion, error) {
	if cmd.FabricsType() == nvme.FabricsAuthSend {
		q.replied = len(data) > 1 && dhchap.MessageID(data[1]) == dhchap.MsgReply
		_, err := q.c.Send(data)
		return nvme.Completion{}, err
	}
	if q.replied {
		return nvme.Completion{}, fmt.Errorf("nvme/tcp: queue 0 to 127.0.0.1:4420: %w: EOF", nvme.ErrQueueFailed)
	}
	b, _, err := q.c.Receive(len(data))
	copy(data, b)
	return nvme.Completion{}, err
}

// TestQueueClosedAfterReplyIsARefusal: a target that closes the queue
// instead of answering the host's reply (nvmet, refusing a secret) is
// reported as a refusal, which stops reconnects.
func TestQueueClosedAfterReplyIsARefusal(t *testing.T) {
	q := &nvmetQueue{c: dhchap.NewController(authHost, testSubNQN, func() (dhchap.Credentials, bool) {
		return dhchap.Credentials{Host: newSecret(t, dhchap.HashSHA256)}, true
	})}
	a := hostAuth{secret: newSecret(t, dhchap.HashSHA256)}
	err := a.authenticate(context.Background(), q, nvme.ConnectData{SubNQN: testSubNQN, HostNQN: authHost}, true)
	if !errors.Is(err, dhchap.ErrRejected) || !authFailure(err) || !strings.Contains(err.Error(), "refused host "+authHost+"'s DH-HMAC-CHAP secret") {
		t.Fatalf("queue closed after the reply: %v, want a refusal naming the host", err)
	}
}
