#!/usr/bin/env bash
# make bench-durable: persistent 1 KiB messages in durable queues (1 and 100
# queues) against a warrend with --data on this machine's disk: msg/s, the
# broker's fdatasyncs (perf, over the measured window: every fdatasync of the
# process, the WAL's and any segment file's), messages per fdatasync, and the
# raw pwrite+fdatasync rate at the same bytes of bodies per sync (messages per
# fdatasync × 1 KiB), measured right after on the same disk (warren-loadtest
# rawsync); the ratio is bodies written per second by Warren over the raw
# rate. It also gives what the process wrote to the disk (/proc/PID/io
# write_bytes: WAL framing, moves into segment files, snapshots). Then
# publish→confirm latency at a fixed 10,000 msg/s. Needs perf (linux-perf) and root, or
# kernel.perf_event_paranoid ≤ 1, for the fdatasync count.
#
#   DUR=10s DATA_PARENT=/var/tmp loadtest/bench/durable.sh
set -euo pipefail
BIN=${BIN:-bin}
DUR=${DUR:-10s}
WARMUP=${WARMUP:-2}
DATA_PARENT=${DATA_PARENT:-/var/tmp}
PORT=${PORT:-5693}
QUEUES=${QUEUES:-1 100}
secs=${DUR%s}
data=$(mktemp -d "$DATA_PARENT/warren-bench-durable.XXXXXX")
out=$(mktemp -d /tmp/warren-bench-durable-out.XXXXXX)
"$BIN/warrend" --listen 127.0.0.1:$PORT --http 127.0.0.1:$((PORT + 10000)) --data "$data" --log-level warn &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$data"' EXIT
until curl -sf http://127.0.0.1:$((PORT + 10000))/readyz >/dev/null; do sleep 0.1; done
url=warren://guest:guest@127.0.0.1:$PORT
wbytes() { awk '/^write_bytes/ {print $2}' /proc/$pid/io; }

echo "machine: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r); data: $data ($(df -h --output=source,fstype "$data" | tail -1))"
echo
echo "| queues | producers | msg/s (confirmed) | MB/s of bodies | fdatasyncs/s | msgs per fdatasync | raw pwrite+fdatasync, blocks of that many KiB | Warren / raw | written by warrend (write_bytes) | warrend CPU µs per message | load avg (1 min) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for q in $QUEUES; do
	p=2
	[ "$q" -gt 1 ] && p=4
	"$BIN/warren-loadtest" --url "$url" --persistent --size 1024 --queues "$q" --producers $p --consumers 1 \
		--warmup ${WARMUP}s --duration "$DUR" --broker-pid $pid --json "$out/q$q.json" >"$out/q$q.txt" 2>&1 &
	lt=$!
	sleep "$WARMUP"
	b0=$(wbytes)
	perf stat -x, -e syscalls:sys_enter_fdatasync -p $pid -o "$out/perf$q.txt" -- sleep "$secs" 2>/dev/null
	b1=$(wbytes)
	load=$(cut -d' ' -f1 /proc/loadavg)
	wait $lt || { cat "$out/q$q.txt"; exit 1; }
	syncs=$(grep fdatasync "$out/perf$q.txt" | cut -d, -f1)
	rate=$(python3 -c "import json;print(json.load(open('$out/q$q.json'))['publish_rate'])")
	bcpu=$(python3 -c "import json;print(json.load(open('$out/q$q.json')).get('broker_cpu_us_per_msg', 0))")
	block=$(python3 -c "print(max(4096, int($rate * $secs / max($syncs, 1)) * 1024))")
	raw=$("$BIN/warren-loadtest" rawsync --dir "$data" --block "$block" --duration 5s)
	python3 - "$q" "$p" "$rate" "$syncs" "$secs" "$b0" "$b1" "$raw" "$load" "$bcpu" <<'PY'
import sys, re
q, p, rate, syncs, secs, b0, b1, raw, load, bcpu = sys.argv[1:]
rate, syncs, secs, b0, b1 = float(rate), int(syncs), float(secs), int(b0), int(b1)
m = re.search(r"([0-9]+)-byte blocks.* ([0-9.]+) MB/s", raw)
blk, rawmb = int(m.group(1)), float(m.group(2))
wmb = (b1 - b0) / secs / 1e6
mb = rate * 1024 / 1e6
print(f"| {q} | {p} | {rate:,.0f} | {mb:.1f} | {syncs/secs:,.0f} | {rate*secs/max(syncs,1):,.1f} | {blk/1024:,.0f} KiB: {rawmb:.1f} MB/s | **{100*mb/rawmb:.0f} %** | {wmb:.1f} MB/s, {(b1-b0)/max(syncs,1)/1024:,.0f} KiB per fdatasync | {float(bcpu):.1f} | {load} |")
PY
done
echo
echo "Latency at a fixed 10,000 msg/s (1 queue, 1 producer, 1 consumer, 1 KiB persistent):"
"$BIN/warren-loadtest" --url "$url" --persistent --size 1024 --queues 1 --producers 1 --consumers 1 --rate 10000 --broker-pid $pid \
	--warmup ${WARMUP}s --duration "$DUR" --json "$out/lat.json" >"$out/lat.txt" 2>&1 || { cat "$out/lat.txt"; exit 1; }
python3 - "$out/lat.json" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
c, e = r["confirm_latency_ms"], r["e2e_latency_ms"]
print(f"publish {r['publish_rate']:,.0f} msg/s, consume {r['consume_rate']:,.0f}, warrend CPU {r.get('broker_cpu_us_per_msg', 0):.1f} µs per message; publish→confirm p50 {c['p50']:.2f} ms, p99 {c['p99']:.2f} ms, max {c['max']:.2f}; publish→deliver p50 {e['p50']:.2f} ms, p99 {e['p99']:.2f} ms; lost {r['lost']}; load avg {sys.argv[2]}")
PY
echo "(runs' own reports: $out)"
