package csi

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"

	"github.com/nprdma/nprdma/internal/gobuild"
	"github.com/nprdma/nprdma/internal/logtest"
	"github.com/nprdma/nprdma/internal/mountinfo"
	"github.com/nprdma/nprdma/internal/targettest"
	"github.com/nprdma/nprdma/target/manage"
)

func TestMain(m *testing.M) {
	code := m.Run()
	gobuild.Clean()
	os.Exit(code)
}

// requireNode skips unless the node service can work here: root, FUSE,
// loop devices and the tools NodeStage runs.
func requireNode(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the node service attaches loop devices and mounts")
	}
	for _, dev := range []string{"/dev/fuse", "/dev/loop-control"} {
		if _, err := os.Stat(dev); err != nil {
			t.Skipf("no %s: the node service attaches in fuse mode (a FUSE file and a loop device)", dev)
		}
	}
	for _, tool := range []string{"mkfs.ext4", "blkid", "mount", "resize2fs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (scripts/deps.sh installs it)", tool)
		}
	}
}

// rig is two real targets started by the test, and the driver over them,
// serving both services on a unix socket.
type rig struct {
	targets  []*targettest.Proc
	driver   *Driver
	endpoint string
	runDir   string
	hostNQN  string
	log      logtest.Buffer // the driver's log
}

func newRig(t *testing.T, node bool) *rig {
	t.Helper()
	dir := t.TempDir()
	r := &rig{runDir: filepath.Join(dir, "run"), endpoint: filepath.Join(dir, "csi.sock")}
	var list []Target
	for _, name := range []string{"t1", "t2"} {
		p := targettest.Start(t, filepath.Join(dir, name), targettest.FreeAddr(t), "--no-default-namespace", "--memory", "256MiB")
		r.targets = append(r.targets, p)
		list = append(list, Target{Name: name, Manage: "unix:" + p.Socket, Address: p.Addr})
	}
	// Every line at debug (requests included), kept for tests that read
	// the log; shown too with -v.
	var w io.Writer = &r.log
	if testing.Verbose() {
		w = io.MultiWriter(w, os.Stderr)
	}
	log := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts := []Option{WithController(list), WithLogger(log)}
	if node {
		ini := gobuild.Command(t, "nprdma-initiator", "NPRDMA_INITIATOR_BIN")
		hostid := filepath.Join(dir, "hostid")
		out, err := exec.Command(ini, "--hostid-file", hostid, "hostnqn").Output()
		if err != nil {
			t.Fatal(err)
		}
		r.hostNQN = strings.TrimSpace(string(out))
		opts = append(opts, WithNode(r.hostNQN, ini, r.runDir, "--hostid-file", hostid))
	}
	d, err := New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	r.driver = d
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx, "unix://"+r.endpoint) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	for i := 0; ; i++ {
		if _, err := os.Stat(r.endpoint); err == nil {
			break
		}
		if i > 500 {
			t.Fatal("the driver's socket did not appear")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return r
}

// inventories asks each target what it serves.
func (r *rig) inventories(t *testing.T) []manage.Inventory {
	t.Helper()
	var out []manage.Inventory
	for _, p := range r.targets {
		c, err := manage.Dial("unix:"+p.Socket, "")
		if err != nil {
			t.Fatal(err)
		}
		inv, err := c.Inventory(context.Background())
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, inv)
	}
	return out
}

// TestSanity runs csi-sanity against the driver over two real targets,
// with real attaches (fuse mode: a FUSE file and a loop device per volume),
// mkfs and mounts. Afterwards nothing is left: no volume on the targets, no
// attachment, no mount under the test's directories.
func TestSanity(t *testing.T) {
	requireNode(t)
	r := newRig(t, true)
	dir := t.TempDir()
	cfg := sanity.NewTestConfig()
	cfg.Address = r.endpoint
	cfg.TargetPath = filepath.Join(dir, "target")
	cfg.StagingPath = filepath.Join(dir, "staging")
	cfg.TestVolumeSize = 16 << 20
	cfg.TestVolumeExpandSize = 24 << 20
	cfg.IdempotentCount = 2
	start := time.Now()
	sanity.Test(t, cfg)
	t.Logf("csi-sanity took %v", time.Since(start).Round(time.Second))

	for i, inv := range r.inventories(t) {
		for _, s := range inv.Subsystems {
			t.Errorf("target %d still serves subsystem %s with %d namespaces", i+1, s.NQN, len(s.Namespaces))
		}
	}
	r.checkNothingLeft(t, "after csi-sanity", dir)
}

// checkNothingLeft fails the test (saying when) if an attachment is left
// on the node, or a mount under the run directory or dirs.
func (r *rig) checkNothingLeft(t *testing.T, when string, dirs ...string) {
	t.Helper()
	a, err := exec.Command(r.driver.cfg.initiator, "list", "--json", "--run-dir", r.runDir).Output()
	if err != nil || strings.TrimSpace(string(a)) != "[]" {
		t.Errorf("%s: attachments left: %s (%v)", when, a, err)
	}
	mounts, err := mountinfo.Read()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		for _, d := range append(dirs, r.runDir) {
			if strings.HasPrefix(m.MountPoint, d) {
				t.Errorf("%s: mount left at %s (%s)", when, m.MountPoint, m.FSType)
			}
		}
	}
}
