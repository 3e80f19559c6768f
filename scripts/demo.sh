#!/usr/bin/env bash
# make demo: start a target whose namespace is 4x its DRAM budget, attach it
# twice (an NBD socket, and a /dev/loopN block device), run fio with
# verification through both, print a summary, and tear everything down.
#
# Run by `make demo` after `make build` (which installs the dependencies).
# Settings (environment): NPRDMA_DEMO_DIR (default: demo-data/ in the
# repository), NPRDMA_DEMO_SIZE (namespace, default 4GiB), NPRDMA_DEMO_MEMORY
# (budget, default 1GiB), NPRDMA_DEMO_READ_SECONDS (default 20).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=$repo/bin
demo=${NPRDMA_DEMO_DIR:-$repo/demo-data}
size=${NPRDMA_DEMO_SIZE:-4GiB}
memory=${NPRDMA_DEMO_MEMORY:-1GiB}
read_seconds=${NPRDMA_DEMO_READ_SECONDS:-20}
hostnqn=nqn.2024-01.io.nprdma:demo-host
nqn=nqn.2024-01.io.nprdma:default
run=$demo/run          # attachment records, sockets, FUSE mount points
results=$demo/results  # fio output, metrics snapshots, the summary
started=$SECONDS
# The host ID file of the initiator (kept with the demo, not in ~/.config).
export NPRDMA_STATE_DIR=$demo/state

