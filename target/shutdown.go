package target

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Shutdown stops the target gracefully, within ctx. It stops accepting
// connections and answers new commands with "aborted"; waits for the
// commands executing, for at most half of the time ctx leaves (the rest is
// the flush's); closes every queue; flushes and closes every namespace,
// each on its own, so that a backing device that does not answer holds up
// only its namespace; records a clean shutdown when all of that succeeded;
// and closes the metadata store.
//
// It returns nil after a clean shutdown, else a *ShutdownError that says
// what reached the backing devices and the metadata store and what did
// not. It returns by ctx's deadline even when a step blocks (a device or
// the metadata store that does not answer): that step is left running, to
// end with the process, and the shutdown is not recorded as clean.
func (t *Target) Shutdown(ctx context.Context) error {
	if !t.beginStop() {
		return nil
	}
	rep := &stopReport{}
	drain, cancel := ctx, context.CancelFunc(func() {})
	if dl, ok := ctx.Deadline(); ok {
		drain, cancel = context.WithTimeout(ctx, time.Until(dl)/2)
	}
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		t.stop(rep, drain, true)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		rep.abandon()
	}
	return rep.result(t)
}

// Close stops the target at once (no drain), still flushing the namespaces,
// and waits for every step however long it takes. The shutdown is not
// recorded as clean, unless the target never accepted a connection (see
// closeMetaUnserved). It returns the namespaces' flush errors.
func (t *Target) Close() error {
	if !t.beginStop() {
		return nil
	}
	rep := &stopReport{}
	t.stop(rep, nil, false)
	var errs []error
	for _, ns := range rep.ns {
		errs = append(errs, ns.Err)
	}
	return errors.Join(errs...)
}

// beginStop answers new commands with "aborted" from now on; false when a
// stop began already.
func (t *Target) beginStop() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopping {
		return false
	}
	t.stopping = true
	t.drainMu.Lock()
	t.draining.Store(true)
	t.drainMu.Unlock()
	return true
}

// stop takes the target down step by step, recording each in rep. With a
// drain context it waits for the commands executing until that is done;
// graceful says whether a clean shutdown may be recorded after serving.
func (t *Target) stop(rep *stopReport, drain context.Context, graceful bool) {
	rep.setStep("closing the listeners")
	t.mu.Lock()
	ports := t.ports
	t.mu.Unlock()
	for _, p := range ports {
		p.ln.Close()
	}
	if t.stopAccept != nil {
		t.stopAccept()
		t.acceptWG.Wait()
	}
	if drain != nil {
		for _, c := range t.controllers() {
			c.abortAERs()
		}
		rep.setStep("waiting for the commands executing")
		drained := make(chan struct{})
		go func() { t.inflight.Wait(); close(drained) }()
		select {
		case <-drained:
		case <-drain.Done():
			rep.mu.Lock()
			rep.drain = fmt.Errorf("commands still executing at the drain's bound, half the deadline (never acknowledged: their queues are closed): %w", drain.Err())
			rep.mu.Unlock()
		}
	}
	rep.setStep("closing the connections")
	qs := t.closeConnections()
	rep.setStep("flushing the namespaces")
	t.closeNamespaces(rep)
	rep.setStep("waiting for the commands' buffers")
	for _, qc := range qs {
		qc.q.Wait()
	}
	t.retiring.Wait()
	for _, p := range ports {
		if p.release != nil {
			p.release()
		}
	}
	t.pool.Close()
	if t.pins != nil {
		t.pins.release()
	}
	t.dev.Close()
	if t.meta != nil {
		rep.setStep("recording the clean shutdown")
		t.recordStop(rep, graceful)
		rep.setStep("closing the metadata store")
		err := t.meta.close()
		rep.mu.Lock()
		rep.metaClosed, rep.metaCloseErr = err == nil, err
		rep.mu.Unlock()
	}
	rep.setStep("")
}

