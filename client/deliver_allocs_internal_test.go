package client

import (
	"sync"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// TestDeliverAllocs: the reader's DELIVER path allocates per delivery only
// what the copying API hands over (the Delivery and one buffer for its body
// and properties: 2), not the exchange and routing-key strings again for
// every message of a run that shares them; ConsumeBatch allocates nothing.
func TestDeliverAllocs(t *testing.T) {
	c := &Conn{channels: map[uint16]*Channel{}, done: make(chan struct{}), flowOn: true, settles: map[*Channel]struct{}{}, maxFrame: wire.HardMaxFrame}
	c.wcond = sync.NewCond(&c.wmu)
	ch := newChannel(c, 1)
	c.channels[1] = ch
	const n = 100
	buf, mark := wire.BeginDeliver(nil, 1, []byte("ct"))
	body := make([]byte, 128)
	for i := 0; i < n; i++ {
		buf = wire.AppendDelivery(buf, &wire.Delivery{Tag: uint64(i + 1), DeliveryCount: 1, Exchange: []byte("orders"), RoutingKey: []byte("eu.new"), Body: body})
	}
	buf = mark.End(buf, n)
	f, _, err := wire.Split(buf, wire.HardMaxFrame)
	if err != nil {
		t.Fatal(err)
	}
	var dec wire.Decompressor
	run := func(cs *Consumer, drain bool) float64 {
		ch.consumers["ct"] = cs
		return testing.AllocsPerRun(20, func() {
			if err := c.dispatch(f, &dec); err != nil {
				t.Fatal(err)
			}
			for drain && len(cs.feed) > 0 {
				if d := <-cs.feed; d.RoutingKey != "eu.new" || d.Exchange != "orders" {
					t.Fatalf("delivery %d: exchange %q routing key %q", d.Tag, d.Exchange, d.RoutingKey)
				}
			}
		}) / n
	}
	// Per delivery, so a regression adds at least 1; the half below
	// absorbs what other goroutines of the test process allocate while it
	// measures (CI read 2.01: one stray allocation per 100 deliveries).
	if got := run(&Consumer{ch: ch, feed: make(chan *Delivery, n), done: make(chan struct{})}, true); got >= 2.5 {
		t.Errorf("Consume: %.2f allocations per delivery, want at most 2 (the Delivery and its body)", got)
	}
	seen := 0
	batch := &Consumer{ch: ch, feed: make(chan *Delivery), done: make(chan struct{}), batch: func(ds []Delivery) { seen += len(ds) }}
	if got := run(batch, false); got >= 0.5 {
		t.Errorf("ConsumeBatch: %.2f allocations per delivery, want 0", got)
	}
	if seen == 0 {
		t.Error("the ConsumeBatch handler never ran")
	}
}
