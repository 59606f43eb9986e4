#!/usr/bin/env bash
# Benchmark a 3-node cluster on this machine (the issue's replication figure): three `runnel server`
# processes (all controller voters), a topic with replication factor 3 and min.insync.replicas=2,
# then `runnel bench produce --acks all` with 100-byte records: records/s and the produce latency
# percentiles, with the SDK's default producer settings and with lz4 and a 20 ms linger. Each is then run
# again at half its rate, where latency means something (below saturation).
#
# Knobs (environment): COUNT records (default 3000000), PARTITIONS (default 6), PRODUCERS (default 2),
# BENCH_FLAGS extra flags for `runnel bench produce`, NODE_FLAGS extra flags for `runnel server`.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNNEL=${RUNNEL:-./bin/runnel}
COUNT=${COUNT:-3000000}
PARTITIONS=${PARTITIONS:-6}
PRODUCERS=${PRODUCERS:-2}
mkdir -p ./data
DIR=$(mktemp -d ./data/cluster-bench.XXXXXX)
PIDS=()
stop_nodes() {
	for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
	for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
	rm -rf "$DIR"
}
trap stop_nodes EXIT

# Ports below the ephemeral range: grpc 17x70, http 17x71, raft 17x72, serf 17x73 for node x.
for i in 1 2 3; do
	if curl -s -o /dev/null "http://127.0.0.1:17${i}71/readyz" 2>/dev/null; then
		echo "port 127.0.0.1:17${i}71 already answers: another cluster uses the ports 17x70-17x73; stop it first" >&2
		exit 1
	fi
done
voters="1@127.0.0.1:17172,2@127.0.0.1:17272,3@127.0.0.1:17372"
join="127.0.0.1:17173,127.0.0.1:17273,127.0.0.1:17373"
for i in 1 2 3; do
	# shellcheck disable=SC2086 # NODE_FLAGS is a list of flags
	"$RUNNEL" server --node-id "$i" --data-dir "$DIR/node-$i" --grpc-addr "127.0.0.1:17${i}70" --http-addr "127.0.0.1:17${i}71" \
		--raft-addr "127.0.0.1:17${i}72" --serf-addr "127.0.0.1:17${i}73" --controller-voters "$voters" --join "$join" \
		--log-level warn ${NODE_FLAGS:-} >"$DIR/node-$i.log" 2>&1 &
	PIDS+=($!)
done
brokers="127.0.0.1:17170,127.0.0.1:17270,127.0.0.1:17370"
deadline=$((SECONDS + 60))
for i in 1 2 3; do
	until curl -fs "http://127.0.0.1:17${i}71/readyz" >/dev/null 2>&1; do
		if ! kill -0 "${PIDS[$((i - 1))]}" 2>/dev/null || ((SECONDS > deadline)); then
			echo "node $i exited or was not ready within 60 s; its log:" >&2
			cat "$DIR/node-$i.log" >&2
			exit 1
		fi
		sleep 0.2
	done
done
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB RAM", $2/1048576}' /proc/meminfo); 3 nodes on it"
"$RUNNEL" topic create bench-rf3 --brokers "$brokers" -p "$PARTITIONS" -r 3 -c min.insync.replicas=2 >/dev/null
for i in 1 2 3; do # every node has applied the new topic
	until "$RUNNEL" topic describe bench-rf3 --brokers "127.0.0.1:17${i}70" >/dev/null 2>&1; do sleep 0.1; done
done
# Two producer settings: no compression with a 5 ms linger (the SDK's default before natural batching),
# and lz4 with a 20 ms linger,
# which sends fewer, smaller batches (fewer appends, fsyncs and follower fetches per record).
for setting in "none 5ms" "lz4 20ms"; do
	read -r compression linger <<<"$setting"
	echo
	echo "== runnel bench produce --acks all --compression $compression --linger $linger, replication factor 3 (${COUNT} records of 100 bytes, $PRODUCERS producers)"
	# shellcheck disable=SC2086 # BENCH_FLAGS is a list of flags
	out=$("$RUNNEL" bench produce --brokers "$brokers" --topic bench-rf3 --acks all --size 100 --count "$COUNT" \
		--compression "$compression" --linger "$linger" --producers "$PRODUCERS" -q ${BENCH_FLAGS:-} -o json)
	echo "$out"
	rate=$(sed -n 's/.*"records_per_sec":\([0-9.]*\).*/\1/p' <<<"$out" | cut -d. -f1)
	if [[ -n $rate && $rate -gt 0 ]]; then
		half=$((rate / 2))
		echo
		echo "== the same at half that rate ($half records/s): latency below saturation"
		# shellcheck disable=SC2086
		"$RUNNEL" bench produce --brokers "$brokers" --topic bench-rf3 --acks all --size 100 --duration 15s --rate "$half" \
			--compression "$compression" --linger "$linger" --producers "$PRODUCERS" -q ${BENCH_FLAGS:-}
	fi
done
