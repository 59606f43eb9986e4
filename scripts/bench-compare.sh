#!/usr/bin/env bash
# Runnel side by side with NATS JetStream and Redis Streams on this machine, in one run (issue 9):
# builds bin/runnel, installs nats-server and redis-server with apt-get when they are missing, then runs
# bench/peers, which starts each server in turn on 127.0.0.1 (data under $OUT), drives it with its own
# Go client, measures the machine's ceilings, and writes $OUT/report.md, $OUT/results.json and PNG
# charts. See docs/benchmarks.md.
#
# Knobs (environment): FULL=1 runs the whole matrix (hours) instead of the reduced one (about 10
# minutes); OUT (default bench/out); DATA (default ../shared/data, for flights-3m.ndjson.zst);
# PEERS_FLAGS extra flags for bench/peers (e.g. "-systems runnel,jetstream" or "-workloads 100B");
# ROUNDS=N (default 1) runs the whole comparison N times, one after another, into $OUT/round-1 ... N,
# each with its own report, and writes $OUT/report.md as the summary: every target's ratio per round
# with its lower median and whether most rounds met it. -cpuprofile/-memprofile in PEERS_FLAGS keep the
# last round's profile only; -out in PEERS_FLAGS is overridden (set OUT instead).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-bench/out}
DATA=${DATA:-../shared/data}
GO=${GO:-go}
rounds=${ROUNDS:-1}
if ! [[ $rounds =~ ^[1-9][0-9]*$ ]]; then
	echo "ROUNDS=$rounds: must be a whole number of at least 1" >&2
	exit 2
fi
# bench/peers saves what it measured when interrupted and exits 130; this stops the rounds there too.
trap 'exit 130' INT TERM

need=()
command -v nats-server >/dev/null 2>&1 || need+=(nats-server)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
if ((${#need[@]} > 0)); then
	echo "installing ${need[*]} with apt-get"
	sudo=()
	if [[ $(id -u) != 0 ]]; then
		sudo=(sudo)
	fi
	"${sudo[@]}" apt-get update -qq
	DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${need[@]}" >/dev/null
fi
# The packages may start a system-wide service; the benchmark never uses it (it starts its own
# servers on free ports), but it says so, since a busy service would skew the figures.
for svc in nats-server redis-server; do
	if pids=$(pgrep -x "$svc" 2>/dev/null); then
		echo "note: $svc already running (pid $(echo "$pids" | tr '\n' ' ')): not ours, left alone" >&2
	fi
done

if [[ ! -f $DATA/flights-3m.ndjson.zst ]]; then
	echo "$DATA/flights-3m.ndjson.zst is missing: set DATA to the folder holding the shared data sets" >&2
	exit 1
fi

"$GO" build -o bin/runnel ./cmd/runnel
mkdir -p "$OUT"
"$GO" build -o "$OUT/peers" ./bench/peers
version="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [[ -n $(git status --porcelain -- api broker client cmd platform 2>/dev/null) ]]; then
	version+="+local changes"
fi

flags=(-runnel bin/runnel -runnel-version "runnel $version" -data "$DATA/flights-3m.ndjson.zst")
if [[ ${FULL:-} == 1 ]]; then
	flags+=(-full)
fi
# shellcheck disable=SC2206 # PEERS_FLAGS is a list of flags
flags+=(${PEERS_FLAGS:-})
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB RAM", $2/1048576}' /proc/meminfo), $(uname -sr)"
# What an earlier run left would sit beside this one's report as if it belonged to it: a single run's
# results and charts, or the rounds and summary of a run with more rounds than this one.
rm -rf "$OUT"/round-* "$OUT/report.md"
if ((rounds == 1)); then
	"$OUT/peers" "${flags[@]}" -out "$OUT"
	echo "report: $OUT/report.md (charts: $OUT/*.png, raw figures: $OUT/results.json)"
	exit 0
fi
rm -f "$OUT/results.json" "$OUT"/*.png
results=()
for ((k = 1; k <= rounds; k++)); do
	echo "round $k of $rounds"
	"$OUT/peers" "${flags[@]}" -out "$OUT/round-$k"
	results+=("$OUT/round-$k/results.json")
done
"$OUT/peers" -summarize "$OUT/report.md" "${results[@]}"
echo "report: $OUT/report.md (the $rounds rounds side by side; each round's own report: $OUT/round-K/report.md)"
