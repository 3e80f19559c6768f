package main

// Tests of what the user sees when things go wrong: a controller lost for
// good, a namespace changed on the target (list, detach, also when the
// teardown is what finds either), a client cut off by a teardown, a run
// directory that does not exist.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nprdma/nprdma/initiator/attach"
	"github.com/nprdma/nprdma/initiator/nbd"
)

// nbdTestConn is the least of an NBD client: the NBD_OPT_EXPORT_NAME
// handshake, simple replies, writes.
type nbdTestConn struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func dialNBD(t *testing.T, socket, export string) *nbdTestConn {
	t.Helper()
	c, err := net.DialTimeout("unix", socket, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(time.Minute))
	n := &nbdTestConn{t: t, c: c, r: bufio.NewReader(c)}
	hello := make([]byte, 18) // NBDMAGIC, IHAVEOPT, handshake flags
	if _, err := io.ReadFull(n.r, hello); err != nil || string(hello[:16]) != "NBDMAGICIHAVEOPT" {
		t.Fatalf("NBD greeting %q: %v", hello, err)
	}
	msg := binary.BigEndian.AppendUint32(nil, 3) // fixed newstyle, no zeroes
	msg = append(msg, "IHAVEOPT"...)
	msg = binary.BigEndian.AppendUint32(msg, nbd.OptExportName)
	msg = binary.BigEndian.AppendUint32(msg, uint32(len(export)))
	msg = append(msg, export...)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(n.r, make([]byte, 10)); err != nil { // size, transmission flags
		t.Fatalf("NBD export %q: %v", export, err)
	}
	return n
}

func (n *nbdTestConn) write(off int64, p []byte) {
	n.t.Helper()
	req := nbd.AppendRequest(nil, nbd.Request{Type: nbd.CmdWrite, Cookie: 1, Offset: uint64(off), Length: uint32(len(p))})
	if _, err := n.c.Write(append(req, p...)); err != nil {
		n.t.Fatal(err)
	}
	rep := make([]byte, 16)
	if _, err := io.ReadFull(n.r, rep); err != nil {
		n.t.Fatal(err)
	}
	if magic, errno := binary.BigEndian.Uint32(rep), binary.BigEndian.Uint32(rep[4:]); magic != 0x67446698 || errno != 0 {
		n.t.Fatalf("NBD write: reply magic %#x, error %d", magic, errno)
	}
}

// read reads length bytes at off and returns the reply's NBD error (0:
// none).
func (n *nbdTestConn) read(off int64, length int) uint32 {
	n.t.Helper()
	req := nbd.AppendRequest(nil, nbd.Request{Type: nbd.CmdRead, Cookie: 3, Offset: uint64(off), Length: uint32(length)})
	if _, err := n.c.Write(req); err != nil {
		n.t.Fatal(err)
	}
	rep := make([]byte, 16)
	if _, err := io.ReadFull(n.r, rep); err != nil {
		n.t.Fatal(err)
	}
	magic, errno := binary.BigEndian.Uint32(rep), binary.BigEndian.Uint32(rep[4:])
	if magic != 0x67446698 {
		n.t.Fatalf("NBD read: reply magic %#x", magic)
	}
	if errno == 0 {
		if _, err := io.ReadFull(n.r, make([]byte, length)); err != nil {
			n.t.Fatal(err)
		}
	}
	return errno
}

func (n *nbdTestConn) disconnect() {
	n.c.Write(nbd.AppendRequest(nil, nbd.Request{Type: nbd.CmdDisc, Cookie: 2}))
	n.c.Close()
}