// closeConnections tears down every controller and closes every queue; it
// returns the queues, whose commands may still be executing.
func (t *Target) closeConnections() []*queueConn {
	for _, c := range t.controllers() {
		c.teardown("target shutting down")
	}
	t.mu.Lock()
	t.closed = true
	qs := make([]*queueConn, 0, len(t.queues))
	for qc := range t.queues {
		qs = append(qs, qc)
	}
	t.mu.Unlock()
	for _, qc := range qs {
		qc.q.Close()
	}
	return qs
}

// closeNamespaces flushes and closes every namespace, each in its own
// goroutine once its own commands have finished, and waits for all.
func (t *Target) closeNamespaces(rep *stopReport) {
	var wg sync.WaitGroup
	for _, s := range t.Subsystems() {
		s.stopServing()
		for _, n := range s.Namespaces() {
			i := rep.addNamespace(n)
			wg.Add(1)
			go func() {
				defer wg.Done()
				n.users.Wait()
				rep.setNamespaceStep(i, "flushing")
				unflushed, err := n.closeReporting()
				rep.mu.Lock()
				ns := &rep.ns[i]
				ns.Flushed, ns.Err, ns.Unflushed, rep.nsSteps[i] = err == nil, err, unflushed, ""
				rep.mu.Unlock()
			}()
		}
	}
	wg.Wait()
}

// recordStop writes the clean-shutdown marker when the stop was clean:
// every command drained, every namespace flushed, the store working, and
// either a graceful stop or a run that served nothing (closeMetaUnserved).
// Once Shutdown stopped waiting, no marker is written any more: it has
// reported it as not written.
func (t *Target) recordStop(rep *stopReport, graceful bool) {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	why := rep.notClean()
	switch {
	case why != "":
	case !graceful && !t.servedNothing():
		why = "closed without a drain after serving"
	case rep.abandoned:
		why = "the shutdown's deadline passed before it"
	case t.meta.failed() != nil:
		why = "the metadata store failed"
	}
	if why != "" {
		rep.marker, rep.markerWhy = MarkerNotWritten, why
		return
	}
	rep.marker = MarkerUnknown
	rep.mu.Unlock()
	err := t.meta.markClean()
	rep.mu.Lock()
	if err != nil {
		rep.marker, rep.markerWhy = MarkerNotWritten, err.Error()
		return
	}
	rep.marker = MarkerWritten
}

// servedNothing: the target never accepted a connection, so it changed no
// data, and a start that fails (a port in use, a bad namespace) must not
// make the next start report a crash, nor hide one: a clean or first
// previous run is recorded as a clean shutdown; after a crash the marker
// stays absent.
func (t *Target) servedNothing() bool {
	return !t.accepted.Load() && t.prevRun != PreviousRunUnclean && t.prevRun != PreviousRunUnknown
}

// closeMetaUnserved closes the metadata store of a target whose start
// failed before it served (New's failure path), recording a clean shutdown
// when servedNothing says so.
func (t *Target) closeMetaUnserved() {
	if t.meta != nil && t.servedNothing() {
		if err := t.meta.markClean(); err != nil {
			t.log.Warn("target: recording the shutdown of a run that served nothing", "err", err)
		}
	}
	t.closeMeta()
}

func (t *Target) closeMeta() {
	if t.meta != nil {
		if err := t.meta.close(); err != nil {
			t.log.Warn("target: metadata store", "err", err)
		}
	}
}

// Health is the target's own account of what works.
type Health struct {
	// Serving: started and not stopping, so hosts may connect.
	Serving bool
	// Metadata is the metadata store's failure, nil while it works or
	// without a data directory. While it is set, operations that record
	// something (AddSubsystem, AddNamespace, AllowHost) fail with an error
	// wrapping ErrMetadataStore and change nothing; block I/O is served.
	Metadata *MetadataError
}

// Health reports what works now.
func (t *Target) Health() Health {
	t.mu.Lock()
	h := Health{Serving: t.started && !t.stopping}
	t.mu.Unlock()
	if t.meta != nil {
		h.Metadata = t.meta.failed()
	}
	return h
}

