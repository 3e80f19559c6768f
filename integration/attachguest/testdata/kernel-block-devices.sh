# The script of TestGuestKernelBlockDevices (guest_test.go says what it
# does); also runnable by hand: nprdma-lab run --modules ublk_drv,nbd --env BIN=DIR THIS
cp "$BIN/nprdma-target" "$BIN/nprdma-initiator" /dev/shm/
I=/dev/shm/nprdma-initiator
step "target"
mkdir -p /dev/shm/target
/dev/shm/nprdma-target --allow-any-host --data-dir /dev/shm/target --default-size 64MiB --memory 16MiB \
	--listen 127.0.0.1:4420 --metrics-addr 127.0.0.1:9420 --log-level warn >"$LAB_OUT/target.log" 2>&1 &
TP=$!
# The target's metrics, with bash's /dev/tcp (no HTTP client needed).
metrics() {
	exec 3<>/dev/tcp/127.0.0.1/9420 || return 1
	printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3
	cat <&3
	exec 3<&-
}
for i in $(seq 300); do metrics >/dev/null 2>&1 && break; kill -0 $TP; sleep 0.1; done
dsm() { metrics | awk '/^nprdma_target_commands_total\{/ && /opcode="dataset-management"/ {s += $NF} END {print s + 0}'; }
# field FILE KEY: a string or number field of a one-line JSON record.
field() { sed -n 's/.*"'"$2"'":"\{0,1\}\([^",}]*\).*/\1/p' "$1"; }
attach() { "$I" --hostid-file /dev/shm/hostid attach --daemon --json --target 127.0.0.1:4420 --nqn nqn.2024-01.io.nprdma:default --io-queues 2 --queue-depth 32 "$@"; }
gone() { for i in $(seq 300); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done; return 1; }

for mode in ${MODES:-ublk nbd-kernel}; do
	name=d-$mode
	mnt=/mnt/$mode
	mkdir -p $mnt

	step "$mode: attach, fio verify"
	attach --mode $mode --name $name >"$LAB_OUT/$mode-attach1.json"
	dev=$(field "$LAB_OUT/$mode-attach1.json" device)
	fio --name=verify --filename=$dev --direct=1 --ioengine=libaio --rw=randwrite --bs=4k --iodepth=32 --numjobs=2 \
		--size=2m --offset_increment=2m --verify=crc32c --verify_fatal=1 --verify_state_save=0 --group_reporting \
		--output-format=json >"$LAB_OUT/$mode-fio.json"

	step "$mode: blkdiscard reaches Dataset Management"
	before=$(dsm)
	blkdiscard -o 16M -l 8M $dev
	after=$(dsm)
	echo "$before $after" >"$LAB_OUT/$mode-blkdiscard"
	[ "$after" -gt "$before" ]

	step "$mode: mkfs, mount, copy, fstrim"
	mkfs.ext4 -q -E nodiscard,lazy_itable_init=1,lazy_journal_init=1 $dev
	mount $dev $mnt
	dd if=/dev/urandom of=$mnt/one bs=1M count=2 status=none
	cp -r /usr/share/doc/fio $mnt/docs
	sync
	before=$(dsm)
	fstrim -v $mnt
	after=$(dsm)
	echo "$before $after" >"$LAB_OUT/$mode-fstrim"
	[ "$after" -gt "$before" ]

	step "$mode: detach refused while mounted"
	if "$I" detach $name 2>"$LAB_OUT/$mode-refused.err"; then echo "detached while mounted"; exit 1; fi
	grep -q "mounted at $mnt" "$LAB_OUT/$mode-refused.err"
	mountpoint -q $mnt

	step "$mode: kill -9, resume"
	dd if=/dev/urandom of=$mnt/two bs=1M count=1 status=none
	sync
	(cd $mnt && md5sum one two >/dev/shm/$mode.md5)
	pid=$(field "$LAB_OUT/$mode-attach1.json" pid)
	kill -9 $pid
	gone $pid
	"$I" list >"$LAB_OUT/$mode-list-orphaned"
	grep -q orphaned "$LAB_OUT/$mode-list-orphaned"
	attach --mode $mode --name $name >"$LAB_OUT/$mode-attach2.json"
	[ "$(field "$LAB_OUT/$mode-attach2.json" device)" = $dev ]
	[ "$(field "$LAB_OUT/$mode-attach2.json" resumed_from)" = $pid ]
	echo 3 >/proc/sys/vm/drop_caches
	(cd $mnt && md5sum -c /dev/shm/$mode.md5)

	step "$mode: unmount, e2fsck"
	umount $mnt
	e2fsck -fn $dev >"$LAB_OUT/$mode-fsck.log" 2>&1

	step "$mode: kill -9, detach"
	pid=$(field "$LAB_OUT/$mode-attach2.json" pid)
	kill -9 $pid
	gone $pid
	"$I" detach $name 2>"$LAB_OUT/$mode-detach-dead.err"
	grep -q "removed the .* device $dev" "$LAB_OUT/$mode-detach-dead.err"

	step "$mode: attach again, files intact, detach --force while mounted"
	how="--mode $mode"
	[ $mode = ublk ] && how="--mode auto"
	attach $how --name $name >"$LAB_OUT/$mode-attach3.json" 2>"$LAB_OUT/$mode-attach3.err"
	dev=$(field "$LAB_OUT/$mode-attach3.json" device)
	mount $dev $mnt
	(cd $mnt && md5sum -c /dev/shm/$mode.md5)
	"$I" detach --force $name
	if mountpoint -q $mnt; then echo "$mnt still mounted"; exit 1; fi
	pid=$(field "$LAB_OUT/$mode-attach3.json" pid)
	gone $pid

	step "$mode: nothing left"
	"$I" list >"$LAB_OUT/$mode-list-end"
	grep -q "nothing is attached" "$LAB_OUT/$mode-list-end"
	if pgrep -af "nprdma-initiator.*attach"; then echo "an attach process is left"; exit 1; fi
	left=$(find /run/nprdma -name '*.sock' -o -name '*.json' 2>/dev/null)
	[ -z "$left" ] || { echo "left in /run/nprdma: $left"; exit 1; }
	case $mode in
	ublk) if ls /dev/ublkb* /dev/ublkc* 2>/dev/null; then echo "a ublk device is left"; exit 1; fi ;;
	nbd-kernel) [ ! -e /sys/block/$(basename $dev)/pid ] || { echo "$dev is still connected"; exit 1; } ;;
	esac
done

step "target stops"
kill -TERM $TP
wait $TP
