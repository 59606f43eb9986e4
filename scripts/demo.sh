#!/usr/bin/env bash
# Stream a file of flights through a fresh node and check that every record came back with per-key
# order intact (see `runnel demo flights --help`). Usage: scripts/demo.sh FLIGHTS.ndjson[.zst|.gz]
# `make demo` builds bin/runnel and runs this on ../shared/data/flights-3m.ndjson.zst.
set -euo pipefail
cd "$(dirname "$0")/.."
file=${1:?usage: scripts/demo.sh FLIGHTS.ndjson[.zst|.gz]}
[[ -f $file ]] || { echo "demo: $file not found" >&2; exit 1; }
# shellcheck source=scripts/node.sh
source scripts/node.sh

start_node
status=0
"$RUNNEL" demo flights --file "$file" || status=$?
stop_node
exit "$status"
