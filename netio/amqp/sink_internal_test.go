package amqp

import (
	"context"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/wire"
)

// sinkBroker runs a broker with an AMQP listener and one client
// connection, and returns the client's channel and the broker's side of
// the connection, whose Sink methods a test calls as a shard would.
func sinkBroker(t *testing.T, ncfg netio.Config) (*amqp091.Connection, *amqp091.Channel, *conn) {
	return sinkBrokerWith(t, ncfg, amqp091.Config{})
}

func sinkBrokerWith(t *testing.T, ncfg netio.Config, acfg amqp091.Config) (*amqp091.Connection, *amqp091.Channel, *conn) {
	t.Helper()
	ncfg.Addr, ncfg.Shards, ncfg.EventLoops = "127.0.0.1:0", 2, 1
	srv, err := netio.Start(ncfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := Listen(srv, Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = l.Close()
		_ = srv.Close(ctx)
	})
	cc, err := amqp091.DialConfig("amqp://guest:guest@"+l.Addr().String()+"/", acfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.CloseDeadline(time.Now().Add(10 * time.Second)) })
	ch, err := cc.Channel()
	if err != nil {
		t.Fatal(err)
	}
	var c *conn
	l.mu.Lock()
	for k := range l.conns {
		c = k
	}
	n := len(l.conns)
	l.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d connections, want 1", n)
	}
	return cc, ch, c
}

// onlyChannel returns the connection's one open channel.
func onlyChannel(t *testing.T, c *conn) *channel {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.channels) != 1 {
		t.Fatalf("%d channels, want 1", len(c.channels))
	}
	for _, ch := range c.channels {
		return ch
	}
	return nil
}

// pendingConsume registers a consumer on ch as a no-wait basic.consume
// does before its queue answers (the subscribe itself is not sent: the
// test answers for the queue).
func pendingConsume(t *testing.T, c *conn, ch *channel, qn, tag string) *consumer {
	t.Helper()
	q := c.srv.LookupQueue(c.qn(qn))
	if q == nil {
		t.Fatalf("no queue %q", qn)
	}
	cr := &consumer{id: c.srv.NewConsumerID(), tag: tag, ch: ch, q: q, noWait: true}
	c.mu.Lock()
	ch.consumers[tag] = cr
	c.byID[cr.id] = cr
	c.mu.Unlock()
	return cr
}

