package target

import (
	"fmt"
	"time"
)

// RestoreReport says what RestoreManaged did.
type RestoreReport struct {
	Subsystems []string // restored
	Namespaces []string // restored, as "NQN ns N"
	Skipped    []string // not restored, and why
}

// ManagedBudgets is the DRAM budget the namespaces created through the
// management API in earlier runs hold (their records): what RestoreManaged
// will take of the target's memory, for the caller to leave out of the
// configuration's namespaces' shares.
func (t *Target) ManagedBudgets() (int64, error) {
	if t.meta == nil {
		return 0, nil
	}
	recs, err := t.meta.managedNamespaces()
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, r := range recs {
		sum += max(r.Budget, minBudget)
	}
	return sum, nil
}

// RestoreManaged serves again the subsystems, hosts and namespaces created
// through the management API in earlier runs, as their records say. Call it
// after the configuration's subsystems and namespaces are added: the
// configuration wins. A subsystem whose NQN the configuration names is the
// configuration's, with the configuration's hosts (the API's record is kept
// and comes back once the configuration gives the NQN up); the namespaces
// the API created under that NQN are restored into it. A namespace whose
// NSID the configuration took, or whose subsystem is not served, or whose
// backing cannot be opened, is skipped with its record kept (it comes back
// once that is resolved) and reported.
func (t *Target) RestoreManaged() (RestoreReport, error) {
	var rep RestoreReport
	if t.meta == nil {
		return rep, nil
	}
	subs, err := t.meta.managedSubsystems()
	if err != nil {
		return rep, fmt.Errorf("target: restoring: %w", err)
	}
	for _, r := range subs {
		if t.Subsystem(r.NQN) != nil {
			rep.Skipped = append(rep.Skipped, fmt.Sprintf("subsystem %s: the configuration serves it (the configuration wins)", r.NQN))
			continue
		}
		if _, err := t.AddSubsystem(SubsystemConfig{NQN: r.NQN, AllowAnyHost: r.AllowAnyHost, managed: true}); err != nil {
			return rep, fmt.Errorf("target: restoring: %w", err)
		}
		rep.Subsystems = append(rep.Subsystems, r.NQN)
	}
	nss, err := t.meta.managedNamespaces()
	if err != nil {
		return rep, fmt.Errorf("target: restoring: %w", err)
	}
	for _, r := range nss {
		what := fmt.Sprintf("%s ns %d", r.SubNQN, r.NSID)
		skip := func(why string, args ...any) {
			rep.Skipped = append(rep.Skipped, what+": "+fmt.Sprintf(why, args...))
			t.log.Error("target: namespace created through the management API not restored", "subsystem", r.SubNQN,
				"nsid", r.NSID, "name", r.Name, "why", fmt.Sprintf(why, args...))
		}
		s := t.Subsystem(r.SubNQN)
		switch {
		case s == nil:
			skip("its subsystem is not served")
			continue
		case s.Namespace(r.NSID) != nil:
			skip("the configuration serves NSID %d there (the configuration wins)", r.NSID)
			continue
		case r.Name != "" && t.namespaceNamed(r.Name) != nil:
			skip("another namespace is named %q", r.Name)
			continue
		}
		dev, err := t.openBacking(r.Backing)
		if err != nil {
			skip("backing: %v", err)
			continue
		}
		m := &managedNamespace{name: r.Name, budget: r.Budget, maxSize: r.MaxSize, ownsFile: r.OwnsFile}
		start := time.Now()
		if _, err := s.AddNamespace(NamespaceConfig{NSID: r.NSID, Backing: dev, Budget: r.Budget, Size: r.Size,
			MaxSize: max(r.MaxSize, DefaultMaxSize(r.Size)), managed: m}); err != nil {
			dev.Close()
			skip("%v", err)
			continue
		}
		rep.Namespaces = append(rep.Namespaces, what)
		t.log.Debug("target: namespace restored", "subsystem", r.SubNQN, "nsid", r.NSID, "took", time.Since(start))
	}
	return rep, nil
}
