package dhchap

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
)

// Credentials are what a controller knows of one host: the host's secret
// (required) and the controller's own secret, with which it proves itself
// when the host asks (bidirectional authentication; nil: it cannot).
type Credentials struct {
	Host       *Secret
	Controller *Secret
}

// Errors of the state machines; test with errors.Is.
var (
	// ErrRejected: the controller refused the host (it sent AUTH_Failure1),
	// most often because the host's secret is not the one it holds.
	ErrRejected = errors.New("dhchap: the controller refused the authentication")
	// ErrControllerNotAuthenticated: the controller's response did not
	// prove the controller secret (or it gave none when asked).
	ErrControllerNotAuthenticated = errors.New("dhchap: the controller failed to prove it holds the controller secret")
	// ErrUnansweredReply: the host's reply got no answer (neither Success1
	// nor Failure1): the transport failed or ctx ended while the host
	// waited; the transport's error is wrapped too. Linux's nvmet ends the
	// controller as it refuses a host, often before its Failure1 has left,
	// so from a host that is what a refusal may look like.
	ErrUnansweredReply = errors.New("dhchap: the controller did not answer the host's reply")
	// ErrHostFailed: the host ended the transaction with AUTH_Failure2.
	ErrHostFailed = errors.New("dhchap: the host abandoned the authentication")
	// ErrSequence: a command out of the protocol's order.
	ErrSequence = errors.New("dhchap: message out of sequence")
)

// Option configures a Controller or a Host.
type Option func(*options)

type options struct {
	hashes []HashID
	groups []DHGroupID
	rand   io.Reader
}

func newOptions(opts []Option) options {
	o := options{hashes: DefaultHashes, groups: DefaultDHGroups, rand: rand.Reader}
	for _, f := range opts {
		f(&o)
	}
	return o
}

// WithHashes sets the hash functions, in order of preference (default
// DefaultHashes).
func WithHashes(h ...HashID) Option { return func(o *options) { o.hashes = h } }

// WithDHGroups sets the DH groups, in order of preference (default
// DefaultDHGroups).
func WithDHGroups(g ...DHGroupID) Option { return func(o *options) { o.groups = g } }

// WithRand sets the source of challenges, sequence numbers and DH keys
// (default crypto/rand; tests use a fixed one).
func WithRand(r io.Reader) Option { return func(o *options) { o.rand = r } }

// Controller is the controller side of DH-HMAC-CHAP on one queue: it takes
// the messages of Authentication Send (Send) and answers Authentication
// Receive (Receive). It is safe for concurrent use, although a host sends
// one command of a transaction at a time.
//
// A host authenticates with AUTH_Negotiate, Receive (challenge),
// DH-HMAC-CHAP_Reply, Receive (success1) and, when it asked the controller
// to prove itself, DH-HMAC-CHAP_Success2. Any message the protocol does not
// allow next, or one that fails its checks, makes the next Receive an
// AUTH_Failure1 that ends the transaction; so does a wrong response.
// AUTH_Failure2 from the host ends it too. A Negotiate starts a new
// transaction at any time: re-authentication of an authenticated queue,
// which stays authenticated until that transaction fails.
type Controller struct {
	opts    options
	hostNQN string
	subNQN  string
	creds   func() (Credentials, bool)

	mu            sync.Mutex
	step          step
	failure       Explanation // of the pending Failure1
	err           error       // why the transaction failed (terminal)
	authenticated bool
	t             transaction
	// key is the controller's DH key, drawn at the queue's first
	// transaction in a group and used by the next ones in that group (as
	// nvmet keeps one per controller): a peer that restarts transactions
	// does not make the controller compute a new key each time.
	key *DHKey
}

// step is what the controller expects next.
type step int

const (
	stepNegotiate step = iota // a Negotiate (nothing started)
	stepChallenge             // a Receive: the challenge
	stepReply                 // a Reply
	stepSuccess1              // a Receive: success1
	stepSuccess2              // a Success2 (or Failure2)
	stepFailure1              // a Receive: failure1
	stepDone                  // authenticated; only a new Negotiate
	stepFailed                // the transaction failed; only a new Negotiate
)

type transaction struct {
	tid     uint16
	hash    HashID
	group   DHGroupID
	creds   Credentials
	seq1    uint32
	c1      []byte
	dh      *DHKey
	session []byte
	seq2    uint32
	c2      []byte
}

// NewController starts the controller side for a host. creds is asked for
// the host's credentials at each Negotiate, so that a transaction uses the
// secrets in force when it starts (re-authentication after the secrets
// were replaced uses the new ones); false: the host has none (every
// transaction fails).
func NewController(hostNQN, subNQN string, creds func() (Credentials, bool), opts ...Option) *Controller {
	return &Controller{opts: newOptions(opts), hostNQN: hostNQN, subNQN: subNQN, creds: creds}
}

// Authenticated reports whether a transaction has succeeded on the queue
// (and no later one failed).
func (c *Controller) Authenticated() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.authenticated
}

