#!/usr/bin/env bash
# Three warrend nodes on loopback (make cluster / make cluster-stop).
#   node N: native 5680+10(N-1), HTTP 15680+10(N-1), cluster 5682+10(N-1)
#   (PORT_BASE=B moves them to B+10(N-1), B+10000+10(N-1), B+2+10(N-1))
#   data under $DATA/nodeN (default ./warren-data), log in $DATA/nodeN/warrend.log
# The shared cluster secret is $DATA/cluster-secret (made once, 32 random bytes).
set -euo pipefail
DATA=${DATA:-./warren-data}
BIN=${WARREND:-./bin/warrend}
B=${PORT_BASE:-5680}
PEERS="1=127.0.0.1:$((B + 2)),2=127.0.0.1:$((B + 12)),3=127.0.0.1:$((B + 22))"

start() {
	mkdir -p "$DATA"
	if [ ! -s "$DATA/cluster-secret" ]; then
		(umask 077; head -c 32 /dev/urandom | base64 > "$DATA/cluster-secret")
	fi
	for n in 1 2 3; do
		dir="$DATA/node$n"
		mkdir -p "$dir"
		if [ -f "$dir/warrend.pid" ] && kill -0 "$(cat "$dir/warrend.pid")" 2>/dev/null; then
			echo "node $n already runs (pid $(cat "$dir/warrend.pid")); make cluster-stop first" >&2
			exit 1
		fi
		off=$(( (n - 1) * 10 ))
		"$BIN" --node-id "$n" --peers "$PEERS" --cluster-secret-file "$DATA/cluster-secret" \
			--listen "127.0.0.1:$((B + off))" --http "127.0.0.1:$((B + 10000 + off))" \
			--data "$dir" >"$dir/warrend.log" 2>&1 &
		echo $! > "$dir/warrend.pid"
	done
	# Ready once each node's metadata group has a leader and it caught up.
	for n in 1 2 3; do
		off=$(( (n - 1) * 10 ))
		for _ in $(seq 300); do
			if curl -fsS "http://127.0.0.1:$((B + 10000 + off))/readyz" >/dev/null 2>&1; then
				break
			fi
			if ! kill -0 "$(cat "$DATA/node$n/warrend.pid")" 2>/dev/null; then
				echo "node $n exited; its log:" >&2
				tail -20 "$DATA/node$n/warrend.log" >&2
				exit 1
			fi
			sleep 0.1
		done
	done
	echo "NODE  NATIVE           HTTP              CLUSTER          DATA"
	for n in 1 2 3; do
		off=$(( (n - 1) * 10 ))
		printf '%-5s 127.0.0.1:%-6s 127.0.0.1:%-7s 127.0.0.1:%-6s %s\n' "$n" $((B + off)) $((B + 10000 + off)) $((B + 2 + off)) "$DATA/node$n"
	done
	echo "warrenctl --url warren://guest:guest@127.0.0.1:$B cluster status"
}

stop() {
	local failed=0
	for n in 1 2 3; do
		pidf="$DATA/node$n/warrend.pid"
		[ -f "$pidf" ] || continue
		pid=$(cat "$pidf")
		if kill -TERM "$pid" 2>/dev/null; then
			for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		fi
		if kill -0 "$pid" 2>/dev/null; then
			echo "node $n (pid $pid) has not stopped after 20 s: see $DATA/node$n/warrend.log; kill -9 $pid ends it" >&2
			failed=1
			continue
		fi
		rm -f "$pidf"
		echo "node $n stopped"
	done
	return $failed
}

case "${1:-}" in
start) start ;;
stop) stop ;;
*) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