// MarkerState says what became of the clean-shutdown marker.
type MarkerState int

const (
	// MarkerNoStore: the target has no data directory.
	MarkerNoStore MarkerState = iota
	// MarkerNotWritten: the next start reports an unclean shutdown.
	MarkerNotWritten
	// MarkerUnknown: the marker was being written when Shutdown stopped
	// waiting; it is written only after every namespace was flushed, so
	// either outcome is true of the data.
	MarkerUnknown
	// MarkerWritten: the next start reports a clean shutdown.
	MarkerWritten
)

// ByteRange is a range of a namespace, in bytes.
type ByteRange struct{ Off, Len int64 }

func (r ByteRange) String() string { return fmt.Sprintf("[%d, +%d)", r.Off, r.Len) }

// NamespaceStop is what became of one namespace's data at a stop.
type NamespaceStop struct {
	Subsystem string
	NSID      uint32
	Backing   string
	// Flushed: every write acknowledged to hosts is on the backing device
	// and the device was flushed.
	Flushed bool
	// Err says why not: the flush's error, or the step it was in when
	// Shutdown stopped waiting.
	Err error
	// Unflushed are the byte ranges that may not be on the backing device:
	// the pages still dirty after a flush failed. Empty when the flush did
	// not end or only the device's own flush (fdatasync) failed: then
	// anything written since the last completed Flush may be lost.
	Unflushed []ByteRange
}

// ShutdownError is Shutdown's account of a stop that was not clean.
type ShutdownError struct {
	// TimedOut: Shutdown stopped waiting at its deadline, while the stop
	// was at step Waiting.
	TimedOut bool
	Waiting  string
	// Drain: commands were still executing when the drain's bound passed.
	Drain      error
	Namespaces []NamespaceStop
	Marker     MarkerState
	// MarkerReason says why the marker was not written.
	MarkerReason string
	// Metadata is the metadata store's failure, if it failed.
	Metadata *MetadataError
	// MetadataClose: closing the store failed, or had not finished.
	MetadataClose error
	// Recorded counts the subsystem and namespace records (host lists,
	// identities) written since the start, each synced when it was made;
	// Refused the ones refused because the store had failed.
	Recorded, Refused uint64
}

func (e *ShutdownError) Error() string {
	var b strings.Builder
	b.WriteString("shutdown not clean")
	if e.TimedOut {
		fmt.Fprintf(&b, " (stopped waiting at its deadline while %s)", e.Waiting)
	}
	b.WriteString(":")
	line := func(format string, args ...any) {
		b.WriteString("\n  ")
		fmt.Fprintf(&b, format, args...)
	}
	if e.Drain != nil {
		line("%v", e.Drain)
	}
	flushed := 0
	for _, ns := range e.Namespaces {
		if ns.Flushed {
			flushed++
		}
	}
	if flushed == len(e.Namespaces) {
		line("page data: every namespace (%d) flushed to its backing device: no acknowledged write is lost (page data is never kept in the metadata store)", flushed)
	} else {
		for _, ns := range e.Namespaces {
			name := fmt.Sprintf("%s ns %d on %s", ns.Subsystem, ns.NSID, ns.Backing)
			switch {
			case ns.Flushed:
				line("page data: %s: flushed: every acknowledged write is on the backing device", name)
			case len(ns.Unflushed) > 0:
				rs := make([]string, len(ns.Unflushed))
				for i, r := range ns.Unflushed {
					rs[i] = r.String()
				}
				line("page data: %s: NOT flushed: bytes %s may not be on the backing device: writes acknowledged there since their last completed Flush may be lost, no Flush covering them was acknowledged (%v)",
					name, strings.Join(rs, " "), ns.Err)
			default:
				line("page data: %s: NOT flushed: writes acknowledged since the last completed Flush may be lost, no Flush covering them was acknowledged (%v)", name, ns.Err)
			}
		}
	}
	if e.Metadata != nil {
		line("%v", e.Metadata)
	}
	switch e.Marker {
	case MarkerNotWritten:
		line("clean-shutdown marker: not written (%s): the next start with this store reports an unclean shutdown", e.MarkerReason)
	case MarkerUnknown:
		line("clean-shutdown marker: being written at the deadline, after every namespace was flushed: the next start may report either")
	case MarkerWritten:
		line("clean-shutdown marker: written")
	}
	if e.Marker != MarkerNoStore {
		kept := "each synced to the store's log when it was made"
		if e.Metadata != nil && e.Metadata.Removed {
			kept = "each synced when it was made, but in the directory that was removed or replaced: gone with it unless it is restored; a start without them gives the namespaces new identities"
		}
		line("host-list and namespace records: %d written since the start, %s", e.Recorded, kept)
		if e.Refused > 0 {
			line("host-list and namespace changes: %d refused after the store failed, changing nothing", e.Refused)
		}
	}
	if e.MetadataClose != nil {
		line("metadata store: %v", e.MetadataClose)
	}
	return b.String()
}