// TestLostAttachmentIsListedAndDetached: once the target stays away past
// the controller-loss timeout, list shows the attachments as lost, with
// since when and why, in the table and in --json. detach of one that had
// nothing unflushed succeeds, saying the controller had been lost; detach
// of one holding a write it acknowledged but never flushed fails, saying
// so. Before, list showed them attached and both detaches failed alike.
func TestLostAttachmentIsListedAndDetached(t *testing.T) {
	e := newCLIEnv(t)
	loss := []string{"--mode", "nbd", "--ctrl-loss-timeout", "2s", "--keep-alive", "1s"}
	clean := e.attachDaemon("lost-clean", loss...)
	dirty := e.attachDaemon("lost-dirty", loss...)
	lostOnes := []attach.Record{clean, dirty}
	var fuse *attach.Record // where the machine allows it: the fuse mode's teardown flushes elsewhere
	if canLoop() {
		r := e.attachDaemon("lost-fuse", "--mode", "fuse", "--ctrl-loss-timeout", "2s", "--keep-alive", "1s")
		fuse, lostOnes = &r, append(lostOnes, r)
	}
	c := dialNBD(t, dirty.Socket, dirty.Name)
	c.write(0, bytes.Repeat([]byte{0xa5}, 4096)) // acknowledged, never flushed
	c.disconnect()

	e.tg.Close()
	var listed []attach.Record
	for deadline := time.Now().Add(60 * time.Second); ; {
		out, _ := e.mustRun("list", "--json")
		if err := json.Unmarshal([]byte(out), &listed); err != nil {
			t.Fatalf("list --json: %v\n%s", err, out)
		}
		lost := 0
		for _, r := range listed {
			if r.State == attach.StateLost {
				lost++
			}
		}
		if lost == len(lostOnes) && len(listed) == len(lostOnes) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not listed as lost long after the loss timeout:\n%s", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, r := range listed {
		if r.LostSince.IsZero() || time.Since(r.LostSince) > time.Minute || !strings.Contains(r.LostReason, "not reconnected within 2s") {
			t.Errorf("list --json: %s lost since %v: %q", r.Name, r.LostSince, r.LostReason)
		}
	}
	e.assertListedDead(lostOnes, "lost", "controller lost since ", "not reconnected within 2s")

	_, stderr, err := e.run("detach", clean.Name)
	if err != nil || !strings.Contains(stderr, "detached lost-clean") || !strings.Contains(stderr, "controller had been lost since") {
		t.Errorf("detach of a lost attachment with nothing unflushed: %v\n%s", err, stderr)
	}
	e.assertGone(clean)
	if fuse != nil {
		_, stderr, err := e.run("detach", fuse.Device)
		if err != nil || !strings.Contains(stderr, "detached lost-fuse") || !strings.Contains(stderr, "controller had been lost since") {
			t.Errorf("detach of a lost fuse attachment with nothing unflushed: %v\n%s", err, stderr)
		}
		e.assertGone(*fuse)
	}

	_, stderr, err = e.run("detach", dirty.Name)
	// Not "refused": the process ended, and detach cleaned up after it.
	if err == nil || !strings.Contains(stderr, "exited with an error") ||
		!strings.Contains(stderr, "1 write or trim (4 KiB)") || !strings.Contains(stderr, "could not be flushed") {
		t.Errorf("detach of a lost attachment holding an unflushed write: %v\n%s", err, stderr)
	}
	os.Remove(dirty.LogFile) // kept by design after a failed teardown
	e.assertGone(dirty)
}

