package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio/warrentest"
)

// TestCancelReturnsUntakenDeliveries: Cancel returns to the queue what the
// broker had delivered that the application never took from Deliveries()
// (some still buffered, the rest arriving while CANCEL is in flight or
// after it), and leaves what it took to be settled. Before, those stayed
// unacknowledged on the channel until it closed: a long-lived channel that
// cancels and consumes again hid them from every other consumer (the
// fault harness saw them as lost).
func TestCancelReturnsUntakenDeliveries(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, warrentest.URL(s))
	must(t, err)
	defer c.Close()
	ch, err := c.Channel(ctx)
	must(t, err)
	_, err = ch.DeclareQueue(ctx, "work", client.QueueOptions{})
	must(t, err)
	for range 10 {
		must(t, ch.Publish(ctx, "", client.Message{RoutingKey: "work", Body: []byte("job")}))
	}
	cs, err := ch.Consume(ctx, "work", client.ConsumeOptions{Prefetch: 10})
	must(t, err)
	var held *client.Delivery
	select {
	case held = <-cs.Deliveries():
	case <-ctx.Done():
		t.Fatal("no delivery")
	}
	must(t, cs.Cancel(ctx))
	q := s.Broker.LookupQueue("work")
	for q.ReadyCount() != 9 {
		select {
		case <-ctx.Done():
			t.Fatalf("after Cancel: %d ready, want 9 (returned; the one taken stays unacked)", q.ReadyCount())
		case <-time.After(time.Millisecond): // polling the counters, not a sync sleep
		}
	}
	must(t, held.Ack())
	// Another consumer on the same channel gets the nine.
	cs2, err := ch.Consume(ctx, "work", client.ConsumeOptions{Prefetch: 10})
	must(t, err)
	for i := range 9 {
		select {
		case d := <-cs2.Deliveries():
			if !d.Redelivered {
				t.Fatalf("delivery %d again: not flagged redelivered", i)
			}
			must(t, d.Ack())
		case <-ctx.Done():
			t.Fatalf("got %d of the 9 returned messages", i)
		}
	}
}
