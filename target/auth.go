package target

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nprdma/nprdma/nvme"
	"github.com/nprdma/nprdma/nvme/dhchap"
)

// Keyring gives the DH-HMAC-CHAP credentials of a host on a subsystem:
// false when the host has no secret there (it is admitted on its NQN
// alone). It is asked at every Connect and at the start of every
// authentication transaction, so replacing what it returns takes effect for
// new queues and re-authentications at once; it must be safe for
// concurrent use.
type Keyring interface {
	DHCHAP(subNQN, hostNQN string) (dhchap.Credentials, bool)
}

// DefaultAuthTimeout is how long a queue that must authenticate may take
// to do so after its Connect.
const DefaultAuthTimeout = 10 * time.Second

// authFailureGrace is how long a controller whose host failed to
// authenticate lives on, so that the completion carrying AUTH_Failure1
// reaches the host before its queues close.
const authFailureGrace = 500 * time.Millisecond

// maxAuthMessage bounds an Authentication Send or Receive (a reply with an
// ffdhe8192 value is 1168 bytes; hosts receive into 4 KiB, as Linux does).
const maxAuthMessage = 8192

// authDataTimeout bounds the fetch of an Authentication Send's data (an
// RDMA READ, or NVMe/TCP's R2T and H2CData).
const authDataTimeout = 10 * time.Second

// WithKeyring makes hosts that have a secret in k authenticate with
// DH-HMAC-CHAP on every queue before anything else (default: none; hosts are
// admitted on their NQN alone, unless the management API gave them a key
// file: hostkeys.go, where k's secret wins). Discovery controllers never
// ask.
func WithKeyring(k Keyring) Option { return func(c *config) { c.keyring = k } }

// WithAuthTimeout sets how long a queue has to authenticate after Connect
// (default DefaultAuthTimeout): an admin queue that has not by then loses
// its controller, an I/O queue is closed.
func WithAuthTimeout(d time.Duration) Option { return func(c *config) { c.authTimeout = d } }

// queueAuth is a queue's in-band authentication: whether Connect required
// it, and the protocol's state once a transaction started.
type queueAuth struct {
	mu       sync.Mutex
	required bool
	dh       *dhchap.Controller // nil until the first Authentication Send
	granted  bool               // the access tag is set (authenticated once)
	deadline *time.Timer
}

// requireAuth decides at Connect whether the queue must authenticate (the
// host has a secret for the subsystem) and returns it, the ATR bit of the
// response. A queue that need not authenticate may use the controller's
// regions at once; one that must gets the controller's access tag only
// when it has authenticated, so no READ with any key is served on it
// before. It runs before the queue is bound to c. The rules are the same on
// every transport: only the granting of regions is the nprdma fabric's.
func (qc *queueConn) requireAuth(c *controller) bool {
	t := qc.t
	if _, ok := t.credentials(c.sub, c.hostNQN); !ok {
		qc.grantAccess(c)
		return false
	}
	a := &qc.auth
	a.required = true
	a.deadline = time.AfterFunc(t.cfg.authTimeout, func() { qc.authExpired(c) })
	return true
}

// grantAccess lets the queue's peer read c's regions one-sidedly, on a
// binding that exports regions (RegionExporter: the nprdma fabric's queue
// pairs get c's access tag); over the others there is nothing to grant.
func (qc *queueConn) grantAccess(c *controller) {
	if e, ok := qc.q.(RegionExporter); ok {
		e.SetAccessTag(c.tag)
	}
}

// authExpired ends a queue that did not authenticate in time.
func (qc *queueConn) authExpired(c *controller) {
	a := &qc.auth
	a.mu.Lock()
	done := a.granted
	a.mu.Unlock()
	if done {
		return
	}
	qc.t.log.Warn("target: queue did not authenticate in time", "cntlid", c.id, "qid", qc.q.QID(), "host", c.hostNQN,
		"from", qc.q.RemoteAddr(), "timeout", qc.t.cfg.authTimeout)
	if qc.admin {
		c.teardown("the host did not authenticate in time")
		return
	}
	qc.q.Close()
}

