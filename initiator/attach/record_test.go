package attach

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func self(t *testing.T) Process {
	t.Helper()
	p, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func testDir(t *testing.T) *Dir {
	t.Helper()
	d, err := OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// liveRecord is a record owned by this (live) test process.
func liveRecord(t *testing.T, name string) Record {
	p := self(t)
	return Record{Name: name, State: StateAttached, PID: p.PID, ProcStart: p.Start, Mode: ModeNBD,
		Target: "127.0.0.1:4420", NQN: "nqn.2024-01.io.nprdma:x", NSID: 1}
}

// deadRecord names this process's PID with another start time: what a
// record of a process whose PID was reused looks like.
func deadRecord(t *testing.T, name string) Record {
	r := liveRecord(t, name)
	r.ProcStart++
	return r
}

func TestParseModeAndNames(t *testing.T) {
	for _, s := range []string{"nbd", "fuse", "ublk", "nbd-kernel", "auto"} {
		if m, err := ParseMode(s); err != nil || string(m) != s {
			t.Errorf("ParseMode(%q) = %q, %v", s, m, err)
		}
	}
	if _, err := ParseMode("loop"); err == nil || !strings.Contains(err.Error(), "want fuse, nbd, nbd-kernel, ublk or auto") {
		t.Errorf("ParseMode(loop): %v", err)
	}
	for nqn, want := range map[string]string{
		"nqn.2024-01.io.nprdma:default":  "default-ns1",
		"nqn.2026-11.io.nprdma:disk 0/x": "disk-0-x-ns1",
		"nqn.2024-01.io.nprdma:":         "nprdma-ns1",
		"nqn.2024-01.io.nprdma:..a":      "a-ns1",
		"no-colon":                       "no-colon-ns1",
	} {
		got := DefaultName(nqn, 1)
		if got != want {
			t.Errorf("DefaultName(%q) = %q, want %q", nqn, got, want)
		}
		if err := ValidName(got); err != nil {
			t.Errorf("DefaultName(%q) = %q is not valid: %v", nqn, got, err)
		}
	}
	if n := DefaultName("nqn.x:"+strings.Repeat("a", 100), 4294967295); ValidName(n) != nil {
		t.Errorf("long default name %q is invalid", n)
	}
	for _, bad := range []string{"", ".hidden", "-x", "a/b", "a b", strings.Repeat("a", 65), "../x"} {
		if ValidName(bad) == nil {
			t.Errorf("ValidName(%q) accepted", bad)
		}
	}
}

func TestChooseMode(t *testing.T) {
	for _, c := range []struct {
		k    Kernel
		want Mode
		why  []string
	}{
		{Kernel{Root: true, UBLK: true, NBD: true, FUSE: true, Loop: true}, ModeUBLK, []string{"has ublk (/dev/ublk-control)"}},
		{Kernel{Root: true, UBLK: true}, ModeUBLK, []string{"has ublk"}},
		{Kernel{Root: true, NBD: true, FUSE: true, Loop: true}, ModeNBDKernel, []string{"no ublk", "has the NBD client (/sys/module/nbd)"}},
		{Kernel{Root: true, FUSE: true, Loop: true}, ModeFUSE, []string{"neither ublk (/dev/ublk-control) nor an NBD client"}},
		{Kernel{Root: true, Loop: true}, ModeNBD, []string{"fuse mode needs /dev/fuse"}},
		{Kernel{Root: true, FUSE: true}, ModeNBD, []string{"fuse mode needs /dev/loop-control"}},
		{Kernel{Root: true}, ModeNBD, []string{"needs /dev/fuse and /dev/loop-control"}},
		{Kernel{UBLK: true, NBD: true, FUSE: true, Loop: true}, ModeNBD, []string{"need root"}},
	} {
		m, why := ChooseMode(c.k)
		if m != c.want {
			t.Errorf("%+v: chose %s (%s), want %s", c.k, m, why, c.want)
		}
		for _, w := range append(c.why, "auto chose "+string(c.want)) {
			if !strings.Contains(why, w) {
				t.Errorf("%+v: %q does not say %q", c.k, why, w)
			}
		}
	}
}

func TestRecordLifecycle(t *testing.T) {
	d := testDir(t)
	rec := liveRecord(t, "disk0")
	if _, err := d.Claim(rec); err != nil {
		t.Fatal(err)
	}
	rec.URI, rec.Socket = "nbd+unix:///disk0?socket=/x.sock", "/x.sock"
	if err := d.Save(rec); err != nil {
		t.Fatal(err)
	}
	got, err := d.Load("disk0")
	if err != nil || got.URI != rec.URI || got.PID != rec.PID || got.ProcStart != rec.ProcStart || got.Mode != ModeNBD {
		t.Fatalf("Load: %+v, %v", got, err)
	}
	other := liveRecord(t, "disk1")
	other.Device = "/dev/loop7"
	if _, err := d.Claim(other); err != nil {
		t.Fatal(err)
	}
	list, err := d.List()
	if err != nil || len(list) != 2 || list[0].Name != "disk0" || list[1].Name != "disk1" {
		t.Fatalf("List: %+v, %v", list, err)
	}
	// No temporary files are left next to the records.
	entries, _ := os.ReadDir(filepath.Join(d.Root(), "attach"))
	if len(entries) != 2 {
		t.Errorf("attach/ holds %d entries, want the 2 records", len(entries))
	}
	if err := d.Remove("disk0"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Load("disk0"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load after Remove: %v", err)
	}
	if err := d.Remove("disk0"); err != nil {
		t.Errorf("second Remove: %v", err)
	}
}

func TestClaimRefusesALiveOwnerAndReplacesADeadOne(t *testing.T) {
	d := testDir(t)
	if _, err := d.Claim(liveRecord(t, "a")); err != nil {
		t.Fatal(err)
	}
	var exists *ExistsError
	if _, err := d.Claim(liveRecord(t, "a")); !errors.As(err, &exists) || !strings.Contains(err.Error(), `"a" already exists`) {
		t.Fatalf("second claim: %v", err)
	}
	if got := d.FreeName("a"); got != "a-2" {
		t.Errorf("FreeName(a) = %q, want a-2", got)
	}

	if _, err := d.Claim(deadRecord(t, "b")); err != nil {
		t.Fatal(err)
	}
	if got := d.FreeName("b"); got != "b" {
		t.Errorf("FreeName(b) = %q: a dead owner's name is free", got)
	}
	fresh := liveRecord(t, "b")
	fresh.NSID = 9
	if _, err := d.Claim(fresh); err != nil {
		t.Fatalf("claim over a dead owner: %v", err)
	}
	if got, _ := d.Load("b"); got.NSID != 9 {
		t.Errorf("record after replacing a dead owner: %+v", got)
	}
}

// TestConcurrentClaims: of many claims of one name at once exactly one wins
// and every reader sees a whole record.
func TestConcurrentClaims(t *testing.T) {
	d := testDir(t)
	const n = 16
	var wg sync.WaitGroup
	errs := make(chan error, n)
	stop := make(chan struct{})
	readerDone := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				readerDone <- nil
				return
			default:
			}
			if _, err := d.Load("x"); err != nil && !errors.Is(err, os.ErrNotExist) {
				readerDone <- err
				return
			}
		}
	}()
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := d.Claim(liveRecord(t, "x"))
			errs <- err
		}()
	}
	wg.Wait()
	close(stop)
	if err := <-readerDone; err != nil {
		t.Fatalf("a reader saw a partial record: %v", err)
	}
	close(errs)
	won := 0
	for err := range errs {
		var exists *ExistsError
		switch {
		case err == nil:
			won++
		case !errors.As(err, &exists):
			t.Errorf("claim: %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d claims won, want 1", won)
	}
}

