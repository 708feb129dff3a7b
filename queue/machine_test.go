package queue

import (
	"slices"
	"strings"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// kinds returns the effects' kinds without the trailing timer.
func kinds(effs []Effect) []EffectKind {
	var ks []EffectKind
	for _, e := range effs {
		if e.Kind != Timer {
			ks = append(ks, e.Kind)
		}
	}
	return ks
}

// TestDeliveryLimitCountsDeliveries: "a message delivered more than this
// many times is dead-lettered" (spec §7.2, as RabbitMQ): with limit L the
// message is delivered L+1 times, and the (L+1)th failure dead-letters it,
// whichever way the delivery fails (requeue, lease expiry, consumer gone).
func TestDeliveryLimitCountsDeliveries(t *testing.T) {
	for _, limit := range []uint32{1, 2, 5} {
		for _, how := range []string{"requeue", "lease", "down"} {
			m := New(Config{DeliveryLimit: limit, DeadLetter: true, ConsumerTimeout: 100}, 0)
			m.Enqueue(0, []Message{{ID: 1}})
			now := int64(0)
			deliveries := 0
			var tag uint64
			var effs []Effect
			var err error
			effs, err = m.Subscribe(now, ConsumerSpec{ID: 1, Owner: 1, Prefetch: 1})
			if err != nil {
				t.Fatal(err)
			}
			for round := 0; round < 20; round++ {
				dead := false
				for _, e := range effs {
					switch e.Kind {
					case Deliver:
						deliveries++
						tag = e.Tag
						if e.DeliveryCount != uint32(deliveries) {
							t.Fatalf("limit %d %s: delivery %d carries count %d", limit, how, deliveries, e.DeliveryCount)
						}
					case DeadLetter:
						if e.Reason != wire.ReasonDeliveryLimit {
							t.Fatalf("limit %d %s: dead-lettered for %v", limit, how, e.Reason)
						}
						dead = true
					}
				}
				if dead {
					break
				}
				switch how {
				case "requeue":
					effs, err = m.Settle(now, 1, wire.SettleRequeue, tag, tag, 0)
				case "lease":
					now += 100
					effs = m.Tick(now)
				case "down":
					m.Down(now, 1)
					effs, err = m.Subscribe(now, ConsumerSpec{ID: 1, Owner: 1, Prefetch: 1})
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if deliveries != int(limit)+1 {
				t.Errorf("limit %d, failing by %s: delivered %d times before dead-lettering, want %d", limit, how, deliveries, limit+1)
			}
		}
	}
}

// TestPerConsumerTimeout: a consumer's own ack timeout (SUBSCRIBE
// consumer-timeout-ms) overrides the queue's for its deliveries only, also
// on a queue with none; extend without a lease renews by the consumer's
// own; a snapshot keeps it. Time is the fake clock passed in.
func TestPerConsumerTimeout(t *testing.T) {
	expired := func(effs []Effect) (out []ConsumerID) {
		for _, e := range effs {
			if e.Kind == LeaseExpired {
				out = append(out, e.Consumer)
			}
		}
		return out
	}
	timer := func(effs []Effect) int64 {
		if n := len(effs); n > 0 && effs[n-1].Kind == Timer {
			return effs[n-1].At
		}
		return -1
	}

	// The queue's timeout is 1000 ms; consumer 1 overrides it with 100.
	m := New(Config{ConsumerTimeout: 1000}, 0)
	m.Enqueue(0, []Message{{ID: 1}, {ID: 2}})
	if _, err := m.Subscribe(0, ConsumerSpec{ID: 1, Owner: 1, Prefetch: 1, TimeoutMs: 100}); err != nil {
		t.Fatal(err)
	}
	effs, err := m.Subscribe(0, ConsumerSpec{ID: 2, Owner: 1, Prefetch: 1})
	if err != nil {
		t.Fatal(err)
	}
	if at := timer(effs); at != 100 {
		t.Fatalf("next wake-up at %d, want 100 (consumer 1's lease)", at)
	}
	if got := expired(m.Tick(99)); len(got) != 0 {
		t.Fatalf("at 99 ms: leases of %v expired", got)
	}
	restored, err := Restore(m.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	for name, q := range map[string]*Machine{"original": m, "restored": restored} {
		effs := q.Tick(100)
		if got := expired(effs); len(got) != 1 || got[0] != 1 {
			t.Fatalf("%s at 100 ms: leases of %v expired, want consumer 1's only", name, got)
		}
		// Consumer 1 got message 1 back at 100 (deadline 200), and so on.
		if got := expired(q.Tick(999)); slices.Contains(got, 2) {
			t.Fatalf("%s at 999 ms: consumer 2's lease expired", name)
		}
		if got := expired(q.Tick(1000)); !slices.Contains(got, 2) {
			t.Fatalf("%s at 1000 ms: leases of %v expired, want consumer 2's (the queue's timeout)", name, got)
		}
	}

	// A queue without a timeout: only the consumer's applies; extend with
	// no lease renews by the consumer's timeout.
	m = New(Config{}, 0)
	m.Enqueue(0, []Message{{ID: 1}})
	effs, err = m.Subscribe(0, ConsumerSpec{ID: 1, Owner: 1, Prefetch: 1, TimeoutMs: 50})
	if err != nil {
		t.Fatal(err)
	}
	if at := timer(effs); at != 50 {
		t.Fatalf("next wake-up at %d, want 50", at)
	}
	if _, err := m.Settle(40, 1, wire.SettleExtend, 1, 1, 0); err != nil {
		t.Fatal(err)
	}
	if got := expired(m.Tick(50)); len(got) != 0 {
		t.Fatal("extended lease expired at its old deadline")
	}
	if got := expired(m.Tick(90)); len(got) != 1 {
		t.Fatal("extended lease (40 + 50 ms) did not expire at 90 ms")
	}
	if _, err := m.Subscribe(90, ConsumerSpec{ID: 2, Owner: 1, Prefetch: 1}); err != nil {
		t.Fatal(err)
	}
	if got := expired(m.Tick(1 << 40)); len(got) != 1 || got[0] != 1 {
		t.Fatalf("leases of %v expired; consumer 2 has no timeout", got)
	}
}

// TestCountersCheckedByInvariants: the unacked and consumer counters are
// kept, not recounted, so checkInvariants (which the random, model and
// trace tests run after every command) compares them with a recount and
// catches one that drifts.
func TestCountersCheckedByInvariants(t *testing.T) {
	m := New(Config{}, 0)
	for c := 1; c <= 3; c++ {
		if _, err := m.Subscribe(0, ConsumerSpec{ID: ConsumerID(c), Owner: OwnerID(c), Prefetch: 2}); err != nil {
			t.Fatal(err)
		}
	}
	m.Enqueue(0, []Message{{ID: 1}, {ID: 2}, {ID: 3}, {ID: 4}, {ID: 5}})
	if _, err := m.Cancel(0, 2, false); err != nil {
		t.Fatal(err)
	}
	if m.Unacked() != 5 || m.Consumers() != 2 {
		t.Fatalf("unacked %d consumers %d, want 5 and 2", m.Unacked(), m.Consumers())
	}
	// c1's two come back; c3 (prefetch 2, holding 1) takes one of them.
	m.Down(0, 1)
	if m.Unacked() != 4 || m.Ready() != 1 || m.Consumers() != 1 {
		t.Fatalf("after down: unacked %d ready %d consumers %d, want 4, 1 and 1", m.Unacked(), m.Ready(), m.Consumers())
	}
	if err := m.checkInvariants(); err != nil {
		t.Fatal(err)
	}
	m.unacked++
	if err := m.checkInvariants(); err == nil || !strings.Contains(err.Error(), "unacked") {
		t.Fatalf("a drifted unacked counter passes the check: %v", err)
	}
	m.unacked--
	m.active--
	if err := m.checkInvariants(); err == nil || !strings.Contains(err.Error(), "active consumers") {
		t.Fatalf("a drifted consumer counter passes the check: %v", err)
	}
}

// TestGetIsNoConsumer: the one-shot consumer standing for a get is not
// counted by Consumers (AMQP declare-ok's consumer count, queue.delete's
// if-unused), while it is active as after a snapshot's restore. On a
// replicated queue it stays active until its cancel is committed, after
// the client has its message: a client's get, then delete with if-unused,
// was refused 406 "in use" (found driving a cluster with pika; RabbitMQ
// deletes, a get being no consumer).
func TestGetIsNoConsumer(t *testing.T) {
	m := New(Config{}, 0)
	m.Enqueue(0, []Message{{ID: 1}, {ID: 2}})
	if _, err := m.Subscribe(0, ConsumerSpec{ID: 1, Owner: 1, Prefetch: 1, Get: true}); err != nil {
		t.Fatal(err)
	}
	if m.Consumers() != 0 || m.Unacked() != 1 {
		t.Fatalf("a get: consumers %d unacked %d, want 0 and 1", m.Consumers(), m.Unacked())
	}
	if _, err := m.Subscribe(0, ConsumerSpec{ID: 2, Owner: 2, Prefetch: 1}); err != nil {
		t.Fatal(err)
	}
	if m.Consumers() != 1 {
		t.Fatalf("a get and a consumer: consumers %d, want 1", m.Consumers())
	}
	r, err := Restore(m.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	if r.Consumers() != 1 {
		t.Fatalf("restored: consumers %d, want 1", r.Consumers())
	}
	if err := r.checkInvariants(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Cancel(0, 1, false); err != nil {
		t.Fatal(err)
	}
	if m.Consumers() != 1 {
		t.Fatalf("the get cancelled: consumers %d, want 1", m.Consumers())
	}
	if err := m.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}
