package amqp_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/warren-mq/warren/netio/amqp"
)

// Direct reply-to, as RabbitMQ has it: an RPC client consumes the
// pseudo-queue amq.rabbitmq.reply-to (no-ack), sends requests with
// reply-to amq.rabbitmq.reply-to, which the server sees as a name of its
// own; a reply published to the default exchange with that name as its
// routing key goes straight to the client's consumer, through no queue.
func TestDirectReplyTo(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, _, url := start(t, amqp.Config{})
	_, server := dial(t, url)
	if _, err := server.QueueDeclare("rpc", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	requests, err := server.Consume("rpc", "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	clientConn, client := dial(t, url)
	// Spring AMQP's test for the feature: a passive declare of the name.
	if _, err := client.QueueDeclarePassive("amq.rabbitmq.reply-to", false, false, false, false, nil); err != nil {
		t.Fatalf("passive declare of amq.rabbitmq.reply-to: %v", err)
	}
	replies, err := client.Consume("amq.rabbitmq.reply-to", "rt", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := client.PublishWithContext(context.Background(), "", "rpc", false, false,
		amqp091.Publishing{ReplyTo: "amq.rabbitmq.reply-to", CorrelationId: "c1", Body: []byte("ping")}); err != nil {
		t.Fatal(err)
	}
	req := recv(t, requests)
	if !strings.HasPrefix(req.ReplyTo, "amq.rabbitmq.reply-to.") || string(req.Body) != "ping" {
		t.Fatalf("request reply-to %q body %q, want amq.rabbitmq.reply-to.<token>", req.ReplyTo, req.Body)
	}
	if c := publishConfirmed(t, server, "", req.ReplyTo, amqp091.Publishing{CorrelationId: req.CorrelationId, Body: []byte("pong")}); !c.Ack {
		t.Fatalf("the reply's confirm: %+v", c)
	}
	rep := recv(t, replies)
	if string(rep.Body) != "pong" || rep.CorrelationId != "c1" || rep.ConsumerTag != "rt" || rep.Exchange != "" ||
		rep.RoutingKey != req.ReplyTo || rep.Redelivered || rep.DeliveryTag != 1 {
		t.Fatalf("reply %+v", rep)
	}
	// A reply to a token nobody holds: returned if mandatory, as an
	// unroutable message.
	rets := server.NotifyReturn(make(chan amqp091.Return, 1))
	if err := server.PublishWithContext(context.Background(), "", "amq.rabbitmq.reply-to.nobody", true, false, amqp091.Publishing{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-rets:
		if r.ReplyCode != 312 {
			t.Fatalf("return %d %s, want 312 NO_ROUTE", r.ReplyCode, r.ReplyText)
		}
	case <-time.After(deadline):
		t.Fatal("no basic.return for an unknown reply-to token")
	}
	// Once the client's channel is closed its name takes nothing.
	if err := client.Close(); err != nil {
		t.Fatal(err)
	}
	if err := server.PublishWithContext(context.Background(), "", req.ReplyTo, true, false, amqp091.Publishing{Body: []byte("late")}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-rets:
		if r.ReplyCode != 312 {
			t.Fatalf("return %d, want 312", r.ReplyCode)
		}
	case <-time.After(deadline):
		t.Fatal("a reply to a closed channel's name was not returned")
	}
	_ = clientConn
}

// Its refusals, in RabbitMQ's words.
func TestDirectReplyToRefusals(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, _, url := start(t, amqp.Config{})
	conn, ch := dial(t, url)
	check := func(what string, err error, text string) {
		t.Helper()
		var e *amqp091.Error
		if !errors.As(err, &e) || e.Code != 406 || e.Reason != text {
			t.Errorf("%s: %v\nwant (406) %q", what, err, text)
		}
		ch, _ = conn.Channel()
	}
	_, err := ch.Consume("amq.rabbitmq.reply-to", "", false, false, false, false, nil)
	check("consume with acks", err, "PRECONDITION_FAILED - reply consumer cannot acknowledge")
	if _, err := ch.Consume("amq.rabbitmq.reply-to", "a", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	_, err = ch.Consume("amq.rabbitmq.reply-to", "b", true, false, false, false, nil)
	check("a second reply consumer", err, "PRECONDITION_FAILED - reply consumer already set")
	closed := ch.NotifyClose(make(chan *amqp091.Error, 1))
	if err := ch.PublishWithContext(context.Background(), "", "x", false, false, amqp091.Publishing{ReplyTo: "amq.rabbitmq.reply-to"}); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-closed:
		if want := "PRECONDITION_FAILED - fast reply consumer does not exist"; e == nil || e.Code != 406 || e.Reason != want {
			t.Errorf("reply-to without a reply consumer: %v, want (406) %q", e, want)
		}
	case <-time.After(deadline):
		t.Error("a publish with reply-to amq.rabbitmq.reply-to and no reply consumer was taken")
	}
}
