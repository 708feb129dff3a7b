#!/usr/bin/env bash
# make bench-scale (issue 17 item 5), against a warrend of its own:
#  1. scale-idle: IDLE idle connections (authenticated, a channel each,
#     heartbeats every 10 s proposed) held by PROCS child processes; the
#     broker's VmRSS per idle connection and its CPU with only them open;
#     then an active publisher/consumer pair measured beside them and
#     without them, alternately, twice each. The broker's max_connections is
#     raised to IDLE + 200 for this run (the default is 10,000).
#  2. queues-10000: 10,000 queues with a consumer each under load from 4
#     producers: msg/s, broker CPU per message, and the broker's VmRSS.
#
#   IDLE=10000 PROCS=2 ROUNDS=2 DUR=10s Q_DUR=30s loadtest/bench/scale.sh
set -euo pipefail
BIN=${BIN:-bin}
IDLE=${IDLE:-10000}
PROCS=${PROCS:-2}
DUR=${DUR:-10s}
Q_DUR=${Q_DUR:-30s}
SETTLE=${SETTLE:-30s}
ROUNDS=${ROUNDS:-2}
PORT=${PORT:-5694}
OUT=${OUT:-.}
need=$((IDLE + 400))
if [ "$(ulimit -n)" -lt "$need" ]; then
	ulimit -n "$need" 2>/dev/null || { echo "ulimit -n is $(ulimit -n); the broker needs $need open files (ulimit -Hn: $(ulimit -Hn))"; exit 1; }
fi
data=$(mktemp -d /tmp/warren-bench-scale.XXXXXX)
printf '{"max_connections": %d}\n' $((IDLE + 200)) >"$data/warrend.json"
"$BIN/warrend" --config "$data/warrend.json" --listen 127.0.0.1:$PORT --http 127.0.0.1:$((PORT + 10000)) \
	--data "$data/data" --log-level warn &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$data"' EXIT
until curl -sf http://127.0.0.1:$((PORT + 10000))/readyz >/dev/null; do sleep 0.1; done
url=warren://guest:guest@127.0.0.1:$PORT
rss() { awk '/^VmRSS/ {printf "%.1f MiB", $2/1024}' /proc/$pid/status; }

echo "machine: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r); ulimit -n $(ulimit -n); load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "warrend $pid: max_connections $((IDLE + 200)); VmRSS at start $(rss)"
echo
"$BIN/warren-loadtest" scale-idle --url "$url" --idle "$IDLE" --procs "$PROCS" --settle "$SETTLE" --rounds "$ROUNDS" --duration "$DUR" \
	--broker-pid $pid --json "$OUT/scale-idle.json" 2>"$OUT/scale-idle.log"
echo
echo "queues-10000: VmRSS before $(rss)"
"$BIN/warren-loadtest" --scenario queues-10000 --url "$url" --duration "$Q_DUR" --broker-pid $pid --json "$OUT/queues-10000.json" \
	>"$OUT/queues-10000.log" 2>&1 || { tail -20 "$OUT/queues-10000.log"; exit 1; }
sed -n '/^== /,$p' "$OUT/queues-10000.log"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