func TestFind(t *testing.T) {
	d := testDir(t)
	nbdRec := liveRecord(t, "n")
	nbdRec.Socket, nbdRec.URI, nbdRec.TCPURI = "/run/x/n.sock", "nbd+unix:///n?socket=/run/x/n.sock", "nbd://127.0.0.1:10809/n"
	fuseRec := liveRecord(t, "f")
	fuseRec.Mode, fuseRec.Device = ModeFUSE, "/dev/loop5"
	for _, r := range []Record{nbdRec, fuseRec} {
		if _, err := d.Claim(r); err != nil {
			t.Fatal(err)
		}
	}
	for arg, want := range map[string]string{
		"n": "n", "f": "f", "/dev/loop5": "f", "loop5": "f", "/run/x/n.sock": "n",
		nbdRec.URI: "n", nbdRec.TCPURI: "n",
	} {
		got, err := d.Find(arg)
		if err != nil || got.Name != want {
			t.Errorf("Find(%q) = %q, %v; want %q", arg, got.Name, err, want)
		}
	}
	if _, err := d.Find("/dev/loop6"); err == nil || !strings.Contains(err.Error(), `no attachment named "/dev/loop6"`) {
		t.Errorf("Find of an unknown device: %v", err)
	}
}

func TestParseStat(t *testing.T) {
	// The command name may hold spaces and parentheses.
	line := "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 3 0 777123 1000 10 18446744073709551615"
	start, state, err := parseStat([]byte(line))
	if err != nil || start != 777123 || state != 'S' {
		t.Fatalf("parseStat = %d %c %v", start, state, err)
	}
	for _, bad := range []string{"", "1 (x", "1 (x) S 1 2", "1 (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 notanumber"} {
		if _, _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q) accepted", bad)
		}
	}
}

