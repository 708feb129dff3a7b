package queue

import (
	"testing"

	"github.com/warren-mq/warren/wire"
)

// TestPurgeRemovesParkedRetries: purge removes every message not out with a
// consumer, including those waiting out a retry backoff (they are not
// awaiting an ack), and counts them; none comes back when its wait ends.
func TestPurgeRemovesParkedRetries(t *testing.T) {
	m := New(Config{RetryInitialMs: 1000, RetryMultiplierMilli: 1000}, 0)
	if _, err := m.Subscribe(0, ConsumerSpec{ID: 1, Prefetch: 2}); err != nil {
		t.Fatal(err)
	}
	m.Enqueue(0, []Message{{ID: 1}, {ID: 2}, {ID: 3}})
	// Tags 1 and 2 are out; nack both: they wait 1 s before they are ready,
	// and the freed credit takes message 3 out.
	if _, err := m.Settle(10, 1, wire.SettleRequeue, 1, 2, 0); err != nil {
		t.Fatal(err)
	}
	if m.Parked() != 2 {
		t.Fatalf("parked %d, want 2", m.Parked())
	}
	n, effs := m.Purge(20)
	removed := map[uint64]bool{}
	for _, e := range effs {
		if e.Kind == Remove {
			removed[e.Msg] = true
		}
	}
	if n != 2 || !removed[1] || !removed[2] || len(removed) != 2 || m.Parked() != 0 || m.Unacked() != 1 {
		t.Fatalf("purge: count %d, removed %v, parked %d, unacked %d; want 2, messages 1 and 2, 0, 1 (message 3 is out)", n, removed, m.Parked(), m.Unacked())
	}
	for _, e := range m.Tick(5000) {
		if e.Kind == Deliver {
			t.Fatalf("message %d delivered after the purge", e.Msg)
		}
	}
	if err := m.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}
