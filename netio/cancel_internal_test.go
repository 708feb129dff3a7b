package netio

import (
	"context"
	"testing"
	"time"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/client"
)

// Deliveries a queue makes to a consumer after the client's CANCEL was
// answered (before the queue applied the cancel: for a durable queue, a
// log round later) go back to the queue at once. Before, they were sent
// and the client, which no longer had the consumer, dropped them: they
// stayed unacknowledged until the channel closed, hidden from every other
// consumer of the queue for as long as the connection lived.
func TestDeliveriesAfterCancelGoBack(t *testing.T) {
	s, err := Start(Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close(context.Background()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, "warren://guest:guest@"+s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, err := c.Channel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.DeclareQueue(ctx, "work", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	cs, err := ch.Consume(ctx, "work", client.ConsumeOptions{Prefetch: 10})
	if err != nil {
		t.Fatal(err)
	}
	// The window, held open: CANCEL answered (the consumer is marked as
	// the CANCEL handler marks it), its queue not told yet.
	s.connsMu.Lock()
	var cr *consumerRef
	for _, sc := range s.conns {
		sc.mu.Lock()
		for _, r := range sc.byID {
			cr = r
		}
		if cr != nil {
			cr.cancelled = true
		}
		sc.mu.Unlock()
	}
	s.connsMu.Unlock()
	if cr == nil {
		t.Fatal("no consumer on the server")
	}
	if err := ch.Publish(ctx, "", client.Message{RoutingKey: "work", Body: []byte("job")}); err != nil {
		t.Fatal(err)
	}
	s.Submit(broker.Command{Kind: broker.CmdCancel, Queue: cr.q, Consumer: cr.id})
	q := s.Broker.LookupQueue("work")
	for q.ReadyCount() != 1 || q.ConsumerCount() != 0 {
		select {
		case <-ctx.Done():
			t.Fatalf("%d ready, %d consumers; want the message back (1) and no consumer", q.ReadyCount(), q.ConsumerCount())
		case <-time.After(time.Millisecond): // polling counters, with a deadline
		}
	}
	select {
	case d := <-cs.Deliveries():
		t.Fatalf("the client got a delivery after its CANCEL was answered: %+v", d)
	default:
	}
}
