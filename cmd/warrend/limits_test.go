package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/wire"
)

// TestTopologyLimitFlags: max_queues, max_exchanges and max_bindings come
// from the config file, the environment and flags (a flag over the file);
// a declare past one is refused with limit_reached naming it. So is a
// second consumer with the file's max_consumers_per_connection 1.
func TestTopologyLimitFlags(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "warren.json")
	if err := os.WriteFile(cfg, []byte(`{"max_queues": 100, "max_exchanges": 5, "max_bindings": 100, "max_consumers_per_connection": 1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	a := startWarrend(t, []string{"--config", cfg, "--max-queues", "1"}, map[string]string{"WARREN_MAX_BINDINGS": "1"})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch := func() *client.Channel {
		c, err := client.Dial(ctx, "warren://guest:guest@"+a.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		ch, err := c.Channel(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ch
	}
	refused := func(what string, err error, flag string) {
		t.Helper()
		if wire.CodeOf(err) != wire.LimitReached || !strings.Contains(err.Error(), flag) {
			t.Fatalf("%s: %v, want limit_reached naming %s", what, err, flag)
		}
	}
	c := ch()
	if _, err := c.DeclareQueue(ctx, "q1", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := c.DeclareQueue(ctx, "q2", client.QueueOptions{})
	refused("second queue (--max-queues 1 over the file's 100)", err, "--max-queues")
	c = ch()
	if err := c.DeclareExchange(ctx, "x1", "direct", client.ExchangeOptions{}); err != nil {
		t.Fatal(err)
	}
	refused("sixth exchange (the file's 5)", c.DeclareExchange(ctx, "x2", "direct", client.ExchangeOptions{}), "--max-exchanges")
	c = ch()
	if err := c.Bind(ctx, client.Binding{Source: "x1", Destination: "q1", RoutingKey: "a"}); err != nil {
		t.Fatal(err)
	}
	refused("second binding (WARREN_MAX_BINDINGS=1 over the file's 100)", c.Bind(ctx, client.Binding{Source: "x1", Destination: "q1", RoutingKey: "b"}), "--max-bindings")
	c = ch()
	if _, err := c.Consume(ctx, "q1", client.ConsumeOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Consume(ctx, "q1", client.ConsumeOptions{})
	refused("second consumer (the file's max_consumers_per_connection 1)", err, "max_consumers_per_connection")
}

// TestExclusivePerConnectionFlag: --max-exclusive-queues-per-connection
// caps the exclusive queues one connection owns.
func TestExclusivePerConnectionFlag(t *testing.T) {
	a := startWarrend(t, []string{"--max-exclusive-queues-per-connection", "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, "warren://guest:guest@"+a.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, err := c.Channel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.DeclareQueue(ctx, "e1", client.QueueOptions{Exclusive: true}); err != nil {
		t.Fatal(err)
	}
	_, err = ch.DeclareQueue(ctx, "e2", client.QueueOptions{Exclusive: true})
	if wire.CodeOf(err) != wire.LimitReached || !strings.Contains(err.Error(), "--max-exclusive-queues-per-connection") {
		t.Fatalf("second exclusive queue: %v, want limit_reached naming --max-exclusive-queues-per-connection", err)
	}
}
