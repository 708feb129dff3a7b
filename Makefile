# Warren — build, test and benchmark targets. `make test` is what CI runs.
SHELL    := bash
GO       ?= go
PKGS     := ./...
# Packages with goroutines or shared state run under the race detector.
RACE_PKGS := ./queue/... ./broker/... ./netio/... ./admin/... ./client/... ./cmd/... ./segment/... ./internal/... ./replication/...

.PHONY: soak ui all build run cluster cluster-stop test test-race vet fmt-check lint bench bench-segment bench-compare bench-million bench-topology fuzz vectors tools soak-segment soak-replication soak-sim soak-kill soak-crash abuse jepsen

all: build

# The three binaries the README uses: bin/warrend, bin/warrenctl, bin/warren-loadtest.
build:
	$(GO) build -o bin/warrend ./cmd/warrend
	$(GO) build -o bin/warrenctl ./cmd/warrenctl
	$(GO) build -o bin/warren-loadtest ./cmd/warren-loadtest

# Start a broker with the defaults: native protocol on 127.0.0.1:5680,
# HTTP (the web console at /, /api/, /metrics, /healthz, /readyz) on
# 127.0.0.1:15680, data in ./warren-data.
# Builds bin/warrend and runs it in the foreground (not go run: the
# process is warrend, so signals and pgrep find it, and bin/ is reused).
run:
	$(GO) build -o bin/warrend ./cmd/warrend
	exec bin/warrend $(ARGS)

# Three nodes on loopback (README: Cluster quick start): node N serves
# the native protocol on 127.0.0.1:5680+10(N-1), HTTP on 15680+10(N-1),
# the cluster port on 5682+10(N-1), data in ./warren-data/nodeN; prints
# the ports once every node is ready. cluster-stop stops them (SIGTERM).
cluster: build
	ops/cluster/cluster.sh start

cluster-stop:
	ops/cluster/cluster.sh stop

# Rebuild the web console's vendored assets from npm (uPlot and its
# license into admin/console/assets/vendor); they are committed, so
# building and running need no npm.
ui:
	cd admin/console/ui && npm ci --no-audit --no-fund
	cp admin/console/ui/node_modules/uplot/dist/uPlot.iife.min.js admin/console/ui/node_modules/uplot/dist/uPlot.min.css admin/console/assets/vendor/
	cp admin/console/ui/node_modules/uplot/LICENSE admin/console/assets/vendor/uPlot.LICENSE

# The hostile-client suite judges a well-behaved pair's latency beside
# each probe: it runs alone, after the rest, not beside another package's
# tests on the same two cores.
ALONE_PKGS := ./loadtest/abuse
test: fmt-check vet
	$(GO) test -count=1 -timeout 5m $$($(GO) list $(PKGS) | grep -v -x -e github.com/warren-mq/warren/loadtest/abuse)
	$(GO) test -count=1 -timeout 5m $(ALONE_PKGS)
	$(GO) test -count=1 -timeout 5m -race $(RACE_PKGS)

