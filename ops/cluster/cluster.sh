#!/usr/bin/env bash
# Three warrend nodes on loopback (make cluster / make cluster-stop).
#   node N: native 5680+10(N-1), HTTP 15680+10(N-1), cluster 5682+10(N-1)
#   (PORT_BASE=B moves them to B+10(N-1), B+10000+10(N-1), B+2+10(N-1))
#   AMQP=1: each node also serves AMQP 0-9-1 on B+3+10(N-1) (5683, 5693, 5703)
#   data under $DATA/nodeN (default ./warren-data), log in $DATA/nodeN/warrend.log (appended to)
# The shared cluster secret is $DATA/cluster-secret (made once, 32 random bytes).
set -euo pipefail
DATA=${DATA:-./warren-data}
BIN=${WARREND:-./bin/warrend}
B=${PORT_BASE:-5680}
AMQP=${AMQP:-}
PEERS="1=127.0.0.1:$((B + 2)),2=127.0.0.1:$((B + 12)),3=127.0.0.1:$((B + 22))"

# alive PID: the process runs (not a zombie waiting to be reaped).
alive() { kill -0 "$1" 2>/dev/null && [ "$(ps -o stat= -p "$1" 2>/dev/null | cut -c1)" != Z ]; }

# in_use PORT: something on this machine accepts connections on 127.0.0.1:PORT.
in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start() {
	mkdir -p "$DATA"
	if [ ! -s "$DATA/cluster-secret" ]; then
		(umask 077; head -c 32 /dev/urandom | base64 > "$DATA/cluster-secret")
	fi
	# The ports of the nodes to start must be free: another process on one
	# (a make run broker on 5680 and 15680) would answer the readiness check
	# below in that node's place while the node exits on "address already
	# in use".
	for n in 1 2 3; do
		dir="$DATA/node$n"
		if [ -f "$dir/warrend.pid" ] && alive "$(cat "$dir/warrend.pid")"; then
			continue
		fi
		off=$(( (n - 1) * 10 ))
		ports="$((B + off)) $((B + 10000 + off)) $((B + 2 + off))"
		[ -n "$AMQP" ] && ports="$ports $((B + 3 + off))"
		for p in $ports; do
			if in_use "$p"; then
				echo "node $n: 127.0.0.1:$p is in use (a warrend from make run? stop it first, or move the cluster: make cluster PORT_BASE=6680); no node started" >&2
				exit 1
			fi
		done
	done
	for n in 1 2 3; do
		dir="$DATA/node$n"
		mkdir -p "$dir"
		if [ -f "$dir/warrend.pid" ] && alive "$(cat "$dir/warrend.pid")"; then
			echo "node $n already runs (pid $(cat "$dir/warrend.pid")): left as it is" >&2
			continue # a start after one node died starts that one
		fi
		off=$(( (n - 1) * 10 ))
		echo "--- start $(date -u +%FT%TZ)" >>"$dir/warrend.log" # the log of earlier runs is kept
		amqp=()
		[ -n "$AMQP" ] && amqp=(--amqp-listen "127.0.0.1:$((B + 3 + off))")
		"$BIN" --node-id "$n" --peers "$PEERS" --cluster-secret-file "$DATA/cluster-secret" \
			--listen "127.0.0.1:$((B + off))" --http "127.0.0.1:$((B + 10000 + off))" \
			"${amqp[@]}" --data "$dir" >>"$dir/warrend.log" 2>&1 &
		echo $! > "$dir/warrend.pid"
	done
	# Ready once each node's metadata group has a leader and it caught up.
	for n in 1 2 3; do
		off=$(( (n - 1) * 10 ))
		ready=no
		for _ in $(seq 600); do
			if curl -fsS "http://127.0.0.1:$((B + 10000 + off))/readyz" >/dev/null 2>&1; then
				ready=yes
				break
			fi
			if ! alive "$(cat "$DATA/node$n/warrend.pid")"; then
				echo "node $n exited; its log:" >&2
				tail -20 "$DATA/node$n/warrend.log" >&2
				exit 1
			fi
			sleep 0.1
		done
		if [ $ready = no ]; then
			echo "node $n is not ready after 60 s: $(curl -sS "http://127.0.0.1:$((B + 10000 + off))/readyz" 2>&1); its log: $DATA/node$n/warrend.log" >&2
			exit 1
		fi
	done
	# A node that exited after another process answered for it.
	for n in 1 2 3; do
		if ! alive "$(cat "$DATA/node$n/warrend.pid")"; then
			echo "node $n exited; its log:" >&2
			tail -20 "$DATA/node$n/warrend.log" >&2
			exit 1
		fi
	done
	echo "NODE  NATIVE           HTTP              CLUSTER          ${AMQP:+AMQP             }DATA"
	for n in 1 2 3; do
		off=$(( (n - 1) * 10 ))
		a=""
		[ -n "$AMQP" ] && a=$(printf '127.0.0.1:%-6s ' $((B + 3 + off)))
		printf '%-5s 127.0.0.1:%-6s 127.0.0.1:%-7s 127.0.0.1:%-6s %s%s\n' "$n" $((B + off)) $((B + 10000 + off)) $((B + 2 + off)) "$a" "$DATA/node$n"
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
			for _ in $(seq 200); do alive "$pid" || break; sleep 0.1; done
		fi
		if alive "$pid"; then
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
