package dhchap

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"slices"
)

// Exchanger carries the messages of one queue: Send is an Authentication
// Send with msg as its data, Receive an Authentication Receive of al bytes.
// An NVMe status error of either is returned by Authenticate as is.
type Exchanger interface {
	Send(ctx context.Context, msg []byte) error
	Receive(ctx context.Context, al int) ([]byte, error)
}

// Host is the host side of DH-HMAC-CHAP: it authenticates queues with its
// secret and, given the controller's secret, makes the controller prove
// itself too (bidirectional).
type Host struct {
	opts       options
	hostNQN    string
	subNQN     string
	secret     *Secret
	ctrlSecret *Secret
}

// NewHost prepares the host side for hostNQN on subsystem subNQN. secret is
// required; ctrlSecret (nil: none) makes every transaction bidirectional.
func NewHost(hostNQN, subNQN string, secret, ctrlSecret *Secret, opts ...Option) (*Host, error) {
	if secret == nil {
		return nil, errors.New("dhchap: a host needs its secret")
	}
	return &Host{opts: newOptions(opts), hostNQN: hostNQN, subNQN: subNQN, secret: secret, ctrlSecret: ctrlSecret}, nil
}

// Authenticate runs one transaction with identifier tid over x. It returns
// what was chosen, or an error: ErrRejected when the controller refused the
// host (its Failure1's explanation follows), ErrControllerNotAuthenticated
// when the controller's response did not prove its secret, a
// *ProtocolError when the controller broke the protocol (then, as for
// ErrControllerNotAuthenticated, a Failure2 was sent), ErrUnansweredReply
// when the transport failed after the host's reply, or the transport's
// error.
func (h *Host) Authenticate(ctx context.Context, x Exchanger, tid uint16) (Result, error) {
	neg, err := (&Negotiate{TID: tid, SCC: SCCNone, Hashes: h.opts.hashes, DHGroups: h.opts.groups}).Marshal()
	if err != nil {
		return Result{}, err
	}
	if err := x.Send(ctx, neg); err != nil {
		return Result{}, err
	}
	msg, err := h.receive(ctx, x, MsgChallenge, tid)
	if err != nil {
		return Result{}, err
	}
	var ch Challenge
	if err := ch.Unmarshal(msg); err != nil {
		return Result{}, h.abandon(ctx, x, tid, err)
	}
	res := Result{Hash: ch.Hash, DHGroup: ch.DHGroup, Bidirectional: h.ctrlSecret != nil}
	if err := h.checkChallenge(&ch); err != nil {
		return res, h.abandon(ctx, x, tid, err)
	}
	reply := Reply{TID: tid}
	var session []byte
	if ch.DHGroup != DHGroupNull {
		key, err := GenerateDHKey(ch.DHGroup, h.opts.rand)
		if err != nil {
			return res, h.abandon(ctx, x, tid, err)
		}
		if session, err = key.SessionKey(ch.DHValue); err != nil {
			return res, h.abandon(ctx, x, tid, &ProtocolError{Explanation: ExplanationDHGroupUnusable, Detail: err.Error()})
		}
		reply.DHValue = key.PublicValue()
	}
	params := func(c []byte, seq uint32) ResponseParams {
		if session != nil {
			c = AugmentedChallenge(ch.Hash, session, c)
		}
		return ResponseParams{Hash: ch.Hash, Challenge: c, Seq: seq, TID: tid, SCC: SCCNone, HostNQN: h.hostNQN, SubNQN: h.subNQN}
	}
	reply.Response = HostResponse(h.secret.Transform(h.hostNQN), params(ch.Challenge, ch.Seq))
	if h.ctrlSecret != nil {
		reply.Challenge = make([]byte, ch.Hash.Size())
		if _, err := io.ReadFull(h.opts.rand, reply.Challenge); err != nil {
			return res, fmt.Errorf("dhchap: drawing a challenge: %w", err)
		}
		if reply.Seq, err = drawSeq(h.opts.rand); err != nil {
			return res, err
		}
	}
	if err := x.Send(ctx, reply.Marshal()); err != nil {
		return res, err
	}
	msg, err = x.Receive(ctx, ReceiveLength)
	if err != nil {
		return res, fmt.Errorf("%w: %w", ErrUnansweredReply, err)
	}
	if msg, err = h.check(ctx, x, msg, MsgSuccess1, tid); err != nil {
		return res, err
	}
	var s1 Success1
	if err := s1.Unmarshal(msg); err != nil {
		return res, h.abandon(ctx, x, tid, err)
	}
	if s1.HashLen != ch.Hash.Size() {
		return res, h.abandon(ctx, x, tid, &ProtocolError{Explanation: ExplanationHashUnusable,
			Detail: fmt.Sprintf("success1 with a hash length of %d for %v", s1.HashLen, ch.Hash)})
	}
	if h.ctrlSecret == nil {
		return res, nil
	}
	want := ControllerResponse(h.ctrlSecret.Transform(h.subNQN), params(reply.Challenge, reply.Seq))
	if s1.Response == nil || subtle.ConstantTimeCompare(want, s1.Response) != 1 {
		why := "its response does not match"
		if s1.Response == nil {
			why = "it sent no response"
		}
		h.sendFailure2(ctx, x, tid, ExplanationFailed)
		return res, fmt.Errorf("%w: %s", ErrControllerNotAuthenticated, why)
	}
	return res, x.Send(ctx, (&Success2{TID: tid}).Marshal())
}