vet:
	$(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

lint: vet
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.7.0 $(PKGS)

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

# Topology at scale (BENCHMARKS.md, Topology): TOPOLOGY_QUEUES queues
# declared and bound by one pipelining client over loopback (wall time,
# heap and RSS per queue), then routing through 100,000 topic bindings.
TOPOLOGY_QUEUES ?= 100000
bench-topology:
	WARREN_TOPOLOGY_QUEUES=$(TOPOLOGY_QUEUES) $(GO) test -count=1 -timeout 30m -run TestTopologyScale -v ./netio
	$(GO) test -run '^$$' -bench BenchmarkRouteTopic100k -benchtime 2000000x -benchmem ./broker

# Storage engine soak: 10,000,000 × 1 KiB entries written (about 20 GiB of
# disk writes), moved into segment files and read back; reports heap and
# RSS. CRASH_SEEDS runs the crash property test with more seeds.
SEGMENT_SOAK_DIR ?=
CRASH_SEEDS ?= 20000
soak-segment:
	SEGMENT_SOAK=1 SEGMENT_SOAK_DIR=$(SEGMENT_SOAK_DIR) $(GO) test -count=1 -run TestSoakTenMillion -v -timeout 60m ./segment
	$(GO) test -count=1 -run TestCrashProperty ./segment -crash.seeds=$(CRASH_SEEDS)

# Replication crash simulations (worker rounds, snapshots and recovery,
# a single voter), each over REPL_SEEDS seeds; make test runs a few dozen.
REPL_SEEDS ?= 10000
soak-replication:
	$(GO) test -count=1 -timeout 60m -run 'TestSnapshotsCompactAndRecover|TestWorkerRounds|TestSingleVoterRecovers' ./replication -worker.seeds=$(REPL_SEEDS) -voter.seeds=$(REPL_SEEDS)

# Three voters in one process (replication/sim: fake network with delay,
# drop, duplicate, reorder and partitions; crashes at failed fsyncs with
# torn writes; restarts) over SIM_SEEDS seeds; make test runs 60 (10 under
# -race). One seed: go test ./replication/sim -run TestSim -sim.seed=N -v
SIM_SEEDS ?= 20000
soak-sim:
	$(GO) test -count=1 -timeout 120m -run 'TestSim$$' -v ./replication/sim -sim.seeds=$(SIM_SEEDS)

# The broker's node-wide crash simulation (durable queues and topology on an
# in-memory filesystem, crashed at random fsyncs, torn writes included) over
# CRASHSIM_SEEDS seeds; make test runs 1,000 (50 under -race).
CRASHSIM_SEEDS ?= 100000
soak-crash:
	$(GO) test -count=1 -timeout 120m -run TestCrashSim -v ./broker -crashsim.seeds=$(CRASHSIM_SEEDS)

# kill -9 over the wire: persistent load from warren-loadtest with --ledger,
# the broker killed with SIGKILL KILLS times (restarted on the same data each
# time), then --verify: no confirmed message lost; make test runs 5 kills.
KILLS ?= 10
soak-kill:
	LOADTEST_KILLS=$(KILLS) $(GO) test -count=1 -timeout 30m -run TestKill9Ledger -v ./cmd/warren-loadtest

# Every durability soak in one go (hours on 2 cores): the segment engine,
# the replication crash simulations, the three-voter simulation, the
# node-wide crash simulation and kill -9 over the wire.
soak: soak-segment soak-replication soak-sim soak-crash soak-kill

bench-segment:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s ./segment

# Fuzz the frame decoder, the queue command decoder, the AMQP front (its
# field tables, content headers and queue arguments, and a broker fed a
# client's bytes after the handshake, raw and as well-framed frames) and the
# metadata log (topology, users and vhosts requested as the fronts make them:
# every command must decode as encoded, and a restart recover the state);
# FUZZTIME=10m make fuzz for a longer run.
FUZZTIME ?= 60s
fuzz:
	$(GO) test -run '^$$' -fuzz=FuzzDecode -fuzztime=$(FUZZTIME) ./wire
	$(GO) test -run '^$$' -fuzz=FuzzDecodeCommand -fuzztime=$(FUZZTIME) ./queue
	$(GO) test -run '^$$' -fuzz='^FuzzMetaLog$$' -fuzztime=$(FUZZTIME) -parallel 1 ./broker
	$(GO) test -run '^$$' -fuzz='^FuzzParseTable$$' -fuzztime=$(FUZZTIME) -parallel 1 ./netio/amqp
	$(GO) test -run '^$$' -fuzz='^FuzzParseHeader$$' -fuzztime=$(FUZZTIME) -parallel 1 ./netio/amqp
	$(GO) test -run '^$$' -fuzz='^FuzzQueueArgs$$' -fuzztime=$(FUZZTIME) -parallel 1 ./netio/amqp
	$(GO) test -run '^$$' -fuzz='^FuzzMethods$$' -fuzztime=$(FUZZTIME) -parallel 1 ./netio/amqp
	$(GO) test -run '^$$' -fuzz='^FuzzConn$$' -fuzztime=$(FUZZTIME) -parallel 1 ./netio/amqp
	$(GO) test -run '^$$' -fuzz='^FuzzConnFrames$$' -fuzztime=$(FUZZTIME) -parallel 1 ./netio/amqp

# The example client spec/examples/minimal_client.py (Python 3, standard
# library only, written from spec/PROTOCOL.md alone) against a warrend of its
# own on free loopback ports (outside the ephemeral range: internal/freeport)
# with a temporary data directory (disk alarm off:
# the check must not depend on the machine's free space); exits non-zero when
# any of its checks fails, with the broker's log. Not part of make test: CI
# may have no python3.
.PHONY: spec-client-check
spec-client-check:
	$(GO) build -o bin/warrend ./cmd/warrend
	@command -v python3 >/dev/null || { echo "spec-client-check needs python3"; exit 1; }
	@data=$$(mktemp -d); log=$$data.log; \
	read -r port http < <($(GO) run ./internal/freeport/freeports 2); \
	bin/warrend --listen 127.0.0.1:$$port --http 127.0.0.1:$$http --data $$data --disk-free-limit -1 >$$log 2>&1 & pid=$$!; \
	trap 'kill $$pid 2>/dev/null; wait $$pid 2>/dev/null; rm -rf $$data $$log' EXIT; \
	for i in $$(seq 300); do \
		(exec 3<>/dev/tcp/127.0.0.1/$$port) 2>/dev/null && break; \
		kill -0 $$pid 2>/dev/null || { echo "warrend exited:"; cat $$log; exit 1; }; \
		sleep 0.1; \
	done; \
	python3 spec/examples/minimal_client.py --addr 127.0.0.1:$$port || { echo "--- warrend log"; tail -50 $$log; exit 1; }

# Regenerate spec/vectors from the Go cases (review the diff!).
vectors:
	$(GO) test ./wire -run TestVectors -update

# Standard scenarios against Warren (its native protocol, and its AMQP
# 0-9-1 listener driven by the same AMQP client as RabbitMQ) and, when it
# answers on 127.0.0.1:5672, RabbitMQ (classic and quorum queues), side by
# side, with the ratios of the same run and the load average. Starts its
# own warrend on 127.0.0.1:5690 (AMQP on 5691). Writes bench-compare.md and
# bench-compare.html.
COMPARE_DURATION ?= 10s
COMPARE_SCENARIOS ?= throughput,persistent-1k,priority-mix,queues-1000,latency
bench-compare:
	$(GO) build -o bin/warrend ./cmd/warrend
	$(GO) build -o bin/warren-loadtest ./cmd/warren-loadtest
	@bin/warrend --listen 127.0.0.1:5690 --amqp-listen 127.0.0.1:5691 --http 127.0.0.1:15690 --data $$(mktemp -d) --log-level warn & \
	pid=$$!; trap "kill $$pid" EXIT; \
	until (exec 3<>/dev/tcp/127.0.0.1/5691) 2>/dev/null; do sleep 0.1; done; \
	bin/warren-loadtest compare --warren-url warren://guest:guest@127.0.0.1:5690 --warren-pid $$pid \
		--warren-amqp-url amqp://guest:guest@127.0.0.1:5691/ \
		--amqp-pid $$(pgrep -o beam.smp || echo 0) --duration $(COMPARE_DURATION) --scenarios $(COMPARE_SCENARIOS) \
		--out bench-compare.md --html bench-compare.html
	@cat bench-compare.md

# Durable queues (BENCHMARKS.md): persistent 1 KiB with 1 and 100 queues
# against the raw pwrite+fdatasync rate at the same bytes per sync, measured
# interleaved (ROUNDS pairs: warren, raw, warren, raw; medians compared), and
# latency at 10,000 msg/s (DUR per run; needs perf); then the 10 M-message
# backlog: RssAnon and restart time, warm and cold (needs root to drop the
# page cache; writes about 11 GB under DATA_PARENT, removed after).
.PHONY: bench-durable bench-durable-rss
bench-durable:
	$(GO) build -o bin/warrend ./cmd/warrend
	$(GO) build -o bin/warren-loadtest ./cmd/warren-loadtest
	loadtest/bench/durable.sh
bench-durable-rss:
	$(GO) build -o bin/warrend ./cmd/warrend
	$(GO) build -o bin/warren-loadtest ./cmd/warren-loadtest
	loadtest/bench/durable-rss.sh

# Real third-party AMQP 0-9-1 clients against a warrend of its own on
# 127.0.0.1:$(AMQP_COMPAT_PORT) (and the next two ports): pika's checks
# (/usr/bin/python3 with python3-pika), then amqp091-go's own integration
# tests, unmodified, from the version in go.mod; a failure not listed with
# its reason in netio/amqp/compat/amqp091-known-failures.txt fails it.
# make test runs both, against its own listener (TestPikaCompat, TestAMQP091Suite).
AMQP_COMPAT_PORT ?= 5697
amqp-compat:
	$(GO) build -o bin/warrend ./cmd/warrend
	GO=$(GO) AMQP_COMPAT_PORT=$(AMQP_COMPAT_PORT) netio/amqp/compat/run.sh bin/warrend

# The AMQP differential test (netio/amqp/compat/diff_test.go): seeded short
# scenarios (routing over the four exchange kinds with alternate exchanges
# and mandatory returns; one queue's publishes, gets, consumes with
# prefetch, acks, nacks, rejects, recovers, cancels, purges and channel
# closes under max-length, priorities and dead-lettering; TTL; refusals;
# quorum delivery limits) driven by amqp091-go against the RabbitMQ at
# AMQP_DIFF_RABBIT and against an in-process Warren, failing on the first
# line where what the client saw differs, per seed. Needs a RabbitMQ
# (apt-get install rabbitmq-server; rabbitmq-server -detached). A failing
# seed reruns alone: AMQP_DIFF_SEEDS=1 AMQP_DIFF_SEED=N AMQP_DIFF_ONLY=name.
AMQP_DIFF_RABBIT ?= amqp://guest:guest@127.0.0.1:5672/
AMQP_DIFF_SEEDS ?= 40
AMQP_DIFF_SEED ?= 1
AMQP_DIFF_ONLY ?=
.PHONY: amqp-diff
amqp-diff:
	WARREN_AMQP_DIFF_RABBIT=$(AMQP_DIFF_RABBIT) WARREN_AMQP_DIFF_SEEDS=$(AMQP_DIFF_SEEDS) WARREN_AMQP_DIFF_SEED=$(AMQP_DIFF_SEED) \
		WARREN_AMQP_DIFF_ONLY=$(AMQP_DIFF_ONLY) $(GO) test -count=1 -timeout 30m -run '^TestAMQPDiff$$' ./netio/amqp/compat

# The fault harness (loadtest/jepsen, RELIABILITY.md): warrend processes
# under confirmed persistent load and acking consumers (random requeue,
# cancel, reconnect) while each fault class runs for JEPSEN_TIME (kill -9,
# SIGSTOP/SIGCONT, power loss, a flipped bit, a truncated segment file;
# partitions with --nodes 3), then healed, drained and checked; ends with
# lost=N duplicated=N invented=N and fails when lost or invented is not 0.
# JEPSEN_FLAGS="--classes kill,pause --rate 2000" narrows or loads it;
# make test runs a short version (TestShortRun).
JEPSEN_TIME ?= 60s
JEPSEN_FLAGS ?=
jepsen:
	$(GO) build -o bin/warrend ./cmd/warrend
	$(GO) build -o bin/warren-jepsen ./cmd/warren-jepsen
	bin/warren-jepsen --warrend bin/warrend --time $(JEPSEN_TIME) $(JEPSEN_FLAGS)

# Issue 14's failover measurement: three warrend processes, kill -9 the
# leader of a replicated queue FAILOVER_KILLS times under persistent
# publishing at FAILOVER_RATE msg/s; time to the next confirm and delivery.
FAILOVER_KILLS ?= 10
FAILOVER_RATE ?= 5000
.PHONY: failover bench-cluster-compare
# Three Warren nodes, then a three-node RabbitMQ cluster with quorum queues,
# the same persistent 1 KiB loads (loadtest/bench/cluster-compare.sh).
bench-cluster-compare:
	DUR=$(or $(COMPARE_DURATION),20s) loadtest/bench/cluster-compare.sh

failover:
	WARREN_FAILOVER_KILLS=$(FAILOVER_KILLS) WARREN_FAILOVER_RATE=$(FAILOVER_RATE) $(GO) test -count=1 -timeout 20m -run '^TestFailoverMeasure$$' -v ./cmd/warrend/ | grep -E '^failover:|kill [0-9]|^(ok|FAIL|---)'

# The hostile clients of issue 11 at full size, each beside a 2,000 msg/s
# pair against its own warrend child (RELIABILITY.md has the results).
# ABUSE_FLAGS="--probe slowloris,auth-storm" runs some of them. Loads the
# machine for about five minutes.
ABUSE_FLAGS ?=
abuse:
	$(GO) build -o bin/warrend ./cmd/warrend
	$(GO) build -o bin/warren-abuse ./cmd/warren-abuse
	ulimit -n $$(ulimit -Hn) && bin/warren-abuse --bin bin/warrend --json abuse.json --md abuse.md $(ABUSE_FLAGS)

# Scale (issue 17 item 5; BENCHMARKS.md, Scale): IDLE idle connections with
# heartbeats, held by child processes: the broker's RSS per idle connection,
# and an active publisher/consumer pair's msg/s beside them and without them
# (its max_connections is raised to IDLE + 200 for the run); then
# 10,000 queues with a consumer each under load. Starts its own warrend on
# 127.0.0.1:5694; writes scale-idle.json and queues-10000.json. make test
# runs a scaled-down scale-idle (TestScaleIdleSmall).
IDLE ?= 10000
.PHONY: bench-scale
bench-scale:
	$(GO) build -o bin/warrend ./cmd/warrend
	$(GO) build -o bin/warren-loadtest ./cmd/warren-loadtest
	IDLE=$(IDLE) loadtest/bench/scale.sh

# The 1,000,000 msg/s validation against a running broker (WARREN_URL).
WARREN_URL ?= warren://guest:guest@127.0.0.1:5680
bench-million:
	$(GO) run ./cmd/warren-loadtest --scenario million --url $(WARREN_URL) --json million.json

# The Grafana dashboard and Prometheus alert rules in ops/: promtool checks the
# rules (Debian: apt-get install prometheus), and Go tests (also in make test)
# check that every metric they name is in a live warrend's /metrics and, with
# promtool, that each alert fires on the trouble it is for and not otherwise.
.PHONY: dashboards
dashboards:
	@command -v promtool >/dev/null || { echo "promtool not found: apt-get install prometheus (Debian), or get it from prometheus.io"; exit 1; }
	promtool check rules ops/prometheus/alerts.yml
	WARREN_REQUIRE_PROMTOOL=1 $(GO) test -count=1 -run 'Dashboard|AlertRules|PromQL' ./cmd/warrend
