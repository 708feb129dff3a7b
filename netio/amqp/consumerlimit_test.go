package amqp_test

import (
	"context"
	"strings"
	"testing"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/amqp"
)

// TestConsumerLimit: with max_consumers_per_connection 2, a connection's
// third basic.consume is refused with 406 naming the setting (a channel
// error: the connection goes on); so is a basic.get while two gets' messages
// are unacked (each holds its consumer until it is settled). Before, a
// connection could make consumers without end, and basic.get without acks
// hold any number of messages. A declare past max_queues is 406 too, as
// RabbitMQ refuses its queue limit (it was 541 INTERNAL_ERROR).
func TestConsumerLimit(t *testing.T) {
	_, _, url := startWith(t, netio.Config{MaxConsumersPerConnection: 2, MaxQueues: 2}, amqp.Config{})
	conn, ch := dial(t, url)
	if _, err := ch.QueueDeclare("q", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if _, err := ch.Consume("q", "", false, false, false, false, nil); err != nil {
			t.Fatalf("consumer %d: %v", i+1, err)
		}
	}
	_, err := ch.Consume("q", "", false, false, false, false, nil)
	if amqpCode(err) != 406 || !strings.Contains(err.Error(), "max_consumers_per_connection") {
		t.Fatalf("third consumer: %v, want 406 naming max_consumers_per_connection", err)
	}
	ch, err = conn.Channel()
	if err != nil {
		t.Fatalf("the connection after the refusal: %v", err)
	}
	if _, err := ch.QueueDeclarePassive("q", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}

	// basic.get without acks, on a connection of its own.
	_, gch := dial(t, url)
	if err := gch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	if _, err := gch.QueueDeclare("g", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"a", "b", "c"} {
		dc, err := gch.PublishWithDeferredConfirmWithContext(context.Background(), "", "g", false, false, amqp091.Publishing{Body: []byte(b)})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
			t.Fatal("not confirmed", err)
		}
	}
	for _, want := range []string{"a", "b"} {
		if d, ok, err := gch.Get("g", false); !ok || err != nil || string(d.Body) != want {
			t.Fatalf("get: ok=%v err=%v body=%q, want %q", ok, err, d.Body, want)
		}
	}
	if _, _, err := gch.Get("g", false); amqpCode(err) != 406 || !strings.Contains(err.Error(), "max_consumers_per_connection") {
		t.Fatalf("a third get with two unacked: %v, want 406 naming max_consumers_per_connection", err)
	}

	// The queue limit (two: q and g exist).
	ch, err = conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("q3", false, false, false, false, nil); amqpCode(err) != 406 || !strings.Contains(err.Error(), "max_queues") {
		t.Fatalf("a declare past max_queues: %v, want 406 naming max_queues", err)
	}
}
