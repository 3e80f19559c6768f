package initiator

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nprdma/nprdma/nvme"
)

// Namespace Attribute Changed notices. Each session enables the notice
// (Set Features Asynchronous Event Configuration, when the target's Identify
// Controller offers it) and keeps one Asynchronous Event Request parked on
// the admin queue. When it completes with the notice, the session reads the
// Changed Namespace List log (which re-arms the notice) and identifies each
// namespace it handed out that the list names (all of them when the target
// lost count): a namespace that grew under the same NGUID takes its new
// size, at once, with no reconnect (Resized); one that shrank, changed its
// NGUID or went away fails for good (ErrNamespaceChanged), as a reconnect
// finding it so would. The notices are best effort: a reconnect checks
// every namespace anyway (checkNamespaces).

// enableNotices asks the target for Namespace Attribute Changed notices if
// it offers them; a target that refuses simply sends none.
func (s *session) enableNotices(ctx context.Context) bool {
	if nvme.AsyncEventConfig(s.ident.OAES)&nvme.AECNamespaceAttribute == 0 {
		return false
	}
	_, err := s.admin.Submit(ctx, nvme.SetFeaturesCommand(nvme.FeatureAsyncEventConfig, uint32(nvme.AECNamespaceAttribute), false), nil)
	if err != nil {
		s.c.cfg.log.Debug("initiator: namespace attribute notices not enabled", "subsystem", s.c.subNQN, "err", err)
	}
	return err == nil
}

// watchNotices keeps an Asynchronous Event Request parked on s's admin
// queue and acts on what completes it, until s fails or the controller
// closes.
func (c *Controller) watchNotices(s *session) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.failed:
		case <-c.stop:
		case <-ctx.Done():
		}
		cancel()
	}()
	for ctx.Err() == nil {
		cqe, err := s.admin.Submit(ctx, nvme.AsyncEventRequestCommand(), nil)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, nvme.StatusAbortedSQDeleted) && s.admin.Err() == nil {
				c.cfg.log.Warn("initiator: asynchronous event request failed; no more namespace notices in this session", "subsystem", c.subNQN, "err", err)
			}
			return
		}
		ev := nvme.DecodeAsyncEvent(cqe.DW0)
		if ev.Type != nvme.AsyncEventNotice || ev.Info != nvme.NoticeNamespaceAttributeChanged {
			c.cfg.log.Debug("initiator: asynchronous event ignored", "subsystem", c.subNQN, "event", fmt.Sprintf("%+v", ev))
			continue
		}
		ids, all, err := s.changedNamespaces(ctx)
		if err != nil {
			c.cfg.log.Warn("initiator: reading the changed namespace list", "subsystem", c.subNQN, "err", err)
			continue
		}
		c.nsMu.Lock()
		var handed []*Namespace
		for _, n := range c.namespaces {
			if n.changed.Load() == nil && (all || slices.Contains(ids, n.nsid)) {
				handed = append(handed, n)
			}
		}
		c.nsMu.Unlock()
		for _, n := range handed {
			if err := n.identify(ctx, s); err != nil && !errors.Is(err, ErrNamespaceChanged) {
				c.cfg.log.Debug("initiator: identifying a changed namespace", "nsid", n.nsid, "err", err)
			}
		}
	}
}

// changedNamespaces reads (and so clears, re-arming the notice) the Changed
// Namespace List log; all is set when the target lost count.
func (s *session) changedNamespaces(ctx context.Context) (ids []uint32, all bool, err error) {
	b := make([]byte, nvme.ChangedNamespaceListSize)
	cmd, err := nvme.GetLogPageCommand(nvme.LogChangedNamespaces, nvme.BroadcastNSID, 0, uint32(len(b)), nvme.NullSGL())
	if err != nil {
		return nil, false, err
	}
	if _, err := s.admin.Submit(ctx, cmd, b); err != nil {
		return nil, false, err
	}
	return nvme.ParseChangedNamespaceList(b)
}

// identify reads Identify Namespace in s and reconciles the namespace with
// it: the same NGUID and at least its size is the same namespace, grown if
// larger; anything else fails it for good with ErrNamespaceChanged.
func (n *Namespace) identify(ctx context.Context, s *session) error {
	id, err := s.identifyNamespace(ctx, n.nsid)
	blocks := n.blocks.Load()
	switch {
	case err == nil && (id.NSZE < blocks || id.NGUID != n.nguid):
		return n.markChanged(fmt.Errorf("%w: namespace %d of %s is now %d blocks, NGUID %x (was %d blocks, NGUID %x)",
			ErrNamespaceChanged, n.nsid, n.c.subNQN, id.NSZE, id.NGUID, blocks, n.nguid))
	case errors.Is(err, nvme.StatusInvalidNamespaceOrFormat):
		return n.markChanged(fmt.Errorf("%w: %w", ErrNamespaceChanged, err))
	case err != nil:
		return err
	case id.NSZE > blocks:
		n.grow(s, blocks, id.NSZE)
	}
	return nil
}

// grow takes the namespace's new size. The session's region descriptor is
// dropped: its registration covers the old size, so the next read fetches
// one that covers the new (reads beyond a descriptor go two-sided).
func (n *Namespace) grow(s *session, from, to uint64) {
	if !n.blocks.CompareAndSwap(from, to) {
		return // another check got there first
	}
	s.mu.Lock()
	delete(s.regions, n.nsid)
	s.mu.Unlock()
	n.c.cfg.log.Info("initiator: namespace grew on the target", "subsystem", n.c.subNQN, "nsid", n.nsid,
		"from", int64(from)*BlockSize, "to", int64(to)*BlockSize)
	select {
	case n.grown <- struct{}{}:
	default: // one is pending: its reader reads the latest size
	}
}

// Resized receives a value whenever the namespace grows on the target (a
// notice, or a reconnect finding it larger), so that whoever serves it
// (attach's frontends) can follow Size without polling. It is buffered by
// one: a reader that comes late reads the latest size.
func (n *Namespace) Resized() <-chan struct{} { return n.grown }