// receive reads the next message: want, or a Failure1 (ErrRejected).
func (h *Host) receive(ctx context.Context, x Exchanger, want MessageID, tid uint16) ([]byte, error) {
	msg, err := x.Receive(ctx, ReceiveLength)
	if err != nil {
		return nil, err
	}
	return h.check(ctx, x, msg, want, tid)
}

// check returns msg if it is want of transaction tid; a Failure1 is
// ErrRejected.
func (h *Host) check(ctx context.Context, x Exchanger, msg []byte, want MessageID, tid uint16) ([]byte, error) {
	hd, err := PeekHeader(msg)
	if err != nil {
		return nil, h.abandon(ctx, x, tid, err)
	}
	if hd.ID == MsgFailure1 && hd.Type == AuthTypeCommon {
		var f Failure
		if err := f.Unmarshal(msg); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", ErrRejected, f.Explanation)
	}
	if hd.ID != want || hd.Type != AuthTypeDHCHAP {
		return nil, h.abandon(ctx, x, tid, &ProtocolError{Explanation: ExplanationIncorrectMessage,
			Detail: fmt.Sprintf("expected %v, got %v", want, hd.ID)})
	}
	if hd.TID != tid {
		return nil, h.abandon(ctx, x, tid, payloadErrorf("%v for transaction %d, not %d", want, hd.TID, tid))
	}
	return msg, nil
}

func (h *Host) checkChallenge(ch *Challenge) error {
	switch {
	case !ch.Hash.Valid() || !slices.Contains(h.opts.hashes, ch.Hash):
		return &ProtocolError{Explanation: ExplanationHashUnusable, Detail: fmt.Sprintf("challenge chose %v, which was not offered", ch.Hash)}
	case len(ch.Challenge) != ch.Hash.Size():
		return &ProtocolError{Explanation: ExplanationHashUnusable, Detail: fmt.Sprintf("challenge of %d bytes for %v", len(ch.Challenge), ch.Hash)}
	case !ch.DHGroup.Valid() || !slices.Contains(h.opts.groups, ch.DHGroup):
		return &ProtocolError{Explanation: ExplanationDHGroupUnusable, Detail: fmt.Sprintf("challenge chose %v, which was not offered", ch.DHGroup)}
	case ch.DHGroup == DHGroupNull && len(ch.DHValue) != 0:
		return payloadErrorf("a DH value with the null group")
	case ch.DHGroup != DHGroupNull && len(ch.DHValue) != ch.DHGroup.Size():
		return &ProtocolError{Explanation: ExplanationDHGroupUnusable, Detail: fmt.Sprintf("DH value of %d bytes for %v", len(ch.DHValue), ch.DHGroup)}
	}
	return nil
}

// abandon sends a Failure2 for err and returns err.
func (h *Host) abandon(ctx context.Context, x Exchanger, tid uint16, err error) error {
	h.sendFailure2(ctx, x, tid, explanationOf(err))
	return err
}

func (h *Host) sendFailure2(ctx context.Context, x Exchanger, tid uint16, e Explanation) {
	// Best effort: the transaction has failed whatever the controller hears.
	_ = x.Send(ctx, (&Failure{ID: MsgFailure2, TID: tid, Reason: ReasonFailed, Explanation: e}).Marshal())
}
