package netio

import (
	"context"
	"testing"
	"time"

	"github.com/warren-mq/warren/client"
)

// A channel that subscribes and cancels in a loop keeps only the consumers
// its queues still have in ch.all, not every one it ever had: before, the
// list grew by one consumer per SUBSCRIBE until the channel closed (2,000
// loops: 2,000 entries, each closed at the channel's end).
func TestSubscribeCancelLoopHoldsNothing(t *testing.T) {
	s, err := Start(Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close(context.Background()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, "warren://guest:guest@"+s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, err := c.Channel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.DeclareQueue(ctx, "q", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2000; i++ {
		cs, err := ch.Consume(ctx, "q", client.ConsumeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := cs.Cancel(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The purge is answered by the queue's shard after it applied every
	// cancel before it (one shard, in order): each consumer is gone.
	if _, err := ch.PurgeQueue(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	s.connsMu.Lock()
	defer s.connsMu.Unlock()
	for _, sc := range s.conns {
		sc.mu.Lock()
		for _, sch := range sc.channels {
			if n := len(sch.all); n > 2*len(sc.byID)+16 {
				t.Errorf("channel %d keeps %d consumers after 2,000 subscribe-cancel loops; the connection has %d: want at most %d", sch.id, n, len(sc.byID), 2*len(sc.byID)+16)
			}
		}
		if len(sc.byID) != 0 {
			t.Errorf("%d consumers still known after every one was cancelled and its queue let it go", len(sc.byID))
		}
		sc.mu.Unlock()
	}
}