// authGate runs Authentication Send and Receive, and refuses every other
// command of a queue that must authenticate and has not (yet, or any more
// after a failed re-authentication) with Authentication Required (DNR), as
// nvmet does; done reports that it answered the command.
func (qc *queueConn) authGate(c *controller, r Request) (res result, done bool) {
	cmd := r.Command()
	if cmd.IsFabrics() && (cmd.FabricsType() == nvme.FabricsAuthSend || cmd.FabricsType() == nvme.FabricsAuthReceive) {
		return qc.authCommand(c, r), true
	}
	a := &qc.auth
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.required || (a.dh != nil && a.dh.Authenticated()) {
		return result{}, false
	}
	return result{err: nvme.Errorf(nvme.StatusAuthenticationRequired.WithDNR(),
		"queue %d of controller %d has not authenticated (DH-HMAC-CHAP)", qc.q.QID(), c.id)}, true
}

// authCommand executes an Authentication Send or Receive.
func (qc *queueConn) authCommand(c *controller, r Request) result {
	cmd := r.Command()
	p, err := cmd.CheckAuth(maxAuthMessage)
	if err != nil {
		return result{err: err}
	}
	var msg []byte
	if cmd.FabricsType() == nvme.FabricsAuthSend {
		if msg, err = r.HostData(authDataTimeout); err != nil {
			return result{err: err}
		}
	}
	a := &qc.auth
	a.mu.Lock()
	if a.dh == nil {
		t, host := qc.t, c.hostNQN
		a.dh = dhchap.NewController(host, c.subNQN(), func() (dhchap.Credentials, bool) {
			creds, ok := t.credentials(c.sub, host)
			return creds, ok && creds.Host != nil
		})
	}
	dh := a.dh
	a.mu.Unlock()
	var ev dhchap.Event
	if msg != nil {
		if ev, err = dh.Send(msg); err != nil {
			return result{err: nvme.Errorf(nvme.StatusInvalidField.WithDNR(), "authentication message: %v", err)}
		}
	} else {
		var b []byte
		if b, ev, err = dh.Receive(int(p.Length)); err != nil {
			st := nvme.StatusInvalidField
			if errors.Is(err, dhchap.ErrSequence) {
				st = nvme.StatusCommandSequenceError
			}
			return result{err: nvme.Errorf(st.WithDNR(), "authentication receive: %v", err)}
		}
		if err := setData(r, b); err != nil {
			return result{err: err}
		}
	}
	qc.authOutcome(c, dh, ev)
	return result{}
}

// authOutcome acts on the end of a transaction: a queue that authenticated
// gets the controller's access tag; a failed transaction (AUTH_Failure1
// sent or AUTH_Failure2 received) tears the controller down, as nvmet
// treats it as a fatal error, after a grace that lets the failure reach
// the host. Neither is logged with anything secret.
func (qc *queueConn) authOutcome(c *controller, dh *dhchap.Controller, ev dhchap.Event) {
	t := qc.t
	a := &qc.auth
	switch ev {
	case dhchap.EventNone:
		return
	case dhchap.EventFailed:
		err := dh.Err()
		if t.met != nil {
			t.met.auths.WithLabelValues("failure").Inc()
		}
		t.log.Warn("target: host failed to authenticate; tearing its controller down", "cntlid", c.id, "qid", qc.q.QID(),
			"host", c.hostNQN, "subsystem", c.subNQN(), "from", qc.q.RemoteAddr(), "err", err)
		time.AfterFunc(authFailureGrace, func() { c.teardown(fmt.Sprintf("authentication failed on queue %d", qc.q.QID())) })
		return
	}
	a.mu.Lock()
	first := !a.granted
	a.granted = true
	if a.deadline != nil {
		a.deadline.Stop()
	}
	a.mu.Unlock()
	if first {
		qc.grantAccess(c)
	}
	if t.met != nil {
		t.met.auths.WithLabelValues("success").Inc()
	}
	res := dh.Result()
	t.log.Info("target: host authenticated", "cntlid", c.id, "qid", qc.q.QID(), "host", c.hostNQN, "subsystem", c.subNQN(),
		"hash", res.Hash, "dhgroup", res.DHGroup, "bidirectional", res.Bidirectional, "reauthentication", !first)
}
