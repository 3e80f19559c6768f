#!/usr/bin/env bash
# Installs what building, testing, the demo and the benchmarks need on a fresh
# Debian machine of the project's kind. Safe to run again: it only installs
# what is missing.
set -euo pipefail

packages=(fio nbdkit libnbd-bin fuse3 e2fsprogs util-linux mount procps iproute2)
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
