package netio

import (
	"context"
	"testing"
	"time"

	"github.com/warren-mq/warren/client"
)

// An idle connection, authenticated and with a channel open (as the scale
// run's 10,000 are), carries no publish or settle scratch and no consumer
// maps: its record is what the collector marks, and these are allocated at
// the first PUBLISH or SETTLE frame and the first consumer.
func TestIdleConnCarriesNoScratch(t *testing.T) {
	s, err := Start(Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close(context.Background()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
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
	if _, err := ch.DeclareQueue(ctx, "q", client.QueueOptions{}); err != nil { // a round trip: the channel is open
		t.Fatal(err)
	}
	s.connsMu.Lock()
	defer s.connsMu.Unlock()
	if len(s.conns) != 1 {
		t.Fatalf("%d connections, want 1", len(s.conns))
	}
	for _, sc := range s.conns {
		sc.mu.Lock()
		if sc.ls != nil || sc.byID != nil || len(sc.channels) != 1 {
			t.Errorf("idle connection: scratch %v, consumers by id %v, %d channels; want nil, nil, 1", sc.ls != nil, sc.byID, len(sc.channels))
		}
		for _, cch := range sc.channels {
			if cch.consumers != nil {
				t.Errorf("channel %d with no consumer has a consumer map", cch.id)
			}
		}
		sc.mu.Unlock()
	}
}
