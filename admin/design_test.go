package admin_test

import (
	"context"
	"testing"
	"time"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
)

// TestDesignExampleVerbatim: the original design's example topology, as
// admin requests copied verbatim, is accepted and reads back as declared
// (issue 11 item 30: overflow "dead-letter" was refused). Then a queue with
// the same settings but room for only 2 messages shows what the policy does:
// the displaced (oldest) message goes to the dead-letter exchange with
// reason maxlen.
func TestDesignExampleVerbatim(t *testing.T) {
	e := setup(t)
	verbatim := []struct{ path, body string }{
		{"/api/queues/orders", `{"durable": true, "max_priority": 9, "max_length": 1000000, "message_ttl_ms": 60000, "dead_letter_exchange": "dlx", "replicas": 3, "overflow": "dead-letter"}`},
		{"/api/exchanges/events", `{"type": "topic", "durable": true, "alternate_exchange": "unrouted"}`},
		{"/api/bindings", `{"exchange": "events", "queue": "orders", "routing_key": "order.*.created"}`},
	}
	for _, r := range verbatim {
		var got map[string]any
		if st := e.do("PUT", r.path, r.body, &got); st != 200 {
			t.Fatalf("PUT %s %s: %d %v", r.path, r.body, st, got)
		}
	}
	var q map[string]any
	e.do("GET", "/api/queues/orders", "", &q)
	for k, want := range map[string]any{"overflow": "dead-letter", "max_length": 1e6, "max_priority": 9.0, "dead_letter_exchange": "dlx", "replicas": 3.0, "message_ttl_ms": 60000.0} {
		if q[k] != want {
			t.Errorf("orders %s = %v, want %v", k, q[k], want)
		}
	}

	// The same settings with max_length 2, a dead-letter exchange and queue.
	for _, r := range []struct{ path, body string }{
		{"/api/exchanges/dlx", `{"type": "fanout"}`},
		{"/api/queues/orders.dlq", `{}`},
		{"/api/bindings", `{"exchange": "dlx", "queue": "orders.dlq", "routing_key": ""}`},
		{"/api/queues/orders.small", `{"durable": true, "max_priority": 9, "max_length": 2, "message_ttl_ms": 60000, "dead_letter_exchange": "dlx", "replicas": 3, "overflow": "dead-letter"}`},
		{"/api/bindings", `{"exchange": "events", "queue": "orders.small", "routing_key": "order.*.created"}`},
	} {
		if st := e.do("PUT", r.path, r.body, nil); st != 200 {
			t.Fatalf("PUT %s: %d", r.path, st)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, warrentest.URL(e.srv))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, err := c.Channel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{"a", "b", "c"} {
		if _, err := ch.PublishAsync(ctx, "events", client.Message{RoutingKey: "order.42.created", Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := ch.WaitConfirms(ctx); err != nil {
		t.Fatal(err)
	}
	expectReady(t, e.srv, ch, "orders", 3)
	expectReady(t, e.srv, nil, "orders.small", 2)
	expectReady(t, e.srv, nil, "orders.dlq", 1)
	var got struct{ Messages []broker.Message }
	if st := e.do("POST", "/api/queues/orders.dlq/get", `{"count": 10}`, &got); st != 200 || len(got.Messages) != 1 {
		t.Fatalf("get: %d %+v", st, got)
	}
	m := got.Messages[0]
	if string(m.Body) != "a" || m.Properties == nil || len(m.Properties.Deaths) != 1 ||
		m.Properties.Deaths[0].Queue != "orders.small" || m.Properties.Deaths[0].Reason != wire.ReasonMaxLen {
		t.Fatalf("dead-lettered message %+v, want body a, one death in orders.small for maxlen", m)
	}
}
