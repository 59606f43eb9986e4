#!/usr/bin/env bash
# Runs every Go fuzz target of the repository (every `func FuzzXxx` in a _test.go file) for FUZZTIME
# each. Crashers found are written by `go test` to the package's testdata/fuzz/ and must be committed
# there as seeds. Usage: scripts/fuzz.sh [FUZZTIME]
# FUZZTIME is a duration (60s) or an execution count (10000x). `make test` uses a count: a duration
# races Go's fuzz coordinator at the deadline (golang/go#75804, unfixed in go1.26) and fails a run
# with a bare "context deadline exceeded" and no crasher on a loaded machine; a count has no deadline.
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