func TestProcessIdentity(t *testing.T) {
	me := self(t)
	if !me.Alive() {
		t.Fatal("this process is not alive")
	}
	if (Process{PID: me.PID, Start: me.Start + 1}).Alive() {
		t.Error("a reused PID (other start time) counts as alive")
	}
	if (Process{}).Alive() {
		t.Error("PID 0 counts as alive")
	}

	// A child that exited but was not waited for is a zombie: not alive,
	// and not signalled.
	cmd := exec.Command("sleep", "0")
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start sleep: %v", err)
	}
	start, _, err := procStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	child := Process{PID: cmd.Process.Pid, Start: start}
	deadline := time.Now().Add(10 * time.Second)
	for child.Alive() {
		if time.Now().After(deadline) {
			t.Fatal("sleep 0 still alive after 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, state, err := procStat(child.PID); err != nil || state != 'Z' {
		t.Fatalf("child state %c %v, want a zombie", state, err)
	}
	if err := child.Signal(syscall.SIGTERM); !errors.Is(err, ErrProcessGone) {
		t.Errorf("Signal of a zombie: %v", err)
	}
	cmd.Wait()
	if err := child.Signal(syscall.SIGTERM); !errors.Is(err, ErrProcessGone) {
		t.Errorf("Signal of a reaped process: %v", err)
	}
}

func TestReapRemovesStaleSocketOnly(t *testing.T) {
	d := testDir(t)
	// A socket file nobody listens on any more (as a killed server leaves it).
	stale := filepath.Join(d.Root(), "stale.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	rec := deadRecord(t, "s")
	rec.Socket = stale
	rec.LogFile = filepath.Join(d.Root(), "s.log")
	os.WriteFile(rec.LogFile, []byte("last words\n"), 0o644)
	if _, err := d.Claim(liveRecord(t, "s")); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Reap(liveRecord(t, "s"), false); err == nil || !strings.Contains(err.Error(), "still served by pid") {
		t.Fatalf("Reap of a live attachment: %v", err)
	}
	if err := d.Save(rec); err != nil {
		t.Fatal(err)
	}
	notes, err := d.Reap(rec, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale socket left: %v", err)
	}
	if _, err := d.Load("s"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("record left: %v", err)
	}
	if _, err := os.Stat(rec.LogFile); err != nil {
		t.Errorf("the log was not kept: %v", err)
	}
	joined := strings.Join(notes, "; ")
	if !strings.Contains(joined, "removed socket "+stale) || !strings.Contains(joined, rec.LogFile) {
		t.Errorf("notes: %q", joined)
	}

	// A socket somebody listens on, and a file that is not a socket, are
	// left alone and the record kept.
	live := filepath.Join(d.Root(), "live.sock")
	ln, err = net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	plain := filepath.Join(d.Root(), "plain")
	os.WriteFile(plain, nil, 0o644)
	for path, want := range map[string]string{live: "another process listens", plain: "not a socket"} {
		rec := deadRecord(t, "k")
		rec.Socket = path
		if err := d.Save(rec); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Reap(rec, false); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Reap with socket %s: %v, want %q", path, err, want)
		}
		if _, err := os.Lstat(path); err != nil {
			t.Errorf("%s was removed", path)
		}
		if _, err := d.Load("k"); err != nil {
			t.Errorf("record removed although cleanup failed: %v", err)
		}
	}
}

// TestMountQueries: the mount queries Reap relies on see this process's
// table (the parser's own tests are internal/mountinfo's).
func TestMountQueries(t *testing.T) {
	// This process's own view has "/" mounted.
	if ok, err := IsMountPoint("/"); err != nil || !ok {
		t.Errorf("IsMountPoint(/) = %v, %v", ok, err)
	}
	if ok, _ := IsMountPoint(t.TempDir()); ok {
		t.Error("a fresh temporary directory is a mount point")
	}
	if _, err := MountPointsOf("/dev/null"); err == nil || !strings.Contains(err.Error(), "not a block device") {
		t.Errorf("MountPointsOf(/dev/null): %v", err)
	}
}

// TestDirAtCreatesNothing: a run directory opened for reading (list,
// detach) that does not exist has no records, finds nothing, and is not
// created; one with a record shows it, lost state included.
func TestDirAtCreatesNothing(t *testing.T) {
	root := filepath.Join(t.TempDir(), "run")
	d, err := DirAt(root)
	if err != nil {
		t.Fatal(err)
	}
	if recs, err := d.List(); err != nil || len(recs) != 0 {
		t.Fatalf("List of a missing run directory: %v, %v", recs, err)
	}
	if _, err := d.Find("x"); err == nil || !strings.Contains(err.Error(), `no attachment named "x"`) {
		t.Fatalf("Find in a missing run directory: %v", err)
	}
	if _, err := os.Stat(root); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the run directory was created: %v", err)
	}
	w, err := OpenDir(root)
	if err != nil {
		t.Fatal(err)
	}
	rec := liveRecord(t, "a")
	rec.State, rec.LostSince, rec.LostReason = StateLost, time.Date(2026, 11, 21, 14, 0, 0, 0, time.UTC), "not reconnected within 30s"
	if _, err := w.Claim(rec); err != nil {
		t.Fatal(err)
	}
	recs, err := d.List()
	if err != nil || len(recs) != 1 || recs[0].State != StateLost || !recs[0].LostSince.Equal(rec.LostSince) || recs[0].LostReason != rec.LostReason {
		t.Fatalf("List: %+v, %v", recs, err)
	}
}