initiator() { "$bin/nprdma-initiator" --hostnqn "$hostnqn" "$@"; }
report() { "$bin/nprdma-demo-report" "$@"; }
bytes() { # 4GiB -> 4294967296
	local n=${1%[KMGT]iB} u=${1#"${1%[KMGT]iB}"}
	case $u in KiB) echo $((n << 10)) ;; MiB) echo $((n << 20)) ;; GiB) echo $((n << 30)) ;; TiB) echo $((n << 40)) ;; *) echo "$1" ;; esac
}
field() { sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p" "$2"; } # a string field of a one-line JSON record

# running PID: the process exists and is not a zombie (an exited daemon
# waits for init to reap it).
running() {
	local stat
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	stat=${stat##*) }
	[ "${stat%% *}" != Z ]
}

step_name="starting"
step() {
	step_name=$1
	printf '\n==> %s  [%ds]\n' "$1" $((SECONDS - started))
}

target_pid=""
fio_pid=""
attached=()
torn_down=false

# teardown detaches everything (forced when the demo failed: nothing of the
# demo may be left mounted), stops the target and checks that nothing is
# left. It runs on success, on failure and on interruption.
teardown() {
	local force=$1 ok=true
	if [ -n "$fio_pid" ] && kill -0 "$fio_pid" 2>/dev/null; then
		kill "$fio_pid" 2>/dev/null || true
		wait "$fio_pid" 2>/dev/null || true
	fi
	if [ -d "$run/attach" ] && compgen -G "$run/attach/*.json" >/dev/null; then
		if ! "$bin/nprdma-initiator" detach --all $force --run-dir "$run"; then
			echo "demo: detach failed (see above)" >&2
			ok=false
		fi
	fi
	if [ -n "$target_pid" ]; then
		kill -TERM "$target_pid" 2>/dev/null || true
		local rc=0
		wait "$target_pid" || rc=$?
		target_pid=""
		if [ "$rc" -ne 0 ]; then
			echo "demo: the target exited with status $rc (its log: $demo/target.log)" >&2
			ok=false
		fi
	fi
	# Check that nothing is left behind.
	local left=()
	compgen -G "$run/attach/*.json" >/dev/null && left+=("attachment records in $run/attach")
	compgen -G "$run/*.sock" >/dev/null && left+=("sockets in $run")
	grep -q " $run/" /proc/self/mountinfo && left+=("mounts under $run")
	local f
	for f in /sys/block/loop*/loop/backing_file; do
		[ -e "$f" ] && grep -q "^$run/" "$f" && left+=("loop device $(basename "$(dirname "$(dirname "$f")")")")
	done
	local pid
	for pid in "${attached[@]}"; do
		running "$pid" && left+=("attach process $pid")
	done
	if ((${#left[@]})); then
		echo "demo: left behind: ${left[*]}" >&2
		ok=false
	fi
	torn_down=true
	$ok
}

on_exit() {
	local rc=$?
	trap - EXIT INT TERM
	if ! $torn_down; then
		echo
		if [ "$rc" -eq 130 ]; then
			echo "demo: stopped during: $step_name. Tearing down." >&2
		elif [ "$rc" -ne 0 ]; then
			echo "demo: FAILED during: $step_name. Tearing down." >&2
		fi
		teardown --force || rc=1
	fi
	exit "$rc"
}
trap on_exit EXIT
trap 'echo; echo "demo: interrupted" >&2; exit 130' INT TERM

fail() {
	echo "demo: $*" >&2
	exit 1
}

step "Checking the machine"
for tool in fio nbdinfo; do
	command -v $tool >/dev/null || fail "$tool is missing: run scripts/deps.sh (make demo does)"
done
for b in nprdma-target nprdma-initiator nprdma-demo-report; do
	[ -x "$bin/$b" ] || fail "$bin/$b is missing: run make build (make demo does)"
done
fuse_skipped=""
if [ "$(id -u)" -ne 0 ]; then
	fuse_skipped="not root (a loop device needs root); rerun as root for the block device part"
elif [ ! -e /dev/fuse ] || [ ! -e /dev/loop-control ]; then
	fuse_skipped="this kernel has no /dev/fuse or /dev/loop-control"
fi
[ -n "$fuse_skipped" ] && echo "the block-device (FUSE + loop) part will be skipped: $fuse_skipped"
mkdir -p "$demo"
if [ -f "$demo/target.pid" ] && kill -0 "$(cat "$demo/target.pid")" 2>/dev/null &&
	grep -q nprdma-target "/proc/$(cat "$demo/target.pid")/cmdline" 2>/dev/null; then
	fail "a target from an earlier demo run is still running (pid $(cat "$demo/target.pid")); stop it (kill $(cat "$demo/target.pid")) and run again"
fi
if [ -d "$run/attach" ] && compgen -G "$run/attach/*.json" >/dev/null; then
	echo "cleaning up attachments of an earlier demo run"
	"$bin/nprdma-initiator" detach --all --force --run-dir "$run"
fi
rm -rf "$demo/target" "$run" "$results" "$demo/target.log"
mkdir -p "$run" "$results"
avail_kib=$(df -Pk "$demo" | awk 'NR == 2 {print $4}')
need=$(($(bytes "$size") * 3 / 4 + (1 << 30)))
((avail_kib * 1024 >= need)) || fail "$demo has $((avail_kib >> 20)) GiB free; the demo writes about $((need >> 30)) GiB"
echo "demo directory: $demo"

step "Starting the target: a $size namespace (sparse file) with a DRAM budget of $memory"
# Its own session: a Ctrl-C of the demo must not stop the target before the
# initiators have detached from it; the trap stops it last.
setsid "$bin/nprdma-target" --data-dir "$demo/target" --default-size "$size" --memory "$memory" \
	--listen 127.0.0.1:0 --metrics-addr 127.0.0.1:0 --nqn "$nqn" --allow-host "$hostnqn" \
	>"$demo/target.log" 2>&1 &
target_pid=$!
echo "$target_pid" >"$demo/target.pid"
for _ in $(seq 300); do
	grep -q "connect with:" "$demo/target.log" && break
	kill -0 "$target_pid" 2>/dev/null || { cat "$demo/target.log" >&2; fail "the target did not start (above: its log)"; }
	sleep 0.1
done
# setsid forks only when called as a process group leader, which a command
# started with & by a script is not; so $! is the target itself.
grep -q nprdma-target "/proc/$target_pid/cmdline" 2>/dev/null || fail "pid $target_pid is not the target (setsid forked?)"
target_addr=$(sed -n 's/.*connect with: .*--target \([^ ]*\).*/\1/p' "$demo/target.log")
target_metrics=$(sed -n 's|.*url=http://\([^/]*\)/metrics.*|\1|p' "$demo/target.log")
[ -n "$target_addr" ] && [ -n "$target_metrics" ] || { cat "$demo/target.log" >&2; fail "the target did not say where it listens (above: its log)"; }
grep "nprdma-target: serving" "$demo/target.log"
echo "metrics: http://$target_metrics/metrics (pid $target_pid)"

cat >"$results/run.env" <<EOF
NAMESPACE_BYTES=$(bytes "$size")
BUDGET_BYTES=$(bytes "$memory")
VERIFY_JOB=fio randwrite 64 KiB, 4 jobs x QD 8, --verify=crc32c
READ_JOB=fio randread 4 KiB, ${read_seconds} s, 4 jobs x QD 8
EOF

# run_fio MODE NAME ARGS...: one fio job, JSON results to $results/MODE/NAME.json.
run_fio() {
	local mode=$1 name=$2
	shift 2
	# In the results directory: fio may leave files in its working directory.
	(cd "$results/$mode" && exec fio --name="$name" --group_reporting --output-format=json --output="$name.json" "$@") &
	fio_pid=$!
	local rc=0
	wait "$fio_pid" || rc=$?
	fio_pid=""
	[ "$rc" -eq 0 ] || fail "fio $name through $mode failed with status $rc (output: $results/$mode/$name.json)"
}

# measure MODE OFFSET FIO-TARGET-ARGS...: write+verify, then random reads, over
# 1.5 GiB at OFFSET, with snapshots of the target's metrics around both and
# of the initiator's around the reads.
measure() {
	local mode=$1 offset=$2 initiator_metrics
	shift 2
	initiator_metrics=$(field metrics_addr "$results/$mode/attach.json")
	report scrape "$target_metrics" "$results/$mode/target-start.prom"
	echo "random writes with verification: 4 jobs x 384 MiB, 64 KiB blocks, QD 8 each (write, then read back and check)"
	run_fio "$mode" fio-verify "$@" --offset="$offset" --size=384m --offset_increment=384m --numjobs=4 --iodepth=8 \
		--rw=randwrite --bs=64k --verify=crc32c --verify_fatal=1 --verify_state_save=0
	report scrape "$initiator_metrics" "$results/$mode/initiator-mid.prom"
	echo "random 4 KiB reads over the same 1.5 GiB for ${read_seconds} s, 4 jobs x QD 8"
	run_fio "$mode" fio-read "$@" --offset="$offset" --size=384m --offset_increment=384m --numjobs=4 --iodepth=8 \
		--rw=randread --bs=4k --time_based --runtime="$read_seconds"
	report scrape "$initiator_metrics" "$results/$mode/initiator-end.prom"
	report scrape "$target_metrics" "$results/$mode/target-end.prom"
}

step "Attaching over NBD (an NBD server on a unix socket)"
mkdir -p "$results/nbd"
initiator attach --target "$target_addr" --nqn "$nqn" --mode nbd --name demo-nbd --run-dir "$run" \
	--metrics-addr 127.0.0.1:0 --daemon --json >"$results/nbd/attach.json"
attached+=("$(sed -n 's/.*"pid":\([0-9]*\).*/\1/p' "$results/nbd/attach.json")")
nbd_uri=$(field uri "$results/nbd/attach.json")
echo "NBD URI: $nbd_uri"
nbdinfo "$nbd_uri" | grep -E "export-size:|can_flush|can_trim|can_multi_conn" | sed 's/^/  nbdinfo: /'
echo "NBD_USE=$nbd_uri" >>"$results/run.env"

step "fio through the NBD socket (fio's nbd engine)"
measure nbd 0 --ioengine=nbd --uri="$nbd_uri"

if [ -z "$fuse_skipped" ]; then
	step "Attaching as a block device (a loop device over a FUSE file)"
	mkdir -p "$results/fuse"
	initiator attach --target "$target_addr" --nqn "$nqn" --mode fuse --name demo-fuse --run-dir "$run" \
		--metrics-addr 127.0.0.1:0 --daemon --json >"$results/fuse/attach.json"
	attached+=("$(sed -n 's/.*"pid":\([0-9]*\).*/\1/p' "$results/fuse/attach.json")")
	loopdev=$(field device "$results/fuse/attach.json")
	echo "block device: $loopdev ($(cat "/sys/block/${loopdev#/dev/}/size") sectors, direct I/O $(cat "/sys/block/${loopdev#/dev/}/loop/dio"))"
	echo "FUSE_USE=$loopdev" >>"$results/run.env"

	step "fio through $loopdev (libaio, O_DIRECT)"
	measure fuse 2g --filename="$loopdev" --ioengine=libaio --direct=1
else
	echo "FUSE_SKIPPED=$fuse_skipped" >>"$results/run.env"
fi

step "What is attached (nprdma-initiator list)"
"$bin/nprdma-initiator" list --run-dir "$run"
report rss "$target_pid" "$results/target-status"

step "Summary"
report summary "$results" | tee "$results/summary.txt"

step "Tearing down (detach, then SIGTERM to the target)"
if ! teardown ""; then
	fail "teardown incomplete (above)"
fi
rm -rf "$demo/target" "$demo/target.pid" # the backing file: up to ${size} of disk
echo "detached, target exited 0; no process, mount, loop device or socket left."
printf '\ndemo finished in %d s; results in %s (summary.txt)\n' $((SECONDS - started)) "$results"