// stopReport is filled in by the goroutine that stops the target and read
// by Shutdown, which may stop waiting for it.
type stopReport struct {
	mu           sync.Mutex
	step         string
	abandoned    bool
	drain        error
	ns           []NamespaceStop
	nsSteps      []string // what each namespace is waiting for; "" when done
	marker       MarkerState
	markerWhy    string
	metaClosed   bool
	metaCloseErr error
}

func (r *stopReport) setStep(s string) {
	r.mu.Lock()
	r.step = s
	r.mu.Unlock()
}

func (r *stopReport) addNamespace(n *Namespace) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ns = append(r.ns, NamespaceStop{Subsystem: n.sub.nqn, NSID: n.nsid, Backing: n.dev.Path()})
	r.nsSteps = append(r.nsSteps, "waiting for its commands")
	return len(r.ns) - 1
}

func (r *stopReport) setNamespaceStep(i int, s string) {
	r.mu.Lock()
	r.nsSteps[i] = s
	r.mu.Unlock()
}

// notClean says why the stop so far is not clean, "" if it is. The caller
// holds mu.
func (r *stopReport) notClean() string {
	if r.drain != nil {
		return "commands were still executing"
	}
	for _, ns := range r.ns {
		if !ns.Flushed {
			return fmt.Sprintf("namespace %d of %s was not flushed", ns.NSID, ns.Subsystem)
		}
	}
	return ""
}

// abandon records that Shutdown stopped waiting: no marker is written from
// now on.
func (r *stopReport) abandon() {
	r.mu.Lock()
	r.abandoned = true
	r.mu.Unlock()
}

// result is nil for a clean stop, else its account as it stands.
func (r *stopReport) result(t *Target) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := &ShutdownError{Drain: r.drain, Marker: r.marker, MarkerReason: r.markerWhy}
	if r.abandoned && r.step != "" {
		e.TimedOut, e.Waiting = true, r.step
	}
	e.Namespaces = append([]NamespaceStop(nil), r.ns...)
	for i, step := range r.nsSteps {
		if step != "" {
			e.Namespaces[i].Err = fmt.Errorf("still %s at the deadline", step)
		}
	}
	if t.meta != nil {
		e.Metadata = t.meta.failed()
		e.Recorded, e.Refused = t.meta.recorded.Load(), t.meta.recordsRefused.Load()
		switch {
		case r.metaCloseErr != nil:
			e.MetadataClose = r.metaCloseErr
		case !r.metaClosed:
			e.MetadataClose = errors.New("did not close by the deadline: left to process exit")
		}
		if e.Marker == MarkerNoStore {
			// Shutdown stopped waiting before the marker's turn.
			e.Marker, e.MarkerReason = MarkerNotWritten, r.notClean()
			if e.MarkerReason == "" {
				e.MarkerReason = "the shutdown's deadline passed before it"
			}
		}
	}
	if !e.TimedOut && e.Drain == nil && r.notClean() == "" && e.MetadataClose == nil &&
		(t.meta == nil || e.Marker == MarkerWritten) {
		return nil
	}
	return e
}
