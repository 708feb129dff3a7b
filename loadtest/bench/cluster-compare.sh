#!/usr/bin/env bash
# Issue 14: three Warren nodes beside a three-node RabbitMQ cluster with
# quorum queues, on this machine, one after the other in one run (make
# bench-cluster-compare). Each broker gets the same two loads from the same
# load generator: persistent 1 KiB as fast as it goes (msg/s, confirm p99)
# and persistent 1 KiB at a fixed CLUSTER_RATE msg/s (confirm p50/p99). Each
# replicated queue has three replicas on three nodes; clients connect to node
# 1, whichever node leads a queue (Warren forwards to the leader; RabbitMQ's
# channel talks to the quorum leader). Broker CPU per message sums the three
# nodes' utime+stime over the measured run.
#
#   DUR=20s RATE=5000 loadtest/bench/cluster-compare.sh
#
# RabbitMQ: Debian's 3.10, three nodes r1..r3@HOST on AMQP 5672..5674 and
# distribution ports 25672..25674, memory watermark 0.1 of RAM each, data and
# logs under a temporary directory; nothing may run on 5672 already.
set -euo pipefail
cd "$(dirname "$0")/../.."
DUR=${DUR:-20s}
RATE=${RATE:-5000}
OUT=${OUT:-$(mktemp -d)}
GO=${GO:-go}
$GO build -o bin/warrend ./cmd/warrend
$GO build -o bin/warren-loadtest ./cmd/warren-loadtest
echo "results under $OUT"

cpu_of() { # total utime+stime in clock ticks of the given pids
	local t=0
	for p in "$@"; do
		t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
	done
	echo "$t"
}

# run LABEL PIDS -- loadtest flags: one measured run, CPU of PIDS around it.
run() {
	local label=$1 pids=$2
	shift 3
	local c0 c1
	c0=$(cpu_of $pids)
	bin/warren-loadtest "$@" --warmup 0s --duration "$DUR" --json "$OUT/$label.json" >"$OUT/$label.txt" 2>&1 || {
		echo "$label failed:"
		tail -20 "$OUT/$label.txt"
		return 0
	}
	c1=$(cpu_of $pids)
	python3 - "$OUT/$label.json" "$label" "$((c1 - c0))" "$(getconf CLK_TCK)" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
ticks, hz = int(sys.argv[3]), int(sys.argv[4])
consumed = r["consumed"]
lat = r["confirm_latency_ms"]
cpu = ticks / hz * 1e6 / consumed if consumed else float("nan")
print(f"{sys.argv[2]:<20} consumed/s {r['consume_rate']:>9,.0f}  confirm p50 {lat['p50']:>8.2f} ms"
      f"  p99 {lat['p99']:>8.2f} ms  lost {r['lost']}  broker CPU {cpu:,.1f} µs/msg (3 nodes)")
EOF
}

SIDES=${SIDES:-warren rabbit}

# --- Warren, three nodes (ops/cluster/cluster.sh, ports from PORT_BASE).
if [[ " $SIDES " == *" warren "* ]]; then
WDATA=$OUT/warren
export PORT_BASE=${PORT_BASE:-6680} # not make cluster's 5680: a cluster of one's own may run there
DATA=$WDATA ops/cluster/cluster.sh start >/dev/null
trap 'DATA=$WDATA ops/cluster/cluster.sh stop >/dev/null 2>&1 || true' EXIT
wpids="$(for n in 1 2 3; do echo -n "$(cat "$WDATA/node$n/warrend.pid") "; done)"
W=warren://guest:guest@127.0.0.1:$PORT_BASE
run warren-max "$wpids" -- --scenario persistent-1k --url "$W"
run warren-rate "$wpids" -- --scenario latency-persistent-1k --rate "$RATE" --url "$W"
DATA=$WDATA ops/cluster/cluster.sh stop >/dev/null
trap - EXIT
fi
[[ " $SIDES " == *" rabbit "* ]] || exit 0

# --- RabbitMQ, three nodes with quorum queues.
R=$OUT/rabbit
mkdir -p "$R/home"
head -c 20 /dev/urandom | base64 | tr -dc A-Za-z0-9 >"$R/home/.erlang.cookie"
chmod 400 "$R/home/.erlang.cookie"
host=$(hostname -s)
renv() { # renv N cmd...: run cmd with node N's environment
	local n=$1
	shift
	HOME=$R/home RABBITMQ_NODENAME=r$n@$host RABBITMQ_NODE_PORT=$((5671 + n)) \
		RABBITMQ_DIST_PORT=$((25671 + n)) RABBITMQ_MNESIA_BASE=$R/r$n/mnesia \
		RABBITMQ_LOG_BASE=$R/r$n/log RABBITMQ_CONFIG_FILE=$R/r$n/rabbitmq.conf \
		RABBITMQ_ENABLED_PLUGINS_FILE=$R/r$n/enabled_plugins RABBITMQ_PID_FILE=$R/r$n/pid "$@"
}
rstop() { for n in 1 2 3; do renv $n /usr/lib/rabbitmq/bin/rabbitmqctl -n "r$n@$host" stop >/dev/null 2>&1 || true; done; }
trap rstop EXIT
for n in 1 2 3; do
	mkdir -p "$R/r$n"
	echo "[]." >"$R/r$n/enabled_plugins"
	echo "vm_memory_high_watermark.relative = 0.1" >"$R/r$n/rabbitmq.conf"
	renv $n /usr/lib/rabbitmq/bin/rabbitmq-server -detached
done
for n in 1 2 3; do # -detached returns before the node is up
	for _ in $(seq 120); do
		renv $n /usr/lib/rabbitmq/bin/rabbitmqctl -n "r$n@$host" ping >/dev/null 2>&1 && break
		sleep 0.5
	done
	renv $n /usr/lib/rabbitmq/bin/rabbitmqctl -n "r$n@$host" await_startup >/dev/null
done
for n in 2 3; do
	renv $n /usr/lib/rabbitmq/bin/rabbitmqctl -n "r$n@$host" stop_app >/dev/null
	renv $n /usr/lib/rabbitmq/bin/rabbitmqctl -n "r$n@$host" join_cluster "r1@$host" >/dev/null
	renv $n /usr/lib/rabbitmq/bin/rabbitmqctl -n "r$n@$host" start_app >/dev/null
done
renv 1 /usr/lib/rabbitmq/bin/rabbitmqctl -n "r1@$host" cluster_status | grep -A4 -i "running nodes" || true
rpids="$(for n in 1 2 3; do echo -n "$(cat "$R/r$n/pid") "; done)"
A=amqp://guest:guest@127.0.0.1:5672/
run rabbit-quorum-max "$rpids" -- --scenario persistent-1k --driver amqp --queue-type quorum --url "$A"
run rabbit-quorum-rate "$rpids" -- --scenario latency-persistent-1k --rate "$RATE" --driver amqp --queue-type quorum --url "$A"
