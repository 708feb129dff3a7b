#!/usr/bin/env bash
# make bench-durable: persistent 1 KiB messages in durable queues (1 and 100
# queues) against a warrend with --data on this machine's disk: msg/s, the
# broker's fdatasyncs (perf, over the measured window: every fdatasync of the
# process, the WAL's and any segment file's), messages per fdatasync, and the
# raw pwrite+fdatasync rate at the same bytes of bodies per sync (messages per
# fdatasync × 1 KiB; warren-loadtest rawsync) on the same disk. The raw rate
# of a shared virtual disk swings by 2-5× within minutes, so the two are
# interleaved: ROUNDS pairs per queue count (warren, raw, warren, raw, ...),
# each raw run right after its Warren run at that run's bytes per sync, and
# the summary compares the medians. "Warren / raw" is bodies written per
# second by Warren over the raw rate. Per run it also gives what the process
# wrote to the disk (/proc/PID/io write_bytes: WAL framing, moves into segment
# files, snapshots), the CPU per message of warrend and of the load generator,
# the cores they used together, and what 80 % of the raw rate would need: the
# CPU per message (warrend + load generator) that two whole cores could
# afford at 80 % of the raw rate in messages. Then publish→confirm latency at
# a fixed 10,000 msg/s. Needs perf (linux-perf) and root, or
# kernel.perf_event_paranoid ≤ 1, for the fdatasync count.
#
#   DUR=10s ROUNDS=3 DATA_PARENT=/var/tmp loadtest/bench/durable.sh
set -euo pipefail
BIN=${BIN:-bin}
DUR=${DUR:-10s}
WARMUP=${WARMUP:-2}
DATA_PARENT=${DATA_PARENT:-/var/tmp}
PORT=${PORT:-5693}
QUEUES=${QUEUES:-1 100}
ROUNDS=${ROUNDS:-3}
RAWDUR=${RAWDUR:-5s}
CORES=${CORES:-$(nproc)}
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
echo "| queues | round | msg/s (confirmed) | MB/s of bodies | msgs per fdatasync | raw pwrite+fdatasync at that size, right after | Warren / raw | written by warrend (write_bytes) | CPU µs per message: warrend + load generator | cores used | CPU µs per message for 80 % of raw on $CORES cores | load avg (1 min) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for q in $QUEUES; do
	p=2
	[ "$q" -gt 1 ] && p=4
	for r in $(seq "$ROUNDS"); do
		"$BIN/warren-loadtest" --url "$url" --persistent --size 1024 --queues "$q" --producers $p --consumers 1 \
			--warmup ${WARMUP}s --duration "$DUR" --broker-pid $pid --json "$out/q$q-$r.json" >"$out/q$q-$r.txt" 2>&1 &
		lt=$!
		sleep "$WARMUP"
		b0=$(wbytes)
		perf stat -x, -e syscalls:sys_enter_fdatasync -p $pid -o "$out/perf$q-$r.txt" -- sleep "$secs" 2>/dev/null
		b1=$(wbytes)
		load=$(cut -d' ' -f1 /proc/loadavg)
		wait $lt || { cat "$out/q$q-$r.txt"; exit 1; }
		syncs=$(grep fdatasync "$out/perf$q-$r.txt" | cut -d, -f1)
		rate=$(python3 -c "import json;print(json.load(open('$out/q$q-$r.json'))['publish_rate'])")
		block=$(python3 -c "print(max(4096, int($rate * $secs / max($syncs, 1)) * 1024))")
		raw=$("$BIN/warren-loadtest" rawsync --dir "$data" --block "$block" --duration "$RAWDUR")
		python3 - "$q" "$r" "$out/q$q-$r.json" "$syncs" "$secs" "$b0" "$b1" "$raw" "$load" "$CORES" "$out/summary" <<'PY'
import sys, re, json
q, r, js, syncs, secs, b0, b1, raw, load, cores, summary = sys.argv[1:]
j = json.load(open(js))
rate, bcpu, ccpu = j["publish_rate"], j.get("broker_cpu_us_per_msg", 0), j.get("client_cpu_us_per_msg", 0)
syncs, secs, b0, b1, cores = int(syncs), float(secs), int(b0), int(b1), int(cores)
m = re.search(r"([0-9]+)-byte blocks.* ([0-9.]+) MB/s", raw)
blk, rawmb = int(m.group(1)), float(m.group(2))
wmb = (b1 - b0) / secs / 1e6
mb = rate * 1024 / 1e6
need = cores * 1e6 / (0.8 * rawmb * 1e6 / 1024)  # µs of CPU per message at 80 % of raw, on whole cores
print(f"| {q} | {r} | {rate:,.0f} | {mb:.1f} | {rate*secs/max(syncs,1):,.0f} | {blk/1024:,.0f} KiB: {rawmb:.1f} MB/s | **{100*mb/rawmb:.0f} %** | {wmb:.1f} MB/s ({wmb/mb:.2f}×) | {bcpu:.2f} + {ccpu:.2f} | {rate*(bcpu+ccpu)/1e6:.2f} | {need:.2f} | {load} |")
with open(summary, "a") as f:
    f.write(f"{q} {mb} {rawmb} {bcpu} {ccpu} {need}\n")
PY
	done
done
echo
echo "Medians over the rounds (Warren / raw of the medians; the CPU needed for 80 % of the median raw rate):"
echo
python3 - "$out/summary" "$CORES" <<'PY'
import sys, statistics as st
cores = int(sys.argv[2])
rows = {}
for line in open(sys.argv[1]):
    q, *v = line.split()
    rows.setdefault(q, []).append([float(x) for x in v])
print("| queues | rounds | MB/s of bodies | raw MB/s | Warren / raw | each round's Warren / raw | CPU µs per message: warrend + load generator | needed for 80 % |")
print("|---|---|---|---|---|---|---|---|")
for q, rs in rows.items():
    med = [st.median(c) for c in zip(*rs)]
    mb, rawmb, bcpu, ccpu, _ = med
    need = cores * 1024 / (0.8 * rawmb)
    each = ", ".join(f"{100*x[0]/x[1]:.0f} %" for x in rs)
    print(f"| {q} | {len(rs)} | {mb:.1f} | {rawmb:.1f} | **{100*mb/rawmb:.0f} %** | {each} | {bcpu:.2f} + {ccpu:.2f} = {bcpu+ccpu:.2f} | {need:.2f} |")
PY
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