// A no-wait basic.consume its queue refuses (another connection's
// exclusive consumer there) on a channel the client closed before the
// refusal came back is forgotten: no ConsumerGone follows a refusal, and
// it counted against max_consumers_per_connection for the connection's
// life (50 such consumes, and a connection with a limit of 3 could
// consume no more).
func TestRefusedConsumeOnClosedChannelForgotten(t *testing.T) {
	_, ch, c := sinkBroker(t, netio.Config{MaxConsumersPerConnection: 3})
	if _, err := ch.QueueDeclare("q", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	cr := pendingConsume(t, c, onlyChannel(t, c), "q", "t")
	if err := ch.Close(); err != nil { // answered: the channel is closing when the refusal comes
		t.Fatal(err)
	}
	c.Subscribed(cr.id, 0, wire.ResourceLocked, "queue: has an exclusive consumer")
	c.mu.Lock()
	_, kept := c.byID[cr.id]
	c.mu.Unlock()
	if kept {
		t.Fatal("a consume refused after its channel closed still counts against the connection's consumers")
	}
}

// A late answer about a consumer the client cancelled leaves alone the
// consumer that reuses its tag: the broker's cancel of the old one (its
// queue deleted, say) neither frees the tag nor tells the client, who
// would read it as the new consumer's cancel.
func TestLateCancelLeavesReusedTag(t *testing.T) {
	_, ch, c := sinkBroker(t, netio.Config{})
	if _, err := ch.QueueDeclare("q", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	chs := onlyChannel(t, c)
	old := pendingConsume(t, c, chs, "q", "t")
	if err := ch.Cancel("t", false); err != nil { // answered: the tag is free
		t.Fatal(err)
	}
	ds, err := ch.Consume("q", "t", true, false, false, false, nil) // answered: the tag is the new consumer's
	if err != nil {
		t.Fatal(err)
	}
	c.Cancelled(old.id, wire.NotFound, "queue deleted")
	c.mu.Lock()
	cur := chs.consumers["t"]
	c.mu.Unlock()
	if cur == nil || cur.id == old.id {
		t.Fatalf("the tag's consumer after the old one's cancel: %+v, want the new one", cur)
	}
	// The client still has its consumer: a message reaches it (a
	// basic.cancel for "t" would have closed ds).
	if err := ch.PublishWithContext(context.Background(), "", "q", false, false, amqp091.Publishing{Body: []byte("m")}); err != nil {
		t.Fatal(err)
	}
	select {
	case d, ok := <-ds:
		if !ok {
			t.Fatal("the client was told its new consumer of tag t was cancelled")
		}
		if string(d.Body) != "m" {
			t.Fatalf("got %q", d.Body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery to the new consumer")
	}
}

// A channel.close the broker decided on for a channel the client closed
// meanwhile is not sent: its id is free, and here reused by a new
// channel, which the close must not hit. Before, the close went out on
// the id: the new channel was closed, or (id free) the client's close-ok
// to it ended the connection (504, expected 'channel.open').
func TestBrokerCloseAfterClientCloseSendsNothing(t *testing.T) {
	cc, ch, c := sinkBrokerWith(t, netio.Config{}, amqp091.Config{ChannelMax: 1}) // one id: the next channel reuses it
	old := onlyChannel(t, c)
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	ch2, err := cc.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if cur := onlyChannel(t, c); cur.id != old.id || cur == old {
		t.Fatalf("the new channel is %d (the same: %v), want a new one on id %d", cur.id, cur == old, old.id)
	}
	ae := chErr(accessRefused, "ACCESS_REFUSED - queue 'q' in exclusive use")
	ae.class, ae.method = classBasic, 20
	c.closeChannel(old, ae)  // as a shard's close of the old channel, run late
	for i := 0; i < 2; i++ { // the second goes out after the client's answer to any close
		if _, err := ch2.QueueDeclare("", false, true, true, false, nil); err != nil {
			t.Fatalf("declare %d on the new channel: %v", i, err)
		}
	}
	cur := onlyChannel(t, c)
	c.mu.Lock()
	closing := cur.closing
	c.mu.Unlock()
	if closing {
		t.Fatal("the new channel is closing")
	}
}

// basic.get on a queue another connection consumes exclusively takes a
// ready message, as in RabbitMQ (a get is no consumer). Before, the queue
// refused the get's consumer: the client got get-empty with a message
// ready, then a channel.close 403 naming basic.consume.
func TestGetBesideExclusiveConsumer(t *testing.T) {
	cc, ch, _ := sinkBroker(t, netio.Config{})
	if _, err := ch.QueueDeclare("q", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"a", "b"} {
		if err := ch.PublishWithContext(context.Background(), "", "q", false, false, amqp091.Publishing{Body: []byte(b)}); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := ch.Consume("q", "x", false, true, false, false, nil) // exclusive, prefetch 1
	if err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-ds: // "b" is ready now: the consumer's prefetch is full
		if string(d.Body) != "a" {
			t.Fatalf("the consumer got %q", d.Body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery to the exclusive consumer")
	}
	gc, err := amqp091.Dial("amqp://guest:guest@" + cc.RemoteAddr().String() + "/") // another connection
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	gch, err := gc.Channel()
	if err != nil {
		t.Fatal(err)
	}
	closes := gch.NotifyClose(make(chan *amqp091.Error, 1))
	d, ok, err := gch.Get("q", false)
	if err != nil || !ok || string(d.Body) != "b" {
		t.Fatalf("basic.get: ok %v, body %q, err %v; want the ready message b", ok, d.Body, err)
	}
	if err := d.Ack(false); err != nil {
		t.Fatal(err)
	}
	if _, err := gch.QueueDeclarePassive("q", false, false, false, false, nil); err != nil { // after any close for the get
		t.Fatalf("the getter's channel after the get: %v", err)
	}
	select {
	case e := <-closes:
		t.Fatalf("the getter's channel closed: %v", e)
	default:
	}
}
