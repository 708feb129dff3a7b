package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio/warrentest"
)

// TestConsumeConsumerTimeout: ConsumeOptions.ConsumerTimeout gives one
// consumer an ack timeout on a queue without one (SUBSCRIBE argument
// consumer-timeout-ms): an unsettled delivery is taken back, the consumer
// is told, and the message comes again; a sub-millisecond timeout is refused
// before anything is sent.
func TestConsumeConsumerTimeout(t *testing.T) {
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
	if _, err := ch.Consume(ctx, "work", client.ConsumeOptions{ConsumerTimeout: time.Microsecond}); err == nil {
		t.Fatal("a 1µs consumer timeout was accepted")
	}
	cs, err := ch.Consume(ctx, "work", client.ConsumeOptions{Prefetch: 1, ConsumerTimeout: 50 * time.Millisecond})
	must(t, err)
	expired := make(chan []uint64, 4)
	cs.OnLeaseExpired(func(tags []uint64) { expired <- tags })
	must(t, ch.Publish(ctx, "", client.Message{RoutingKey: "work", Body: []byte("job")}))
	next := func() *client.Delivery {
		t.Helper()
		select {
		case d := <-cs.Deliveries():
			return d
		case <-ctx.Done():
			t.Fatal("no delivery")
		}
		return nil
	}
	first := next() // not settled
	select {
	case tags := <-expired:
		if len(tags) != 1 || tags[0] != first.Tag {
			t.Fatalf("lease expired for %v, want [%d]", tags, first.Tag)
		}
	case <-ctx.Done():
		t.Fatal("the consumer's 50 ms ack timeout never expired the delivery")
	}
	again := next()
	if string(again.Body) != "job" || again.DeliveryCount != 2 || !again.Redelivered {
		t.Fatalf("redelivery %+v", again)
	}
	must(t, again.Ack())
}
