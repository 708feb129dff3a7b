#!/usr/bin/env bash
# make bench-durable-rss: fill a warrend (--data on this machine's disk) with
# N ready persistent messages of 1 KiB in Q durable queues (no consumers), then
# restart it twice (page cache warm, then cold: sync; echo 3 >
# /proc/sys/vm/drop_caches, which needs root) and time each start until
# /readyz answers, then drain every queue with warren-loadtest --verify (which
# also checks that every confirmed message came back). RssAnon (anonymous
# memory: mapped log files excluded) is sampled from /proc/PID/status every
# second throughout; the report gives it after the fill, after each restart,
# and the peak of each phase (snapshots of the queues are taken during the
# fill and the drain, so the peaks include them). The data directory is
# removed at the end. The report also gives warrend's CPU time (user +
# system) from its start to /readyz, which a loaded machine changes less
# than the wall time.
#
#   N=10000000 Q=100 DATA_PARENT=/var/tmp loadtest/bench/durable-rss.sh
#
# REUSE=DIR LEDGER=FILE skips the fill and restarts a data directory an
# earlier run kept (KEEP=1 keeps it: no drain, nothing removed).
set -euo pipefail
BIN=${BIN:-bin}
N=${N:-10000000}
Q=${Q:-100}
P=${P:-4}
DATA_PARENT=${DATA_PARENT:-/var/tmp}
PORT=${PORT:-5695}
HTTP=127.0.0.1:$((PORT + 10000))
out=$(mktemp -d /tmp/warren-bench-rss-out.XXXXXX)
if [ -n "${REUSE:-}" ]; then
	data=$REUSE
	cp "$LEDGER" "$out/ledger"
else
	data=$(mktemp -d "$DATA_PARENT/warren-bench-rss.XXXXXX")
