#!/usr/bin/env bash
# Installs what building, testing, the demo and the benchmarks need on a fresh
# Debian machine of the project's kind. Safe to run again: it only installs
# what is missing.
set -euo pipefail

# The guest lab (docs/lab.md) also needs QEMU, a static busybox for its
# initramfs, xz to unpack the kernel's modules, and the tools guest scripts
# run from this machine's root: nvme-cli, RDMA (Soft-RoCE) userspace, curl
# (the NVMe/TCP guest test reads the target's metrics with it).
# nprdma/verbs compiles against the rdma-core headers (libibverbs-dev,
# librdmacm-dev) and loads libibverbs/librdmacm and the device drivers
# (ibverbs-providers) at run time.
packages=(fio nbdkit libnbd-bin fuse3 e2fsprogs util-linux mount procps iproute2
	qemu-system-x86 busybox-static xz-utils nvme-cli rdma-core ibverbs-utils ibverbs-providers perftest curl
	libibverbs-dev librdmacm-dev librdmacm1)
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "deps: installing ${missing[*]}"
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v go >/dev/null || { echo "deps: Go 1.26 is required (https://go.dev/dl)" >&2; exit 1; }
go mod download
# The guest lab's pinned kernels, into its cache under /tmp (quick once
# cached). Without them (no network to the Debian mirror) guest tests skip.
go run ./lab/cmd/nprdma-lab fetch >/dev/null ||
	echo "deps: the guest lab's kernels could not be fetched: guest tests will skip" >&2
