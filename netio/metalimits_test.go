package netio_test

import (
	"strings"
	"testing"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
)

// TestQueueLimitOverTheProtocol: with max_queues 2, a client's third
// declare is refused with limit_reached naming the limit and the flag
// that raises it, a refusal of that request only: the same channel goes
// on working. The queue is not created, and once one is deleted the
// declare succeeds.
func TestQueueLimitOverTheProtocol(t *testing.T) {
	s := warrentest.StartServer(t, &netio.Config{MaxQueues: 2, MaxExchanges: 5, MaxBindings: 1})
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	for _, n := range []string{"a", "b"} {
		if _, err := ch.DeclareQueue(ctx, n, client.QueueOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := ch.DeclareQueue(ctx, "c", client.QueueOptions{})
	if wire.CodeOf(err) != wire.LimitReached || !strings.Contains(err.Error(), "max_queues") || !strings.Contains(err.Error(), "--max-queues") {
		t.Fatalf("third declare: %v, want limit_reached naming max_queues and --max-queues", err)
	}
	if _, err := ch.DeclareQueue(ctx, "c", client.QueueOptions{Passive: true}); wire.CodeOf(err) != wire.NotFound {
		t.Fatalf("on the same channel after the refusal: %v, want not_found (the refused queue does not exist, the channel still answers)", err)
	}
	if _, err := ch.DeleteQueue(ctx, "a", false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.DeclareQueue(ctx, "c", client.QueueOptions{}); err != nil {
		t.Fatalf("declare after a delete made room: %v", err)
	}
	// Exchanges (the four amq.* count) and bindings.
	if err := ch.DeclareExchange(ctx, "x", "direct", client.ExchangeOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := ch.Bind(ctx, client.Binding{Source: "x", Destination: "b", RoutingKey: "k"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.Bind(ctx, client.Binding{Source: "x", Destination: "c", RoutingKey: "k"}); wire.CodeOf(err) != wire.LimitReached || !strings.Contains(err.Error(), "--max-bindings") {
		t.Fatalf("second binding: %v", err)
	}
	if err := ch.DeclareExchange(ctx, "y", "direct", client.ExchangeOptions{}); wire.CodeOf(err) != wire.LimitReached || !strings.Contains(err.Error(), "--max-exchanges") {
		t.Fatalf("sixth exchange: %v", err)
	}
}

// TestConsumerLimitOverTheProtocol: with max_consumers_per_connection 3, a
// connection's fourth SUBSCRIBE (on any of its channels) is refused with
// limit_reached naming the setting, a refusal of that request only; another
// connection is not limited by it; once a consumer is cancelled and its
// queue let it go, a SUBSCRIBE succeeds again. Before, a connection could
// make consumers without end (each one a consumer of the queue's too).
func TestConsumerLimitOverTheProtocol(t *testing.T) {
	s := warrentest.StartServer(t, &netio.Config{MaxConsumersPerConnection: 3})
	ctx := ctxT(t)
	conn := dial(t, s)
	ch1, ch2 := channel(t, conn), channel(t, conn)
	if _, err := ch1.DeclareQueue(ctx, "q", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	var first *client.Consumer
	for i, ch := range []*client.Channel{ch1, ch1, ch2} {
		cs, err := ch.Consume(ctx, "q", client.ConsumeOptions{})
		if err != nil {
			t.Fatalf("consumer %d: %v", i+1, err)
		}
		if first == nil {
			first = cs
		}
	}
	_, err := ch2.Consume(ctx, "q", client.ConsumeOptions{})
	if wire.CodeOf(err) != wire.LimitReached || !strings.Contains(err.Error(), "max_consumers_per_connection") {
		t.Fatalf("fourth consumer: %v, want limit_reached naming max_consumers_per_connection", err)
	}
	if _, err := ch2.DeclareQueue(ctx, "q", client.QueueOptions{Passive: true}); err != nil {
		t.Fatalf("the same channel after the refusal: %v", err)
	}
	if _, err := channel(t, dial(t, s)).Consume(ctx, "q", client.ConsumeOptions{}); err != nil {
		t.Fatalf("another connection: %v", err)
	}
	if err := first.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	// Answered by the queue's shard after the cancel before it: the
	// queue has let the consumer go.
	if _, err := ch1.PurgeQueue(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	if _, err := ch2.Consume(ctx, "q", client.ConsumeOptions{}); err != nil {
		t.Fatalf("after a cancel made room: %v", err)
	}
}

// TestBindingArgsBound: a binding's arguments are at most 65,535 bytes
// encoded and a consistent-hash exchange's hash-header at most 255 (a
// header name), refused with invalid_argument, nothing created. Before,
// each could be as large as a frame (4 MiB), held in the metadata and its
// log for every one of max_bindings bindings and max_exchanges exchanges.
func TestBindingArgsBound(t *testing.T) {
	s := warrentest.StartServer(t, &netio.Config{})
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	if _, err := ch.DeclareQueue(ctx, "q", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	big := wire.Table{{Key: "x-match", Value: wire.String("any")}, {Key: "k", Value: wire.Bytes(make([]byte, 70000))}}
	err := ch.Bind(ctx, client.Binding{Source: "amq.headers", Destination: "q", Args: big})
	if wire.CodeOf(err) != wire.InvalidArgument || !strings.Contains(err.Error(), "at most 65535") {
		t.Fatalf("a binding with 70,000 bytes of arguments: %v, want invalid_argument naming the bound", err)
	}
	ok := wire.Table{{Key: "x-match", Value: wire.String("any")}, {Key: "k", Value: wire.Bytes(make([]byte, 60000))}}
	if err := ch.Bind(ctx, client.Binding{Source: "amq.headers", Destination: "q", Args: ok}); err != nil {
		t.Fatalf("a binding with 60,000 bytes of arguments: %v", err)
	}
	err = ch.DeclareExchange(ctx, "h", "consistent-hash", client.ExchangeOptions{Args: wire.Table{{Key: "hash-header", Value: wire.String(strings.Repeat("h", 256))}}})
	if wire.CodeOf(err) != wire.InvalidArgument || !strings.Contains(err.Error(), "hash-header") {
		t.Fatalf("a hash-header of 256 bytes: %v, want invalid_argument", err)
	}
	if err := ch.DeclareExchange(ctx, "h", "consistent-hash", client.ExchangeOptions{Passive: true}); wire.CodeOf(err) != wire.NotFound {
		t.Fatalf("the refused exchange: %v, want not_found", err)
	}
}
