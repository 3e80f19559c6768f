package manageguest

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/lab"
)

const subNQN = "nqn.2024-01.io.nprdma:resize-guest"

// TestGuestLinuxHostSeesTheResize: in the guest, nprdma-target serves a
// namespace made through ctl over NVMe/TCP; the kernel host connects (nvme
// connect -t tcp), writes a pattern at the end, and ctl resize-ns grows the
// namespace while it stays connected. The kernel takes the notice, reads the
// Changed Namespace List and revalidates: /dev/nvmeXnY reports the new size
// without a reconnect, the pattern reads back, and the grown range is
// written and read. The guest's own log (dmesg) is kept in LAB_OUT.
func TestGuestLinuxHostSeesTheResize(t *testing.T) {
	lab.Require(t)
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to build nprdma-target")
	}
	bin := t.TempDir()
	if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "nprdma-target"), "github.com/nprdma/nprdma/cmd/nprdma-target").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	res := lab.RunT(t, lab.Spec{
		Modules: []string{"nvme-tcp"},
		Env:     map[string]string{"BIN": bin, "NQN": subNQN},
		Timeout: 10 * time.Minute,
		Log:     testLog{t},
		Script: `
step "target"
cp "$BIN"/nprdma-target /dev/shm/
HOSTNQN=$(cat /etc/nvme/hostnqn 2>/dev/null || nvme gen-hostnqn)
/dev/shm/nprdma-target --no-default-namespace --data-dir /dev/shm/data --memory 64MiB \
	--listen 127.0.0.1:4430 --listen-nvme-tcp 127.0.0.1:4420 --log-level info 2>/dev/shm/target.log &
for i in $(seq 100); do grep -q 'connect with' /dev/shm/target.log && break; sleep 0.1; done
ctl() { /dev/shm/nprdma-target ctl --data-dir /dev/shm/data "$@"; }
ctl create-subsys "$NQN" --host "$HOSTNQN"
ctl create-ns "$NQN" --name grows --size 64MiB

step "connect"
nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$NQN" --hostnqn "$HOSTNQN"
dev=$(nvme_ns_dev "$NQN")
[ "$(blockdev --getsize64 "$dev")" = 67108864 ]
head -c 1M /dev/urandom > /dev/shm/pattern
dd if=/dev/shm/pattern of="$dev" bs=1M seek=63 oflag=direct status=none

step "resize"
ctl resize-ns "$NQN" 1 --size 128MiB
for i in $(seq 100); do [ "$(blockdev --getsize64 "$dev")" = 134217728 ] && break; sleep 0.1; done
blockdev --getsize64 "$dev" | tee "$LAB_OUT/size-after"
[ "$(blockdev --getsize64 "$dev")" = 134217728 ]

step "data"
dd if="$dev" of=/dev/shm/back bs=1M skip=63 count=1 iflag=direct status=none
cmp /dev/shm/back /dev/shm/pattern
dd if=/dev/shm/pattern of="$dev" bs=1M seek=127 oflag=direct status=none
dd if="$dev" of=/dev/shm/back bs=1M skip=127 count=1 iflag=direct status=none
cmp /dev/shm/back /dev/shm/pattern

step "disconnect"
nvme disconnect -n "$NQN"
dmesg > "$LAB_OUT/dmesg"
cp /dev/shm/target.log "$LAB_OUT/"
`,
	})
	if !strings.Contains(res.Output, "134217728") {
		t.Fatalf("the size after the resize was not reported:\n%s", res.Output)
	}
}

// testLog writes the lab's progress to the test log.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
