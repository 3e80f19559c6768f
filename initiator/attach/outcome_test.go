package attach

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
	"time"
)

// TestOutcome: a waiter's outcome file gets the final record the attach
// process tells, whoever else waits; files of other names (also a name
// containing ".outcome.") are left alone; nothing is created for a waiter
// that gave up, nor without waiters; List does not see outcome files; those
// of waiters that are gone are swept by the next ExpectOutcome.
func TestOutcome(t *testing.T) {
	d := testDir(t)
	rec := liveRecord(t, "disk")
	rec.State, rec.LostSince, rec.LostReason = StateNamespaceChanged, time.Now().UTC().Truncate(time.Second), "initiator: namespace changed on the target: ..."
	attachDir := filepath.Join(d.Root(), "attach")
	entries := func() []string {
		t.Helper()
		es, err := os.ReadDir(attachDir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range es {
			names = append(names, e.Name())
		}
		return names
	}
	if err := d.TellOutcome(rec); err != nil || len(entries()) != 0 {
		t.Fatalf("TellOutcome without waiters: %v, left %v", err, entries())
	}

	expect := func(name string) *Outcome {
		t.Helper()
		o, err := d.ExpectOutcome(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { o.Close() })
		return o
	}
	o1, o2 := expect("disk"), expect("disk")
	others := []*Outcome{expect("disk.outcome.x"), expect("dis"), expect("disk-2")}
	if _, ok := o1.Read(); ok {
		t.Fatal("an outcome before the process told one")
	}
	if recs, err := d.List(); err != nil || len(recs) != 0 {
		t.Fatalf("List sees outcome files: %+v %v", recs, err)
	}
	if err := d.TellOutcome(rec); err != nil {
		t.Fatal(err)
	}
	for i, o := range []*Outcome{o1, o2} {
		if got, ok := o.Read(); !ok || !reflect.DeepEqual(got, rec) {
			t.Errorf("waiter %d read %+v, %v; want %+v", i+1, got, ok, rec)
		}
	}
	for _, o := range others {
		if got, ok := o.Read(); ok {
			t.Errorf("a waiter for another name (%s) got %+v", o.path, got)
		}
	}

	// A waiter that gave up gets nothing created; the others the new outcome.
	if err := o2.Close(); err != nil {
		t.Fatal(err)
	}
	rec.State = StateLost
	if err := d.TellOutcome(rec); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(o2.path); !os.IsNotExist(err) {
		t.Errorf("the outcome file of a waiter that gave up is back: %v", err)
	}
	if got, ok := o1.Read(); !ok || got.State != StateLost {
		t.Errorf("second outcome: %+v, %v", got, ok)
	}

	// A waiter that is gone (killed while waiting) left its file: swept.
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Skipf("cannot run true: %v", err)
	}
	stale := filepath.Join(attachDir, ".disk.outcome."+strconv.Itoa(gone.Process.Pid)+"-1")
	if err := os.WriteFile(stale, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	expect("disk")
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the outcome file of a waiter that is gone was not swept: %v", err)
	}
	if _, err := os.Stat(o1.path); err != nil {
		t.Errorf("the outcome file of a live waiter was swept: %v", err)
	}

	var none *Outcome
	if _, ok := none.Read(); ok || none.Close() != nil {
		t.Error("a nil Outcome has an outcome")
	}
}
