#!/usr/bin/env bash
# Benchmark a fresh local node (the producer, the consumer and the node share this machine): produce
# with acks=1 and with acks=all (fsynced, group-committed), then consume, all with 100-byte values;
# then this machine's raw disk ceilings for comparison.
#
# Knobs (environment): COUNT records per produce run (default 5000000), PARTITIONS (default 4),
# PRODUCERS concurrent producers (default 1), COMPRESSION (default none), NODE_FLAGS extra flags for
# `runnel dev`, BENCH_FLAGS extra flags for `runnel bench produce` (e.g. "--linger 10ms").
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/node.sh
source scripts/node.sh

COUNT=${COUNT:-5000000}
PARTITIONS=${PARTITIONS:-4}
PRODUCERS=${PRODUCERS:-1}
COMPRESSION=${COMPRESSION:-none}

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB RAM", $2/1048576}' /proc/meminfo), $(uname -sr)"
start_node

# shellcheck disable=SC2206 # BENCH_FLAGS is a list of flags
common=(--size 100 --count "$COUNT" --partitions "$PARTITIONS" --producers "$PRODUCERS" --compression "$COMPRESSION" ${BENCH_FLAGS:-})
for acks in 1 all; do
	echo
	echo "== runnel bench produce --acks $acks (${COUNT} records of 100 bytes)"
	"$RUNNEL" bench produce --topic "bench-acks-$acks" --acks "$acks" "${common[@]}" -q
done
echo
echo "== runnel bench consume (the acks=1 topic, from the start)"
"$RUNNEL" bench consume --topic bench-acks-1 -q
stop_node

# The machine's ceilings: the disk under ./data, where the node kept its data, and a bare gRPC stream
# on loopback (bench/ceiling), then the same disk measured with dd as a cross-check.
if [[ -d bench/ceiling ]]; then
	echo
	echo "== ceilings (go run ./bench/ceiling -dir ./data)"
	mkdir -p ./data
	"${GO:-go}" run ./bench/ceiling -dir ./data
fi
echo
echo "== disk ceilings with dd (./data)"
mkdir -p ./data
probe=$(mktemp ./data/ddprobe.XXXXXX)
trap 'rm -f "$probe"' EXIT
echo -n "sequential write, 1 GiB in 1 MiB blocks, O_DIRECT + fdatasync: "
dd if=/dev/zero of="$probe" bs=1M count=1024 oflag=direct conv=fdatasync 2>&1 | tail -n 1 | sed 's/.*, //'
echo -n "synchronous 4 KiB writes (each one fsynced, O_DSYNC), 2000 of them: "
dd if=/dev/zero of="$probe" bs=4k count=2000 oflag=dsync 2>&1 | tail -n 1 |
	awk -F', ' '{ split($3, t, " "); printf "%s, %.0f fsynced writes/s\n", $3, 2000 / t[1] }'
