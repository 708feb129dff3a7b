package netio_test

import (
	"testing"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
)

// TestExclusiveQueueRefusesOthers: every request of another connection
// that names an exclusive queue is resource_locked (§7.2), bind and unbind
// too (they used to pass: another connection could route messages into,
// or out of, a queue it may not otherwise touch; the AMQP front and
// RabbitMQ refuse them with 405). A publish to it is routed as to any
// queue. Found driving a cluster with the spec's Python client.
func TestExclusiveQueueRefusesOthers(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	owner := channel(t, dial(t, s))
	if _, err := owner.DeclareQueue(ctx, "mine", client.QueueOptions{Exclusive: true}); err != nil {
		t.Fatal(err)
	}
	other := channel(t, dial(t, s))
	b := client.Binding{Source: "amq.direct", Destination: "mine", RoutingKey: "k"}
	expectCode(t, "bind", other.Bind(ctx, b), wire.ResourceLocked)
	expectCode(t, "unbind", other.Unbind(ctx, b), wire.ResourceLocked)
	_, err := other.DeclareQueue(ctx, "mine", client.QueueOptions{Passive: true})
	expectCode(t, "passive declare", err, wire.ResourceLocked)
	_, err = other.PurgeQueue(ctx, "mine")
	expectCode(t, "purge", err, wire.ResourceLocked)
	_, err = other.DeleteQueue(ctx, "mine", false, false)
	expectCode(t, "delete", err, wire.ResourceLocked)
	// The owner binds, and another connection's publish is routed there.
	if err := owner.Bind(ctx, b); err != nil {
		t.Fatal(err)
	}
	if err := other.Publish(ctx, "amq.direct", client.Message{RoutingKey: "k", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	q, err := owner.DeclareQueue(ctx, "mine", client.QueueOptions{Passive: true})
	if err != nil || q.Messages != 1 {
		t.Fatalf("owner's passive declare: %+v %v, want 1 message", q, err)
	}
	if err := owner.Unbind(ctx, b); err != nil {
		t.Fatal(err)
	}
}
