package nvmetcphost

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/internal/fiotest"
	"github.com/nprdma/nprdma/lab"
)

const (
	guestNQN  = "nqn.2026-11.io.nprdma:nvmet-file"
	diskSize  = 64 << 20
	fioRegion = 8 << 20
)

// TestGuestAttachKernelTarget: in the guest, the kernel's nvmet-tcp serves
// a file on 127.0.0.1:4420; nprdma-initiator --transport tcp discovers it
// (nvmet answers the discovery NQN on its I/O port) and attaches it in NBD
// socket mode, without digests and then with header and data digests; fio's
// nbd engine writes a region at random, 4–128 KiB at a time (in the capsule
// and after R2T; reads in one or several C2HData), and verifies it (crc32c)
// through each attachment, and each detach (SIGTERM) flushes and exits 0.
func TestGuestAttachKernelTarget(t *testing.T) {
	lab.Require(t)
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("needs fio (with its nbd engine) on this machine: the guest runs it from here")
	}
	ini := buildInitiator(t)
	res := lab.RunT(t, lab.Spec{
		Modules: []string{"nvmet", "nvmet-tcp"},
		Env:     map[string]string{"INI": ini, "NQN": guestNQN, "REGION": "8m"},
		Timeout: 4 * time.Minute,
		Script: `
step "export a file with nvmet-tcp"
truncate -s 64M /dev/shm/disk.img
nvmet_export "$NQN" /dev/shm/disk.img tcp 127.0.0.1 4420
step "discover"
"$INI" --hostid-file /dev/shm/hostid --transport tcp discover --target 127.0.0.1:4420 --json >"$LAB_OUT/discover.json"
off=0
for mode in plain digests; do
	flags=""
	[ "$mode" = digests ] && flags="--hdr-digest --data-digest"
	sock=/dev/shm/$mode.sock
	step "attach ($mode)"
	"$INI" --hostid-file /dev/shm/hostid --transport tcp $flags attach --mode nbd --target 127.0.0.1 --nqn "$NQN" \
		--socket "$sock" --run-dir /dev/shm/run-$mode >"$LAB_OUT/attach-$mode.log" 2>&1 &
	pid=$!
	for i in $(seq 600); do
		[ -S "$sock" ] && break
		kill -0 "$pid"
		sleep 0.1
	done
	[ -S "$sock" ]
	step "fio verify ($mode)"
	fio --name=verify --ioengine=nbd --uri="nbd+unix:///?socket=$sock" --rw=randwrite --bsrange=4k-128k --iodepth=16 \
		--offset="$off" --size="$REGION" --verify=crc32c --verify_fatal=1 --verify_state_save=0 \
		--output-format=json >"$LAB_OUT/fio-$mode.json"
	step "detach ($mode)"
	kill -TERM "$pid"
	wait "$pid"
	off=$REGION
done
step "nvmet clear"
nvmet_clear
`,
	})
	var d struct {
		Subsystems []struct {
			NQN        string `json:"nqn"`
			Transport  string `json:"transport"`
			Namespaces []struct {
				Size int64 `json:"size_bytes"`
			} `json:"namespaces"`
			Error string `json:"error"`
		} `json:"subsystems"`
	}
	b, err := os.ReadFile(filepath.Join(res.Dir, "discover.json"))
	if err == nil {
		err = json.Unmarshal(b, &d)
	}
	if err != nil {
		t.Fatalf("discover --json: %v\n%s", err, b)
	}
	found := false
	for _, s := range d.Subsystems {
		if s.NQN == guestNQN {
			found = true
			if s.Transport != "tcp" || s.Error != "" || len(s.Namespaces) != 1 || s.Namespaces[0].Size != diskSize {
				t.Errorf("discover lists %+v, want the NVMe/TCP subsystem with one %d-byte namespace", s, diskSize)
			}
		}
	}
	if !found {
		t.Errorf("discover does not list %s:\n%s", guestNQN, b)
	}
	for _, mode := range []string{"plain", "digests"} {
		out, err := os.ReadFile(filepath.Join(res.Dir, "fio-"+mode+".json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := fiotest.CheckVerify(out, fioRegion); err != nil {
			t.Errorf("fio through the %s attachment: %v", mode, err)
		}
		log, _ := os.ReadFile(filepath.Join(res.Dir, "attach-"+mode+".log"))
		if !strings.Contains(string(log), "attached ") {
			t.Errorf("attach (%s) did not say it attached:\n%s", mode, log)
		}
	}
}

// buildInitiator builds nprdma-initiator into a directory the guest sees
// at the same path (the lab shares this machine's file system).
func buildInitiator(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go command to build nprdma-initiator")
	}
	path := filepath.Join(t.TempDir(), "nprdma-initiator")
	cmd := exec.Command("go", "build", "-o", path, "github.com/nprdma/nprdma/cmd/nprdma-initiator")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build nprdma-initiator: %v\n%s", err, out)
	}
	return path
}
