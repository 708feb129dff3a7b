package netio_test

import (
	"strings"
	"testing"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// TestDeliverStoredLongRoutingKey: a message stored with a routing key
// over 255 bytes (before 1615ac8 the admin API's publish took one, and a
// durable queue's log may hold it) is delivered with its key cut to 255
// bytes, as the AMQP front writes it. The DELIVER frame's key is a short
// string: encoding it panicked on the event loop and warrend exited (seen:
// a log from the older version, a restart, one warrenctl consume), again
// at the next consume after every start.
func TestDeliverStoredLongRoutingKey(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	_, err := ch.DeclareQueue(ctx, "q", client.QueueOptions{})
	must(t, err)
	q := s.Broker.LookupQueue("q")
	long := strings.Repeat("k", 300)
	m := broker.NewStoredMsg(nil, []byte(long), wire.AppendProperties(nil, nil)[2:], []byte("m"), 0, 0)
	m.Arena.Refs.Store(1)
	s.Broker.Submit(broker.Command{Kind: broker.CmdPublish, Items: []broker.EnqItem{{Q: q, Msg: m, Meta: queue.Message{Size: 1}}}})
	cs, err := ch.Consume(ctx, "q", client.ConsumeOptions{Prefetch: 1})
	must(t, err)
	d := recv(t, cs)
	if d.RoutingKey != long[:wire.MaxNameLen] {
		t.Fatalf("delivered with a routing key of %d bytes, want the stored one cut to %d", len(d.RoutingKey), wire.MaxNameLen)
	}
	must(t, d.Ack())
	applied(t, s, ch)
	aliveCheck(t, s, ch)
}
