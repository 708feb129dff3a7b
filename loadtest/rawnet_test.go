package loadtest

import "testing"

// TestRawNet: the loopback echo times every round trip, in order of size
// (p50 ≤ p99 ≤ p99.9 ≤ max), and refuses messages too short to carry
// their send time.
func TestRawNet(t *testing.T) {
	r, err := RawNet(20000, 128, 200)
	if err != nil {
		t.Fatal(err)
	}
	if r.N != 200 || r.P50 <= 0 || r.P50 > r.P99 || r.P99 > r.P999 || r.P999 > r.Max {
		t.Fatalf("RawNet = %+v", r)
	}
	if _, err := RawNet(1000, 4, 10); err == nil {
		t.Fatal("RawNet accepted 4-byte messages")
	}
}
