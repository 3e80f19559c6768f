package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nprdma/nprdma/internal/fiotest"
	"github.com/nprdma/nprdma/lab"
)

// The Linux kernel's NVMe/TCP host against nprdma-target, both in one guest
// (the guest lab, package lab): this test binary runs the target in the
// guest (as TestMain's runMainEnv re-execution) over the host file system
// the guest shares, and the kernel's nvme-tcp and nvme-cli connect to it on
// the guest's loopback.

const (
	guestNQN     = "nqn.2026-11.io.nprdma:guest"
	guestHostNQN = "nqn.2014-08.org.nvmexpress:uuid:5a1d7c3e-0000-4000-8000-000000000001"
	guestHostID  = "5a1d7c3e-0000-4000-8000-000000000001"
	guestOther   = "nqn.2014-08.org.nvmexpress:uuid:5a1d7c3e-0000-4000-8000-0000000000ff"
)

// guestTargetLib starts and stops the target in the guest: a 128 MiB
// namespace behind a 32 MiB DRAM budget (4x), the NVMe/TCP port 4420 and
// the discovery port 8009 on the guest's loopback.
const guestTargetLib = `
target_start() {
	NPRDMA_TARGET_TEST_RUN_MAIN=1 /dev/shm/nprdma-target --backing /dev/shm/ns.img --memory 32MiB \
		--listen 127.0.0.1:14420 --listen-nvme-tcp 127.0.0.1:4420 --listen-nvme-tcp-discovery 127.0.0.1:8009 \
		--nqn "$NQN" --allow-host "$HOSTNQN" --data-dir /dev/shm/data --metrics-addr 127.0.0.1:9420 \
		--log-level debug >>/dev/shm/target.log 2>&1 &
	echo $! >/dev/shm/target.pid
	local i n=$(grep -c 'NVMe/TCP on' /dev/shm/target.log || true)
	for ((i = 0; i < 300; i++)); do
		[ "$(grep -c 'NVMe/TCP on' /dev/shm/target.log)" -gt "$n" ] && return 0
		kill -0 "$(cat /dev/shm/target.pid)" || { echo "the target exited" >&2; return 1; }
		sleep 0.1
	done
	echo "the target did not start in 30s" >&2
	return 1
}
# controllers prints the target's live controllers.
controllers() { curl -fsS 127.0.0.1:9420/metrics | awk '$1 == "nprdma_target_controllers" {print $2}'; }
wait_controllers() {
	local i
	for ((i = 0; i < 100; i++)); do
		[ "$(controllers)" = "$1" ] && return 0
		sleep 0.1
	done
	echo "the target has $(controllers) controllers, want $1" >&2
	return 1
}
connect() {
	nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$NQN" --hostnqn "$HOSTNQN" --hostid "$HOSTID" "$@"
}
no_nvme_devices() { ! ls /dev/nvme[0-9]* 2>/dev/null; }
`

