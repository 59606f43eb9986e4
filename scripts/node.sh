# Sourced by demo.sh and bench.sh: start and stop a fresh `bin/runnel dev` node.
#
#   start_node   starts it on free ports (port 0; the node prints what it bound) with its data in a new
#                directory under ./data/ (on the same disk as the clone, so fsync figures are real),
#                waits until it answers, and exports RUNNEL_BROKERS for the client verbs.
#   stop_node    stops it with SIGTERM (SIGKILL after 30 s) and removes its data. It also runs on exit.
#
# NODE_FLAGS adds flags to `runnel dev` (e.g. NODE_FLAGS=--no-fsync).

RUNNEL=${RUNNEL:-./bin/runnel}

start_node() {
	if [[ ! -x $RUNNEL ]]; then
		echo "$RUNNEL is missing: run 'make build' first (make demo and make bench do)" >&2
		exit 1
	fi
	mkdir -p ./data
	NODE_DIR=$(mktemp -d ./data/run.XXXXXX)
	# shellcheck disable=SC2086 # NODE_FLAGS is a list of flags
	"$RUNNEL" dev --data-dir "$NODE_DIR/data" --grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 --raft-addr 127.0.0.1:0 --serf-addr "" ${NODE_FLAGS:-} \
		>"$NODE_DIR/node.log" 2>&1 &
	NODE_PID=$!
	trap stop_node EXIT
	local addr="" deadline=$((SECONDS + 60))
	while :; do
		if ! kill -0 "$NODE_PID" 2>/dev/null; then
			echo "the node exited while starting; its log:" >&2
			cat "$NODE_DIR/node.log" >&2
			exit 1
		fi
		if [[ -z $addr ]]; then
			addr=$(sed -n 's/.*listening grpc=\([^ ]*\) .*/\1/p' "$NODE_DIR/node.log" | head -n 1)
		fi
		if [[ -n $addr ]] && "$RUNNEL" topic list --brokers "$addr" >/dev/null 2>&1; then
			break
		fi
		if ((SECONDS > deadline)); then
			echo "the node did not answer within 60 s; its log:" >&2
			cat "$NODE_DIR/node.log" >&2
			exit 1
		fi
		sleep 0.1
	done
	export RUNNEL_BROKERS=$addr
	echo "node $NODE_PID serving at $addr, data in $NODE_DIR/data"
}

stop_node() {
	trap - EXIT
	[[ -n ${NODE_PID:-} ]] || return 0
	if kill -0 "$NODE_PID" 2>/dev/null; then
		kill -TERM "$NODE_PID"
		local deadline=$((SECONDS + 30))
		while kill -0 "$NODE_PID" 2>/dev/null && ((SECONDS < deadline)); do
			sleep 0.1
		done
		if kill -0 "$NODE_PID" 2>/dev/null; then
			echo "the node did not stop within 30 s of SIGTERM; killing it" >&2
			kill -KILL "$NODE_PID" 2>/dev/null || true
		fi
	fi
	wait "$NODE_PID" 2>/dev/null || true
	NODE_PID=
	rm -rf "$NODE_DIR"
}
