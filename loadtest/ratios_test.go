package loadtest

import (
	"strings"
	"testing"
)

// WriteRatios divides within one scenario only, and leaves out a pair with
// a side that was not run.
func TestWriteRatios(t *testing.T) {
	rep := func(rate, p99 float64) *Report {
		r := &Report{ConsumeRate: rate}
		r.E2ELat.P99 = p99
		return r
	}
	results := []CompareResult{
		{Scenario: "throughput", Label: "A", Report: rep(300, 2)},
		{Scenario: "throughput", Label: "B", Report: rep(100, 8)},
		{Scenario: "latency", Label: "A", Report: rep(50, 1)},
		{Scenario: "latency", Label: "B", Note: "not reachable; skipped"},
	}
	var b strings.Builder
	WriteRatios(&b, results, [][2]string{{"A", "B"}})
	out := b.String()
	if !strings.Contains(out, "| throughput | A ÷ B | 3.00× | 0.25× |") {
		t.Fatalf("no throughput ratio row in\n%s", out)
	}
	if strings.Contains(out, "| latency |") {
		t.Fatalf("a ratio for a pair with a side not run:\n%s", out)
	}
}