// Err is why the latest transaction failed, once it has ended (after the
// Failure1 went out or a Failure2 came in); nil otherwise.
func (c *Controller) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Result describes a completed transaction.
type Result struct {
	Hash          HashID
	DHGroup       DHGroupID
	Bidirectional bool
}

// Result is what the latest transaction chose.
func (c *Controller) Result() Result {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Result{Hash: c.t.hash, DHGroup: c.t.group, Bidirectional: c.t.c2 != nil}
}

// Event is what a Send or Receive did to the transaction.
type Event int

const (
	// EventNone: the transaction goes on (or nothing happened).
	EventNone Event = iota
	// EventSucceeded: the transaction completed; the queue is
	// authenticated.
	EventSucceeded
	// EventFailed: the transaction ended in failure (Err says why); the
	// queue is not authenticated.
	EventFailed
)

// Send takes the data of an Authentication Send. It fails only when msg
// has no header (the command's data is too short to be a message); a
// message the protocol refuses is answered by the next Receive.
func (c *Controller) Send(msg []byte) (Event, error) {
	h, err := PeekHeader(msg)
	if err != nil {
		return EventNone, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	before := c.step
	switch {
	case h.ID == MsgNegotiate && h.Type == AuthTypeCommon:
		c.negotiate(msg)
	case h.ID == MsgFailure2 && h.Type == AuthTypeCommon:
		var f Failure
		if err := f.Unmarshal(msg); err == nil {
			c.end(fmt.Errorf("%w: %v", ErrHostFailed, f.Explanation))
		}
	case c.step == stepReply && h.ID == MsgReply:
		c.reply(msg)
	case c.step == stepSuccess2 && h.ID == MsgSuccess2 && h.TID == c.t.tid:
		c.step = stepDone
		c.authenticated = true
		c.forget()
	default:
		c.fail(ExplanationIncorrectMessage)
	}
	return c.event(before), nil
}

// event is what moving from step before to the current one means.
func (c *Controller) event(before step) Event {
	switch {
	case c.step == before:
		return EventNone
	case c.step == stepDone:
		return EventSucceeded
	case c.step == stepFailed:
		return EventFailed
	}
	return EventNone
}

// Receive returns the message for an Authentication Receive of al bytes:
// the challenge, success1 or failure1 the transaction is at, padded with
// zeros to al. With nothing to say (no transaction, or one that ended) it
// is ErrSequence. An al too short for the message is an error that leaves
// the transaction as it was.
func (c *Controller) Receive(al int) ([]byte, Event, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	before, wasAuthenticated := c.step, c.authenticated
	var msg []byte
	switch c.step {
	case stepChallenge:
		m, err := c.challenge()
		if err != nil {
			return nil, EventNone, err
		}
		msg = m
	case stepSuccess1:
		s := Success1{TID: c.t.tid, HashLen: c.t.hash.Size()}
		if c.t.c2 != nil {
			s.Response = ControllerResponse(c.t.creds.Controller.Transform(c.subNQN), c.params(c.t.c2, c.t.seq2))
		}
		msg = s.Marshal()
	case stepFailure1:
		msg = (&Failure{ID: MsgFailure1, TID: c.t.tid, Reason: ReasonFailed, Explanation: c.failure}).Marshal()
	case stepReply, stepSuccess2:
		// The host asks for a message while it should send one: the
		// transaction fails, and this Receive says so.
		c.fail(ExplanationIncorrectMessage)
		msg = (&Failure{ID: MsgFailure1, TID: c.t.tid, Reason: ReasonFailed, Explanation: c.failure}).Marshal()
	default:
		return nil, EventNone, fmt.Errorf("%w: no authentication transaction to answer", ErrSequence)
	}
	if al < len(msg) {
		if before != c.step {
			c.step, c.authenticated = before, wasAuthenticated
		}
		return nil, EventNone, fmt.Errorf("dhchap: allocation of %d bytes for a %d-byte %v", al, len(msg), MessageID(msg[1]))
	}
	switch c.step {
	case stepChallenge:
		c.step = stepReply
	case stepSuccess1:
		if c.t.c2 != nil {
			c.step = stepSuccess2
		} else {
			c.step = stepDone
			c.authenticated = true
			c.forget()
		}
	case stepFailure1:
		c.end(fmt.Errorf("dhchap: host %s: %v", c.hostNQN, c.failure))
	}
	out := make([]byte, al)
	copy(out, msg)
	return out, c.event(before), nil
}

// negotiate starts a transaction.
func (c *Controller) negotiate(msg []byte) {
	c.forget()
	c.err = nil
	var m Negotiate
	if err := m.Unmarshal(msg); err != nil {
		c.t.tid = le.Uint16(msg[4:])
		c.fail(explanationOf(err))
		return
	}
	c.t = transaction{tid: m.TID}
	creds, ok := c.creds()
	if !ok || creds.Host == nil {
		// A host without a secret gets a challenge all the same and fails
		// at its reply, as a wrong secret does: the exchange does not tell
		// a prober which host NQNs have secrets.
		s, err := GenerateSecret(HashNone, 32, c.opts.rand)
		if err != nil {
			c.fail(ExplanationFailed)
			return
		}
		creds = Credentials{Host: s}
	}
	if m.SCC != SCCNone {
		c.fail(ExplanationConcatMismatch)
		return
	}
	c.t.creds = creds
	c.t.hash = pick(c.opts.hashes, m.Hashes)
	if c.t.hash == HashNone {
		c.fail(ExplanationHashUnusable)
		return
	}
	g, ok := pickGroup(c.opts.groups, m.DHGroups)
	if !ok {
		c.fail(ExplanationDHGroupUnusable)
		return
	}
	c.t.group = g
	c.step = stepChallenge
}

// pick is the first of ours the peer offers.
func pick(ours, theirs []HashID) HashID {
	for _, h := range ours {
		if h.Valid() && slices.Contains(theirs, h) {
			return h
		}
	}
	return HashNone
}

func pickGroup(ours, theirs []DHGroupID) (DHGroupID, bool) {
	for _, g := range ours {
		if g.Valid() && slices.Contains(theirs, g) {
			return g, true
		}
	}
	return 0, false
}

// challenge draws C1, S1 and the DH key of the transaction (once: a
// repeated Receive of a lost completion is not possible, the host would
// start over with a Negotiate).
func (c *Controller) challenge() ([]byte, error) {
	t := &c.t
	t.c1 = make([]byte, t.hash.Size())
	if _, err := io.ReadFull(c.opts.rand, t.c1); err != nil {
		return nil, fmt.Errorf("dhchap: drawing a challenge: %w", err)
	}
	seq, err := drawSeq(c.opts.rand)
	if err != nil {
		return nil, err
	}
	t.seq1 = seq
	m := Challenge{TID: t.tid, Hash: t.hash, DHGroup: t.group, Seq: t.seq1, Challenge: t.c1}
	if t.group != DHGroupNull {
		if c.key == nil || c.key.group != t.group {
			if c.key, err = GenerateDHKey(t.group, c.opts.rand); err != nil {
				return nil, err
			}
		}
		t.dh = c.key
		m.DHValue = t.dh.PublicValue()
	}
	return m.Marshal(), nil
}

// drawSeq draws a sequence number: never 0, which means "none" in a reply.
func drawSeq(r io.Reader) (uint32, error) {
	var b [4]byte
	for {
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return 0, fmt.Errorf("dhchap: drawing a sequence number: %w", err)
		}
		if v := binary.LittleEndian.Uint32(b[:]); v != 0 {
			return v, nil
		}
	}
}

