package queue

import (
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
