package loadtest

import (
	"os"
	"testing"
	"time"
)

func TestParseProcStatCPU(t *testing.T) {
	// A command name with a space and a parenthesis, utime 250 and stime
	// 50 ticks: 3 s.
	line := []byte("4242 (warr) end d) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 123 456 789\n")
	got, ok := parseProcStatCPU(line)
	if !ok || got != 3*time.Second {
		t.Fatalf("parseProcStatCPU = %v, %v; want 3s, true", got, ok)
	}
	for _, bad := range []string{"", "4242 no parens", "1 (x) S 1 2", "1 (x) S 1 2 3 4 5 6 7 8 9 x 50"} {
		if _, ok := parseProcStatCPU([]byte(bad)); ok {
			t.Errorf("parseProcStatCPU(%q) succeeded; want a refusal", bad)
		}
	}
}

// TestCPUMeterReadsAProcess samples this test's own process through
// /proc, as the load generator samples the broker's, while it burns CPU:
// the broker figure must be read and must grow.
func TestCPUMeterReadsAProcess(t *testing.T) {
	m := cpuMeter{pid: os.Getpid()}
	a := m.sample()
	if !a.brokerOK {
		t.Skip("no /proc here")
	}
	for b := m.sample(); b.broker <= a.broker || b.client <= a.client; b = m.sample() {
		x := 0
		for i := 0; i < 1e6; i++ {
			x += i * i
		}
		_ = x
	}
	if got := perMessage(time.Second, 3*time.Second, 1000); got != 2000 {
		t.Fatalf("perMessage = %v µs; want 2000", got)
	}
	if got := perMessage(time.Second, 3*time.Second, 0); got != 0 {
		t.Fatalf("perMessage with nothing consumed = %v; want 0", got)
	}
}
