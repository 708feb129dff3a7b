package netio

import (
	"context"
	"testing"
	"time"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/wire"
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

// A consumer the broker cancelled (its queue deleted) frees its tag, as
// the client forgets it on CANCELLED: a SUBSCRIBE with the same tag is
// not refused as a duplicate (precondition_failed, before).
func TestCancelledByBrokerFreesTag(t *testing.T) {
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
	if _, err := ch.DeclareQueue(ctx, "q", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.Consume(ctx, "q", client.ConsumeOptions{Tag: "t"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.DeleteQueue(ctx, "q", false, false); err != nil { // answered after the consumer's CANCELLED
		t.Fatal(err)
	}
	if _, err := ch.DeclareQueue(ctx, "q", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	cs, err := ch.Consume(ctx, "q", client.ConsumeOptions{Tag: "t"})
	if err != nil {
		t.Fatalf("subscribing with the tag of a consumer the broker cancelled: %v", err)
	}
	// A late CANCELLED for a consumer whose tag the client freed and
	// reused (here: one the connection still knows, standing for a
	// consumer the client cancelled before its queue let it go) is not
	// sent: the client would take it for the new consumer's.
	s.connsMu.Lock()
	var sc *conn
	var old *consumerRef
	for _, k := range s.conns {
		sc = k
		k.mu.Lock()
		for _, r := range k.byID {
			cp := *r
			old = &cp
		}
		if old != nil {
			old.id = s.NewConsumerID()
			old.cancelled = true
			k.byID[old.id] = old
		}
		k.mu.Unlock()
	}
	s.connsMu.Unlock()
	if old == nil {
		t.Fatal("no consumer on the server")
	}
	sc.Cancelled(old.id, wire.NotFound, "queue deleted")
	if err := ch.Publish(ctx, "", client.Message{RoutingKey: "q", Body: []byte("m")}); err != nil {
		t.Fatal(err)
	}
	select {
	case d, ok := <-cs.Deliveries():
		if !ok {
			t.Fatalf("the new consumer of tag t was stopped: %v", cs.Err())
		}
		if string(d.Body) != "m" {
			t.Fatalf("got %q", d.Body)
		}
	case <-ctx.Done():
		t.Fatal("no delivery to the new consumer")
	}
}
