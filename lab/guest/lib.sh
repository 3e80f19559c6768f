# The guest lab's bash library, sourced before every guest script (and by
# the guest shell). Steps: `step NAME` starts a step and ends the previous
# one; the step running when the script fails is the failed step. Scripts
# run under `set -eo pipefail`.
# Step records go to $LAB_DIR/steps: "start SECONDS NAME" and "end SECONDS STATUS".

_lab_step=
_lab_step_open=0

# step NAME: the previous step ended well; NAME starts.
step() {
	_lab_step_end 0
	_lab_step=$*
	_lab_step_open=1
	printf 'start %s %s\n' "$EPOCHREALTIME" "$_lab_step" >>"$LAB_DIR/steps"
	printf 'lab: step %s\n' "$_lab_step"
}

_lab_step_end() {
	((_lab_step_open)) || return 0
	printf 'end %s %s\n' "$EPOCHREALTIME" "$1" >>"$LAB_DIR/steps"
	_lab_step_open=0
}

# Names the failing command before set -e ends the script.
_lab_on_err() {
	[[ $- == *e* ]] || return 0
	printf 'lab: step %s: "%s" failed with status %d (line %d)\n' "${_lab_step:-(before the first step)}" "$2" "$1" "$3" >&2
}

trap '_lab_step_end $?' EXIT
trap '_lab_on_err $? "$BASH_COMMAND" $LINENO' ERR

# nvmet_export NQN PATH [TRTYPE [TRADDR [TRSVCID]]]
# The kernel's NVMe target serves PATH (a file or a block device) as
# namespace 1 of subsystem NQN, open to any host, on port TRTYPE (tcp, the
# default, or rdma) TRADDR (127.0.0.1) TRSVCID (4420). A port already
# serving that address is shared. nvmet_clear undoes every export.
nvmet_export() {
	local nqn=$1 path=$2 trtype=${3:-tcp} traddr=${4:-127.0.0.1} trsvcid=${5:-4420}
	local cfs=/sys/kernel/config/nvmet port p id=0
	modprobe nvmet
	modprobe "nvmet-$trtype"
	mkdir "$cfs/subsystems/$nqn"
	echo 1 >"$cfs/subsystems/$nqn/attr_allow_any_host"
	mkdir "$cfs/subsystems/$nqn/namespaces/1"
	printf '%s' "$path" >"$cfs/subsystems/$nqn/namespaces/1/device_path"
	echo 1 >"$cfs/subsystems/$nqn/namespaces/1/enable"
	for p in "$cfs"/ports/*; do
		[ -d "$p" ] || continue
		id=$((${p##*/} > id ? ${p##*/} : id))
		if [ "$(<"$p/addr_trtype")" = "$trtype" ] && [ "$(<"$p/addr_traddr")" = "$traddr" ] &&
			[ "$(<"$p/addr_trsvcid")" = "$trsvcid" ]; then
			port=$p
		fi
	done
	if [ -z "$port" ]; then
		port=$cfs/ports/$((id + 1))
		mkdir "$port"
		echo ipv4 >"$port/addr_adrfam"
		echo "$trtype" >"$port/addr_trtype"
		echo "$traddr" >"$port/addr_traddr"
		echo "$trsvcid" >"$port/addr_trsvcid"
	fi
	ln -s "$cfs/subsystems/$nqn" "$port/subsystems/$nqn"
}

# nvmet_clear removes every nvmet port, subsystem and host.
nvmet_clear() {
	local cfs=/sys/kernel/config/nvmet p s n
	[ -d "$cfs" ] || return 0
	for p in "$cfs"/ports/*; do
		[ -d "$p" ] || continue
		for s in "$p"/subsystems/*; do
			[ -L "$s" ] && rm "$s"
		done
		rmdir "$p"
	done
	for s in "$cfs"/subsystems/*; do
		[ -d "$s" ] || continue
		for n in "$s"/namespaces/*; do
			[ -d "$n" ] || continue
			echo 0 >"$n/enable"
			rmdir "$n"
		done
		for n in "$s"/allowed_hosts/*; do
			[ -L "$n" ] && rm "$n"
		done
		rmdir "$s"
	done
	for s in "$cfs"/hosts/*; do
		[ -d "$s" ] && rmdir "$s"
	done
	return 0
}

# nvme_ns_dev NQN [NSID]: waits up to 10 s for namespace NSID (1) of
# subsystem NQN to appear on the kernel's NVMe host, and prints its /dev path.
nvme_ns_dev() {
	local nqn=$1 nsid=${2:-1} s d i
	for ((i = 0; i < 100; i++)); do
		for s in /sys/class/nvme-subsystem/*; do
			[ "$(cat "$s/subsysnqn" 2>/dev/null)" = "$nqn" ] || continue
			for d in "$s"/nvme*n*; do
				if [ -e "$d/nsid" ] && [ "$(<"$d/nsid")" = "$nsid" ] && [ -b "/dev/${d##*/}" ]; then
					echo "/dev/${d##*/}"
					return 0
				fi
			done
		done
		sleep 0.1
	done
	echo "nvme_ns_dev: no namespace $nsid of $nqn after 10s" >&2
	return 1
}

# rxe_up [NETDEV]: a Soft-RoCE device rxe0 over NETDEV (eth0). RDMA
# connections go to the guest's own address, 10.0.2.15 (rdma_cm to
# 127.0.0.1 over rxe on lo does not resolve a route).
rxe_up() {
	modprobe rdma_rxe
	rdma link add rxe0 type rxe netdev "${1:-eth0}"
}