fi
# No per-queue soft limit: nobody consumes during the fill.
echo '{"queue_soft_limit": -1}' >"$out/warrend.json"
echo fill >"$out/phase"
start() {
	GODEBUG=gctrace=1 "$BIN/warrend" --config "$out/warrend.json" --listen 127.0.0.1:$PORT --http $HTTP --data "$data/d" --log-level warn 2>>"$out/warrend.log" &
	pid=$!
	echo $pid >"$out/pid"
}
ready() { until curl -sf http://$HTTP/readyz >/dev/null; do sleep 0.05; done; }
# The live heap at warrend's latest garbage collection, in MB (gctrace's
# "start->end->live MB"), from its log.
live() { grep -E '^gc [0-9]+ ' "$out/warrend.log" | tail -1 | sed -E 's/.*->([0-9]+) MB,.*/\1/'; }
rss() { awk '/^RssAnon/ {print $2}' /proc/$(cat "$out/pid")/status; }
stopit() { kill -TERM $pid; wait $pid || true; }
cpu() { awk '{printf "%.1f", ($14 + $15) / 100}' /proc/$pid/stat; }
if [ -n "${REUSE:-}" ]; then
	find "$data/d" -type f -exec cat {} + >/dev/null # the page cache warm for the first start
	echo restart-warm >"$out/phase"
fi
(while :; do
	p=$(cat "$out/pid" 2>/dev/null || echo self)
	a=$(awk '/^RssAnon/ {print $2}' /proc/$p/status 2>/dev/null || echo 0)
	f=$(awk '/^RssFile/ {print $2}' /proc/$p/status 2>/dev/null || echo 0)
	echo "$(date +%s.%N) $(cat "$out/phase") ${a:-0} ${f:-0} $(cut -d' ' -f1 /proc/loadavg)" >>"$out/rss.log"
	sleep 1
done) &
sampler=$!
t2=$(date +%s.%N)
start
trap 'kill $pid 2>/dev/null || true; kill $sampler 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$data"' EXIT
ready
t_ready=$(date +%s.%N)
cpu_first=$(cpu)
url=warren://guest:guest@127.0.0.1:$PORT
t0=$(date +%s.%N)
if [ -z "${REUSE:-}" ]; then
	"$BIN/warren-loadtest" --url "$url" --persistent --publish-only --ledger "$out/ledger" --count "$N" --size 1024 \
		--queues "$Q" --producers "$P" --warmup 0s >"$out/fill.txt" 2>&1 || { tail -5 "$out/fill.txt"; exit 1; }
fi
t1=$(date +%s.%N)
echo settle >"$out/phase"
sleep 10
after_fill=$(rss)
live_fill=$(live)
du_data=$(du -sh "$data/d" | cut -f1)
if [ -n "${REUSE:-}" ]; then
	# The first start was the warm restart.
	t3=$t_ready; after_warm=$after_fill; cpu_warm=$cpu_first
else
	echo stop >"$out/phase"
	stopit
	echo restart-warm >"$out/phase"
	t2=$(date +%s.%N); start; ready; t3=$(date +%s.%N); cpu_warm=$(cpu)
	sleep 2
	after_warm=$(rss)
fi
echo stop >"$out/phase"
stopit
sync; echo 3 >/proc/sys/vm/drop_caches
echo restart-cold >"$out/phase"
t4=$(date +%s.%N); start; ready; t5=$(date +%s.%N); cpu_cold=$(cpu)
sleep 2
after_cold=$(rss)
if [ -n "${KEEP:-}" ]; then
	echo "kept $data (ledger $out/ledger)"
	N=0
fi
echo drain >"$out/phase"
t6=$(date +%s.%N)
if [ -z "${KEEP:-}" ]; then
	"$BIN/warren-loadtest" --url "$url" --verify "$out/ledger" --quiet 15s >"$out/drain.txt" 2>&1 || { tail -5 "$out/drain.txt"; exit 1; }
fi
t7=$(date +%s.%N)
echo done >"$out/phase"
kill $sampler || true
python3 - "$out" "$(( N > 0 ? N : 1 ))" "$Q" "$t0" "$t1" "$t2" "$t3" "$t4" "$t5" "$t6" "$t7" "$after_fill" "$after_warm" "$after_cold" "$du_data" "$cpu_warm" "$cpu_cold" "${live_fill:-0}" <<'PY'
import sys, collections
out, n, q = sys.argv[1], int(sys.argv[2]), sys.argv[3]
t0, t1, t2, t3, t4, t5, t6, t7 = map(float, sys.argv[4:12])
af, aw, ac = map(int, sys.argv[12:15])
du, cw, cc, lf = sys.argv[15], sys.argv[16], sys.argv[17], sys.argv[18]
peak, load = collections.defaultdict(int), collections.defaultdict(list)
for line in open(out + "/rss.log"):
    f = line.split()
    if len(f) < 5: continue
    peak[f[1]] = max(peak[f[1]], int(f[2])); load[f[1]].append(float(f[4]))
mib = lambda kb: f"{kb/1024:,.0f} MiB ({kb*1024/n:.1f} B/msg)"
la = lambda ph: f"{min(load[ph]):.1f}–{max(load[ph]):.1f}" if load[ph] else "-"
print(f"{n:,} persistent 1 KiB messages in {q} durable queues; data directory {du}")
print(f"| phase | time | RssAnon | peak RssAnon in the phase | load avg |")
print(f"|---|---|---|---|---|")
print(f"| fill (publish-only, confirmed) | {t1-t0:.1f} s ({n/(t1-t0):,.0f} msg/s) | {mib(af)} 10 s after | {mib(peak['fill'])} | {la('fill')} |")
print(f"| restart, page cache warm: start → /readyz | **{t3-t2:.1f} s** (CPU {cw} s) | {mib(aw)} | {mib(peak['restart-warm'])} | {la('restart-warm')} |")
print(f"| restart, page cache dropped | **{t5-t4:.1f} s** (CPU {cc} s) | {mib(ac)} | {mib(peak['restart-cold'])} | {la('restart-cold')} |")
print(f"| live heap at the last GC of the fill (gctrace) | | {lf} MB ({int(lf)*1e6/n:.1f} B/msg) | | |")
print(f"| drain (--verify: consume all, check the ledger) | {t7-t6:.1f} s | | {mib(peak['drain'])} | {la('drain')} |")
PY
[ -f "$out/drain.txt" ] && tail -3 "$out/drain.txt"
echo "(samples and logs: $out)"
