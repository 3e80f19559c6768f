// The constraint keeps this file out of builds, vet and go mod tidy until
// package lab and the NVMe/TCP flags it uses are in the module: delete it
// then.

//go:build ignore

package dhchapguest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/lab"
)

const (
	hostNQN = "nqn.2014-08.org.nvmexpress:uuid:5d3c8f2e-7a41-4b6e-9f10-2c4d6e8a0b13"
	subNQN  = "nqn.2024-01.io.nprdma:dhchap-guest"
)

// buildTools builds the two commands into a directory the guest sees (the
// host's file system is visible read-only at the same paths).
func buildTools(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to build nprdma-target and nprdma-initiator")
	}
	dir := t.TempDir()
	for _, cmd := range []string{"nprdma-target", "nprdma-initiator"} {
		out, err := exec.Command("go", "build", "-o", filepath.Join(dir, cmd), "github.com/nprdma/nprdma/cmd/"+cmd).CombinedOutput()
		if err != nil {
			t.Fatalf("go build %s: %v\n%s", cmd, err, out)
		}
	}
	return dir
}

// secrets makes the host and controller secrets in the guest, and skips
// the run (exit 77) where the kernel lacks in-band authentication.
const secrets = `
step "secrets"
cp "$BIN"/nprdma-target "$BIN"/nprdma-initiator /dev/shm/
grep -q '^CONFIG_NVME_AUTH=y' /boot/config-"$(uname -r)" 2>/dev/null || { echo "kernel without CONFIG_NVME_AUTH"; exit 77; }
umask 077
/dev/shm/nprdma-target gen-dhchap-key --hmac 1 --output /dev/shm/host.key
/dev/shm/nprdma-target gen-dhchap-key --hmac 3 --output /dev/shm/ctrl.key
/dev/shm/nprdma-target gen-dhchap-key --hmac 1 --output /dev/shm/wrong.key
HOST=$(cat /dev/shm/host.key) CTRL=$(cat /dev/shm/ctrl.key) WRONG=$(cat /dev/shm/wrong.key)
truncate -s 64M /dev/shm/disk.img
`

// TestLinuxHostAuthenticatesToOurTarget: the kernel's NVMe/TCP host
// connects to nprdma-target with --dhchap-secret (and, the second time,
// --dhchap-ctrl-secret), and fio verifies I/O through the namespace; a
// wrong secret is refused, with the kernel's own words.
func TestLinuxHostAuthenticatesToOurTarget(t *testing.T) {
	lab.Require(t)
	bin := buildTools(t)
	res := run(t, lab.Spec{
		Modules: []string{"nvme-tcp"},
		Env:     map[string]string{"BIN": bin, "HOSTNQN": hostNQN, "NQN": subNQN},
		Timeout: 10 * time.Minute,
		Log:     testLog{t},
		Script: secrets + `
step "target"
/dev/shm/nprdma-target --backing /dev/shm/disk.img --memory 32MiB --listen 127.0.0.1:4430 \
	--listen-nvme-tcp 127.0.0.1:4420 --nqn "$NQN" --allow-host "$HOSTNQN" \
	--dhchap-secret-file "$HOSTNQN=/dev/shm/host.key" --dhchap-ctrl-secret-file "$HOSTNQN=/dev/shm/ctrl.key" \
	--data-dir /dev/shm/data --log-level info 2>"$LAB_OUT/target.log" &
for i in $(seq 100); do grep -q 'connect with' "$LAB_OUT/target.log" && break; sleep 0.1; done

step "connect unidirectional"
nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$NQN" --hostnqn "$HOSTNQN" --dhchap-secret "$HOST"
dev=$(nvme_ns_dev "$NQN")
step "io unidirectional"
fio --name=v --filename="$dev" --rw=randwrite --bs=4k --size=16M --ioengine=libaio --iodepth=8 --direct=1 \
	--verify=crc32c --do_verify=1 --output-format=json --output="$LAB_OUT/fio-uni.json"
nvme disconnect -n "$NQN"

step "connect bidirectional"
nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$NQN" --hostnqn "$HOSTNQN" --dhchap-secret "$HOST" --dhchap-ctrl-secret "$CTRL"
dev=$(nvme_ns_dev "$NQN")
step "io bidirectional"
fio --name=v --filename="$dev" --rw=randrw --bs=4k --size=16M --ioengine=libaio --iodepth=8 --direct=1 \
	--verify=crc32c --do_verify=1 --output-format=json --output="$LAB_OUT/fio-bidi.json"
nvme disconnect -n "$NQN"

step "wrong secret refused"
if nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$NQN" --hostnqn "$HOSTNQN" --dhchap-secret "$WRONG" 2>"$LAB_OUT/wrong.err"; then
	echo "connected with a wrong secret"; exit 1
fi
dmesg | grep -i 'nvme' | grep -i 'auth' >"$LAB_OUT/wrong.dmesg" || true
step "wrong controller secret refused"
if nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$NQN" --hostnqn "$HOSTNQN" --dhchap-secret "$HOST" --dhchap-ctrl-secret "$WRONG" 2>"$LAB_OUT/wrongctrl.err"; then
	echo "connected to a controller that did not prove its secret"; exit 1
fi
dmesg | grep -i 'nvme' | grep -i 'auth' >"$LAB_OUT/wrongctrl.dmesg" || true
cp /dev/shm/*.key "$LAB_OUT/"
`,
	})
	for _, f := range []string{"wrong.dmesg", "wrongctrl.dmesg"} {
		b := readOut(t, res.Dir, f)
		if !strings.Contains(b, "authentication failed") {
			t.Errorf("%s: the kernel did not report a failed authentication:\n%s", f, b)
		}
		t.Logf("%s:\n%s", f, b)
	}
	target := readOut(t, res.Dir, "target.log")
	for _, s := range []string{"host.key", "ctrl.key", "wrong.key"} {
		if secret := strings.TrimSpace(readOut(t, res.Dir, s)); len(secret) < 40 || strings.Contains(target, secret[10:40]) {
			t.Fatalf("the target logged %s", s)
		}
	}
	if !strings.Contains(target, "host authenticated") || !strings.Contains(target, "host failed to authenticate") {
		t.Fatalf("the target's log lacks the authentications:\n%s", target)
	}
}