// guestKernelHostScript: discovery, connect, identify, fio verify, ext4,
// disconnect; the same with digests; a host refused; SIGKILL with flushed
// writes in flight and a restart.
const guestKernelHostScript = guestTargetLib + `
step start target
cp "$TARGET" /dev/shm/nprdma-target
truncate -s 128M /dev/shm/ns.img
target_start

step discover
nvme discover -t tcp -a 127.0.0.1 -s 8009 --hostnqn "$HOSTNQN" --hostid "$HOSTID" | tee "$LAB_OUT/discover-8009"
nvme discover -t tcp -a 127.0.0.1 -s 4420 --hostnqn "$HOSTNQN" --hostid "$HOSTID" >"$LAB_OUT/discover-4420"
grep -q "subnqn: *$NQN" "$LAB_OUT/discover-4420"
wait_controllers 0

step connect
connect
dev=$(nvme_ns_dev "$NQN")
ctrl=${dev%n[0-9]*}
echo "$dev" >"$LAB_OUT/dev"

step identify
nvme list | tee "$LAB_OUT/list"
nvme id-ctrl "$ctrl" >"$LAB_OUT/id-ctrl"
nvme id-ns "$dev" >"$LAB_OUT/id-ns"
[ "$(blockdev --getsize64 "$dev")" = $((128 << 20)) ]

step fio verify
fio --name=verify --filename="$dev" --direct=1 --ioengine=libaio --iodepth=16 --rw=randwrite --bs=4k \
	--size=128M --io_size=8M --verify=crc32c --verify_fatal=1 --group_reporting --output-format=json \
	--output="$LAB_OUT/fio-verify.json"

step mkfs.ext4
mkfs.ext4 -q -F "$dev"
step copy files
mkdir -p /mnt/ns
mount "$dev" /mnt/ns
cp -a /usr/share/zoneinfo/America /mnt/ns/
umount /mnt/ns
step e2fsck
e2fsck -fn "$dev" | tee "$LAB_OUT/e2fsck"
mount -o ro "$dev" /mnt/ns
diff -r /usr/share/zoneinfo/America /mnt/ns/America
umount /mnt/ns

step disconnect
nvme disconnect -n "$NQN" | tee "$LAB_OUT/disconnect"
no_nvme_devices
wait_controllers 0

step digests
connect -g -G
dev=$(nvme_ns_dev "$NQN")
grep -q 'digests=header+data' /dev/shm/target.log
fio --name=digests --filename="$dev" --direct=1 --ioengine=libaio --iodepth=8 --rw=randwrite --bs=16k \
	--size=128M --io_size=4M --verify=crc32c --verify_fatal=1 --group_reporting --output-format=json \
	--output="$LAB_OUT/fio-digests.json"
nvme disconnect -n "$NQN"
no_nvme_devices
wait_controllers 0

step refused host
if nvme connect -t tcp -a 127.0.0.1 -s 4420 -n "$NQN" --hostnqn "$OTHER" 2>"$LAB_OUT/refused"; then
	echo "a host not on the allow-list connected" >&2
	exit 1
fi
dmesg | grep 'is not allowed' | tee "$LAB_OUT/refused-dmesg"
no_nvme_devices
wait_controllers 0

step sigkill
connect --reconnect-delay 1 --ctrl-loss-tmo 60
dev=$(nvme_ns_dev "$NQN")
: >/dev/shm/acked
# Writes the host saw flushed (O_DSYNC: FUA), one block each, logged once
# acknowledged; and unflushed writes in flight beside them.
(
	i=0
	while [ ! -e /dev/shm/stop ]; do
		printf '%04096d' "$i" | dd of="$dev" bs=4096 seek="$i" count=1 oflag=direct,dsync status=none
		echo "$i" >>/dev/shm/acked
		i=$((i + 1))
	done
) &
writer=$!
fio --name=inflight --filename="$dev" --direct=1 --ioengine=libaio --iodepth=32 --rw=randwrite --bs=4k \
	--offset=64M --size=64M --time_based --runtime=300 >/dev/null 2>&1 &
fio=$!
while [ "$(wc -l </dev/shm/acked)" -lt 10 ]; do sleep 0.1; done
kill -9 "$(cat /dev/shm/target.pid)"
while kill -0 "$(cat /dev/shm/target.pid)" 2>/dev/null; do sleep 0.1; done
before=$(wc -l </dev/shm/acked)
killed=$EPOCHREALTIME
target_start
while [ "$(wc -l </dev/shm/acked)" -lt $((before + 5)) ]; do sleep 0.1; done
awk -v now="$EPOCHREALTIME" -v then="$killed" 'BEGIN { printf "%.1f\n", now - then }' | tee "$LAB_OUT/reconnect"
touch /dev/shm/stop
wait "$writer"
kill "$fio"
wait "$fio" || true

step flushed writes read back
# The writer wrote blocks 0, 1, 2, … in order and logged each once acknowledged.
n=$(wc -l </dev/shm/acked)
for ((i = 0; i < n; i++)); do printf '%04096d' "$i"; done >/dev/shm/expected
if ! dd if="$dev" bs=4096 count="$n" iflag=direct status=none | cmp - /dev/shm/expected; then
	echo "flushed writes lost: blocks 0..$((n - 1)) were acknowledged ($before before the kill)" >&2
	exit 1
fi
echo "$n flushed writes read back intact ($before acknowledged before the kill)" | tee "$LAB_OUT/flushed"
nvme disconnect -n "$NQN"
no_nvme_devices
wait_controllers 0
kill "$(cat /dev/shm/target.pid)"
cp /dev/shm/target.log "$LAB_OUT/"
`

