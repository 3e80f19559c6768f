package dhchap

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

const (
	testHost = "nqn.2014-08.org.nvmexpress:uuid:0f7e6d5c-4b3a-4921-8f0e-1d2c3b4a5968"
	testSub  = "nqn.2024-01.io.nprdma:exchange"
)

// direct carries a host's messages straight to a Controller, recording
// what went by.
type direct struct {
	c      *Controller
	sent   []MessageID
	got    []MessageID
	events []Event // the events other than EventNone
}

func (d *direct) Send(_ context.Context, msg []byte) error {
	d.sent = append(d.sent, MessageID(msg[1]))
	ev, err := d.c.Send(msg)
	if ev != EventNone {
		d.events = append(d.events, ev)
	}
	return err
}

func (d *direct) Receive(_ context.Context, al int) ([]byte, error) {
	b, ev, err := d.c.Receive(al)
	if ev != EventNone {
		d.events = append(d.events, ev)
	}
	if err == nil {
		d.got = append(d.got, MessageID(b[1]))
	}
	return b, err
}

func fixedCreds(c Credentials) func() (Credentials, bool) {
	return func() (Credentials, bool) { return c, true }
}

func mustSecret(t testing.TB, h HashID) *Secret {
	t.Helper()
	s, err := GenerateSecret(h, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestHostAndControllerAgree runs both sides against each other for every
// hash, the null group and each DH group, one- and bidirectionally, with
// secrets of every kind of transformation.
func TestHostAndControllerAgree(t *testing.T) {
	groupsToTry := []DHGroupID{DHGroupNull, DHGroupFFDHE2048, DHGroupFFDHE3072, DHGroupFFDHE4096, DHGroupFFDHE6144, DHGroupFFDHE8192}
	for _, h := range DefaultHashes {
		for _, g := range groupsToTry {
			for _, bidi := range []bool{false, true} {
				if g > DHGroupFFDHE2048 && (h != HashSHA512 || !bidi) {
					continue // the large groups once each: they cost CPU, not coverage
				}
				t.Run(fmt.Sprintf("%v/%v/bidi=%v", h, g, bidi), func(t *testing.T) {
					host, ctrl := mustSecret(t, h), mustSecret(t, HashID((int(h)%3)+1))
					creds := Credentials{Host: host}
					var hostCtrl *Secret
					if bidi {
						creds.Controller, hostCtrl = ctrl, ctrl
					}
					c := NewController(testHost, testSub, fixedCreds(creds), WithHashes(h), WithDHGroups(g))
					x := &direct{c: c}
					hs, err := NewHost(testHost, testSub, host, hostCtrl)
					if err != nil {
						t.Fatal(err)
					}
					res, err := hs.Authenticate(context.Background(), x, 9)
					if err != nil {
						t.Fatalf("authenticate: %v (sent %v, got %v)", err, x.sent, x.got)
					}
					if !c.Authenticated() || c.Err() != nil {
						t.Fatalf("controller: authenticated %v, err %v", c.Authenticated(), c.Err())
					}
					want := Result{Hash: h, DHGroup: g, Bidirectional: bidi}
					if res != want || c.Result() != want {
						t.Fatalf("host result %+v, controller %+v, want %+v", res, c.Result(), want)
					}
					wantSent := []MessageID{MsgNegotiate, MsgReply}
					if bidi {
						wantSent = append(wantSent, MsgSuccess2)
					}
					if fmt.Sprint(x.events) != fmt.Sprint([]Event{EventSucceeded}) {
						t.Fatalf("controller events %v, want one success", x.events)
					}
					if fmt.Sprint(x.sent) != fmt.Sprint(wantSent) || fmt.Sprint(x.got) != fmt.Sprint([]MessageID{MsgChallenge, MsgSuccess1}) {
						t.Fatalf("sent %v got %v", x.sent, x.got)
					}
				})
			}
		}
	}
}

func TestWrongHostSecretIsRejected(t *testing.T) {
	c := NewController(testHost, testSub, fixedCreds(Credentials{Host: mustSecret(t, HashSHA256)}))
	x := &direct{c: c}
	h, _ := NewHost(testHost, testSub, mustSecret(t, HashSHA256), nil)
	_, err := h.Authenticate(context.Background(), x, 1)
	if !errors.Is(err, ErrRejected) {
		t.Fatalf("wrong secret: %v, want ErrRejected", err)
	}
	if c.Authenticated() || c.Err() == nil || fmt.Sprint(x.events) != fmt.Sprint([]Event{EventFailed}) {
		t.Fatalf("controller: authenticated %v, err %v, events %v", c.Authenticated(), c.Err(), x.events)
	}
	// Another host NQN with the right secret is wrong too: the NQN is in
	// the transformation and the response.
	s := mustSecret(t, HashSHA384)
	c = NewController(testHost, testSub, fixedCreds(Credentials{Host: s}))
	h, _ = NewHost(testHost+"x", testSub, s, nil)
	if _, err := h.Authenticate(context.Background(), &direct{c: c}, 1); !errors.Is(err, ErrRejected) {
		t.Fatalf("other host NQN: %v, want ErrRejected", err)
	}
}

// closesAfterReply is a transport that fails once the host's reply went:
// Linux's nvmet ends the controller as it refuses a host, often before its
// Failure1 has left.
type closesAfterReply struct{ direct }

var errClosed = errors.New("queue closed")

func (c *closesAfterReply) Receive(ctx context.Context, al int) ([]byte, error) {
	if len(c.sent) > 0 && c.sent[len(c.sent)-1] == MsgReply {
		return nil, errClosed
	}
	return c.direct.Receive(ctx, al)
}

func TestReplyWithoutAnswer(t *testing.T) {
	c := NewController(testHost, testSub, fixedCreds(Credentials{Host: mustSecret(t, HashSHA256)}))
	h, _ := NewHost(testHost, testSub, mustSecret(t, HashSHA256), nil)
	_, err := h.Authenticate(context.Background(), &closesAfterReply{direct{c: c}}, 1)
	if !errors.Is(err, ErrUnansweredReply) || !errors.Is(err, errClosed) || errors.Is(err, ErrRejected) {
		t.Fatalf("a queue closed after the reply: %v, want ErrUnansweredReply wrapping the transport's error", err)
	}
}

func TestHostWithoutCredentialsOnControllerIsRejectedAfterChallenge(t *testing.T) {
	c := NewController(testHost, testSub, func() (Credentials, bool) { return Credentials{}, false })
	x := &direct{c: c}
	h, _ := NewHost(testHost, testSub, mustSecret(t, HashSHA256), nil)
	if _, err := h.Authenticate(context.Background(), x, 1); !errors.Is(err, ErrRejected) {
		t.Fatalf("%v, want ErrRejected", err)
	}
	if fmt.Sprint(x.got) != fmt.Sprint([]MessageID{MsgChallenge, MsgFailure1}) {
		t.Fatalf("got %v: the failure must come only after the reply", x.got)
	}
}

func TestControllerThatCannotProveItself(t *testing.T) {
	host := mustSecret(t, HashSHA256)
	for name, ctrlSecret := range map[string]*Secret{"wrong secret": mustSecret(t, HashSHA256), "none": nil} {
		t.Run(name, func(t *testing.T) {
			c := NewController(testHost, testSub, fixedCreds(Credentials{Host: host, Controller: ctrlSecret}))
			x := &direct{c: c}
			h, _ := NewHost(testHost, testSub, host, mustSecret(t, HashSHA256))
			_, err := h.Authenticate(context.Background(), x, 1)
			switch {
			case ctrlSecret == nil && !errors.Is(err, ErrRejected):
				// A controller without the secret cannot answer C2: it
				// refuses at the reply.
				t.Fatalf("%v, want ErrRejected", err)
			case ctrlSecret != nil && !errors.Is(err, ErrControllerNotAuthenticated):
				t.Fatalf("%v, want ErrControllerNotAuthenticated", err)
			}
			if c.Authenticated() || c.Err() == nil {
				t.Fatalf("controller: authenticated %v, err %v", c.Authenticated(), c.Err())
			}
			if ctrlSecret != nil && !errors.Is(c.Err(), ErrHostFailed) {
				t.Fatalf("controller err %v, want ErrHostFailed (the host's Failure2)", c.Err())
			}
		})
	}
}

func TestNegotiationFailures(t *testing.T) {
	s := mustSecret(t, HashSHA256)
	for name, tc := range map[string]struct {
		ctrl, host []Option
		want       Explanation
	}{
		"no common hash":     {ctrl: []Option{WithHashes(HashSHA512)}, host: []Option{WithHashes(HashSHA256)}, want: ExplanationHashUnusable},
		"no common DH group": {ctrl: []Option{WithDHGroups(DHGroupFFDHE4096)}, host: []Option{WithDHGroups(DHGroupNull)}, want: ExplanationDHGroupUnusable},
	} {
		c := NewController(testHost, testSub, fixedCreds(Credentials{Host: s}), tc.ctrl...)
		h, _ := NewHost(testHost, testSub, s, nil, tc.host...)
		_, err := h.Authenticate(context.Background(), &direct{c: c}, 1)
		if !errors.Is(err, ErrRejected) || !errorsContain(err, tc.want.String()) {
			t.Errorf("%s: %v, want ErrRejected: %v", name, err, tc.want)
		}
	}
}

func errorsContain(err error, s string) bool { return err != nil && strings.Contains(err.Error(), s) }

// TestReauthentication authenticates one queue twice, the second time after
// the secret was replaced: the new transaction uses the new one, and a
// failed re-authentication leaves the queue unauthenticated.
func TestReauthentication(t *testing.T) {
	old, replaced := mustSecret(t, HashSHA256), mustSecret(t, HashSHA256)
	cur := old
	c := NewController(testHost, testSub, func() (Credentials, bool) { return Credentials{Host: cur}, true })
	x := &direct{c: c}
	h, _ := NewHost(testHost, testSub, old, nil)
	if _, err := h.Authenticate(context.Background(), x, 1); err != nil {
		t.Fatal(err)
	}
	cur = replaced
	if _, err := h.Authenticate(context.Background(), x, 2); !errors.Is(err, ErrRejected) || c.Authenticated() {
		t.Fatalf("old secret after the replacement: %v, authenticated %v", err, c.Authenticated())
	}
	h, _ = NewHost(testHost, testSub, replaced, nil)
	if _, err := h.Authenticate(context.Background(), x, 3); err != nil || !c.Authenticated() || c.Err() != nil {
		t.Fatalf("new secret: %v, authenticated %v, err %v", err, c.Authenticated(), c.Err())
	}
}

// TestControllerOutOfSequence sends the controller what the protocol does
// not allow next: each is answered with a Failure1 explaining why, and
// nothing authenticates.
func TestControllerOutOfSequence(t *testing.T) {
	s := mustSecret(t, HashSHA256)
	newC := func() *Controller { return NewController(testHost, testSub, fixedCreds(Credentials{Host: s})) }
	neg, _ := (&Negotiate{TID: 4, Hashes: []HashID{HashSHA256}, DHGroups: []DHGroupID{DHGroupNull}}).Marshal()
	expectFailure1 := func(t *testing.T, c *Controller, want Explanation) {
		t.Helper()
		b, ev, err := c.Receive(ReceiveLength)
		if err != nil || ev != EventFailed {
			t.Fatalf("failure1: event %v, %v", ev, err)
		}
		var f Failure
		if err := f.Unmarshal(b); err != nil || f.ID != MsgFailure1 || f.Explanation != want {
			t.Fatalf("got %x (%v), want Failure1 %v", b[:8], err, want)
		}
		if c.Authenticated() || c.Err() == nil {
			t.Fatal("a failed transaction left the queue authenticated or without an error")
		}
		if _, _, err := c.Receive(ReceiveLength); !errors.Is(err, ErrSequence) {
			t.Fatalf("a Receive after the failure: %v, want ErrSequence", err)
		}
	}
	t.Run("receive first", func(t *testing.T) {
		if _, _, err := newC().Receive(ReceiveLength); !errors.Is(err, ErrSequence) {
			t.Fatalf("%v, want ErrSequence", err)
		}
	})
	t.Run("reply first", func(t *testing.T) {
		c := newC()
		c.Send((&Reply{TID: 4, Response: make([]byte, 32)}).Marshal())
		expectFailure1(t, c, ExplanationIncorrectMessage)
	})
	t.Run("success2 instead of reply", func(t *testing.T) {
		c := newC()
		c.Send(neg)
		c.Receive(ReceiveLength)
		c.Send((&Success2{TID: 4}).Marshal())
		expectFailure1(t, c, ExplanationIncorrectMessage)
	})
	t.Run("reply of another transaction", func(t *testing.T) {
		c := newC()
		c.Send(neg)
		c.Receive(ReceiveLength)
		c.Send((&Reply{TID: 5, Response: make([]byte, 32)}).Marshal())
		expectFailure1(t, c, ExplanationIncorrectPayload)
	})
	t.Run("receive instead of reply", func(t *testing.T) {
		c := newC()
		c.Send(neg)
		c.Receive(ReceiveLength)
		expectFailure1(t, c, ExplanationIncorrectMessage)
	})
	t.Run("secure channel", func(t *testing.T) {
		c := newC()
		b, _ := (&Negotiate{TID: 4, SCC: 1, Hashes: []HashID{HashSHA256}, DHGroups: []DHGroupID{DHGroupNull}}).Marshal()
		c.Send(b)
		expectFailure1(t, c, ExplanationConcatMismatch)
	})
	t.Run("short allocation", func(t *testing.T) {
		c := newC()
		c.Send(neg)
		if _, _, err := c.Receive(20); err == nil {
			t.Fatal("a 20-byte allocation took a 48-byte challenge")
		}
		if b, _, err := c.Receive(ReceiveLength); err != nil || MessageID(b[1]) != MsgChallenge || len(b) != ReceiveLength {
			t.Fatalf("the challenge after a short allocation: %v", err)
		}
	})
	t.Run("no header", func(t *testing.T) {
		if _, err := newC().Send([]byte{0, 0, 0}); err == nil {
			t.Fatal("a 3-byte message accepted")
		}
	})
}
