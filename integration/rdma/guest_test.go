package rdma

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/internal/fiotest"
	"github.com/nprdma/nprdma/internal/guesttest"
	"github.com/nprdma/nprdma/lab"
)

// TestGuestRDMA runs, in one guest on Soft-RoCE (rxe over the guest's
// eth0, 10.0.2.15), the tests of nprdma/verbs and then nprdma-target and
// nprdma-initiator with the kernel's own NVMe/RDMA host and target:
//
//   - Verbs: nprdma/verbs's tests, the nprdma conformance suite among them,
//     on the device;
//   - OursToOurs: fio writes and verifies a namespace four times the
//     target's DRAM budget through the NBD socket; a hot set is then read
//     almost entirely one-sided (through frames: the NIC cannot read the
//     namespace's unpinned region), cold reads fall back; the target's
//     pinned memory is its frames, their table and its buffers, nothing of
//     the namespace (whose pinning would exceed that bound);
//   - KernelHost: the kernel's nvme-rdma host connects to our target, nvme
//     list, fio verify, mkfs, mount, a file written, e2fsck; the target
//     killed with SIGKILL after a flush and started again: the host
//     reconnects, the flushed data and the file system are intact;
//     disconnect;
//   - OursToNvmet: our initiator attaches the kernel's nvmet-rdma target,
//     fio verify through the NBD socket (two-sided: a stock target has no
//     frames).
//
// One guest: each costs a boot under TCG (docs/lab.md).
func TestGuestRDMA(t *testing.T) {
	t.Parallel()
	lab.Require(t)
	tgt := guesttest.Command(t, "./cmd/nprdma-target")
	ini := guesttest.Command(t, "./cmd/nprdma-initiator")
	vt := guesttest.TestBinary(t, "./nprdma/verbs")
	res := lab.RunT(t, lab.Spec{
		Modules: []string{"rdma_rxe", "rdma_ucm", "nvme-rdma", "nvmet-rdma"},
		Env:     map[string]string{"TARGET": tgt, "INITIATOR": ini, "VERBS": vt, "NQN": nqn, "KNQN": kernelNQN},
		Script:  guestScript,
		// A bound against a hang: under TCG on a loaded machine the run
		// takes from two minutes to more than five.
		Timeout: 10 * time.Minute,
	})
	out := func(t *testing.T, name string) []byte {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(res.Dir, name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return b
	}
	for _, s := range res.Steps {
		t.Logf("step %-22s %v (guest clock, TCG)", s.Name, s.Duration.Round(1e6))
	}

	t.Run("Verbs", func(t *testing.T) {
		o := string(out(t, "verbs.out"))
		if !strings.Contains(o, "\nPASS\n") {
			t.Fatalf("no PASS from nprdma/verbs's tests in the guest:\n%s", o)
		}
		// With rxe up, the tests that need a device ran on it (the
		// conformance suite skips what rxe lacks).
		for _, name := range []string{"TestConformance", "TestConnectSendReadWrite", "TestRejectAndNobodyListening",
			"TestDisconnectAndClose", "TestCloseWhilePeerDisconnects"} {
			if !strings.Contains(o, "--- PASS: "+name+" ") {
				t.Errorf("nprdma/verbs's %s did not pass in the guest", name)
			}
		}
		if t.Failed() {
			t.Logf("nprdma/verbs in the guest:\n%s", o)
		}
	})
	t.Run("OursToOurs", func(t *testing.T) {
		if err := fiotest.CheckVerify(out(t, "fio-ours.json"), nsSize); err != nil {
			t.Errorf("fio verify through NBD: %v", err)
		}
		before, after := metrics(t, out(t, "initiator-hot-before")), metrics(t, out(t, "initiator-hot-after"))
		reads := after["nprdma_initiator_reads_total"] - before["nprdma_initiator_reads_total"]
		oneSided := after["nprdma_initiator_reads_one_sided_total"] - before["nprdma_initiator_reads_one_sided_total"]
		t.Logf("hot set: %.0f of %.0f reads one-sided (%.1f%%); whole run: %.0f frame misses, %.0f fallback reads",
			oneSided, reads, 100*oneSided/reads, after["nprdma_initiator_frame_misses_total"], after["nprdma_initiator_fallback_reads_total"])
		if reads == 0 || oneSided < 0.9*reads {
			t.Errorf("hot set: %.0f of %.0f reads one-sided, want at least 90%%", oneSided, reads)
		}
		if after["nprdma_initiator_frame_misses_total"] == 0 || after["nprdma_initiator_fallback_reads_total"] == 0 {
			t.Errorf("reading a namespace four times the budget: no miss read two-sided")
		}
		tm := metrics(t, out(t, "target-metrics"))
		pin := vmPinOf(t, out(t, "target-status"))
		frames, pool, reg := tm["nprdma_target_frame_pinned_bytes"], tm["nprdma_fabric_pool_registered_bytes"], tm["nprdma_fabric_registered_bytes"]
		t.Logf("target: VmPin %d KiB; registered %.0f KiB: frames and table %.0f KiB, data pool %.0f KiB, receive buffers the rest", pin>>10, reg/1024, frames/1024, pool/1024)
		// The frames are half the budget: the pinned memory is bounded by
		// the budget, the table and the buffers, whatever the namespace's
		// size. The slack for the receive buffers of the few queues here
		// (about 2 MiB) is less than the namespace, so a pinned namespace
		// fails it.
		const buffers = 4 << 20
		if frames == 0 || frames > budget/2+budget/64 || float64(pin) > frames+pool+buffers {
			t.Errorf("target pins %d bytes (frames %.0f, pool %.0f) for a budget of %d and a namespace of %d", pin, frames, pool, budget, nsSize)
		}
	})
	t.Run("KernelHost", func(t *testing.T) {
		if list := string(out(t, "nvme-list")); !strings.Contains(list, "nprdma") {
			t.Errorf("nvme list shows no nprdma namespace:\n%s", list)
		}
		if err := fiotest.CheckVerify(out(t, "fio-kernel.json"), kernelFio); err != nil {
			t.Errorf("fio verify: %v", err)
		}
		if d := string(out(t, "disconnect")); !strings.Contains(d, "disconnected 1 controller") {
			t.Errorf("nvme disconnect said %q", d)
		}
	})
	t.Run("OursToNvmet", func(t *testing.T) {
		if err := fiotest.CheckVerify(out(t, "fio-nvmet.json"), nvmetFio); err != nil {
			t.Errorf("fio verify through NBD: %v", err)
		}
	})
}

const (
	nqn       = "nqn.2026-11.io.nprdma:rdma"
	kernelNQN = "nqn.2026-11.io.nprdma:nvmet"
	nsSize    = 8 << 20 // four times the budget
	budget    = 2 << 20
	kernelFio = 4 << 20
	nvmetFio  = 4 << 20
)

// The script: one guest, every scenario a few steps. nprdma/verbs's tests
// record their verdict (the Verbs subtest reads it) and do not stop the rest.
const guestScript = `
fio_json() { fio --output-format=json --group_reporting "$@"; }
target_up() {
	setsid /dev/shm/nprdma-target --provider verbs --listen 10.0.2.15:4420 --backing /dev/shm/ns.img \
		--memory 2MiB --allow-any-host --nqn "$NQN" --data-dir /dev/shm/tdata \
		--metrics-addr 127.0.0.1:9420 --log-level warn >>/dev/shm/target.log 2>&1 &
	echo $! >/dev/shm/target.pid
	for i in $(seq 100); do grep -q "connect with" /dev/shm/target.log && return 0; sleep 0.2; done
	cat /dev/shm/target.log; return 1
}
initiator_metrics() { wget -qO- http://127.0.0.1:9421/metrics | grep '^nprdma_initiator_' >"$LAB_OUT/$1"; }
# A failure shows the logs of our processes and the steps' times.
on_exit() {
	local rc=$1
	if ((rc)); then
		tail -n 30 /dev/shm/target.log /dev/shm/run/*.log 2>/dev/null || true
		cat "$LAB_DIR/steps" || true
	fi
	_lab_step_end "$rc"
}
trap 'on_exit $?' EXIT

step rxe
rxe_up
cp "$TARGET" "$INITIATOR" /dev/shm/
cp "$VERBS" /dev/shm/verbs.test
truncate -s 8M /dev/shm/ns.img

step verbs
(cd /dev/shm && NPRDMA_VERBS_ADDR=10.0.2.15 ./verbs.test -test.v -test.timeout 3m >"$LAB_OUT/verbs.out" 2>&1) || true

step target
target_up

step ours-attach
/dev/shm/nprdma-initiator --provider verbs attach --target 10.0.2.15:4420 --nqn "$NQN" --mode nbd \
	--socket /dev/shm/nbd.sock --run-dir /dev/shm/run --daemon --metrics-addr 127.0.0.1:9421
step ours-fio-verify
fio_json --name=verify --ioengine=nbd --uri='nbd+unix:///?socket=/dev/shm/nbd.sock' --rw=randwrite --bs=64k \
	--size=8M --verify=crc32c --do_verify=1 --iodepth=4 >"$LAB_OUT/fio-ours.json"
step ours-hot-set
# Read once, the hot set is in frames; then 4 KiB reads at random in it.
fio --name=warm --ioengine=nbd --uri='nbd+unix:///?socket=/dev/shm/nbd.sock' --rw=read --bs=64k \
	--offset=4M --size=512k --output-format=terse >/dev/null
initiator_metrics initiator-hot-before
fio --name=hot --ioengine=nbd --uri='nbd+unix:///?socket=/dev/shm/nbd.sock' --rw=randread --bs=4k \
	--offset=4M --size=512k --io_size=1M --iodepth=1 --output-format=terse >/dev/null
initiator_metrics initiator-hot-after
wget -qO- http://127.0.0.1:9420/metrics | grep -E '^nprdma_(fabric|target)_' >"$LAB_OUT/target-metrics"
cat /proc/$(cat /dev/shm/target.pid)/status >"$LAB_OUT/target-status"
step ours-detach
/dev/shm/nprdma-initiator detach --run-dir /dev/shm/run --all

step kernel-connect
nvme connect -t rdma -a 10.0.2.15 -s 4420 -n "$NQN" --ctrl-loss-tmo=60 --reconnect-delay=1
dev=$(nvme_ns_dev "$NQN")
nvme list >"$LAB_OUT/nvme-list"
step kernel-fio-verify
fio_json --name=kverify --filename="$dev" --ioengine=libaio --direct=1 --rw=randwrite --bsrange=4k-128k \
	--size=4M --verify=crc32c --do_verify=1 --iodepth=8 >"$LAB_OUT/fio-kernel.json"
step kernel-mkfs-mount
mkfs.ext4 -q -F "$dev"
mkdir -p /mnt/rdma
mount "$dev" /mnt/rdma
head -c 512k /dev/urandom >/mnt/rdma/file
md5sum /mnt/rdma/file | cut -d' ' -f1 >/dev/shm/file.md5
umount /mnt/rdma
e2fsck -fn "$dev"
step kernel-flush-then-sigkill
head -c 1M /dev/urandom >/dev/shm/flushed
dd if=/dev/shm/flushed of="$dev" bs=1M seek=7 oflag=direct status=none
nvme flush "$dev"
kill -9 "$(cat /dev/shm/target.pid)"
step kernel-target-restarted
target_up
for i in $(seq 300); do [ "$(cat /sys/class/nvme/$(basename "${dev%n1}")/state)" = live ] && break; sleep 0.2; done
[ "$(cat /sys/class/nvme/$(basename "${dev%n1}")/state)" = live ]
dd if="$dev" of=/dev/shm/back bs=1M skip=7 count=1 iflag=direct status=none
cmp /dev/shm/flushed /dev/shm/back
e2fsck -fn "$dev"
mount "$dev" /mnt/rdma
[ "$(md5sum /mnt/rdma/file | cut -d' ' -f1)" = "$(cat /dev/shm/file.md5)" ]
umount /mnt/rdma
step kernel-disconnect
nvme disconnect -n "$NQN" | tee "$LAB_OUT/disconnect"
! ls /dev/nvme*n* 2>/dev/null

step nvmet-export
truncate -s 8M /dev/shm/k.img
nvmet_export "$KNQN" /dev/shm/k.img rdma 10.0.2.15 4421
step nvmet-attach
/dev/shm/nprdma-initiator --provider verbs attach --target 10.0.2.15:4421 --nqn "$KNQN" --mode nbd \
	--socket /dev/shm/k.sock --run-dir /dev/shm/run --daemon
step nvmet-fio-verify
fio_json --name=nverify --ioengine=nbd --uri='nbd+unix:///?socket=/dev/shm/k.sock' --rw=randwrite --bs=32k \
	--size=4M --verify=crc32c --do_verify=1 --iodepth=4 >"$LAB_OUT/fio-nvmet.json"
step nvmet-detach
/dev/shm/nprdma-initiator detach --run-dir /dev/shm/run --all
nvmet_clear
`

// metrics reads a Prometheus text dump, summing a family's series.
func metrics(t *testing.T, b []byte) map[string]float64 {
	t.Helper()
	m := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		name := line[:i]
		if j := strings.IndexByte(name, '{'); j >= 0 {
			name = name[:j]
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		m[name] += v
	}
	return m
}

// vmPinOf reads VmPin from a /proc/PID/status dump, in bytes.
func vmPinOf(t *testing.T, status []byte) int64 {
	t.Helper()
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmPin:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmPin in the target's status:\n%s", status)
	return 0
}
