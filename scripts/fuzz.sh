#!/usr/bin/env bash
# Runs every Fuzz target in the module for the given time each (default 10s).
# The committed seed corpora live in testdata/fuzz/<FuzzName>/ next to each target.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${1:-10s}
status=0
while read -r pkg; do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	for name in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
		echo "fuzz: $pkg $name for $fuzztime"
		if ! go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "$pkg"; then
			status=1
		fi
	done
done < <(go list ./...)
exit $status
