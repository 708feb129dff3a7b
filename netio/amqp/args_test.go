package amqp_test

import (
	"context"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/warren-mq/warren/netio/amqp"
	"github.com/warren-mq/warren/wire"
)

// Each RabbitMQ queue argument becomes its Warren argument (their effects
// are the broker's, tested there); quorum is a durable queue with
// replicas 3; x-max-priority is strict, as RabbitMQ dispatches.
func TestQueueArgumentsMapped(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	srv, _, url := start(t, amqp.Config{})
	_, ch := dial(t, url)
	_, err := ch.QueueDeclare("mapped", true, false, false, false, amqp091.Table{
		"x-max-priority": int32(7), "x-message-ttl": int32(60000), "x-expires": int64(3600000),
		"x-max-length": int32(100), "x-max-length-bytes": int32(1 << 20), "x-overflow": "reject-publish-dlx",
		"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "dead", "x-delivery-limit": int32(5),
		"x-single-active-consumer": true, "x-queue-type": "quorum",
	})
	if err != nil {
		t.Fatal(err)
	}
	info, ok := srv.Queue("mapped")
	if !ok {
		t.Fatal("no queue")
	}
	want := wire.QueueArgs{MaxPriority: 7, StrictPriority: true, MessageTTL: time.Minute, Expires: time.Hour, MaxLength: 100, MaxLengthBytes: 1 << 20,
		Overflow: wire.RejectPublishDLX, DeadLetterExchange: "dlx", DeadLetterRoutingKey: "dead", DeliveryLimit: 5,
		SingleActiveConsumer: true, Replicas: 3, RetryMultiplier: 1}
	if info.Args != want || !info.Durable {
		t.Fatalf("args %+v durable=%v\nwant %+v durable", info.Args, info.Durable, want)
	}
}

// An exchange's alternate-exchange takes what it cannot route.
func TestAlternateExchange(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, _, url := start(t, amqp.Config{})
	_, ch := dial(t, url)
	if err := ch.ExchangeDeclare("ae", "fanout", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare("main", "direct", false, false, false, false, amqp091.Table{"alternate-exchange": "ae"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("unrouted", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("unrouted", "", "ae", false, nil); err != nil {
		t.Fatal(err)
	}
	publishConfirmed(t, ch, "main", "nobody", amqp091.Publishing{Body: []byte("lost?")})
	if m, ok, err := ch.Get("unrouted", true); err != nil || !ok || string(m.Body) != "lost?" {
		t.Fatalf("get from the alternate exchange's queue: %v %v %q", ok, err, m.Body)
	}
}

// x-overflow reject-publish: a publish to a full queue is nacked.
func TestOverflowRejectPublishNacks(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, _, url := start(t, amqp.Config{})
	_, ch := dial(t, url)
	if _, err := ch.QueueDeclare("full", false, false, false, false, amqp091.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"}); err != nil {
		t.Fatal(err)
	}
	if c := publishConfirmed(t, ch, "", "full", amqp091.Publishing{Body: []byte("1")}); !c.Ack {
		t.Fatalf("first publish: %+v, want ack", c)
	}
	if c := publishConfirmed(t, ch, "", "full", amqp091.Publishing{Body: []byte("2")}); c.Ack {
		t.Fatalf("publish to the full queue: %+v, want nack", c)
	}
}

// Consumer priority (x-priority): the higher-priority consumer gets the
// messages while it has room under its prefetch; the other the rest.
func TestConsumerPriority(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, _, url := start(t, amqp.Config{})
	conn, ch := dial(t, url)
	if _, err := ch.QueueDeclare("cp", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	hiCh, _ := conn.Channel()
	loCh, _ := conn.Channel()
	if err := hiCh.Qos(3, 0, false); err != nil {
		t.Fatal(err)
	}
	lo, err := loCh.Consume("cp", "lo", false, false, false, false, amqp091.Table{"x-priority": int32(-1)})
	if err != nil {
		t.Fatal(err)
	}
	hi, err := hiCh.Consume("cp", "hi", false, false, false, false, amqp091.Table{"x-priority": int32(10)})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		publishConfirmed(t, ch, "", "cp", amqp091.Publishing{Body: []byte{byte(i)}})
	}
	for i := 0; i < 3; i++ {
		if d := recv(t, hi); d.Body[0] != byte(i) {
			t.Fatalf("high-priority consumer got %v, want %d", d.Body, i)
		}
	}
	publishConfirmed(t, ch, "", "cp", amqp091.Publishing{Body: []byte{3}}) // hi is at its prefetch
	if d := recv(t, lo); d.Body[0] != 3 {
		t.Fatalf("low-priority consumer got %v, want 3", d.Body)
	}
}

// AMQPLAIN, the other mechanism RabbitMQ's clients offer, with the same
// users: a good password opens, a bad one is refused with 403.
func TestAMQPLAIN(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, l, _ := start(t, amqp.Config{})
	url := "amqp://" + l.Addr().String() + "/"
	c, err := amqp091.DialConfig(url, amqp091.Config{SASL: []amqp091.Authentication{&amqp091.AMQPlainAuth{Username: "guest", Password: "guest"}}})
	if err != nil {
		t.Fatalf("AMQPLAIN guest/guest: %v", err)
	}
	_ = c.Close()
	_, err = amqp091.DialConfig(url, amqp091.Config{SASL: []amqp091.Authentication{&amqp091.AMQPlainAuth{Username: "guest", Password: "nope"}}})
	if amqpCode(err) != 403 {
		t.Fatalf("AMQPLAIN with a bad password: %v, want 403 access_refused", err)
	}
}

// publishConfirmed publishes in confirm mode and returns its confirm.
func publishConfirmed(t *testing.T, ch *amqp091.Channel, ex, key string, p amqp091.Publishing) amqp091.Confirmation {
	t.Helper()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), ex, key, false, false, p)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	ack, err := dc.WaitContext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return amqp091.Confirmation{DeliveryTag: dc.DeliveryTag, Ack: ack}
}

// The server's capabilities are what it does: RabbitMQ's clients look at
// them (consumer_priorities: x-priority is honoured;
// authentication_failure_close: a refused login gets connection.close;
// direct_reply_to: amq.rabbitmq.reply-to).
func TestServerCapabilities(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, _, url := start(t, amqp.Config{})
	conn, _ := dial(t, url)
	caps, _ := conn.Properties["capabilities"].(amqp091.Table)
	for _, c := range []string{"publisher_confirms", "basic.nack", "consumer_cancel_notify", "exchange_exchange_bindings",
		"per_consumer_qos", "connection.blocked", "consumer_priorities", "authentication_failure_close", "direct_reply_to"} {
		if caps[c] != true {
			t.Errorf("capability %s: %v, want true (capabilities %v)", c, caps[c], caps)
		}
	}
}
