#!/usr/bin/env bash
# CPU and allocation profiles of a fresh local node under a produce workload and under a consume
# workload, taken from the node's /debug/pprof HTTP endpoints while `runnel bench` drives it. Writes
# to $OUT (default bench/out):
#
#   profile-produce-cpu.pprof   profile-produce-allocs.pprof   (and .top.txt summaries of each)
#   profile-consume-cpu.pprof   profile-consume-allocs.pprof
#   profile-produce-client-cpu.pprof, profile-consume-client-cpu.pprof   (the runnel bench process: the
#                               producer and consumer share the 2 cores with the node)
#
# Read them with `go tool pprof -top bin/runnel FILE` or `go tool pprof -http=: bin/runnel FILE`.
# Knobs (environment): SECONDS_PROFILED (default 15), PARTITIONS (default 12), ACKS (default all),
# SIZE (default 100), NODE_FLAGS (e.g. --no-fsync), BENCH_FLAGS (extra flags for bench produce).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/node.sh
source scripts/node.sh

OUT=${OUT:-bench/out}
SECS=${SECONDS_PROFILED:-15}
PARTITIONS=${PARTITIONS:-12}
ACKS=${ACKS:-all}
SIZE=${SIZE:-100}
GO=${GO:-go}
mkdir -p "$OUT"

start_node
http=$(sed -n 's/.*listening grpc=[^ ]* http=\([^ ]*\) .*/\1/p' "$NODE_DIR/node.log" | head -n 1)
if [[ -z $http ]]; then
	echo "could not find the node's HTTP address in its log" >&2
	exit 1
fi
echo "node HTTP (pprof) at http://$http/debug/pprof/"

# profile NAME: CPU and allocation (delta over the same window) profiles of the node, in parallel.
profile() {
	local name=$1
	echo "profiling the node for ${SECS}s under $name"
	curl -sf -o "$OUT/profile-$name-cpu.pprof" "http://$http/debug/pprof/profile?seconds=$SECS" &
	local cpu=$!
	curl -sf -o "$OUT/profile-$name-allocs.pprof" "http://$http/debug/pprof/allocs?seconds=$SECS" &
	local allocs=$!
	wait "$cpu" "$allocs"
	"$GO" tool pprof -top -nodecount=30 "$RUNNEL" "$OUT/profile-$name-cpu.pprof" >"$OUT/profile-$name-cpu.top.txt" 2>/dev/null || true
	"$GO" tool pprof -top -nodecount=30 -sample_index=alloc_space "$RUNNEL" "$OUT/profile-$name-allocs.pprof" >"$OUT/profile-$name-allocs.top.txt" 2>/dev/null || true
}

# Produce: one producer, as fast as the node takes records, for longer than the profile window.
# shellcheck disable=SC2086 # BENCH_FLAGS is a list of flags
"$RUNNEL" bench produce --topic profile --acks "$ACKS" --size "$SIZE" --partitions "$PARTITIONS" \
	--duration "$((SECS + 6))s" --cpuprofile "$OUT/profile-produce-client-cpu.pprof" -q -o json ${BENCH_FLAGS:-} \
	>"$OUT/profile-produce-bench.json" &
bench=$!
sleep 3 # past the start-up
profile produce
wait "$bench"
echo "produce: $(cat "$OUT/profile-produce-bench.json")"

# Consume: read the topic from the start again and again for the whole window (the client profile
# is of the first pass).
(
	end=$((SECONDS + SECS + 4))
	prof=(--cpuprofile "$OUT/profile-consume-client-cpu.pprof")
	while ((SECONDS < end)); do
		"$RUNNEL" bench consume --topic profile -q -o json "${prof[@]}"
		prof=()
	done
) >"$OUT/profile-consume-bench.json" &
bench=$!
sleep 2
profile consume
wait "$bench"
echo "consume: $(head -n 1 "$OUT/profile-consume-bench.json")"
stop_node
for side in produce consume; do
	"$GO" tool pprof -top -nodecount=30 "$RUNNEL" "$OUT/profile-$side-client-cpu.pprof" >"$OUT/profile-$side-client-cpu.top.txt" 2>/dev/null || true
done

for f in "$OUT"/profile-*.top.txt; do
	echo
	echo "== $f"
	sed -n '1,18p' "$f"
done
