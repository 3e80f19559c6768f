#!/usr/bin/env bash
# Runs every Fuzz target in the module for the given time each (default 10s):
#   scripts/fuzz.sh [FUZZTIME] [PACKAGE...]
#   scripts/fuzz.sh 10m                  # the long run (make fuzz FUZZTIME=10m)
#   scripts/fuzz.sh 1m ./nvme ./integration/reliability
# The committed seed corpora live in testdata/fuzz/<FuzzName>/ next to each
# target and also run as ordinary tests in `go test`. A failing input is
# written by `go test` to testdata/fuzz/<FuzzName>/<hash> in the package:
# fix the bug, keep that file (commit it) and it is a regression test from
# then on. docs/reliability.md lists every target.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${1:-10s}
shift || true
pkgs=("$@")
if [ ${#pkgs[@]} -eq 0 ]; then
	pkgs=(./...)
fi
failed=()
count=0
while read -r pkg; do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	for name in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
		echo "fuzz: $pkg $name for $fuzztime"
		count=$((count + 1))
		if ! go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "$pkg"; then
			failed+=("$pkg $name")
		fi
	done
done < <(go list "${pkgs[@]}")
echo "fuzz: $count targets for $fuzztime each"
if [ ${#failed[@]} -gt 0 ]; then
	echo "fuzz: FAILED:"
	printf '  %s\n' "${failed[@]}"
	echo "fuzz: the failing inputs are in testdata/fuzz/<FuzzName>/ of each package (see docs/reliability.md)"
	exit 1
fi