// TestGuestNVMeTCPKernelHost is the acceptance test of the NVMe/TCP target
// against the Linux kernel's host (issue 23): nvme discover/connect, nvme
// list, id-ctrl and id-ns; fio verify on a namespace 4x the target's
// DRAM budget; ext4 made, filled, checked clean; disconnect leaving no
// controller on either side; the same with header and data digests; a host
// not allowed refused with the status Linux reports as "not allowed"; and
// the target killed with SIGKILL while writes are in flight, restarted on
// the same data: the host reconnects and every write it saw flushed reads
// back.
func TestGuestNVMeTCPKernelHost(t *testing.T) {
	t.Parallel()
	lab.Require(t)
	bin, err := filepath.Abs(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	res := lab.RunT(t, lab.Spec{
		Modules: []string{"nvme-tcp", "ext4"},
		Env: map[string]string{"TARGET": bin, "NQN": guestNQN, "HOSTNQN": guestHostNQN, "HOSTID": guestHostID,
			"OTHER": guestOther},
		Script:  guestKernelHostScript,
		Timeout: 6 * time.Minute,
	})
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(res.Dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, name := range []string{"discover-8009", "discover-4420"} {
		d := read(name)
		for _, want := range []string{"trtype:  tcp", "adrfam:  ipv4", "subnqn:  " + guestNQN, "traddr:  127.0.0.1", "trsvcid: 4420", "not required"} {
			if !strings.Contains(d, want) {
				t.Errorf("%s lacks %q:\n%s", name, want, d)
			}
		}
	}
	dev := strings.TrimSpace(read("dev"))
	if l := read("list"); !strings.Contains(l, dev) || !strings.Contains(l, "nprdma") {
		t.Errorf("nvme list does not show %s served by nprdma:\n%s", dev, l)
	}
	idc := read("id-ctrl")
	for _, re := range []string{`(?m)^mn\s+: nprdma`, `(?m)^subnqn\s+: ` + regexp.QuoteMeta(guestNQN), `(?m)^kas\s+: (10|0xa)$`, `(?m)^cntrltype\s+: 1`} {
		if !regexp.MustCompile(re).MatchString(idc) {
			t.Errorf("nvme id-ctrl does not match %s:\n%s", re, idc)
		}
	}
	if idn := read("id-ns"); !regexp.MustCompile(`(?m)^nsze\s+: 0x8000$`).MatchString(idn) ||
		!strings.Contains(idn, "lbads:12") {
		t.Errorf("nvme id-ns: want 0x8000 blocks of 4 KiB:\n%s", idn)
	}
	if err := fiotest.CheckVerify([]byte(read("fio-verify.json")), 8<<20); err != nil {
		t.Error(err)
	}
	if err := fiotest.CheckVerify([]byte(read("fio-digests.json")), 4<<20); err != nil {
		t.Error(err)
	}
	if e := read("e2fsck"); !strings.Contains(e, "clean") && !regexp.MustCompile(`\d+/\d+ files`).MatchString(e) {
		t.Errorf("e2fsck -fn: %s", e)
	}
	if d := read("disconnect"); !strings.Contains(d, "disconnected 1 controller") {
		t.Errorf("nvme disconnect: %s", d)
	}
	if r := read("refused-dmesg"); !strings.Contains(r, guestOther) {
		t.Errorf("refused host: dmesg says %q", r)
	}
	secs, err := strconv.ParseFloat(strings.TrimSpace(read("reconnect")), 64)
	if err != nil || secs <= 0 || secs >= 60 {
		t.Errorf("the host wrote again %v s after the kill (%v), want within its ctrl_loss_tmo of 60 s", secs, err)
	}
	t.Logf("writing again %.1f s after the kill; %s (guest clock, TCG)", secs, strings.TrimSpace(read("flushed")))
	for _, s := range res.Steps {
		t.Logf("step %-28s %v (guest clock, TCG)", s.Name, s.Duration.Round(time.Millisecond))
	}
}
