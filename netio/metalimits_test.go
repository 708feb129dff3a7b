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