// waitListed polls list --json until every attachment listed is in state
// and there are want of them, and returns them.
func (e *cliEnv) waitListed(state string, want int) []attach.Record {
	e.t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; {
		out, _ := e.mustRun("list", "--json")
		var listed []attach.Record
		if err := json.Unmarshal([]byte(out), &listed); err != nil {
			e.t.Fatalf("list --json: %v\n%s", err, out)
		}
		n := 0
		for _, r := range listed {
			if r.State == state {
				n++
			}
		}
		if n == want && len(listed) == want {
			return listed
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("not listed as %s in time:\n%s", state, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestNamespaceChangedAttachmentIsListedAndDetached: the target restarted on
// another backing under the same NSID; the reconnect finds it, and I/O
// fails (EIO). list shows them namespace-changed, with since when and
// why, in the table and in --json; detach of the one with nothing unflushed
// succeeds, saying its namespace had changed; detach of the one holding a
// write it acknowledged but never flushed fails, saying so. Before, list
// showed them attached and both detaches failed alike.
func TestNamespaceChangedAttachmentIsListedAndDetached(t *testing.T) {
	e := newCLIEnv(t)
	clean := e.attachDaemon("changed-clean", "--mode", "nbd")
	dirty := e.attachDaemon("changed-dirty", "--mode", "nbd")
	cc, cd := dialNBD(t, clean.Socket, clean.Name), dialNBD(t, dirty.Socket, dirty.Name)
	cd.write(0, bytes.Repeat([]byte{0x5a}, 4096)) // acknowledged, never flushed

	e.restartOnOtherBacking(nsSize / 2)
	for _, c := range []*nbdTestConn{cc, cd} {
		if errno := c.read(0, 4096); errno != 5 { // NBD_EIO
			t.Fatalf("read after the target changed the namespace: NBD error %d, want EIO", errno)
		}
		c.disconnect()
	}
	listed := e.waitListed(attach.StateNamespaceChanged, 2)
	for _, r := range listed {
		if r.LostSince.IsZero() || time.Since(r.LostSince) > time.Minute || !strings.Contains(r.LostReason, "namespace changed on the target") ||
			!strings.Contains(r.LostReason, "is now 32768 blocks") {
			t.Errorf("list --json: %s changed since %v: %q", r.Name, r.LostSince, r.LostReason)
		}
	}
	e.assertListedDead([]attach.Record{clean, dirty}, "namespace-changed", "namespace changed on the target since ", "is now 32768 blocks")

	_, stderr, err := e.run("detach", clean.Name)
	if err != nil || !strings.Contains(stderr, "detached changed-clean") ||
		!strings.Contains(stderr, "its namespace had changed on the target since") || !strings.Contains(stderr, "nothing it acknowledged was left unflushed") {
		t.Errorf("detach of a namespace-changed attachment with nothing unflushed: %v\n%s", err, stderr)
	}
	e.assertGone(clean)
	_, stderr, err = e.run("detach", dirty.Name)
	if err == nil || !strings.Contains(stderr, "1 write or trim (4 KiB)") || !strings.Contains(stderr, "could not be flushed") ||
		!strings.Contains(stderr, "namespace changed on the target") {
		t.Errorf("detach of a namespace-changed attachment holding an unflushed write: %v\n%s", err, stderr)
	}
	os.Remove(dirty.LogFile) // kept by design after a failed teardown
	e.assertGone(dirty)
}

// TestDetachSaysWhatTheTeardownFound: a controller loss found by the
// teardown itself (its final flush) is recorded a moment before the attach
// process removes its record, which a detach polling the record misses;
// detach reads the final record the process leaves it (its outcome file)
// and says it all the same: the target gone with the loss timeout not yet
// over when detach starts. A namespace changed on the target needs no I/O
// to be found: the reconnect checks it, so even an attachment nobody used
// since (nbd, and fuse where the machine allows) is listed as changed, and
// detach says so.
func TestDetachSaysWhatTheTeardownFound(t *testing.T) {
	e := newCLIEnv(t)
	changed := []attach.Record{e.attachDaemon("found-changed", "--mode", "nbd")}
	if canLoop() {
		changed = append(changed, e.attachDaemon("found-changed-fuse", "--mode", "fuse"))
	}
	e.restartOnOtherBacking(nsSize / 2)
	e.waitListed(attach.StateNamespaceChanged, len(changed)) // no I/O since the restart
	for _, r := range changed {
		_, stderr, err := e.run("detach", r.Name)
		if err != nil || !strings.Contains(stderr, "detached "+r.Name+" ") ||
			!strings.Contains(stderr, "its namespace had changed on the target since") || !strings.Contains(stderr, "nothing it acknowledged was left unflushed") {
			t.Errorf("detach of an attachment whose namespace changed: %v\n%s", err, stderr)
		}
		e.assertGone(r)
	}

	e.restartOnOtherBacking(nsSize) // the size attachDaemon expects
	lost := e.attachDaemon("found-lost", "--mode", "nbd", "--ctrl-loss-timeout", "3s", "--keep-alive", "1s")
	e.tg.Close()
	start := time.Now()
	_, stderr, err := e.run("detach", lost.Name)
	if err != nil || !strings.Contains(stderr, "detached found-lost ") || !strings.Contains(stderr, "its controller had been lost since") {
		t.Errorf("detach of an attachment whose teardown found its controller lost: %v\n%s", err, stderr)
	}
	if el := time.Since(start); el < 2*time.Second {
		t.Logf("detach took %v: the loss may have been declared before it (not what this case is about)", el)
	}
	e.assertGone(lost)
}

// TestDetachNamesWhatAnUncleanTargetRestartMayHaveLost: writes the
// attachment acknowledged and had not flushed when the target restarted
// without a clean shutdown may be lost; detach fails naming them, even
// though the final flush on the new target succeeds, and the attach process
// logged it when it reconnected. After a clean restart nothing is at risk
// and detach succeeds.
func TestDetachNamesWhatAnUncleanTargetRestartMayHaveLost(t *testing.T) {
	e := newCLIEnv(t)
	for _, clean := range []bool{true, false} {
		name := map[bool]string{true: "restart-clean", false: "restart-unclean"}[clean]
		r := e.attachDaemon(name, "--mode", "nbd")
		c := dialNBD(t, r.Socket, r.Name)
		c.write(0, bytes.Repeat([]byte{7}, 3*4096))
		e.restartInPlace(clean)
		if errno := c.read(0, 4096); errno != 0 { // served by the new target process
			t.Fatalf("%s: NBD read after the restart: error %d", name, errno)
		}
		c.disconnect()
		e.waitPossiblyLost(r.Name, map[bool]int64{true: 0, false: 1}[clean])
		_, stderr, err := e.run("detach", r.Name)
		const lost = "1 write or trim (12 KiB) that the initiator acknowledged had not been flushed when the target restarted without a clean shutdown, and may be lost"
		if clean {
			if err != nil || strings.Contains(stderr, "may be lost") {
				t.Errorf("detach after a clean target restart: %v\n%s", err, stderr)
			}
		} else if err == nil || !strings.Contains(stderr, lost) {
			t.Errorf("detach after an unclean target restart: %v\n%s\nwant %q", err, stderr, lost)
		}
		e.assertGone(r)
	}
}

// waitPossiblyLost waits until list --json shows the attachment name with
// want writes possibly lost to a target restart, and checks the table says
// so (or says nothing of it).
func (e *cliEnv) waitPossiblyLost(name string, want int64) {
	e.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out, _ := e.mustRun("list", "--json")
		var listed []attach.Record
		if err := json.Unmarshal([]byte(out), &listed); err != nil {
			e.t.Fatalf("list --json: %v\n%s", err, out)
		}
		i := slices.IndexFunc(listed, func(r attach.Record) bool { return r.Name == name })
		if i >= 0 && listed[i].PossiblyLost == want && (want == 0 || listed[i].PossiblyLostBytes == 3*4096 && !listed[i].PossiblyLostSince.IsZero()) {
			break
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s not listed with %d writes possibly lost:\n%s", name, want, out)
		}
	}
	table, _ := e.mustRun("list")
	line := name + ": 1 write or trim (12 KiB) it had acknowledged may be lost: they were not flushed when the target restarted without a clean shutdown"
	if strings.Contains(table, line) != (want > 0) {
		e.t.Errorf("list (want %d possibly lost for %s):\n%s", want, name, table)
	}
}

// TestSIGTERMLogsConnectedNBDClient: a client still connected when an nbd
// attachment is told to stop is named in a warning of the attach process,
// which closes its connection after a flush. Before, it was dropped without
// a word.
func TestSIGTERMLogsConnectedNBDClient(t *testing.T) {
	e := newCLIEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd, rec, stderr := e.startForeground(ctx, "--target", e.addr, "--nqn", cliSubNQN, "--name", "sigterm",
		"--socket", filepath.Join(t.TempDir(), "sigterm.sock"), "--io-queues", "1")
	c := dialNBD(t, rec.Socket, rec.Name)
	c.write(0, bytes.Repeat([]byte{1}, 4096))
	flushes := e.commands("flush")
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("attach after SIGTERM: %v\n%s", err, stderr.String())
	}
	if _, err := c.r.ReadByte(); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("the client's connection is still open after the teardown: %v", err)
	}
	log := stderr.String()
	for _, want := range []string{"level=WARN", "closing a connected client's connection after a flush",
		fmt.Sprintf("client=\"pid %d (uid %d) on unix:%s\"", os.Getpid(), os.Getuid(), rec.Socket)} {
		if !strings.Contains(log, want) {
			t.Errorf("the attach process's log lacks %q:\n%s", want, log)
		}
	}
	if !e.commandsAbove("flush", flushes) {
		t.Error("no flush reached the target at the teardown")
	}
	e.assertGone(rec)
}

// canLoop reports whether the fuse mode can work here (root, FUSE, loop devices).
func canLoop() bool {
	if os.Geteuid() != 0 {
		return false
	}
	for _, p := range []string{"/dev/fuse", "/dev/loop-control"} {
		if _, err := os.Stat(p); err != nil {
			return false
		}
	}
	return true
}

// TestListCreatesNoRunDir: list and detach --all with a run directory that
// does not exist report nothing attached and create nothing.
func TestListCreatesNoRunDir(t *testing.T) {
	e := &cliEnv{t: t, runDir: filepath.Join(t.TempDir(), "no", "such", "run")}
	out, _ := e.mustRun("list")
	if !strings.Contains(out, "nothing is attached") {
		t.Errorf("list with no run directory: %s", out)
	}
	out, _ = e.mustRun("list", "--json")
	if strings.TrimSpace(out) != "[]" {
		t.Errorf("list --json with no run directory: %s", out)
	}
	if _, stderr := e.mustRun("detach", "--all"); !strings.Contains(stderr, "nothing is attached") {
		t.Errorf("detach --all with no run directory: %s", stderr)
	}
	if _, stderr, err := e.run("detach", "x"); err == nil || !strings.Contains(stderr, `no attachment named "x"`) {
		t.Errorf("detach x with no run directory: %v %s", err, stderr)
	}
	if _, err := os.Stat(filepath.Dir(filepath.Dir(e.runDir))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("list or detach created (part of) the run directory %s: %v", e.runDir, err)
	}
}

// assertListedDead checks that list's table shows each of recs in state,
// with a line under it saying since when (since) and why (why).
func (e *cliEnv) assertListedDead(recs []attach.Record, state, since, why string) {
	e.t.Helper()
	out, _ := e.mustRun("list")
	for _, r := range recs {
		if !strings.Contains(out, r.Name+": "+since) || !strings.Contains(out, why) {
			e.t.Errorf("list does not say since when and why %s is %s:\n%s", r.Name, state, out)
		}
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, r.Name+" ") && !strings.Contains(l, " "+state+" ") {
				e.t.Errorf("list line of %s does not say %s:\n%s", r.Name, state, out)
			}
		}
	}
}
