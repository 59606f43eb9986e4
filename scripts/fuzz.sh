#!/usr/bin/env bash
# Runs every Go fuzz target of the repository (every `func FuzzXxx` in a _test.go file) for FUZZTIME
# each. Crashers found are written by `go test` to the package's testdata/fuzz/ and must be committed
# there as seeds. Usage: scripts/fuzz.sh [FUZZTIME]
set -euo pipefail
fuzztime=${1:-60s}
cd "$(dirname "$0")/.."
grep -rl --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]*\(' . | sort | while read -r file; do
  pkg=./$(dirname "${file#./}")
  for target in $(grep -oE '^func Fuzz[A-Za-z0-9_]*' "$file" | sed 's/^func //'); do
    echo "fuzz $pkg $target for $fuzztime"
    go test "$pkg" -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime"
  done
done