// TestOurInitiatorAuthenticatesToNvmet: nprdma-initiator, with the host
// and controller secrets, reads and writes through the kernel's nvmet
// configured with the same dhchap keys (SHA-512, ffdhe3072); a wrong
// secret is refused.
func TestOurInitiatorAuthenticatesToNvmet(t *testing.T) {
	lab.Require(t)
	bin := buildTools(t)
	res := run(t, lab.Spec{
		Modules: []string{"nvmet-tcp"},
		Env:     map[string]string{"BIN": bin, "HOSTNQN": hostNQN, "NQN": subNQN},
		Timeout: 10 * time.Minute,
		Log:     testLog{t},
		Script: secrets + `
step "nvmet with a dhchap key"
nvmet_export "$NQN" /dev/shm/disk.img tcp 127.0.0.1 4420
cfs=/sys/kernel/config/nvmet
echo 0 >"$cfs/subsystems/$NQN/attr_allow_any_host"
mkdir "$cfs/hosts/$HOSTNQN"
[ -e "$cfs/hosts/$HOSTNQN/dhchap_key" ] || { echo "nvmet without CONFIG_NVME_TARGET_AUTH"; exit 77; }
echo "$HOST" >"$cfs/hosts/$HOSTNQN/dhchap_key"
echo "$CTRL" >"$cfs/hosts/$HOSTNQN/dhchap_ctrl_key"
echo 'hmac(sha512)' >"$cfs/hosts/$HOSTNQN/dhchap_hash"
echo ffdhe3072 >"$cfs/hosts/$HOSTNQN/dhchap_dhgroup"
ln -s "$cfs/hosts/$HOSTNQN" "$cfs/subsystems/$NQN/allowed_hosts/$HOSTNQN"

step "attach bidirectional"
/dev/shm/nprdma-initiator --hostnqn "$HOSTNQN" --dhchap-secret-file /dev/shm/host.key \
	--dhchap-ctrl-secret-file /dev/shm/ctrl.key attach --transport tcp --target 127.0.0.1:4420 --nqn "$NQN" \
	--mode nbd --socket /dev/shm/ns.sock --name auth --run-dir /dev/shm/run --daemon
step "io"
fio --name=v --ioengine=nbd --uri='nbd+unix:///?socket=/dev/shm/ns.sock' --rw=randwrite --bs=4k --size=16M \
	--iodepth=8 --verify=crc32c --do_verify=1 --output-format=json --output="$LAB_OUT/fio.json"
/dev/shm/nprdma-initiator detach --run-dir /dev/shm/run --all

step "wrong secret refused"
chmod 600 /dev/shm/wrong.key
if /dev/shm/nprdma-initiator --hostnqn "$HOSTNQN" --dhchap-secret-file /dev/shm/wrong.key \
	discover --transport tcp --target 127.0.0.1:4420 --json >"$LAB_OUT/wrong.json" 2>&1; then
	grep -q 'refused host' "$LAB_OUT/wrong.json"
fi
step "controller that cannot prove itself"
if /dev/shm/nprdma-initiator --hostnqn "$HOSTNQN" --dhchap-secret-file /dev/shm/host.key \
	--dhchap-ctrl-secret-file /dev/shm/wrong.key discover --transport tcp --target 127.0.0.1:4420 --json >"$LAB_OUT/wrongctrl.json" 2>&1; then
	grep -q 'did not prove' "$LAB_OUT/wrongctrl.json"
fi
`,
	})
	if fio := readOut(t, res.Dir, "fio.json"); !strings.Contains(fio, `"jobs"`) {
		t.Fatalf("no fio report from the I/O through the initiator:\n%s", fio)
	}
}

// run runs s, skipping the test when the script exits 77 (the guest
// kernel lacks in-band authentication) and failing it, with the failed
// step and the output's tail, on any other failure.
func run(t *testing.T, s lab.Spec) *lab.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), s.Timeout+time.Minute)
	defer cancel()
	res, err := lab.Run(ctx, s)
	if err != nil {
		t.Fatalf("lab: %v", err)
	}
	out := res.Output[max(0, len(res.Output)-4000):]
	switch res.ExitCode {
	case 0:
		return res
	case 77:
		t.Skip(strings.TrimSpace(out))
	}
	t.Fatalf("step %q failed (exit %d):\n%s", res.FailedStep, res.ExitCode, out)
	return nil
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func readOut(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Errorf("reading what the guest wrote: %v", err)
	}
	return string(b)
}
