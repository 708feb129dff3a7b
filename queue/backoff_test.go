package queue

import (
	"math"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/wire"
)

// specMaxWaitMs is the longest wait (spec §7.2): the largest
// retry-max-ms a declare accepts, which is also the cap when none is set.
const specMaxWaitMs = math.MaxInt64 / int64(time.Millisecond)

// backoffMachine declares a queue the way the broker does: from the
// arguments as a client sends them.
func backoffMachine(initialMs int64, multiplier float64, maxMs int64) *Machine {
	a := wire.QueueArgs{RetryMultiplier: multiplier}
	a.RetryInitial = time.Duration(initialMs) * time.Millisecond
	a.RetryMax = time.Duration(maxMs) * time.Millisecond
	return New(ConfigFromArgs(a, false), 0)
}

// TestBackoffIntegerRule: the retry wait follows the integer rule of spec
// §7.2 (multiplier in thousandths, wait in integer nanoseconds, rounded
// down at each step), so every replica computes the same wait on any
// CPU. Floating point gets some of these wrong by a millisecond
// (100 × 2.3 is 229.99999999999997 in binary64).
func TestBackoffIntegerRule(t *testing.T) {
	for _, c := range []struct {
		initialMs  int64
		multiplier float64
		maxMs      int64
		n          uint32
		want       int64
	}{
		{100, 2.3, 0, 1, 100},
		{100, 2.3, 0, 2, 230}, // float: 229
		{100, 2.3, 0, 3, 529}, // float: 528
		{1, 1.5, 0, 2, 1},
		{1, 1.5, 0, 3, 2},
		{1, 1.5, 0, 8, 17},
		{7, 1.5, 0, 30, 894838},
		{10, 1.001, 0, 1000, 27},
		{3, 1.001, 0, 20000, 1439343557},
		{250, 1.25, 60000, 12, 2910},
		{250, 1.25, 60000, 30, 60000},
		{100, 2, 300, 1, 100},
		{100, 2, 300, 2, 200},
		{100, 2, 300, 3, 300},
		{100, 2, 300, 4, 300},
		{100, 1, 0, 1000, 100},
		{5, 1.0004, 0, 50, 5},    // rounds to 1.000 at declare
		{5, 1.0006, 0, 1000, 13}, // rounds to 1.001
		{1000, 1000, 0, 10, specMaxWaitMs},
		{1000, 1000, 0, math.MaxUint32, specMaxWaitMs},
		{1, 2, 0, math.MaxUint32, specMaxWaitMs},
		{specMaxWaitMs, 2, 0, 2, specMaxWaitMs},
		{500, 2, 100, 1, 100}, // the cap applies to the first wait too
	} {
		m := backoffMachine(c.initialMs, c.multiplier, c.maxMs)
		if got := m.backoff(c.n); got != c.want {
			t.Errorf("initial %d ms, multiplier %v, max %d ms, failure %d: wait %d ms, want %d", c.initialMs, c.multiplier, c.maxMs, c.n, got, c.want)
		}
	}
}

// specBackoff is spec §7.2's rule in unbounded integers.
func specBackoff(initialMs, multMilli, maxMs int64, n uint32) int64 {
	if initialMs <= 0 {
		return 0
	}
	if maxMs <= 0 {
		maxMs = specMaxWaitMs
	}
	w := new(big.Int).Mul(big.NewInt(initialMs), big.NewInt(1_000_000))
	bm, thousand := big.NewInt(multMilli), big.NewInt(1000)
	for k := uint32(1); k < n; k++ {
		w.Quo(w.Mul(w, bm), thousand)
	}
	w.Quo(w, big.NewInt(1_000_000))
	if !w.IsInt64() || w.Int64() > maxMs {
		return maxMs
	}
	return w.Int64()
}

// TestBackoffAgainstSpec compares the machine's bounded arithmetic (which
// stops once the wait reaches the cap) with the rule computed exactly.
func TestBackoffAgainstSpec(t *testing.T) {
	r := rand.New(rand.NewPCG(12, 6))
	for range 2000 {
		initialMs := r.Int64N(100_000) + 1
		multMilli := int64(1000 + r.IntN(4000))
		if r.IntN(4) == 0 {
			multMilli = int64(1000 + r.IntN(999_001))
		}
		var maxMs int64
		if r.IntN(2) == 0 {
			maxMs = initialMs + r.Int64N(10_000_000)
		}
		n := uint32(1 + r.IntN(300))
		m := backoffMachine(initialMs, float64(multMilli)/1000, maxMs)
		if got, want := m.backoff(n), specBackoff(initialMs, multMilli, maxMs, n); got != want {
			t.Fatalf("initial %d ms, multiplier %d‰, max %d ms, failure %d: wait %d ms, the rule gives %d", initialMs, multMilli, maxMs, n, got, want)
		}
	}
}

// TestSnapshotOldVersionRefused: a snapshot of version 4 (its retry
// multiplier a float) is refused with an error that names the versions;
// none was ever written to disk.
func TestSnapshotOldVersionRefused(t *testing.T) {
	m := backoffMachine(100, 2.3, 0)
	snap := m.Snapshot()
	if snap[0] == 4 {
		t.Fatal("snapshots are still version 4 (a float multiplier)")
	}
	old := append([]byte{4}, snap[1:]...)
	_, err := Restore(old)
	if err == nil || !strings.Contains(err.Error(), "version 4") {
		t.Fatalf("restoring a version-4 snapshot: %v, want an error naming version 4", err)
	}
	m2, err := Restore(snap)
	if err != nil {
		t.Fatal(err)
	}
	if got := m2.backoff(2); got != 230 {
		t.Fatalf("restored machine waits %d ms after the 2nd failure, want 230", got)
	}
}
