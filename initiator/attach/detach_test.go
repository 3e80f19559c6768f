package attach

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// attachProcess starts script under sh as a stand-in for the attach
// process of a record named name, and returns that record once the script
// has set its traps (and run what comes before "ready" in it).
func attachProcess(t *testing.T, d *Dir, name, script string) Record {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "ready")
	cmd := exec.Command("sh", "-c", strings.Replace(script, "ready;", `: >"$READY";`, 1))
	cmd.Env = append(os.Environ(), "READY="+ready)
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start sh: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not ready after 10 s", script)
		}
	}
	start, _, err := procStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	rec := liveRecord(t, name)
	rec.PID, rec.ProcStart = cmd.Process.Pid, start
	if err := d.Save(rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

func collect(said *[]string) func(string) {
	return func(msg string) { *said = append(*said, msg) }
}

func TestDetach(t *testing.T) {
	d := testDir(t)
	var said []string

	// A clean teardown: the process removes its record and exits.
	rec := attachProcess(t, d, "clean", `trap 'rm -f `+d.recordPath("clean")+`; exit 0' TERM; ready; while :; do sleep 0.02; done`)
	if err := d.Detach(rec, false, 10*time.Second, collect(&said)); err != nil {
		t.Fatalf("clean teardown: %v", err)
	}
	if len(said) != 1 || !strings.HasPrefix(said[0], "detached clean (") {
		t.Errorf("clean teardown said %q", said)
	}

	// A process that exits and leaves its record: its teardown failed, and
	// what it left is cleaned up.
	rec = attachProcess(t, d, "failed", `ready; exec sleep 60`)
	err := d.Detach(rec, false, 10*time.Second, collect(&said))
	if err == nil || !strings.Contains(err.Error(), "detach failed: the attach process exited with an error") {
		t.Errorf("teardown that left its record: %v", err)
	}
	if _, err := d.Load("failed"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the record of a failed teardown is not reaped: %v", err)
	}

	// A process that refuses (it counts the refusal in its record) and
	// serves on.
	rec = attachProcess(t, d, "refuses", `trap '' TERM; ready; while :; do sleep 0.02; done`)
	refused := rec
	refused.DetachAttempts, refused.DetachError = 1, "/dev/loop9 is mounted at /mnt"
	if err := d.Save(refused); err != nil {
		t.Fatal(err)
	}
	err = d.Detach(rec, false, 10*time.Second, collect(&said))
	if err == nil || !strings.Contains(err.Error(), "refused: /dev/loop9 is mounted at /mnt") {
		t.Errorf("refused teardown: %v", err)
	}

	// One that does not finish in time.
	rec = attachProcess(t, d, "slow", `trap '' TERM; ready; while :; do sleep 0.02; done`)
	err = d.Detach(rec, false, 100*time.Millisecond, collect(&said))
	if err == nil || !strings.Contains(err.Error(), "still tearing down after 100ms") {
		t.Errorf("teardown past its timeout: %v", err)
	}
	if _, err := d.Load("slow"); err != nil {
		t.Errorf("the record of a process still tearing down is gone: %v", err)
	}

	// A record whose process is gone is reaped.
	said = nil
	if err := d.Save(deadRecord(t, "gone")); err != nil {
		t.Fatal(err)
	}
	if err := d.Detach(deadRecord(t, "gone"), false, time.Second, collect(&said)); err != nil {
		t.Fatal(err)
	}
	if len(said) != 1 || !strings.HasPrefix(said[0], "gone was not running") {
		t.Errorf("reaping a gone process said %q", said)
	}
	if _, err := d.Load("gone"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the record of a gone process is kept: %v", err)
	}
}

func TestAttached(t *testing.T) {
	d := testDir(t)
	for _, r := range []Record{liveRecord(t, "live"), deadRecord(t, "gone")} {
		if err := d.Save(r); err != nil {
			t.Fatal(err)
		}
	}
	var said []string
	got := d.Attached(collect(&said))
	if len(got) != 1 || got[0].Name != "live" {
		t.Fatalf("Attached: %+v, want the live one only", got)
	}
	if len(said) != 1 || !strings.HasPrefix(said[0], "dropped gone: its process") {
		t.Errorf("said %q", said)
	}
	if _, err := d.Load("gone"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the record of a gone process is kept: %v", err)
	}
	if got := testDir(t).Attached(collect(&said)); got == nil || len(got) != 0 {
		t.Errorf("Attached of an empty directory: %#v, want an empty list", got)
	}
}
