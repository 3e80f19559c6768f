package initiator

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/dhchap"
)

// ErrAuthenticationRequired: the target requires this host to
// authenticate (DH-HMAC-CHAP) and no secret was given (WithDHCHAPSecret).
var ErrAuthenticationRequired = errors.New("initiator: the target requires DH-HMAC-CHAP authentication and no secret was given")

// WithDHCHAPSecret sets the host's DH-HMAC-CHAP secret (default none): a
// queue whose Connect asks for authentication authenticates with it.
// Without one, such a target is refused with ErrAuthenticationRequired.
func WithDHCHAPSecret(s *dhchap.Secret) Option { return func(c *config) { c.auth.secret = s } }

// WithDHCHAPControllerSecret sets the controller's secret (default none):
// every queue of a subsystem then authenticates bidirectionally, whether
// its Connect asked or not, and fails with
// dhchap.ErrControllerNotAuthenticated unless the controller proves it
// holds this secret (a discovery controller authenticates only when it
// asks). It needs WithDHCHAPSecret.
func WithDHCHAPControllerSecret(s *dhchap.Secret) Option {
	return func(c *config) { c.auth.ctrlSecret = s }
}

// hostAuth is the host's side of in-band authentication.
type hostAuth struct {
	secret     *dhchap.Secret
	ctrlSecret *dhchap.Secret
}

func (a hostAuth) check() error {
	if a.ctrlSecret != nil && a.secret == nil {
		return errors.New("initiator: a controller secret needs the host's secret too (DH-HMAC-CHAP authenticates the host first)")
	}
	return nil
}

// authTIDs numbers the transactions of this process.
var authTIDs atomic.Uint32

// submitter is what authentication needs of a queue.
type submitter interface {
	Submit(ctx context.Context, cmd nvme.Command, data []byte) (nvme.Completion, error)
	QID() uint16
}

// authenticate runs DH-HMAC-CHAP on q, just connected for data, when the
// controller required it (atr) or the host wants the controller to prove
// itself. A refusal can be cured only by another secret: it is returned
// wrapping dhchap.ErrRejected, and a controller that fails to prove itself
// wrapping dhchap.ErrControllerNotAuthenticated, so that reconnects stop.
func (a hostAuth) authenticate(ctx context.Context, q submitter, data nvme.ConnectData, atr bool) error {
	// A controller secret belongs to a subsystem (it is transformed with its
	// NQN): the discovery controller is not asked to prove it.
	if !atr && (a.ctrlSecret == nil || data.SubNQN == nvme.DiscoveryNQN) {
		return nil
	}
	if a.secret == nil {
		return fmt.Errorf("%w: %s at queue %d of %s", ErrAuthenticationRequired, data.HostNQN, q.QID(), data.SubNQN)
	}
	h, err := dhchap.NewHost(data.HostNQN, data.SubNQN, a.secret, a.ctrlSecret)
	if err != nil {
		return err
	}
	_, err = h.Authenticate(ctx, queueExchanger{q}, uint16(authTIDs.Add(1)))
	switch {
	case err == nil:
		return nil
	case errors.Is(err, dhchap.ErrRejected):
		return fmt.Errorf("initiator: %s refused host %s's DH-HMAC-CHAP secret on queue %d (not the secret it holds for this host?): %w",
			data.SubNQN, data.HostNQN, q.QID(), err)
	case errors.Is(err, dhchap.ErrUnansweredReply) && errors.Is(err, nvme.ErrQueueFailed):
		// Linux's nvmet: it ends the controller as it refuses the host,
		// the Failure1 often lost with the connection.
		return fmt.Errorf("initiator: %s refused host %s's DH-HMAC-CHAP secret on queue %d (not the secret it holds for this host?): it closed the queue instead of answering the reply, as Linux's nvmet does when it refuses one: %w (%w)",
			data.SubNQN, data.HostNQN, q.QID(), dhchap.ErrRejected, err)
	case errors.Is(err, dhchap.ErrControllerNotAuthenticated):
		return fmt.Errorf("initiator: %s did not prove it holds the controller secret on queue %d: %w", data.SubNQN, q.QID(), err)
	case !atr && (errors.Is(err, nvme.StatusInvalidOpcode) || errors.Is(err, nvme.StatusInvalidField)):
		return fmt.Errorf("initiator: %s cannot authenticate (a controller secret was given, so it must): %w", data.SubNQN, err)
	}
	return fmt.Errorf("initiator: authenticating queue %d to %s: %w", q.QID(), data.SubNQN, err)
}

// authFailure reports whether err is an authentication failure that only
// other secrets can cure.
func authFailure(err error) bool {
	return errors.Is(err, ErrAuthenticationRequired) || errors.Is(err, dhchap.ErrRejected) ||
		errors.Is(err, dhchap.ErrControllerNotAuthenticated)
}

// queueExchanger carries DH-HMAC-CHAP messages in Authentication Send and
// Receive commands on a queue.
type queueExchanger struct{ q submitter }

func (x queueExchanger) Send(ctx context.Context, msg []byte) error {
	_, err := x.q.Submit(ctx, nvme.AuthSendCommand(uint32(len(msg)), nvme.NullSGL()), msg)
	return err
}

func (x queueExchanger) Receive(ctx context.Context, al int) ([]byte, error) {
	b := make([]byte, al)
	_, err := x.q.Submit(ctx, nvme.AuthReceiveCommand(uint32(al), nvme.NullSGL()), b)
	return b, err
}
