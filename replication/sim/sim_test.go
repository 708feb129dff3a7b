package sim

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"
)

var (
	seeds = flag.Int("sim.seeds", 0, "seeds to run (0: 60, or 10 under -race)")
	first = flag.Uint64("sim.first", 0, "the first seed")
	one   = flag.Int64("sim.seed", -1, "run only this seed (with -v: its trace)")
	ops   = flag.Int("sim.ops", 0, "workload operations per seed (0: 300)")
)

// TestSim runs the three-voter simulation over many seeds (see the
// package doc for what it checks). A failing seed prints the command that
// reproduces it, trace included.
func TestSim(t *testing.T) {
	if *one >= 0 {
		cfg := Config{Ops: *ops}
		if testing.Verbose() {
			cfg.Trace = os.Stdout
		}
		res, err := Run(uint64(*one), cfg)
		t.Logf("seed %d: %+v", *one, res)
		if err != nil {
			t.Fatalf("seed %d: %v", *one, err)
		}
		return
	}
	n := *seeds
	if n == 0 {
		n = 60
		if raceEnabled {
			n = 10
		}
	}
	start := time.Now()
	var total Result
	for seed := *first; seed < *first+uint64(n); seed++ {
		res, err := Run(seed, Config{Ops: *ops})
		if err != nil {
			t.Fatalf("seed %d: %v\nreproduce: go test ./replication/sim -run TestSim -sim.seed=%d -v", seed, err, seed)
		}
		total.Events += res.Events
		total.Publishes += res.Publishes
		total.Crashes += res.Crashes
		total.SyncFails += res.SyncFails
		total.Restarts += res.Restarts
		total.Transfers += res.Transfers
		total.Partitions += res.Partitions
		total.Leaders += res.Leaders
		total.Checks += res.Checks
		total.Messages += res.Messages
		total.Dropped += res.Dropped
		total.Snapshots += res.Snapshots
		total.Installs += res.Installs
		total.SnapsSent += res.SnapsSent
	}
	el := time.Since(start)
	t.Logf("%d seeds in %v (%.1f seeds/s): %d events, %d publishes committed, %d leaders, %d crashes (%d at a failed fsync), %d clean restarts, %d leadership transfers, %d partitions, %d messages (%d dropped), %d snapshot comparisons, %d snapshots taken, %d sent, %d installed",
		n, el.Round(time.Millisecond), float64(n)/el.Seconds(), total.Events, total.Publishes, total.Leaders, total.Crashes, total.SyncFails, total.Restarts, total.Transfers, total.Partitions, total.Messages, total.Dropped, total.Checks, total.Snapshots, total.SnapsSent, total.Installs)
	if n >= 10 && (total.Snapshots == 0 || total.Installs == 0) {
		t.Fatalf("%d seeds took %d snapshots and installed %d: the run does not exercise snapshot install", n, total.Snapshots, total.Installs)
	}
}

// TestSimDeterministic: a seed run twice does the same thing, event for
// event (raft's election timeouts included).
func TestSimDeterministic(t *testing.T) {
	for seed := uint64(0); seed < 3; seed++ {
		var ta, tb bytes.Buffer
		a, errA := Run(seed, Config{Trace: &ta})
		b, errB := Run(seed, Config{Trace: &tb})
		if a != b || fmt.Sprint(errA) != fmt.Sprint(errB) || ta.String() != tb.String() {
			t.Fatalf("seed %d: two runs differ:\n%+v %v\n%+v %v", seed, a, errA, b, errB)
		}
		if a.Leaders == 0 || a.Publishes == 0 {
			t.Fatalf("seed %d did nothing: %+v", seed, a)
		}
	}
}
