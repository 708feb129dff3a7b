#!/usr/bin/env bash
# Two warrend builds compared on durable.sh's throughput run (persistent
# 1 KiB messages, durable queues, confirm window 10,000 per producer,
# prefetch 1,000, acks in batches of 100), alternated in A B, B A, A B, ...
# order so that a steady drift of the machine's load favours neither: each
# run a fresh warrend on a fresh data directory, DUR seconds measured after
# a 2 s warmup. Each run appends a benchmark line to OUT/A.txt or OUT/B.txt
# (msg/s, warrend's and the load generator's CPU per message, and what
# warrend wrote to the disk per message: /proc/PID/io write_bytes over the
# whole run), for benchstat, and a line to OUT/log. Compare CPU per message
# (on a shared machine the rate follows the cores the runs get):
#
#   QUEUES=1 PAIRS=10 DUR=8 loadtest/bench/durable-ab.sh bin-a bin-b
#   benchstat OUT/bin-a.txt OUT/bin-b.txt
#
# BIN_A and BIN_B are directories holding warrend and warren-loadtest (the
# load generator is taken from BIN_A for both). OUT defaults to a new
# directory under /tmp.
set -euo pipefail
A=${1:?usage: durable-ab.sh BIN_A BIN_B}
B=${2:?usage: durable-ab.sh BIN_A BIN_B}
QUEUES=${QUEUES:-1}
PAIRS=${PAIRS:-6}
DUR=${DUR:-8}
PORT=${PORT:-5697}
DATA_PARENT=${DATA_PARENT:-/var/tmp}
OUT=${OUT:-$(mktemp -d /tmp/warren-durable-ab.XXXXXX)}
mkdir -p "$OUT"
p=2
[ "$QUEUES" -gt 1 ] && p=4

one() { # one run of build $1; appends to $OUT/$(basename $1).txt
	local bin=$1 name data pid wb n
	name=$(basename "$bin")
	data=$(mktemp -d "$DATA_PARENT/warren-durable-ab.XXXXXX")
	"$bin/warrend" --listen 127.0.0.1:$PORT --http 127.0.0.1:$((PORT + 10000)) --data "$data" --log-level warn &
	pid=$!
	until curl -sf http://127.0.0.1:$((PORT + 10000))/readyz >/dev/null; do sleep 0.1; done
	if "$A/warren-loadtest" --url warren://guest:guest@127.0.0.1:$PORT --persistent --size 1024 --queues "$QUEUES" \
		--producers $p --consumers 1 --warmup 2s --duration "${DUR}s" --broker-pid $pid --json "$OUT/run.json" >"$OUT/run.txt" 2>&1; then
		wb=$(awk '/^write_bytes/ {print $2}' /proc/$pid/io)
		python3 - "$OUT/run.json" "$wb" "$QUEUES" "$name" "$OUT" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, sys
js, wb, q, name, out, load = sys.argv[1:]
j = json.load(open(js))
rate, b, c, n = j["publish_rate"], j.get("broker_cpu_us_per_msg", 0), j.get("client_cpu_us_per_msg", 0), max(j.get("consumed", 0), 1)
with open(f"{out}/{name}.txt", "a") as f:
    f.write(f"BenchmarkDurableWire/queues={q} 1 {rate:.0f} msg/s {b:.2f} broker-us/msg {c:.2f} client-us/msg {b+c:.2f} total-us/msg {int(wb)/n:.0f} written-B/msg\n")
line = f"{name} rate {rate:.0f} broker {b:.2f} client {c:.2f} load {load} written {int(wb)/n:.0f}"
print(line)
open(f"{out}/log", "a").write(line + "\n")
PY
	else
		echo "$name: the run failed:" && tail -3 "$OUT/run.txt"
	fi
	kill $pid 2>/dev/null || true
	wait $pid 2>/dev/null || true
	rm -rf "$data"
}

for i in $(seq "$PAIRS"); do
	if [ $((i % 2)) -eq 1 ]; then one "$A"; one "$B"; else one "$B"; one "$A"; fi
done
echo "results: $OUT ($(basename "$A").txt, $(basename "$B").txt, log)"