// reply checks R1 and records C2.
func (c *Controller) reply(msg []byte) {
	t := &c.t
	var m Reply
	if err := m.Unmarshal(msg); err != nil {
		c.fail(explanationOf(err))
		return
	}
	switch {
	case m.TID != t.tid:
		c.fail(ExplanationIncorrectPayload)
		return
	case len(m.Response) != t.hash.Size():
		c.fail(ExplanationHashUnusable)
		return
	case t.group == DHGroupNull && len(m.DHValue) != 0:
		c.fail(ExplanationIncorrectPayload)
		return
	}
	if t.group != DHGroupNull {
		s, err := t.dh.SessionKey(m.DHValue)
		if err != nil {
			c.fail(ExplanationDHGroupUnusable)
			return
		}
		t.session = s
	}
	want := HostResponse(t.creds.Host.Transform(c.hostNQN), c.params(t.c1, t.seq1))
	if subtle.ConstantTimeCompare(want, m.Response) != 1 {
		c.fail(ExplanationFailed)
		return
	}
	// S2 0 with a challenge asks for no proof (the challenge would only
	// feed a secure channel, which is not supported).
	if m.Challenge != nil && m.Seq != 0 {
		if t.creds.Controller == nil {
			c.fail(ExplanationFailed)
			return
		}
		t.c2, t.seq2 = m.Challenge, m.Seq
	}
	c.step = stepSuccess1
}

// params are the response inputs for challenge and seq in the current
// transaction (augmented with the session key when a group is used).
func (c *Controller) params(challenge []byte, seq uint32) ResponseParams {
	t := &c.t
	if t.session != nil {
		challenge = AugmentedChallenge(t.hash, t.session, challenge)
	}
	return ResponseParams{Hash: t.hash, Challenge: challenge, Seq: seq, TID: t.tid, SCC: SCCNone, HostNQN: c.hostNQN, SubNQN: c.subNQN}
}

// fail makes the next Receive a Failure1 with explanation e; the queue is
// no longer authenticated.
func (c *Controller) fail(e Explanation) {
	c.step = stepFailure1
	c.failure = e
	c.authenticated = false
}

// end ends the transaction as failed.
func (c *Controller) end(err error) {
	c.step = stepFailed
	c.err = err
	c.authenticated = false
	c.forget()
}

// forget drops the transaction's keys and challenges (its IDs stay, for
// Result and a Failure1's T_ID).
func (c *Controller) forget() {
	t := &c.t
	clear(t.c1)
	clear(t.session)
	t.c1, t.session, t.dh = nil, nil, nil
}
