package dhchapguest

import (
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

// secrets makes the host and controller secrets in the guest. The lab's
// pinned kernels have in-band authentication on both sides ($AUTHCONFIG:
// CONFIG_NVME_HOST_AUTH or CONFIG_NVME_TARGET_AUTH); one without it fails
// the run saying so.
const secrets = `
step "secrets"
cp "$BIN"/nprdma-target "$BIN"/nprdma-initiator /dev/shm/
grep -q "^$AUTHCONFIG=y" /boot/config-"$(uname -r)" || { echo "the guest kernel has no $AUTHCONFIG"; exit 1; }
umask 077
/dev/shm/nprdma-target gen-dhchap-key --hmac 1 --output /dev/shm/host.key
/dev/shm/nprdma-target gen-dhchap-key --hmac 3 --output /dev/shm/ctrl.key
/dev/shm/nprdma-target gen-dhchap-key --hmac 1 --output /dev/shm/wrong.key
HOST=$(cat /dev/shm/host.key) CTRL=$(cat /dev/shm/ctrl.key) WRONG=$(cat /dev/shm/wrong.key)
truncate -s 64M /dev/shm/disk.img
`

// TestGuestLinuxHostAuthenticatesToOurTarget: the kernel's NVMe/TCP host
// connects to nprdma-target with --dhchap-secret (and, the second time,
// --dhchap-ctrl-secret), and fio verifies I/O through the namespace; a
// wrong secret is refused, with the kernel's own words.
func TestGuestLinuxHostAuthenticatesToOurTarget(t *testing.T) {
	lab.Require(t)
	bin := buildTools(t)
	res := lab.RunT(t, lab.Spec{
		Modules: []string{"nvme-tcp"},
		Env:     map[string]string{"BIN": bin, "HOSTNQN": hostNQN, "NQN": subNQN, "AUTHCONFIG": "CONFIG_NVME_HOST_AUTH"},
		Timeout: 10 * time.Minute,
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
dmesg -C
if nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$NQN" --hostnqn "$HOSTNQN" --dhchap-secret "$WRONG" 2>"$LAB_OUT/wrong.err"; then
	echo "connected with a wrong secret"; exit 1
fi
dmesg | grep -i 'nvme' | grep -i 'auth' >"$LAB_OUT/wrong.dmesg" || true
step "wrong controller secret refused"
dmesg -C
if nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$NQN" --hostnqn "$HOSTNQN" --dhchap-secret "$HOST" --dhchap-ctrl-secret "$WRONG" 2>"$LAB_OUT/wrongctrl.err"; then
	echo "connected to a controller that did not prove its secret"; exit 1
fi
dmesg | grep -i 'nvme' | grep -i 'auth' >"$LAB_OUT/wrongctrl.dmesg" || true
cp /dev/shm/*.key "$LAB_OUT/"
`,
	})
	// The kernel's words: a host secret the target refused is
	// AUTH_Failure1 to it, -EKEYREJECTED (129); a controller that did not
	// prove its secret fails the host's own check.
	for f, says := range map[string]string{"wrong.dmesg": "qid 0: authentication failed, error -129",
		"wrongctrl.dmesg": "qid 0: controller authentication failed"} {
		b := readOut(t, res.Dir, f)
		if !strings.Contains(b, says) {
			t.Errorf("%s: the kernel did not report %q:\n%s", f, says, b)
		}
		t.Logf("%s:\n%s", f, b)
	}
	// nvme connect's: the write to /dev/nvme-fabrics failed with
	// EKEYREJECTED.
	for _, f := range []string{"wrong.err", "wrongctrl.err"} {
		if b := readOut(t, res.Dir, f); !strings.Contains(b, "Key was rejected by service") {
			t.Errorf("%s: nvme connect did not fail with EKEYREJECTED:\n%s", f, b)
		}
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

// TestGuestAuthenticationOverRDMA: over an RDMA NIC (Soft-RoCE), the
// kernel's NVMe/RDMA host and nprdma-initiator on the nprdma fabric both
// authenticate to nprdma-target --provider verbs with the host and
// controller secrets and do verified I/O; a wrong host secret is refused on
// each.
func TestGuestAuthenticationOverRDMA(t *testing.T) {
	lab.Require(t)
	bin := buildTools(t)
	res := lab.RunT(t, lab.Spec{
		Modules: []string{"rdma_rxe", "rdma_ucm", "nvme-rdma"},
		Env:     map[string]string{"BIN": bin, "HOSTNQN": hostNQN, "NQN": subNQN, "AUTHCONFIG": "CONFIG_NVME_HOST_AUTH"},
		Timeout: 10 * time.Minute,
		Script: secrets + `
step "rxe"
rxe_up
step "target"
/dev/shm/nprdma-target --provider verbs --listen 10.0.2.15:4420 --backing /dev/shm/disk.img --memory 32MiB \
	--nqn "$NQN" --allow-host "$HOSTNQN" \
	--dhchap-secret-file "$HOSTNQN=/dev/shm/host.key" --dhchap-ctrl-secret-file "$HOSTNQN=/dev/shm/ctrl.key" \
	--data-dir /dev/shm/data --log-level info 2>"$LAB_OUT/target.log" &
for i in $(seq 100); do grep -q 'connect with' "$LAB_OUT/target.log" && break; sleep 0.1; done

step "kernel host bidirectional"
nvme connect -t rdma -a 10.0.2.15 -s 4420 -n "$NQN" --hostnqn "$HOSTNQN" --dhchap-secret "$HOST" --dhchap-ctrl-secret "$CTRL"
dev=$(nvme_ns_dev "$NQN")
fio --name=v --filename="$dev" --rw=randwrite --bs=4k --size=8M --ioengine=libaio --iodepth=8 --direct=1 \
	--verify=crc32c --do_verify=1 --output-format=json --output="$LAB_OUT/fio-kernel.json"
nvme disconnect -n "$NQN"
step "kernel host wrong secret"
if nvme connect -t rdma -a 10.0.2.15 -s 4420 -n "$NQN" --hostnqn "$HOSTNQN" --dhchap-secret "$WRONG" 2>"$LAB_OUT/wrong-kernel.err"; then
	echo "the kernel host connected with a wrong secret"; exit 1
fi

step "our initiator bidirectional"
/dev/shm/nprdma-initiator --provider verbs --hostnqn "$HOSTNQN" --dhchap-secret-file /dev/shm/host.key \
	--dhchap-ctrl-secret-file /dev/shm/ctrl.key attach --target 10.0.2.15:4420 --nqn "$NQN" \
	--mode nbd --socket /dev/shm/ns.sock --name auth --run-dir /dev/shm/run --daemon
fio --name=v --ioengine=nbd --uri='nbd+unix:///?socket=/dev/shm/ns.sock' --rw=randwrite --bs=4k --size=8M \
	--offset=16M --iodepth=8 --verify=crc32c --do_verify=1 --output-format=json --output="$LAB_OUT/fio-ours.json"
/dev/shm/nprdma-initiator detach --run-dir /dev/shm/run --all
step "our initiator wrong secret"
chmod 600 /dev/shm/wrong.key
if /dev/shm/nprdma-initiator --provider verbs --hostnqn "$HOSTNQN" --dhchap-secret-file /dev/shm/wrong.key \
	attach --target 10.0.2.15:4420 --nqn "$NQN" --mode nbd --socket /dev/shm/wrong.sock --name wrong \
	--run-dir /dev/shm/run --daemon >"$LAB_OUT/wrong-ours.out" 2>&1; then
	echo "our initiator attached with a wrong secret"; exit 1
fi
`,
	})
	for _, f := range []string{"fio-kernel.json", "fio-ours.json"} {
		if fio := readOut(t, res.Dir, f); !strings.Contains(fio, `"jobs"`) || strings.Contains(fio, "verify failed") {
			t.Errorf("%s: no clean fio report:\n%s", f, fio)
		}
	}
	if b := readOut(t, res.Dir, "wrong-kernel.err"); !strings.Contains(b, "Key was rejected by service") {
		t.Errorf("the kernel's NVMe/RDMA host with a wrong secret did not fail with EKEYREJECTED:\n%s", b)
	}
	if b := readOut(t, res.Dir, "wrong-ours.out"); !strings.Contains(b, "refused host "+hostNQN+"'s DH-HMAC-CHAP secret") {
		t.Errorf("our initiator with a wrong secret: the refusal does not say so:\n%s", b)
	}
	target := readOut(t, res.Dir, "target.log")
	// Two controllers, the kernel host's and ours, each authenticated both
	// ways on its admin queue.
	admins := 0
	for _, l := range strings.Split(target, "\n") {
		if strings.Contains(l, "host authenticated") && strings.Contains(l, " qid=0 ") && strings.Contains(l, "bidirectional=true") {
			admins++
		}
	}
	if admins != 2 {
		t.Errorf("the target logged %d bidirectional authentications of an admin queue, want 2 (the kernel host's, ours):\n%s", admins, target)
	}
}

// TestGuestOurInitiatorAuthenticatesToNvmet: nprdma-initiator over
// NVMe/TCP, with the host and controller secrets, reads and writes through
// the kernel's nvmet configured with the same dhchap keys (SHA-512,
// ffdhe3072); a wrong secret is refused, and so is a controller secret the
// target cannot prove.
func TestGuestOurInitiatorAuthenticatesToNvmet(t *testing.T) {
	lab.Require(t)
	bin := buildTools(t)
	res := lab.RunT(t, lab.Spec{
		Modules: []string{"nvmet-tcp"},
		Env:     map[string]string{"BIN": bin, "HOSTNQN": hostNQN, "NQN": subNQN, "AUTHCONFIG": "CONFIG_NVME_TARGET_AUTH"},
		Timeout: 10 * time.Minute,
		Script: secrets + `
step "nvmet with a dhchap key"
nvmet_export "$NQN" /dev/shm/disk.img tcp 127.0.0.1 4420
cfs=/sys/kernel/config/nvmet
echo 0 >"$cfs/subsystems/$NQN/attr_allow_any_host"
mkdir "$cfs/hosts/$HOSTNQN"
echo "$HOST" >"$cfs/hosts/$HOSTNQN/dhchap_key"
echo "$CTRL" >"$cfs/hosts/$HOSTNQN/dhchap_ctrl_key"
echo 'hmac(sha512)' >"$cfs/hosts/$HOSTNQN/dhchap_hash"
echo ffdhe3072 >"$cfs/hosts/$HOSTNQN/dhchap_dhgroup"
ln -s "$cfs/hosts/$HOSTNQN" "$cfs/subsystems/$NQN/allowed_hosts/$HOSTNQN"

step "attach bidirectional"
/dev/shm/nprdma-initiator --transport tcp --hostnqn "$HOSTNQN" --dhchap-secret-file /dev/shm/host.key \
	--dhchap-ctrl-secret-file /dev/shm/ctrl.key attach --target 127.0.0.1:4420 --nqn "$NQN" \
	--mode nbd --socket /dev/shm/ns.sock --name auth --run-dir /dev/shm/run --daemon
step "io"
fio --name=v --ioengine=nbd --uri='nbd+unix:///?socket=/dev/shm/ns.sock' --rw=randwrite --bs=4k --size=16M \
	--iodepth=8 --verify=crc32c --do_verify=1 --output-format=json --output="$LAB_OUT/fio.json"
/dev/shm/nprdma-initiator detach --run-dir /dev/shm/run --all

step "wrong secret refused"
chmod 600 /dev/shm/wrong.key
if /dev/shm/nprdma-initiator --transport tcp --hostnqn "$HOSTNQN" --dhchap-secret-file /dev/shm/wrong.key \
	attach --target 127.0.0.1:4420 --nqn "$NQN" --mode nbd --socket /dev/shm/wrong.sock --name wrong \
	--run-dir /dev/shm/run --daemon >"$LAB_OUT/wrong.out" 2>&1; then
	echo "attached with a wrong secret"; exit 1
fi
step "controller that cannot prove itself"
if /dev/shm/nprdma-initiator --transport tcp --hostnqn "$HOSTNQN" --dhchap-secret-file /dev/shm/host.key \
	--dhchap-ctrl-secret-file /dev/shm/wrong.key attach --target 127.0.0.1:4420 --nqn "$NQN" --mode nbd \
	--socket /dev/shm/wrongctrl.sock --name wrongctrl --run-dir /dev/shm/run --daemon >"$LAB_OUT/wrongctrl.out" 2>&1; then
	echo "attached to a controller that did not prove its secret"; exit 1
fi
/dev/shm/nprdma-initiator list --run-dir /dev/shm/run >"$LAB_OUT/list.out" 2>&1
`,
	})
	if fio := readOut(t, res.Dir, "fio.json"); !strings.Contains(fio, `"jobs"`) {
		t.Fatalf("no fio report from the I/O through the initiator:\n%s", fio)
	}
	for f, says := range map[string]string{"wrong.out": "refused host " + hostNQN + "'s DH-HMAC-CHAP secret",
		"wrongctrl.out": "did not prove it holds the controller secret"} {
		if b := readOut(t, res.Dir, f); !strings.Contains(b, says) {
			t.Errorf("%s: the refusal does not say %q:\n%s", f, says, b)
		}
	}
	if l := readOut(t, res.Dir, "list.out"); strings.Contains(l, "wrong") {
		t.Errorf("a refused attachment is listed:\n%s", l)
	}
}

func readOut(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Errorf("reading what the guest wrote: %v", err)
	}
	return string(b)
}
